"""A run's search modes on the real digits run (tiny profile): IVF at its default nprobe finds the
exact top-10 of the run's validation keys, predictions with a forced IVF mode match exact ones,
deletions through the product are never retrieved, `auto` keeps the small demo bank exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from munkey_core.bank.search import recall_at_k
from munkey_core.config import SearchConfig
from munkey_core.run.paths import open_run
from munkey_core.run import rows
from munkey_core.service import MunkeyRun


def test_auto_mode_keeps_a_small_bank_exact(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    assert len(run.bank) < SearchConfig().exact_below
    assert run.searcher.mode == "exact"
    keys = run.split_keys("test")[:20]
    hits = run.search(keys, 5)
    expect = run.bank.ids[np.argsort(-(keys @ run.bank.keys.numpy().T), axis=1, kind="stable")[:, :5]]
    np.testing.assert_array_equal(hits.ids, expect)
    assert run.searcher.index is None


def test_ivf_recall_on_the_runs_validation_keys_at_the_default_nprobe(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu", search="ivf")
    index = run.searcher.ivf()  # nprobe calibrated on the validation keys (the default)
    assert index.nlist > index.nprobe  # really approximate: not every list is read
    assert run.searcher.describe()["recall_at_10_validation"] >= 0.95
    val, test = run.split_keys("val"), run.split_keys("test")
    assert recall_at_k(index, run.bank, val, 10) >= 0.95
    assert recall_at_k(index, run.bank, test, 10) >= 0.95  # keys the centroids never saw


def test_forced_ivf_predictions_match_exact_on_most_test_images(tiny_run: Path) -> None:
    exact = MunkeyRun(tiny_run, device="cpu", search="exact")
    ivf = MunkeyRun(tiny_run, device="cpu", search="ivf")
    test = exact.dataset.test
    keys = exact.split_keys("test")
    a = exact.predict_prepared(test.images, keys, neighbour_predictions=False)
    b = ivf.predict_prepared(test.images, keys, neighbour_predictions=False)
    assert ivf.searcher.index is not None  # the IVF path really ran
    assert np.mean(a.labels == b.labels) >= 0.95
    same_neighbours = np.mean([set(x) == set(y) for x, y in zip(a.neighbour_ids, b.neighbour_ids)])
    assert 0.8 <= same_neighbours  # approximate: most but not necessarily all neighbour sets equal


def test_deleted_ids_are_never_retrieved_in_ivf_mode(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu", search="ivf")
    ds = run.dataset
    run.search(run.split_keys("val")[:1], 1)  # build the index before the deletion
    index = run.searcher.index
    victims = ds.train.ids[:25].tolist()  # rows 0..24: each refilled by a row moved from the tail
    run.forget(victims)
    assert run.searcher.index is index  # followed, not rebuilt
    queries = run.split_keys("train")[:25]  # the deleted samples' own keys
    hits = run.search(queries, 40)
    assert not set(victims) & set(hits.ids.ravel().tolist())
    preds = run.predict_prepared(ds.train.images[:25], queries, k=40)
    assert not set(victims) & set(preds.neighbour_ids.ravel().tolist())
    lists = np.concatenate([index.list_rows(i) for i in range(index.nlist)])
    np.testing.assert_array_equal(np.sort(lists), np.arange(len(run.bank)))


def test_a_deletion_by_another_process_is_followed_after_reload(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu", search="ivf")
    run.search(run.split_keys("val")[:1], 1)
    centroids = run.searcher.index.centroids.clone()
    victims = run.bank.ids[-10:].tolist()
    rows.delete_bank_rows(open_run(tiny_run).bank, victims)  # what another process's deletion writes
    run.reload_if_changed()
    assert len(run.bank) == len(run.searcher.bank) and run.searcher.bank is run.bank
    assert (run.searcher.index.centroids == centroids).all()  # the same centroids, lists remapped by id
    hits = run.search(run.split_keys("train"), 20)
    assert not set(victims) & set(hits.ids.ravel().tolist())
