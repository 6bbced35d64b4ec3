"""Grid filters (dashboard/gridfilter.py): by class, id, tag, wrong and low confidence, with the count of what
is shown; the run's predictions for them checked against the model's own predict on the tiny digits run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from munkey_core.dashboard.gridfilter import (GridFilter, GridPredictions, confidence_calibration, filter_counts,
                                              filter_grid, grid_predictions, parse_id_query)
from munkey_core.errors import MunkeyError

IDS = [5, 17, 40, 41, 60, 99, 100, 250]
LABELS = [1, 3, 1, 8, 3, 1, 8, 0]


def test_id_query_reads_ids_and_ranges() -> None:
    assert parse_id_query("") == [] and parse_id_query("   ") == []
    assert parse_id_query("12, 40-60 100..120; 7 to 3") == [(12, 12), (40, 60), (100, 120), (3, 7)]
    assert parse_id_query("40 - 60") == [(40, 60)]
    with pytest.raises(MunkeyError, match="40-60"):
        parse_id_query("ids please")


def test_no_filter_shows_everything_up_to_the_limit() -> None:
    view = filter_grid(IDS, LABELS, GridFilter())
    assert view.rows.tolist() == list(range(8)) and view.caption == "Showing 8 of 8."
    view = filter_grid(IDS, LABELS, GridFilter(), limit=3)
    assert view.rows.tolist() == [0, 1, 2] and view.caption == "Showing 3 of 8."


def test_class_and_id_filters_combine() -> None:
    view = filter_grid(IDS, LABELS, GridFilter(classes=(1,)))
    assert [IDS[j] for j in view.rows] == [5, 40, 99]
    assert view.caption == "Showing 3 of 3 matching the filter (8 in all)."
    view = filter_grid(IDS, LABELS, GridFilter(classes=(1, 8), id_query="30-100"))
    assert [IDS[j] for j in view.rows] == [40, 41, 99, 100]
    view = filter_grid(IDS, LABELS, GridFilter(id_query="17, 250"), limit=1)
    assert [IDS[j] for j in view.rows] == [17] and view.caption == "Showing 1 of 2 matching the filter (8 in all)."


def test_nothing_matching_says_how_to_see_them_again() -> None:
    view = filter_grid(IDS, LABELS, GridFilter(classes=(9,)))
    assert view.shown == 0 and "clear the filters" in view.caption
    assert filter_grid([], [], GridFilter()).caption == "Nothing to show."
    for v in (view, filter_grid(IDS, LABELS, GridFilter(id_query="1-5"))):
        assert "None" not in v.caption and "nan" not in v.caption


# the run's prediction of each row above: ids 17, 60, 100 are predicted wrongly; 5 and 41 with low confidence
PRED = GridPredictions(np.array([1, 1, 1, 8, 1, 1, 8, 0]), np.array([0.4, 0.9, 0.95, 0.55, 0.7, 0.99, 0.6, 0.8], np.float32))
TAGGED = {"review": [17, 41, 250, 999], "consent-withdrawn": [41]}


def test_wrong_low_confidence_and_tag_filters() -> None:
    view = filter_grid(IDS, LABELS, GridFilter(wrong=True), predictions=PRED)
    assert [IDS[j] for j in view.rows] == [17, 60]  # 17 (3 -> 1), 60 (3 -> 1); 100 is 8 -> 8: right
    view = filter_grid(IDS, LABELS, GridFilter(low_confidence=0.65), predictions=PRED)
    assert [IDS[j] for j in view.rows] == [5, 41, 100]
    view = filter_grid(IDS, LABELS, GridFilter(tags=("review",)), tagged=TAGGED)
    assert [IDS[j] for j in view.rows] == [17, 41, 250]
    view = filter_grid(IDS, LABELS, GridFilter(classes=(3,), tags=("review",), wrong=True, low_confidence=0.95),
                       predictions=PRED, tagged=TAGGED)
    assert [IDS[j] for j in view.rows] == [17] and view.caption == "Showing 1 of 1 matching the filter (8 in all)."
    assert filter_grid(IDS, LABELS, GridFilter(tags=("nobody",)), tagged=TAGGED).shown == 0
    with pytest.raises(ValueError):  # a page that forgot the predictions fails loudly in tests
        filter_grid(IDS, LABELS, GridFilter(wrong=True))
    counts = filter_counts(IDS, LABELS, predictions=PRED, threshold=0.65, tagged=TAGGED)
    assert counts == {"wrong": 2, "low_confidence": 3, "tags": {"consent-withdrawn": 1, "review": 3}}
    unpredicted = GridPredictions(np.full(8, -1), np.zeros(8, np.float32))  # ids outside the training split
    assert filter_grid(IDS, LABELS, GridFilter(wrong=True, low_confidence=1.0), predictions=unpredicted).shown == 0


def test_a_filter_round_trips_through_a_saved_view() -> None:
    flt = GridFilter(classes=(3, 8), id_query="12, 40..60", tags=("review",), wrong=True, low_confidence=0.7)
    view = flt.to_view()
    assert view == {"classes": [3, 8], "id_ranges": [[12, 12], [40, 60]], "tags": ["review"], "wrong": True,
                    "low_confidence": 0.7}
    back = GridFilter.from_view(view)
    assert back == GridFilter(classes=(3, 8), id_query="12, 40-60", tags=("review",), wrong=True, low_confidence=0.7)
    assert GridFilter.from_view({}) == GridFilter()


def _reference_probs(run, split: str, rows: np.ndarray) -> np.ndarray:
    """The model's own predict (no cache), as model/predict.py computes it."""
    from munkey_core.model.predict import predict

    s = run.dataset.split(split)
    return predict(run.model, run.bank, run.to_input(s.images[rows]), run.split_keys(split)[rows], k=run.train_cfg.k,
                   tau=run.train_cfg.tau, neighbour_predictions=False).probs


def test_grid_predictions_are_the_runs_own(tiny_run_template: Path) -> None:
    from munkey_core.service import MunkeyRun

    run = MunkeyRun(tiny_run_template, device="cpu")
    train = run.dataset.train
    rows = np.array([7, 3, 500, 11, 250])
    ids = [int(i) for i in train.ids[rows]] + [int(run.dataset.test.ids[0])]  # the last: not a training sample
    got = grid_predictions(run, ids)
    ref = _reference_probs(run, "train", rows)
    assert got.predicted[:5].tolist() == ref.argmax(axis=1).tolist() and got.predicted[5] == -1
    np.testing.assert_allclose(got.confidence[:5], ref.max(axis=1), atol=1e-5)
    assert not got.wrong(list(train.labels[rows]) + [0])[5] and not got.below(2.0)[5]

    cal = confidence_calibration(run)
    val = run.dataset.split("val")
    conf = _reference_probs(run, "val", np.arange(len(val))).max(axis=1)
    assert cal.split == "val" and cal.n == len(val)
    assert cal.threshold == pytest.approx(float(np.quantile(conf, 0.10)), abs=1e-5)
    assert cal.accuracy_below is not None and cal.accuracy_above is not None
    assert "None" not in cal.note and "nan" not in cal.note and f"{cal.threshold:.2f}" in cal.note
