"""dashboard/trust.py and the copy-aware selection in views.py, on the tiny digits run (no Streamlit)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from munkey_core.dashboard import trust, views
from munkey_core.service import MunkeyRun


@pytest.fixture(scope="module")
def run(tiny_run_template: Path, tmp_path_factory: pytest.TempPathFactory) -> MunkeyRun:
    dest = tmp_path_factory.mktemp("trust") / "run"  # copy_index caches its calibration in the run
    shutil.copytree(tiny_run_template, dest)
    return MunkeyRun(dest, device="cpu")


@pytest.fixture(scope="module")
def index(run: MunkeyRun):
    return trust.copy_index(run)  # the calibration made with the run (service.train_run)


def _enlarged(img: np.ndarray, side: int) -> np.ndarray:
    return np.asarray(Image.fromarray(img[..., 0]).resize((side, side), Image.Resampling.BICUBIC))[..., None]


def test_a_64px_copy_of_a_training_image_is_found_and_proposed_first(run: MunkeyRun, index) -> None:
    train = run.dataset.train
    row = int(np.flatnonzero(np.isin(train.ids, run.bank.ids))[17])
    sid, copy = int(train.ids[row]), _enlarged(train.images[row], 64)
    found = trust.find_copies(run, index, [copy])[0]
    assert found["found"] and found["id"] == sid and found["in_bank"]
    assert found["message"].startswith(f"Exact match found: training id {sid}")
    rows = views.similar_training_samples(run, [copy], 5, copies=index)
    assert rows[0]["id"] == sid and rows[0]["copy"] and sum(r["copy"] for r in rows) == 1
    # an unseen test image is not a copy of anything
    other = trust.find_copies(run, index, [_enlarged(run.dataset.test.images[0], 64)])[0]
    assert not other["found"] and other["message"].startswith("No match above threshold")
    assert not any(r["copy"] for r in views.similar_training_samples(run, [_enlarged(run.dataset.test.images[0], 64)],
                                                                     5, copies=index))


def test_the_resized_upload_retrieves_its_own_case_as_evidence(run: MunkeyRun) -> None:
    train = run.dataset.train
    row = int(np.flatnonzero(np.isin(train.ids, run.bank.ids))[5])
    preds = run.predict_images([_enlarged(train.images[row], 64)])
    assert int(preds.neighbour_ids[0, 0]) == int(train.ids[row])


def test_out_of_distribution_image_gets_the_warning_and_abstains(run: MunkeyRun) -> None:
    calib = trust.similarity_calibration(run)
    assert calib.n > 0 and calib.threshold <= calib.median
    noise = np.random.default_rng(0).integers(0, 256, (120, 90, 3), dtype=np.uint8)  # a colourful photo-like upload
    test_img = run.dataset.test.images[0]
    preds = run.predict_images([noise, test_img])
    ood = trust.assess_evidence(preds, 0, run.class_names, calib)
    ok = trust.assess_evidence(preds, 1, run.class_names, calib)
    assert ood["far"] and ood["abstain"] and "far from every training case" in ood["warnings"][0]
    assert not ok["far"]
    k = preds.neighbour_labels.shape[1]
    agree = int((preds.neighbour_labels[1] == preds.labels[1]).sum())
    assert ok["agree"] == agree and f"of {k} similar training cases are" in ok["summary"]


def test_unknown_ids_are_named_with_their_split(run: MunkeyRun) -> None:
    test_id, val_id = int(run.dataset.test.ids[0]), int(run.dataset.val.ids[0])
    groups = views.classify_ids(run, [int(run.bank.ids[0]), test_id, val_id, 10**9])
    assert groups["unknown"] == [test_id, val_id, 10**9]
    assert groups["other_split"] == {test_id: "test", val_id: "val"}
    msg = views.unknown_ids_message(groups)
    assert f"{test_id} is in the test split" in msg and f"{val_id} is in the validation split" in msg
    assert f"{10**9} is not a sample" in msg


def test_a_deleted_image_is_named_only_to_the_sender_of_its_own_copy(tiny_run: Path) -> None:
    """After a deletion the copy search still recognises a copy of the deleted image (and says it was
    deleted), but never shows or names it as the look-alike of another upload."""
    run = MunkeyRun(tiny_run, device="cpu")
    index = trust.copy_index(run)
    test_img = _enlarged(run.dataset.test.images[3], 64)  # not a copy of any training image
    before = trust.find_copies(run, index, [test_img])[0]
    assert not before["found"]
    lookalike = before["matches"][0]["id"]
    assert f"id {lookalike}" in before["message"]
    run.forget([lookalike], operator="test")
    index = trust.copy_index(run)
    after = trust.find_copies(run, index, [test_img])[0]
    assert not after["found"] and lookalike not in [m["id"] for m in after["matches"]]
    assert f"id {lookalike}," not in after["message"] and len(after["matches"]) == 5
    assert after["matches"][0]["id"] == before["matches"][1]["id"]  # the next look-alike, still in the bank
    row = int(np.flatnonzero(run.dataset.train.ids == lookalike)[0])
    own = trust.find_copies(run, index, [_enlarged(run.dataset.train.images[row], 64)])[0]
    assert own["found"] and own["id"] == lookalike and own["in_bank"] is False
    assert "already deleted" in own["message"]
