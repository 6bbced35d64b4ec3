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
from pathlib import Path
from typing import Any, BinaryIO, Callable


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def atomic_write_json(path: Path, obj: Any, *, compact: bool = False) -> None:
    """Write `obj` as indented UTF-8 JSON, atomically; `compact`: on one line, for files only the
    program reads (json's C encoder writes that, ~10x faster than the indented form)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":")) if compact else json.dumps(obj, indent=2,
                                                                                             sort_keys=True)
    atomic_write_bytes(path, (text + "\n").encode("utf-8"))


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
