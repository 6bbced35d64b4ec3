"""The copy search's calibration kept in the run (run/copycache.py): made with the run, reused as is, and
after a deletion brought up to date by searching again only the queries a deleted image had scored
(real digits data, tiny profile run; the equality with a calibration from scratch is in
tests/data/test_duplicates.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from munkey_core.run import copycache
from munkey_core.service import MunkeyRun


def _files(root: Path) -> list[Path]:
    return sorted((root / copycache.CACHE_DIR).glob("thresholds-*.json"))


def test_a_new_run_ships_calibrated_and_a_deletion_searches_only_the_queries_it_touched(tiny_run: Path) -> None:
    files = _files(tiny_run)
    assert len(files) == 1  # written by service.train_run with the run, not by a page
    saved = json.loads(files[0].read_text())["calibration"]
    assert saved["queries"] == 600 and len(saved["records"]) == 800
    run = MunkeyRun(tiny_run, device="cpu")
    stamp = files[0].stat().st_mtime_ns
    index = copycache.copy_index(run)
    assert files[0].stat().st_mtime_ns == stamp  # reused as is: nothing searched, nothing written
    assert (index.threshold, index.align_threshold, index.small_threshold) == \
        (saved["threshold"], saved["align_threshold"], saved["small_threshold"])
    # a second calibration that no deleted image scored is left byte for byte
    other = dict(saved, records=[[0, "plain", 0.5, -1]], set_by=[-1])
    copycache.write_thresholds(tiny_run, "other", other)
    other_bytes = copycache.cache_path(tiny_run, "other").read_bytes()

    victim = int(saved["set_by"][0])
    assert victim in set(int(i) for i in run.bank.ids)
    touched = sum(r[3] == victim for r in saved["records"])
    run.forget([victim], operator="test")
    purged = json.loads(files[0].read_text())["calibration"]
    assert victim not in {r[3] for r in purged["records"]} and len(purged["records"]) == 800 - touched
    assert not set(copycache.THRESHOLDS) & set(purged) and "null_max" not in purged
    assert copycache.cache_path(tiny_run, "other").read_bytes() == other_bytes

    again = copycache.copy_index(run)
    cal = again.calibration
    assert 1 <= cal["searched"] <= touched  # the queries whose best look-alike was the deleted image
    assert victim not in cal["set_by"] and victim not in {r[3] for r in cal["records"]}
    assert len(cal["records"]) == 800 and copycache.read_thresholds(tiny_run, files[0].stem[11:]) == cal
    # a deleted image cannot have lowered a threshold
    assert again.threshold <= index.threshold and again.align_threshold <= index.align_threshold
    # the deleted image's own copy is still recognised (the page says it was deleted)
    from munkey_core.dashboard.trust import find_copies

    row = int(np.flatnonzero(run.dataset.train.ids == victim)[0])
    big = np.asarray(Image.fromarray(run.dataset.train.images[row][..., 0]).resize((64, 64), Image.Resampling.BICUBIC))
    found = find_copies(run, again, [big[..., None]])[0]
    assert found["found"] and found["id"] == victim and found["in_bank"] is False


def test_a_calibration_naming_a_deleted_image_is_never_written(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    path = _files(tiny_run)[0]
    saved = json.loads(path.read_text())["calibration"]
    victim = int(saved["records"][0][3])
    run.forget([victim], operator="test")
    before = path.read_bytes()
    # a process that calibrated before the deletion tries to write its (stale) figures back
    assert copycache.write_thresholds(tiny_run, path.stem[len("thresholds-"):], saved) is False
    assert path.read_bytes() == before
