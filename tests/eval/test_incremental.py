"""Incremental evaluation (run/predcache.py, eval/evaluate.py) equals a from-scratch one, and a bank
change never lets it serve a stale prediction (real digits data, tiny profile run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _helpers import assert_same_metrics
from munkey_core.eval.evaluate import _first_in_order
from munkey_core.service import MunkeyRun

METRICS = ("TA", "RA", "FA", "MIA", "Ps", "A_img", "A_tok", "n_test", "n_retain", "n_forget", "bank_size",
           "deleted", "bank_fingerprint")


def _direct(run: MunkeyRun, split: str, pathway: str = "both"):
    """Every row of a split predicted in one plain call of the model (no cache anywhere)."""
    s = run.dataset.split(split)
    return run.predict_prepared(s.images, run.split_keys(split), pathway=pathway, neighbour_predictions=False)


def _same_metrics(a: dict, b: dict) -> None:
    assert_same_metrics(a, b, METRICS)


def test_after_a_deletion_only_the_queries_that_retrieved_a_deleted_id_are_recomputed(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    before = _direct(run, "test")
    run.evaluate(max_samples=0, record=False)  # fills the cache: every test and training row
    k = run.train_cfg.k
    n_test = len(run.dataset.test)
    assert run.predictions.valid_rows(("test", "both", k)) == n_test
    # ten ids that test queries retrieve, so the deletion must change some test predictions
    victims = list(dict.fromkeys(int(i) for i in before.neighbour_ids[:40].ravel()))[:10]
    run.forget(victims, operator="tester")
    hit = np.isin(before.neighbour_ids, victims).any(axis=1)  # the test queries that retrieved one
    assert 0 < hit.sum() < n_test
    assert run.predictions.valid_rows(("test", "both", k)) == n_test - hit.sum()  # the rest is reused

    incremental = run.evaluate(max_samples=0, record=False)
    fresh_run = MunkeyRun(tiny_run, device="cpu")  # the same bank state, nothing cached
    _same_metrics(incremental, fresh_run.evaluate(max_samples=0, record=False))
    for pathway in ("both", "image", "token"):
        direct = _direct(fresh_run, "test", pathway)
        cached = run.predict_rows("test", np.arange(n_test), pathway=pathway)
        np.testing.assert_allclose(cached, direct.probs, atol=1e-5)
        assert (cached.argmax(axis=1) == direct.labels).all()
    train = _direct(fresh_run, "train")
    np.testing.assert_allclose(run.predict_rows("train", np.arange(len(run.dataset.train))), train.probs, atol=1e-5)
    # the deletion did change the predictions it dropped: a cache that kept them would be caught above
    after = _direct(fresh_run, "test")
    assert np.abs(after.probs[hit] - before.probs[hit]).max() > 1e-3
    assert not np.isin(after.neighbour_ids, victims).any()


def test_a_request_with_evaluation_measures_what_a_fresh_evaluation_measures(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    run.evaluate(max_samples=0)  # recorded: the request's "before" comes from metrics.json
    res = run.forget(run.bank.ids[5:15].tolist(), operator="tester", evaluate=True, max_samples=0)
    after = res.entry["metrics"]["after"]
    fresh = MunkeyRun(tiny_run, device="cpu").evaluate(max_samples=0, record=False)
    for name in ("TA", "RA", "FA", "MIA", "Ps", "n_forget", "bank_size", "bank_fingerprint", "FA_remembered",
                 "MIA_remembered", "n_remembered"):
        assert after[name] == pytest.approx(fresh[name], abs=1e-9), name
    # the request's positive control, recomputed here from every held training sample (max_samples=0) with
    # scikit-learn's AUC per class of the deleted samples, weighted by their counts
    from sklearn.metrics import roc_auc_score

    ev, run = res.entry["evidence"], MunkeyRun(tiny_run, device="cpu")
    ds, deleted = run.dataset, np.asarray(res.deleted)
    held = np.flatnonzero(np.isin(ds.train.ids, run.bank.ids))
    assert not np.isin(ds.train.ids[held], deleted).any()
    hp, tp = run.predict_rows("train", held), run.predict_rows("test", np.arange(len(ds.test)))
    hy, ty, fy = ds.train.labels[held], ds.test.labels, ds.lookup(deleted.tolist()).labels
    h_loss, t_loss = -np.log(hp[np.arange(len(hy)), hy]), -np.log(tp[np.arange(len(ty)), ty])
    classes, counts = np.unique(fy, return_counts=True)
    acc = sum(n * np.mean(hp[hy == c].argmax(1) == c) for c, n in zip(classes, counts)) / counts.sum()
    auc = sum(n * roc_auc_score(np.r_[np.ones((hy == c).sum()), np.zeros((ty == c).sum())],
                                -np.r_[h_loss[hy == c], t_loss[ty == c]]) for c, n in zip(classes, counts)) / counts.sum()
    assert ev["FA_remembered"] == pytest.approx(100 * acc) and ev["MIA_remembered"] == pytest.approx(100 * auc)


def test_the_cache_never_serves_a_prediction_of_an_older_bank(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    n_test = len(run.dataset.test)
    everything = np.arange(n_test)
    run.predict_rows("test", everything)
    first = _direct(run, "test")

    # another process deletes: once this one reloads, the whole cache is dropped
    other = MunkeyRun(tiny_run, device="cpu")
    victims = list(dict.fromkeys(int(i) for i in first.neighbour_ids[:30].ravel()))[:10]
    other.forget(victims, operator="tester")
    run.reload_if_changed()
    assert run.predictions.valid_rows(("test", "both", run.train_cfg.k)) == 0
    np.testing.assert_allclose(run.predict_rows("test", everything), _direct(other, "test").probs, atol=1e-5)

    # a second deletion through this object: again equal to a run opened afresh
    second = _direct(run, "test")
    more = [i for i in dict.fromkeys(int(i) for i in second.neighbour_ids[:30].ravel())][:5]
    run.forget(more, operator="tester")
    fresh = MunkeyRun(tiny_run, device="cpu")
    np.testing.assert_allclose(run.predict_rows("test", everything), _direct(fresh, "test").probs, atol=1e-5)

    # the bank edited behind the run's back (not through apply_deletion): the cache notices
    cached = run.predict_rows("test", everything)
    behind = [int(i) for i in second.neighbour_ids[40:60].ravel() if int(i) in run.bank][:3]
    run.bank.delete(behind)
    now = run.predict_rows("test", everything)
    np.testing.assert_allclose(now, _direct(run, "test").probs, atol=1e-5)
    assert np.abs(now - cached).max() > 1e-3


def test_the_retain_and_forget_samples_change_only_by_the_rows_a_deletion_moves() -> None:
    rng = np.random.default_rng(0)
    order = rng.permutation(1000)
    in_bank = np.ones(1000, bool)
    first = _first_in_order(in_bank, 100, order)
    assert len(first) == 100 and len(np.unique(first)) == 100
    assert set(first) == set(order[:100].tolist())  # the first 100 of the seeded order: a uniform sample
    gone = first[:7]
    in_bank[gone] = False
    second = _first_in_order(in_bank, 100, order)
    assert len(second) == 100 and not np.isin(gone, second).any()
    assert len(np.setdiff1d(first, second)) == 7  # only the deleted rows left the sample
    assert (_first_in_order(in_bank, 0, order) == np.flatnonzero(in_bank)).all()  # 0 = all rows


def test_a_deletion_that_switches_the_search_from_ivf_to_exact_drops_every_prediction(tiny_run: Path) -> None:
    from munkey_core.config import SearchConfig

    probe = MunkeyRun(tiny_run, device="cpu")
    n = len(probe.bank)
    run = MunkeyRun(tiny_run, device="cpu", search=SearchConfig(mode="auto", exact_below=n))
    assert run.searcher.mode == "ivf"
    everything = np.arange(len(run.dataset.test))
    run.predict_rows("test", everything)
    retrieved = _direct(run, "test").neighbour_ids
    far = [int(i) for i in run.bank.ids if not np.isin(i, retrieved).any()][:1]
    run.forget(far, operator="tester")  # retrieved by no test query: only the search mode changed
    assert run.searcher.mode == "exact"
    assert run.predictions.valid_rows(("test", "both", run.train_cfg.k)) == 0
    np.testing.assert_allclose(run.predict_rows("test", everything), _direct(run, "test").probs, atol=1e-5)
