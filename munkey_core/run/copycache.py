"""The copy search's calibrated thresholds, cached inside the run: derived data that a deletion purges.

Calibrating the near-duplicate thresholds (data/duplicates.py `NearDuplicateIndex.calibrate`) runs
a few hundred searches of validation images: minutes on ELPV's 300 px images. It depends only on
the images and the method, so the dashboard keeps the result and later uploads (and restarts) reuse it.

Where: `<run>/duplicates/thresholds-<key>.json`; `key` is a hash of the method version, the dataset's
training and validation ids and the calibration's parameters, chosen by the caller
(dashboard/trust.py). A file holds plain numbers only (the thresholds, the best non-copy scores, how
many searches) and `set_by`: the ids of the training images whose look-alikes set the thresholds.
No image, thumbnail or per-sample score is stored.

Why it is safe to keep: a threshold is a maximum over look-alike scores, so only the training images
in `set_by` determined it. A deletion (forget/request.py `apply_journal`, under the run's exclusive
lock, idempotent) calls `purge_ids`, which removes every file whose `set_by` names a deleted id;
the next upload calibrates again. A damaged or foreign file is treated as absent (and removed by the
next purge). Tests: tests/dashboard/test_trust.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from munkey_core.atomic import atomic_write_json
from munkey_core.run.lock import RunLock

CACHE_DIR = "duplicates"
FORMAT = 1


def cache_path(root: str | Path, key: str) -> Path:
    return Path(root) / CACHE_DIR / f"thresholds-{key}.json"


def read_thresholds(root: str | Path, key: str) -> dict | None:
    """The cached calibration for `key`, or None when there is none or it cannot be read (derived
    data: the caller calibrates again)."""
    path = cache_path(root, key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        return None
    cal = data.get("calibration")
    needed = ("threshold", "align_threshold", "small_threshold", "set_by")
    if not isinstance(cal, dict) or any(k not in cal for k in needed):
        return None
    return cal


def write_thresholds(root: str | Path, key: str, calibration: dict, lock: RunLock | None = None) -> None:
    """Cache `calibration` (NearDuplicateIndex.calibration) for `key`, under the run's shared lock, so
    that it is not written while a deletion purges."""
    root = Path(root)
    with (lock or RunLock(root)).hold(exclusive=False):
        atomic_write_json(cache_path(root, key), {"format": FORMAT, "key": key, "calibration": calibration})


def purge_ids(root: str | Path, ids: Iterable[int]) -> int:
    """Remove every cached calibration that a deleted image helped set (the caller holds the run's
    exclusive lock: a deletion), and any unreadable one. Returns the number of files removed."""
    directory = Path(root) / CACHE_DIR
    if not directory.is_dir():
        return 0
    gone = {int(i) for i in ids}
    removed = 0
    for path in sorted(directory.glob("thresholds-*.json")):
        key = path.name[len("thresholds-"):-len(".json")]
        cal = read_thresholds(root, key)
        if cal is None or gone & {int(i) for i in cal["set_by"]}:
            path.unlink(missing_ok=True)
            removed += 1
    for tmp in directory.glob(".thresholds-*.tmp"):  # a temp file left by a writer that was killed
        tmp.unlink(missing_ok=True)
    return removed
