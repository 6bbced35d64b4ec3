"""The copy search's calibration, cached inside the run: derived data that a deletion purges by id.

Calibrating the near-duplicate thresholds (data/duplicates.py `NearDuplicateIndex.calibrate`) runs
600 searches of validation images: tens of seconds on digits, minutes on ELPV's 300 px images. It
depends only on the images, the method and the deleted ids, so it is done once when a run is made
(service.train_run) and kept: later uploads, restarts and other processes reuse it (`copy_index`).

Where: `<run>/duplicates/thresholds-<key>.json`; `key` is a hash of the method version, the dataset's
training and validation ids and the calibration's parameters (`calibration_key`). A file holds the
thresholds, the figures they come from, and `records`: for each calibration query (a validation image,
transformed) and kind of evidence, its best score and the id of the training image that scored it
([query, kind, score, id]); `set_by` names the ids behind the thresholds. No image or thumbnail.

Why it is safe to keep, and cheap to bring up to date: a threshold is a maximum over the records, so
a deleted training image can only have shaped the records that name it. A deletion (forget/request.py
`apply_journal`, under the run's exclusive lock, idempotent) calls `purge_ids`, which rewrites every
file without the records that name a deleted id, and without the thresholds (they may rest on one);
the next `copy_index` searches only those queries again (each ~0.05-0.5 s), excluding every deleted
id: the thresholds are then exactly those of a calibration from scratch without the deleted images.
A file is never written naming an id forgotten.json lists (checked under the lock before writing). A
damaged or foreign file is treated as absent (and removed by the next purge). Tests:
tests/run/test_copycache.py, tests/dashboard/test_trust.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np

from munkey_core.atomic import atomic_write_json, atomic_write_many, json_bytes
from munkey_core.errors import MunkeyError
from munkey_core.run.lock import RunLock
from munkey_core.run.paths import RunPaths, read_forgotten

if TYPE_CHECKING:  # the copy search loads where it runs: a deletion's purge here needs none of it
    from munkey_core.data.duplicates import NearDuplicateIndex
    from munkey_core.run.loaded import LoadedMunkeyRun

CACHE_DIR = "duplicates"
FORMAT = 2  # 2: per-query records (format 1 kept the thresholds only; such a file is treated as absent)
THRESHOLDS = ("threshold", "align_threshold", "small_threshold", "set_by")


def cache_path(root: str | Path, key: str) -> Path:
    return Path(root) / CACHE_DIR / f"thresholds-{key}.json"


def read_calibration(root: str | Path, key: str) -> dict | None:
    """The cached calibration for `key` (its thresholds missing when a purge removed them), or None when
    there is none or it cannot be read (derived data: the caller calibrates again)."""
    path = cache_path(root, key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        return None
    cal = data.get("calibration")
    if not isinstance(cal, dict) or not isinstance(cal.get("records"), list):
        return None
    if not all(isinstance(r, list) and len(r) == 4 for r in cal["records"]):
        return None
    return cal


def read_thresholds(root: str | Path, key: str) -> dict | None:
    """The cached calibration for `key` when it is complete (thresholds and all), else None."""
    cal = read_calibration(root, key)
    return cal if cal is not None and all(k in cal for k in THRESHOLDS) else None


def write_thresholds(root: str | Path, key: str, calibration: dict, lock: RunLock | None = None) -> bool:
    """Cache `calibration` (NearDuplicateIndex.calibration) for `key`, under the run's shared lock (never
    while a deletion purges). Not written (False) when it names an id that forgotten.json lists: a
    process whose view of the run is older than a deletion must not bring a deleted image's scores back."""
    root = Path(root)
    named = {int(r[3]) for r in calibration.get("records", []) if r[3] is not None} | \
        {int(i) for i in calibration.get("set_by", [])}
    with (lock or RunLock(root)).hold(exclusive=False):
        try:
            forgotten = {int(i) for i in read_forgotten(RunPaths(root))["ids"]}
        except MunkeyError:
            return False
        if named & forgotten:
            return False
        atomic_write_json(cache_path(root, key), {"format": FORMAT, "key": key, "calibration": calibration})
    return True


def purge_ids(root: str | Path, ids: Iterable[int]) -> int:
    """Drop from every cached calibration the records that name a deleted id, with its thresholds (the
    next `copy_index` searches those queries again), and remove any unreadable file. The caller holds
    the run's exclusive lock (a deletion). Returns the number of files changed or removed."""
    writes, removed = purged_calibrations(root, ids)
    atomic_write_many(writes)
    return removed + len(writes)


def purged_calibrations(root: str | Path, ids: Iterable[int]) -> tuple[list[tuple[Path, bytes]], int]:
    """`purge_ids` up to its writes: the (path, bytes) of every calibration file to replace, for the
    caller to write atomically (the deletion joins them to its group commit: forget/request.py
    `apply_journal`), and the number of files removed now (unreadable ones, temporary files of a
    killed writer)."""
    directory = Path(root) / CACHE_DIR
    if not directory.is_dir():
        return [], 0
    for tmp in directory.glob(".thresholds-*.tmp"):  # a temp file left by a writer that was killed
        tmp.unlink(missing_ok=True)
    gone = {int(i) for i in ids}
    removed, writes = 0, []
    for path in sorted(directory.glob("thresholds-*.json")):
        key = path.name[len("thresholds-"):-len(".json")]
        cal = read_calibration(root, key)
        if cal is None:
            path.unlink(missing_ok=True)
            removed += 1
            continue
        kept = [r for r in cal["records"] if r[3] is None or int(r[3]) not in gone]
        if len(kept) == len(cal["records"]) and not gone & {int(i) for i in cal.get("set_by", [])}:
            continue
        rest = {k: cal[k] for k in ("n_images", "queries") if k in cal}  # the thresholds and figures go
        writes.append((path, json_bytes({"format": FORMAT, "key": key, "calibration": dict(rest, records=kept)})))
    return writes, removed


# --------------------------------------------------------------------------- the run's copy index


def calibration_key(run: "LoadedMunkeyRun", calibrate: int, seed: int, val_ids: np.ndarray) -> str:
    """The cache key: method version, dataset, parameters, training and validation ids."""
    from munkey_core.data.duplicates import METHOD

    train = run.dataset.train
    digest = hashlib.sha256()
    for part in (METHOD, run.dataset.name, calibrate, seed, train.images.shape):
        digest.update(repr(part).encode())
    digest.update(np.ascontiguousarray(train.ids).tobytes())
    digest.update(np.ascontiguousarray(val_ids).tobytes())
    return digest.hexdigest()[:16]


def pixel_index(run: "LoadedMunkeyRun") -> NearDuplicateIndex:
    """The near-duplicate index of the run's whole training split, uncalibrated (deleted samples too:
    the dataset still holds them, and an upload may be a copy of one: the page says it was deleted).
    It depends on the dataset only, so a caller may keep it across deletions (pages/_common.py)."""
    from munkey_core.data.duplicates import NearDuplicateIndex

    train = run.dataset.train
    return NearDuplicateIndex(train.images, train.ids)


def copy_index(run: "LoadedMunkeyRun", *, calibrate: int = 100, seed: int = 0,
               index: NearDuplicateIndex | None = None) -> NearDuplicateIndex:
    """The run's near-duplicate index with thresholds for its current deleted ids: read from the cache;
    brought up to date when a deletion purged records (only those queries are searched again); else
    calibrated on `calibrate` validation images and cached. `index` (a `pixel_index` of this run) saves
    the build: the result is then a shallow copy of it with its own thresholds (the images are shared)."""
    index = copy.copy(index) if index is not None else pixel_index(run)
    try:
        val = run.dataset.split("val")
    except MunkeyError:
        val = run.dataset.test
    if len(val) == 0:
        val = run.dataset.test
    key = calibration_key(run, calibrate, seed, val.ids)
    forgotten = run.forgotten_ids
    cached = read_calibration(run.paths.root, key)
    if cached is not None and all(k in cached for k in THRESHOLDS) and \
            not {int(i) for i in cached["set_by"]} & set(forgotten):
        index.set_calibration(cached)
        return index
    index.calibrate(val.images, n=calibrate, seed=seed, exclude=forgotten,
                    records=cached["records"] if cached is not None else None)
    write_thresholds(run.paths.root, key, index.calibration or {}, run.runlock)
    return index
