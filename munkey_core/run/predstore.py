"""The cached predictions of dataset rows (run/predcache.py) kept on disk, so a fresh process starts warm.

Why: a deletion with its evaluation needs the predictions of the test split and of the retain samples
with the bank before the deletion. A process that has them (an earlier evaluation) recomputes only the
queries a deletion can change (about 1 s on the demo run); a freshly started one had to run every query
through the model first (about 13 s). With this store the first deletion after a restart is as fast as
the next ones: `munkey train` (service.train_run) evaluates the new run once, which writes the store.

Where: `<run>/predictions/preds-<key>.npz`, one file per table, `key` a hash of what a prediction depends
on besides the bank: the model's weights (fingerprint), split, pathway, K, tau and the search mode.
Each file holds, for the valid rows of its table: their row numbers and sample ids, class probabilities
(n, C) and neighbour ids (n, K), plus a JSON header with `bank`, a sha256 of the sorted ids of the bank
the predictions were made with. A table is loaded only when that digest equals the loaded bank's: a
prediction is never served for another bank state (a bank changed behind the run's back, another
process's deletion not yet seen).

Why it is safe to keep (derived data, recomputable at any time): it never holds a deleted sample's
prediction nor a prediction whose neighbours include a deleted id. `save_table` leaves out the rows of
forgotten samples and writes only under the run's shared lock after checking that the bank file is the
bank the table was computed with; `purge_ids` (the deletion protocol plans the same
writes with `purged_tables` while it applies a request, under the run's exclusive lock, before the bank
file changes, idempotent, and joins them to its group commit: forget/request.py `apply_journal`) removes the rows of the deleted samples and every row that retrieved one, and re-stamps
the file with the bank after the deletion, so the rows it keeps are served to the next process. A damaged or foreign file counts as
absent (and the next purge removes it).
Users: run/loaded.py `LoadedMunkeyRun.predict_rows`. Tests: tests/run/test_predstore.py.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Iterable

import numpy as np

from munkey_core.atomic import atomic_write_bytes, atomic_write_many
from munkey_core.run import rows
from munkey_core.run.predcache import CachedTable

CACHE_DIR = "predictions"
FORMAT = 1
_ARRAYS = ("rows", "ids", "probs", "neighbours")


def bank_digest(ids: np.ndarray) -> str:
    """sha256 of a bank's ids, sorted (the order of rows does not change a prediction)."""
    return hashlib.sha256(np.sort(np.asarray(ids, dtype=np.int64)).tobytes()).hexdigest()


def table_key(desc: dict) -> str:
    """The file key of a table described by `desc` (model fingerprint, split, pathway, k, tau, search)."""
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:24]


def cache_dir(root: str | Path) -> Path:
    return Path(root) / CACHE_DIR


def table_path(root: str | Path, desc: dict) -> Path:
    return cache_dir(root) / f"preds-{table_key(desc)}.npz"


def _encode(meta: dict, arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(dict(meta, format=FORMAT), sort_keys=True)),
             **{a: np.ascontiguousarray(arrays[a]) for a in _ARRAYS})
    return buf.getvalue()


def _read(path: Path) -> tuple[dict, dict[str, np.ndarray]] | None:
    """Header and arrays of a table file, or None when it is missing, damaged or foreign."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays = {a: np.array(data[a]) for a in _ARRAYS}
    except Exception:  # damaged, truncated, foreign: recompute
        return None
    n = len(arrays["rows"])
    if (meta.get("format") != FORMAT or any(len(a) != n for a in arrays.values())
            or arrays["probs"].ndim != 2 or arrays["neighbours"].ndim != 2):
        return None
    return meta, arrays


def load_table(root: str | Path, desc: dict, split_ids: np.ndarray, bank_ids: np.ndarray,
               table: CachedTable) -> int:
    """Fill `table` (rows of a split whose sample ids are `split_ids`) from the stored table `desc` when
    it was made with the bank whose ids are `bank_ids` and with the same split; returns the rows filled."""
    got = _read(table_path(root, desc))
    if got is None:
        return 0
    meta, a = got
    r = a["rows"].astype(np.int64)
    if (meta.get("desc") != desc or meta.get("bank") != bank_digest(bank_ids)
            or a["probs"].shape[1:] != table.probs.shape[1:] or a["neighbours"].shape[1:] != table.neighbours.shape[1:]
            or (len(r) and (r.min() < 0 or r.max() >= len(split_ids))) or not np.array_equal(split_ids[r], a["ids"])):
        return 0
    table.put(r, a["probs"].astype(np.float32), a["neighbours"].astype(np.int64))
    return int(len(r))


def save_table(root: str | Path, desc: dict, split_ids: np.ndarray, bank_ids: np.ndarray, table: CachedTable,
               forgotten: Iterable[int]) -> bool:
    """Write the valid rows of `table`, computed with the bank whose ids are `bank_ids`, except the rows of
    `forgotten` samples. The caller holds the run's lock (at least shared); nothing is written (False)
    when the bank file is not that bank any more (another process deleted since)."""
    digest = bank_digest(bank_ids)
    if bank_digest(rows.bank_ids(Path(root))) != digest:
        return False
    keep = table.valid & ~np.isin(split_ids, np.asarray(list(forgotten), dtype=np.int64))
    r = np.flatnonzero(keep)
    arrays = {"rows": r, "ids": split_ids[r], "probs": table.probs[r], "neighbours": table.neighbours[r]}
    atomic_write_bytes(table_path(root, desc), _encode({"desc": desc, "bank": digest}, arrays))
    return True


def purge_ids(root: str | Path, ids: Iterable[int]) -> int:
    """Remove from every stored table the rows of the samples `ids` and the rows whose neighbours include
    one of them, and stamp the tables with the bank file's ids without `ids`: the bank after the deletion
    (the caller holds the run's exclusive lock: a deletion, which calls this before it changes the bank
    file). A table made with another bank than the file's (before or after the deletion) is stale and
    removed, as is an unreadable file. Idempotent. Returns the number of files changed."""
    writes, removed = purged_tables(root, ids)
    atomic_write_many(writes)  # one group write: each table replaced atomically, all durable on return
    return removed + len(writes)


def purged_tables(root: str | Path, ids: Iterable[int]) -> tuple[list[tuple[Path, bytes]], int]:
    """`purge_ids` up to its writes: the (path, bytes) of every table to replace, for the caller to write
    atomically (the deletion joins them to its group commit: forget/request.py `apply_journal`), and the
    number of files removed now (stale or unreadable tables, temporary files of a killed writer)."""
    directory = cache_dir(root)
    if not directory.is_dir():
        return [], 0
    for tmp in directory.glob(".preds-*.tmp"):  # a temp file left by a writer that was killed
        tmp.unlink(missing_ok=True)
    ids_arr = np.asarray(sorted({int(i) for i in ids}), dtype=np.int64)
    on_disk = rows.bank_ids(Path(root))
    now, after = bank_digest(on_disk), bank_digest(on_disk[~np.isin(on_disk, ids_arr)])  # ids unique (the store)
    removed, writes = 0, []
    for path in sorted(directory.glob("preds-*.npz")):
        got = _read(path)
        if got is None or got[0].get("bank") not in (now, after):
            path.unlink(missing_ok=True)
            removed += 1
            continue
        meta, a = got
        hit = np.isin(a["ids"], ids_arr) | np.isin(a["neighbours"], ids_arr).any(axis=1)
        if not hit.any() and meta.get("bank") == after:
            continue
        kept = {k: v[~hit] for k, v in a.items()}
        writes.append((path, _encode(dict(meta, bank=after), kept)))
    return writes, removed
