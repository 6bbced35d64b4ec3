"""Key deletion makes the model forget, on the real digits data (tiny profile run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from munkey_core.errors import MunkeyError
from munkey_core.service import MunkeyRun
from munkey_core.data.sampling import random_ids


def test_forgetting_drops_forget_accuracy_towards_test_accuracy(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    before = run.evaluate(max_samples=0)
    assert before["TA"] > 60 and before["RA"] > 60  # the run learned (chance is 10); the tiny model barely memorises (RA ~ TA)
    ids = random_ids(run.bank.ids, 0.1, seed=0)
    fa_before = run.accuracy_on_ids(ids)
    res = run.forget(ids)
    assert res.deleted == ids and res.bank_size == before["bank_size"] - len(ids)
    after = run.evaluate(max_samples=0)
    assert after["FA"] == pytest.approx(run.accuracy_on_ids(ids))
    assert after["FA"] < fa_before - 3  # without its own exemplar the sample is recognised less
    assert after["FA"] <= after["TA"] + 10  # behaves like unseen data (loose bound for a tiny model)
    assert after["TA"] >= before["TA"] - 3  # the rest of the model is untouched
    assert len(run.metrics_history) == 2


def test_deletion_survives_reload_and_deleted_ids_are_never_evidence(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    ds = run.dataset
    victims = ds.train.ids[:20].tolist()
    run.forget(victims)
    reloaded = MunkeyRun(tiny_run, device="cpu")
    assert reloaded.forgotten_ids == victims and not any(v in reloaded.bank for v in victims)
    # query with the deleted samples themselves: their ids must not come back
    preds = reloaded.predict_images(list(ds.train.images[:20]), k=50)
    assert not set(preds.neighbour_ids.ravel().tolist()) & set(victims)


def test_deleting_every_sample_with_evaluation_completes_and_is_logged(tiny_run: Path) -> None:
    """An empty bank leaves nothing to predict with: the request must still finish (logged, receipt, no
    journal left behind), saying why it was not evaluated, instead of stopping half-done after its commit."""
    from munkey_core.audit.log import verify_run
    from munkey_core.forget.request import EMPTY_BANK_NOTE

    run = MunkeyRun(tiny_run, device="cpu")
    res = run.forget(run.bank.ids.tolist(), operator="tester", evaluate=True)
    assert res.bank_size == 0 and res.evidence_passed and not (tiny_run / "journal.json").exists()
    body = json.loads(Path(res.receipt).read_text())["entry"]["body"]
    assert body["metrics"]["after"] is None and body["metrics"]["after_source"] == EMPTY_BANK_NOTE
    assert verify_run(tiny_run).ok
    with pytest.raises(MunkeyError, match="memory bank is empty"):  # and predicting says why, no traceback
        MunkeyRun(tiny_run, device="cpu").evaluate()


def test_ids_in_forgotten_json_without_a_journal_are_not_deleted_on_open(tiny_run: Path) -> None:
    # only a journal commits a deletion (interrupted ones: tests/run/test_atomicity.py); an id written into
    # forgotten.json by hand is reported by 'munkey audit verify', never deleted without a request
    run = MunkeyRun(tiny_run, device="cpu")
    victims = run.bank.ids[:3].tolist()
    (tiny_run / "forgotten.json").write_text(json.dumps({"ids": victims, "requests": []}))
    reopened = MunkeyRun(tiny_run, device="cpu")
    assert all(v in reopened.bank for v in victims)


def test_prepare_images_handles_gray_rgb_and_sizes(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    rgb = np.random.default_rng(0).integers(0, 255, (40, 30, 3), dtype=np.uint8)
    gray = np.zeros((5, 5, 1), dtype=np.uint8)
    batch = run.prepare_images([rgb, gray])
    assert batch.shape == (2, 8, 8, 1) and batch.dtype == np.uint8
    with pytest.raises(MunkeyError, match="No image"):
        run.prepare_images([])
