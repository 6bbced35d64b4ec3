"""Atomic file writes: a crash leaves the old file or the new one, never a mix.

Each write goes to a temporary file in the same directory, is fsync'ed, renamed over the target
with os.replace (atomic on POSIX), and the directory is fsync'ed so the rename itself is durable.
Below every other package (the bank, the key cache and the run directory all write through it).
Tests: tests/run/test_atomicity.py, tests/keys/test_keys.py (the key cache).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable, Sequence


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flush_all(flushes: list[tuple[Callable[[int], None], int]]) -> None:
    """Run every (fsync, fd) flush, concurrently when there are several, and return when all are done
    (the first error is raised after all have finished). Each file still gets its own flush; issued
    together they share the device's cache flushes instead of queueing one after another (measured
    in docs/performance.md). At most 16 threads, each taking the next flush as it finishes one (no
    batch waits for its slowest flush before the next starts). The threads live for one call only:
    a pool kept between calls would be inherited without its threads by a forked child, which would
    then wait on it forever. (Plain threads: concurrent.futures would import logging too, ~5% of a
    `munkey forget --no-evaluate`.)"""
    if len(flushes) == 1:
        flushes[0][0](flushes[0][1])
        return
    errors: list[BaseException | None] = [None] * len(flushes)
    todo = iter(range(len(flushes)))  # shared: each next() is one step under the interpreter lock

    def run() -> None:
        for j in todo:
            try:
                flushes[j][0](flushes[j][1])
            except BaseException as exc:  # raised in the caller once every flush has finished
                errors[j] = exc

    threads = [threading.Thread(target=run, name="munkey-flush") for _ in range(min(16, len(flushes)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


class FolderFlushes:
    """Open folders to flush as part of a group (`flush_all`): `flushes()` gives their (fsync, fd)
    pairs; `close()` closes them. A folder's flush makes the renames and new entries in it durable."""

    def __init__(self, folders: Sequence[Path]) -> None:
        self.fds: list[int] = []
        try:
            for folder in dict.fromkeys(Path(f) for f in folders):
                self.fds.append(os.open(folder, os.O_RDONLY))
        except BaseException:
            self.close()
            raise

    def flushes(self) -> list[tuple[Callable[[int], None], int]]:
        return [(os.fsync, fd) for fd in self.fds]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Replace `path` with what `write(file)` writes, atomically and durably (streamed: no copy in memory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # e.g. receipts/: owner-only
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    atomic_write(path, lambda f: f.write(data))


class StagedFiles:
    """The steps of an atomic group replacement, for a caller that joins their flushes with its own
    (`atomic_write_many`; bank/store.py `delete_many` adds a deletion's other files to its rounds):
    the constructor writes each file's bytes to a temporary file beside it (nothing replaced yet);
    `flushes()` are their (fsync, fd) pairs; `rename()` replaces the targets in the given order and
    returns the folders whose flush makes that durable; `discard()` (after a failure before the
    renames) removes what is left. `prepared` are temporary files written already (a new SQLite
    log built beside its target): flushed, then renamed before the others."""

    def __init__(self, files: Sequence[tuple[Path, bytes]], prepared: Sequence[tuple[Path, Path]] = ()) -> None:
        self.temps: list[tuple[str, Path]] = []  # (temporary file, target); "" once renamed
        self.fds: list[int] = []
        try:
            for tmp, path in prepared:
                self.temps.append((str(tmp), Path(path)))
                self.fds.append(os.open(tmp, os.O_RDONLY))
            for path, data in files:
                path = Path(path)
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
                self.fds.append(fd)
                self.temps.append((tmp, path))
                with os.fdopen(fd, "wb", closefd=False) as f:
                    f.write(data)
        except BaseException:
            self.discard()
            raise

    def flushes(self) -> list[tuple[Callable[[int], None], int]]:
        return [(os.fsync, fd) for fd in self.fds]

    def _close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def rename(self) -> list[Path]:
        """Replace every target by its (flushed) temporary file, in order; the folders to flush."""
        self._close()
        try:
            for j, (tmp, path) in enumerate(self.temps):
                os.replace(tmp, path)
                self.temps[j] = ("", path)
        except BaseException:
            self.discard()
            raise
        return list(dict.fromkeys(path.parent for _, path in self.temps))

    def discard(self) -> None:
        self._close()
        for tmp, _ in self.temps:
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)


def atomic_write_many(files: Sequence[tuple[Path, bytes]], prepared: Sequence[tuple[Path, Path]] = ()) -> None:
    """`atomic_write_bytes` of several files as one group: every temporary file is written, then all
    are flushed together (`flush_all`), then renamed over their targets in the given order, then every
    folder is flushed (together). Each file is still replaced atomically (old or new after a crash,
    never a mix) and every file is durable on return, as after the same calls one by one; what a
    crash between two renames leaves (some files new, the rest old) is what it leaves between two
    calls. Two rounds of flushes for the group instead of two flushes per file one after another
    (tests/run/test_atomic_group.py). `prepared`: see `StagedFiles`."""
    if not files and not prepared:
        return
    staged = StagedFiles(files, prepared)
    try:
        flush_all(staged.flushes())
    except BaseException:
        staged.discard()
        raise
    folders = FolderFlushes(staged.rename())
    try:
        flush_all(folders.flushes())
    finally:
        folders.close()


def atomic_write_json(path: Path, obj: Any, *, compact: bool = False) -> None:
    """Write `obj` as indented UTF-8 JSON, atomically; `compact`: on one line, for files only the
    program reads (json's C encoder writes that, ~10x faster than the indented form)."""
    atomic_write_bytes(path, json_bytes(obj, compact=compact))


def json_bytes(obj: Any, *, compact: bool = False) -> bytes:
    """The bytes `atomic_write_json` writes (sorted keys, a final new line), for `atomic_write_many`."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":")) if compact else json.dumps(obj, indent=2,
                                                                                             sort_keys=True)
    return (text + "\n").encode("utf-8")


def atomic_torch_save(path: Path, obj: Any) -> None:
    """torch.save `obj` atomically."""
    import torch  # here: the model-free paths (a deletion without evaluation) never load torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def read_json(path: Path) -> Any:
    """Read a JSON file; a missing or damaged file raises MunkeyError naming it."""
    from munkey_core.errors import MunkeyError

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MunkeyError(f"Missing file {path}. Is this a run directory made by 'munkey train'?") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
        raise MunkeyError(f"{path} is damaged ({type(exc).__name__}); restore the run from a backup.") from None
