"""Where a run directory keeps its per-sample rows, so that forgetting a sample costs O(#deleted) bytes.

Run format 2 (config.json "format": 2):
    bank.store                 the bank as a BankStore (ids, labels, keys, exemplars, AdamW moments)
    bank.store.redo            its redo record (holds only rows that are kept; see bankstore.py)
    checkpoints/epoch_NNN.pt   epoch, training record, model weights (no per-sample row)
    checkpoints/epoch_NNN.rows that epoch's exemplar rows (ids, labels, exemplars) as a BankStore
                               without a key column, plus its own .redo
A deletion overwrites the deleted rows in place in every one of these files (swap-with-last, the
vacated rows zeroed, every file flushed twice, all files in one group commit: bank/store.py
`delete_many`): the bytes written depend on the number of ids, not on the bank size. Format 1 (bank.npz; exemplar rows inside each epoch_NNN.pt) was rewritten whole, bank
and every checkpoint, per request. The readers here (`load_bank`, `bank_ids`, `load_checkpoint`,
`checkpoint_ids_present`) open the files read-only: they never replay a redo record, which only
the holder of the run's exclusive lock (a deletion) or an opening MunkeyRun may do (`open_bank`:
read-only as well where the run may not be written).

Migration (format 1 -> 2) runs once, when the run is first opened by this version, under the run's
exclusive lock, before any interrupted deletion is finished:
1. bank.npz -> bank.store (built under a temporary name, fsync'ed, renamed);
2. per checkpoint: its rows -> epoch_NNN.rows (temporary name, renamed), then epoch_NNN.pt
   rewritten without them (atomic);
3. config.json gets "format": 2 (atomic): the commit point;
4. bank.npz is removed.
A crash before step 3 leaves a format-1 run that the next open migrates again (each step is
redone from the format-1 files, which are still complete); after it, the next open removes a
leftover bank.npz. Cost: one O(N) copy, once.
Tests: tests/run/test_runstore.py (migration, crash at each migration step), tests/run/test_purge.py,
tests/run/test_atomicity.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from munkey_core.bank.store import BankStore, delete_many, unique_ids
from munkey_core.errors import MunkeyError
from munkey_core.run.paths import RunPaths, load_state_dict
from munkey_core.run.lock import crash_point
from munkey_core.atomic import atomic_torch_save, atomic_write_json, fsync_dir, read_json

if TYPE_CHECKING:  # torch and the in-memory bank are imported where used: the file steps of a deletion need neither
    from munkey_core.bank.memory import MemoryBank

STORE_FORMAT = 2
MIGRATION_CRASH_STEPS = ("migrate-bank", "migrate-checkpoint", "migrate-config")  # tests/run/test_runstore.py
ROWS_SUFFIX = ".rows"


# --------------------------------------------------------------------------- writing


def _redo(path: Path) -> Path:
    return path.with_name(path.name + ".redo")


def write_store(path: Path, ids: np.ndarray, labels: np.ndarray, keys: np.ndarray, values: np.ndarray,
                moments: dict[str, np.ndarray] | None = None) -> None:
    """Create the BankStore `path` from rows, atomically: built under a temporary name, then renamed
    (a crash leaves the old file or none, never a half-filled store). Removes a stale redo record."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    for stale in (tmp, _redo(tmp)):
        stale.unlink(missing_ok=True)
    BankStore.from_arrays(tmp, ids, labels, keys, values, moments).close()
    _redo(tmp).unlink(missing_ok=True)
    _redo(path).unlink(missing_ok=True)  # a record of an older file at this name must never replay here
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_bank(path: Path, bank: MemoryBank) -> None:
    """The bank's rows (same order, float32) as a BankStore at `path`, atomically."""
    a = bank.to_arrays()
    moments = {k[len("moment_"):]: v for k, v in a.items() if k.startswith("moment_")}
    write_store(path, a["ids"], a["labels"], a["keys"], a["values"], moments)


def rows_path(checkpoint: Path) -> Path:
    """The row file of a checkpoint epoch_NNN.pt: epoch_NNN.rows."""
    return checkpoint.with_suffix(ROWS_SUFFIX)


def write_checkpoint(path: Path, payload: dict, ids: np.ndarray, labels: np.ndarray, values: np.ndarray) -> None:
    """A checkpoint: `payload` (weights, epoch, record) in `path`, the exemplar rows in its row file.
    The rows are written first, so a checkpoint file never exists without its rows."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    write_store(rows_path(path), np.asarray(ids, dtype=np.int64), np.asarray(labels, dtype=np.int64),
                np.zeros((len(values), 0), dtype=np.float32), values)
    atomic_torch_save(path, payload)


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint with its row file and the row file's redo record."""
    rows = rows_path(path)
    for p in (path, rows, _redo(rows)):
        p.unlink(missing_ok=True)


# --------------------------------------------------------------------------- reading


def bank_path(root: Path) -> Path:
    """The bank file of a run directory: bank.store, or bank.npz for a run not yet migrated."""
    paths = RunPaths(Path(root))
    return paths.bank if paths.bank.exists() or not paths.legacy_bank.exists() else paths.legacy_bank


def open_bank(path: Path) -> BankStore:
    """The run's bank store at `path`, for loading it under the run lock: opened for writing, so that
    an interrupted deletion is finished first. Where this process may not write (a read-only copy or
    mount of the run) it is opened read-only, and refused only while a deletion is unfinished."""
    try:
        return BankStore(path)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise MunkeyError(f"Cannot open the memory bank {path} ({exc.strerror or exc}).") from None
    store = BankStore(path, readonly=True)
    if store.update_pending():
        store.close()
        raise MunkeyError(f"The memory bank {path} has an unfinished deletion, and this process may not write to "
                          "the run to finish it. Open the run once with write access, then retry.")
    return store


def load_bank(root: Path) -> MemoryBank:
    """The run's bank as an in-memory MemoryBank (either format; the run is not changed)."""
    from munkey_core.bank.memory import MemoryBank

    path = bank_path(root)
    if path == RunPaths(Path(root)).legacy_bank:
        return MemoryBank.load(path)
    with BankStore(path, readonly=True) as store:
        return store.to_bank()


def bank_ids(root: Path) -> np.ndarray:
    """The ids stored in the run's bank file (a copy; reads only the id column of a store)."""
    path = bank_path(root)
    if path == RunPaths(Path(root)).legacy_bank:
        try:
            with np.load(path) as data:
                return np.array(data["ids"])
        except Exception as exc:
            raise MunkeyError(f"The memory bank {path} is damaged ({type(exc).__name__}); restore the run from a "
                              "backup.") from None
    with BankStore(path, readonly=True) as store:
        return np.array(store.ids)


def bank_stamp(root: Path) -> tuple[int, int, int]:
    """Changes whenever the run's bank changes on disk (a cache key for the dashboard): the bank
    file's mtime and size (a deletion writes it in place: same size, new mtime) and forgotten.json's
    mtime (rewritten by every deletion)."""
    st = bank_path(root).stat()
    fg = RunPaths(Path(root)).forgotten
    return st.st_mtime_ns, st.st_size, fg.stat().st_mtime_ns if fg.exists() else 0


def checkpoints(directory: Path) -> list[Path]:
    """The run's checkpoint files epoch_NNN.pt, oldest first."""
    return sorted(Path(directory).glob("epoch_*.pt")) if Path(directory).is_dir() else []


def row_files(directory: Path) -> list[Path]:
    """Every checkpoint row file (also one whose .pt is gone: it still holds rows and is purged)."""
    return sorted(Path(directory).glob(f"epoch_*{ROWS_SUFFIX}")) if Path(directory).is_dir() else []


def _torch_load(path: Path) -> dict:
    """A checkpoint's .pt on the CPU; a damaged one says to delete or restore that checkpoint."""
    return load_state_dict(path, "cpu", "it is a checkpoint: delete it or restore it, then retry")


def load_checkpoint(path: Path) -> dict:
    """A checkpoint with its rows as tensors "ids" (N,) and "values" (N, Dv), whatever its format."""
    ckpt = _torch_load(path)
    rows = rows_path(path)
    if "ids" in ckpt:
        return ckpt
    if not rows.exists():
        raise MunkeyError(f"Checkpoint {path} has no exemplar rows ({rows.name} is missing); restore it, or delete "
                          f"{path.name} to drop the checkpoint.")
    import torch

    with BankStore(rows, readonly=True) as store:
        ckpt["ids"] = torch.from_numpy(np.array(store.ids))
        ckpt["values"] = torch.from_numpy(np.array(store.values, dtype=np.float32))
    return ckpt


def checkpoint_ids_present(directory: Path, ids: Iterable[int]) -> tuple[dict[str, list[int]], int]:
    """({file name: the given ids it still holds rows for}, number of checkpoints checked).
    Row files are scanned by their id column; a format-1 checkpoint is loaded."""
    wanted = np.asarray(sorted(set(int(i) for i in ids)), dtype=np.int64)
    found: dict[str, list[int]] = {}
    files = checkpoints(directory)
    for path in files:
        if rows_path(path).exists():
            continue
        ckpt = _torch_load(path)  # format 1: rows inside the .pt
        held = ckpt["ids"].numpy() if "ids" in ckpt else np.zeros(0, np.int64)
        hit = wanted[np.isin(wanted, held)]
        if len(hit):
            found[path.name] = [int(i) for i in hit]
    for rows in row_files(directory):
        with BankStore(rows, readonly=True) as store:
            hit = wanted[np.isin(wanted, store.ids)]
        if len(hit):
            found[rows.name] = [int(i) for i in hit]
    return found, len(files)


# --------------------------------------------------------------------------- purge


def delete_bank_rows(path: Path, ids: Iterable[int]) -> list[int]:
    """Delete `ids` from the bank store at `path` in place (durable on return); returns those deleted.
    Opening the store reads only its header (and finishes an interrupted update); the rows are found
    by one scan of the id column."""
    with BankStore(path) as store:
        return store.delete(ids).deleted


def purge_checkpoint_rows(directory: Path, ids: Iterable[int], on_file: Callable[[Path], None] | None = None,
                          bank: Path | None = None, replace: Sequence[tuple[Path, bytes]] = (),
                          after_files: Callable[[], None] | None = None) -> int:
    """Remove the rows of `ids` from every checkpoint (and from the bank store `bank`, when given);
    returns the files changed. Idempotent.

    The row files (and the bank) delete in place as one group commit (bank/store.py `delete_many`:
    O(#ids) bytes, every file durable on return, two rounds of flushes for all of them), which also
    replaces the (path, bytes) of `replace` atomically (then calls `after_files`, before any row moves); a format-1
    checkpoint (rows inside the .pt, no row file) is rewritten without them. `on_file` is called
    after each change."""
    drop = [int(i) for i in ids]
    changed = 0
    for path in checkpoints(directory):
        if rows_path(path).exists():
            continue
        ckpt = _torch_load(path)
        if "ids" not in ckpt:
            continue
        ck_ids = ckpt["ids"].numpy()
        keep = ~np.isin(ck_ids, drop)
        if keep.all():
            continue
        import torch

        ckpt["ids"] = torch.from_numpy(ck_ids[keep].copy())
        ckpt["values"] = ckpt["values"][torch.from_numpy(keep)].clone()
        atomic_torch_save(path, ckpt)
        changed += 1
        if on_file is not None:
            on_file(path)
    files = row_files(directory) + ([Path(bank)] if bank is not None and Path(bank).exists() else [])
    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(BankStore(f)) for f in files]
        wanted = unique_ids(np.asarray(drop, dtype=np.int64))  # (m,) converted once for every store
        results = delete_many([(store, wanted) for store in stores], replace, after_files)
    for f, res in zip(files, results):
        if res.deleted:
            changed += 1
            if on_file is not None:
                on_file(f)
    return changed


# --------------------------------------------------------------------------- migration


def needs_migration(root: Path) -> bool:
    """True for a format-1 run, or a migrated one whose bank.npz was not removed yet."""
    return RunPaths(Path(root)).legacy_bank.exists()


def migrate(root: Path) -> bool:
    """Move a format-1 run to format 2 (see the module docstring); the caller holds the exclusive run
    lock. Returns True when something was done. Safe to call again after a crash or an error at any
    point (an OSError, e.g. a full disk, becomes a MunkeyError; the run stays in format 1)."""
    try:
        return _migrate(Path(root))
    except OSError as exc:
        raise MunkeyError(f"Could not convert the run {root} to the current storage format ({exc.strerror or exc}). "
                          "Nothing was lost: free disk space or make the directory writable, then open it again.") \
            from None


def _migrate(root: Path) -> bool:
    paths = RunPaths(root)
    legacy = paths.legacy_bank
    if not legacy.exists():
        return False
    config = read_json(paths.config)
    if int(config.get("format", 1)) >= STORE_FORMAT and paths.bank.exists():
        legacy.unlink()  # migrated, crashed before the removal: bank.npz may only be older
        fsync_dir(root)
        return True
    from munkey_core.bank.memory import MemoryBank

    bank = MemoryBank.load(legacy)
    write_bank(paths.bank, bank)
    crash_point("migrate-bank")
    label_of = dict(zip(bank.ids.tolist(), bank.labels.tolist()))
    for path in checkpoints(paths.checkpoints):
        ckpt = _torch_load(path)
        if "ids" not in ckpt:
            continue  # migrated before a crash
        ids = ckpt.pop("ids").numpy()
        values = ckpt.pop("values").numpy()
        labels = np.array([label_of.get(int(i), -1) for i in ids], dtype=np.int64)  # -1: not in the bank
        write_checkpoint(path, ckpt, ids, labels, values)
        crash_point("migrate-checkpoint")
    atomic_write_json(paths.config, {**config, "format": STORE_FORMAT})
    crash_point("migrate-config")
    legacy.unlink()
    fsync_dir(root)
    return True
