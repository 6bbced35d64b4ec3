"""The Embeddings page's maps, cached inside the run: derived data that a deletion purges.

Where: `<run>/embeddings/maps-<key>.npz`, one file per (model fingerprint, map parameters); `key`
is a hash of both, chosen by the caller (dashboard/embeddings.py). Each file holds, for samples
*still in the bank* only: their ids, labels, the 2-D coordinates of both maps and the [CLS] feature
vectors the [CLS] map was fitted on (used to place points the fit did not see), plus a JSON header
(when and how the fit was made, how many deletions it has absorbed since).

Why it is safe to keep: it is derived data (recomputable from the run at any time) and it never
holds a deleted sample's row. `purge_ids` removes the rows of deleted ids from every file; the
deletion protocol calls it while applying a request (forget/request.py `apply_journal`, under the
run's exclusive lock, idempotent, so an interrupted deletion purges the cache when it is rolled
forward). `write_maps` filters its rows against the bank file under the run's shared lock, so a fit
that started before a deletion cannot write the deleted rows back after it. A damaged or foreign
file is treated as absent (and removed by the next purge). No thumbnail or image is stored.
Tests: tests/dashboard/test_embeddings.py.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from munkey_core.atomic import atomic_write_bytes
from munkey_core.run import rows
from munkey_core.run.lock import RunLock

CACHE_DIR = "embeddings"
FORMAT = 1
_ARRAYS = ("ids", "labels", "cls_xy", "exemplar_xy", "cls_features")


@dataclass
class CachedMaps:
    """Rows align across the arrays; ids ascending; only samples in the bank at write time."""

    ids: np.ndarray           # (N,) int64
    labels: np.ndarray        # (N,) int64
    cls_xy: np.ndarray        # (N, 2) float32
    exemplar_xy: np.ndarray   # (N, 2) float32
    cls_features: np.ndarray  # (N, D) float32: what the [CLS] map was fitted on
    meta: dict = field(default_factory=dict)  # format, key, fitted_at, fit_seconds, params, purged, ...

    def without(self, ids: Iterable[int]) -> tuple["CachedMaps", int]:
        """A copy without the rows of `ids`, and how many rows went."""
        drop = np.isin(self.ids, np.asarray(list(ids), np.int64))
        n = int(drop.sum())
        if not n:
            return self, 0
        keep = ~drop
        meta = dict(self.meta, purged=int(self.meta.get("purged", 0)) + n)
        return CachedMaps(*(getattr(self, a)[keep] for a in _ARRAYS), meta=meta), n


def cache_dir(root: str | Path) -> Path:
    return Path(root) / CACHE_DIR


def cache_path(root: str | Path, key: str) -> Path:
    return cache_dir(root) / f"maps-{key}.npz"


def _encode(maps: CachedMaps) -> bytes:
    buf = io.BytesIO()
    meta = dict(maps.meta, format=FORMAT)
    np.savez(buf, meta=np.array(json.dumps(meta, sort_keys=True)),
             **{a: np.ascontiguousarray(getattr(maps, a)) for a in _ARRAYS})
    return buf.getvalue()


def read_maps(path: str | Path) -> CachedMaps | None:
    """The cached maps at `path`, or None when there is none or it cannot be read (derived data:
    the caller recomputes it)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays = [np.array(data[a]) for a in _ARRAYS]
    except Exception:  # damaged, truncated, foreign: recompute
        return None
    if meta.get("format") != FORMAT or len({len(a) for a in arrays}) != 1:
        return None
    return CachedMaps(*arrays, meta=meta)


def write_maps(root: str | Path, key: str, maps: CachedMaps, lock: RunLock | None = None) -> CachedMaps:
    """Write `maps` as the cache for `key`, without any id no longer in the run's bank file (read under
    the run's shared lock, which a deletion holds exclusively while it purges). Returns what was written."""
    root = Path(root)
    with (lock or RunLock(root)).hold(exclusive=False):
        kept = np.isin(maps.ids, rows.bank_ids(root))
        out = maps if kept.all() else CachedMaps(*(getattr(maps, a)[kept] for a in _ARRAYS), meta=dict(maps.meta))
        atomic_write_bytes(cache_path(root, key), _encode(out))
    return out


def purge_ids(root: str | Path, ids: Iterable[int]) -> int:
    """Remove the rows of `ids` from every cached map file of the run (the caller holds the run's
    exclusive lock: a deletion). Unreadable files are removed. Returns the number of files changed."""
    directory = cache_dir(root)
    if not directory.is_dir():
        return 0
    ids = [int(i) for i in ids]
    changed = 0
    for path in sorted(directory.glob("maps-*.npz")):
        maps = read_maps(path)
        if maps is None:
            path.unlink(missing_ok=True)
            changed += 1
            continue
        out, n = maps.without(ids)
        if n:
            atomic_write_bytes(path, _encode(out))
            changed += 1
    for tmp in directory.glob(".maps-*.tmp"):  # a temp file left by a writer that was killed
        tmp.unlink(missing_ok=True)
    return changed
