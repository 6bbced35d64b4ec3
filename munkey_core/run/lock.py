"""The run directory's inter-process lock, and the crash-point hook the atomicity tests use.

`RunLock` is an fcntl.flock on `<run>/.lock` (the file itself stays; only the lock comes and
goes, and the kernel drops it when its holder dies, even by SIGKILL). Deletions and audit-log
appends hold it exclusively; opening a run holds it shared while loading, so a reader never sees
a deletion half way. Re-entrant within one `RunLock` object (a deletion that evaluates and then
appends keeps the one lock). Waiting gives up after $MUNKEY_LOCK_TIMEOUT seconds (default 600).
POSIX only (fcntl).

`crash_point(step)`: when $MUNKEY_CRASH_AT equals `step`, the process SIGKILLs itself there. The
deletion protocol names its steps (see deletion.CRASH_STEPS); tests/run/test_atomicity.py kills a
deletion at each one and checks the run is then wholly before or wholly after it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

from munkey_core.errors import MunkeyError

LOCK_NAME = ".lock"
DELETION_LOCK_NAME = ".deletion.lock"  # held for a whole deletion request, its evaluation included


def crash_point(step: str) -> None:
    """Test hook: die here, as by a power cut, when $MUNKEY_CRASH_AT == step."""
    if os.environ.get("MUNKEY_CRASH_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


def pause_point(step: str) -> None:
    """Test hook: when $MUNKEY_PAUSE_AT == step, create `$MUNKEY_PAUSE_FILE.reached` and wait (at most
    120 s) while $MUNKEY_PAUSE_FILE exists, so a test can act while a request stands at this step."""
    if os.environ.get("MUNKEY_PAUSE_AT") != step or not os.environ.get("MUNKEY_PAUSE_FILE"):
        return
    flag = Path(os.environ["MUNKEY_PAUSE_FILE"])
    Path(f"{flag}.reached").touch()
    deadline = time.monotonic() + 120
    while flag.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def deletion_in_progress(root: str | Path) -> bool:
    """True while a live process holds the run's deletion lock: a journal.json then belongs to a request
    still running (being evaluated), not to an interrupted one; nobody else may finish it."""
    path = Path(root) / DELETION_LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


class RunLock:
    """flock(2) on <root>/.lock: shared for readers, exclusive for writers; re-entrant per object."""

    def __init__(self, root: str | Path, name: str = LOCK_NAME) -> None:
        self.path = Path(root) / name
        self._guard = threading.RLock()
        self._fd: int | None = None
        self._depth = 0
        self._mode = 0

    def _timeout(self) -> float:
        try:
            return float(os.environ.get("MUNKEY_LOCK_TIMEOUT", "600"))
        except ValueError:
            return 600.0

    @contextlib.contextmanager
    def hold(self, exclusive: bool = True) -> Iterator[None]:
        """Hold the lock (exclusive or shared) for the `with` block."""
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        with self._guard:
            if self._depth and (self._mode == fcntl.LOCK_EX or mode == fcntl.LOCK_SH):
                self._depth += 1  # already held strongly enough
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            if self._depth:
                raise RuntimeError("cannot upgrade a shared run lock to an exclusive one while holding it")
            self._acquire(mode)
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0
                self._release()

    @contextlib.contextmanager
    def try_hold_shared(self) -> Iterator[bool]:
        """Hold the lock shared for the block if that needs no waiting: yields True when held (also when this
        thread already holds it), False when another thread or process holds it exclusively. For optional
        work (writing a cache) that must neither wait for a deletion nor deadlock against one."""
        if not self._guard.acquire(blocking=False):
            yield False
            return
        try:
            if self._depth:  # this thread holds it, shared or exclusive: strong enough
                self._depth += 1
                try:
                    yield True
                finally:
                    self._depth -= 1
                return
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                yield False
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                yield False
                return
            self._fd, self._mode, self._depth = fd, fcntl.LOCK_SH, 1
            try:
                yield True
            finally:
                self._depth = 0
                self._release()
        finally:
            self._guard.release()

    def _acquire(self, mode: int) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            if mode == fcntl.LOCK_SH:  # a read-only run directory: readers go on without the lock
                return
            raise MunkeyError(f"Cannot open the run's lock file {self.path} ({exc.strerror}); check that the run "
                              "directory is writable.") from None
        deadline = time.monotonic() + self._timeout()
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise MunkeyError(f"Another process has been changing the run {self.path.parent} for too long "
                                      "(its lock is held). Wait for it to finish, then retry; nothing was changed."
                                      ) from None
                time.sleep(0.02)
        self._fd, self._mode = fd, mode

    def _release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        self._fd, self._mode = None, 0
