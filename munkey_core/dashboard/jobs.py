"""A background job for long work (training, embedding maps) that a UI polls for progress.

States: idle -> running -> done | failed; a failed job may be started again, a running or done
one is not. A MunkeyError's message is kept in `error`; any other exception is kept as a
one-line message and its traceback goes to stderr, so the UI stays alive and the log keeps the bug.
Subclasses implement `task()` and may override `reset()` to clear their own progress fields.
Tests: tests/dashboard/test_views.py (TrainingJob), tests/dashboard/test_embeddings.py (EmbeddingJob), tests/app/test_app.py (DeletionJob,
EvaluationJob), tests/app/test_app_class.py (ClassUnlearnJob).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from abc import ABC, abstractmethod

from munkey_core.errors import MunkeyError


class BackgroundJob(ABC):
    """Runs `task()` once in a daemon thread; poll `state`, `error`, `elapsed`."""

    name = "job"            # thread name
    what = "The job"        # how a failure message names the work

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.state = "idle"
        self.error: str | None = None
        self.started: float | None = None
        self.finished: float | None = None

    @abstractmethod
    def task(self) -> None:
        """The long work itself; runs in the job's thread."""

    def reset(self) -> None:
        """Clear subclass progress before a (re)start."""

    def start(self) -> bool:
        """Start unless running or done; returns whether a thread was started."""
        with self._lock:
            if self.state in ("running", "done"):
                return False
            self.reset()
            self.state, self.error = "running", None
            self.started, self.finished = time.time(), None
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()
            return True

    def _work(self) -> None:
        try:
            self.task()
        except MunkeyError as exc:
            self.error, self.state = str(exc), "failed"
        except Exception as exc:  # a bug: keep the UI alive, keep the traceback for the log
            traceback.print_exc(file=sys.stderr)
            self.error = f"{self.what} failed unexpectedly ({type(exc).__name__}: {exc}). See the server log."
            self.state = "failed"
        else:
            self.state = "done"
        finally:
            self.finished = time.time()

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else (self.finished or time.time()) - self.started

    def wait(self, timeout: float | None = None) -> str:
        """Block until the thread ends (or `timeout`); returns the state."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.state


class ProgressJob(BackgroundJob):
    """A job whose task reports (stage, fraction) through `progress`, e.g. as a service call's
    progress callback; subclasses keep their result in their own attribute."""

    def reset(self) -> None:
        self.stage, self.fraction = "starting", 0.0

    def progress(self, stage: str, fraction: float) -> None:
        self.stage, self.fraction = stage, min(1.0, max(0.0, float(fraction)))
