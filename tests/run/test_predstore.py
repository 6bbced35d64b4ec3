"""The prediction store (run/predstore.py): a fresh process starts from the stored predictions, a
deletion purges them (no deleted sample's prediction, no neighbour list holding a deleted id), and a
store made with another bank is never served (real digits data, tiny profile run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from _helpers import assert_same_metrics
from munkey_core.run import predstore
from munkey_core.run.lock import RunLock
from munkey_core.run.rows import bank_ids
from munkey_core.service import MunkeyRun

METRICS = ("TA", "RA", "FA", "MIA", "Ps", "A_img", "A_tok", "n_test", "n_retain", "n_forget", "bank_size")


class ForwardCounter:
    """Counts the images a run's model embeds (a hook on its real patch embedding, every pathway's entry)."""

    def __init__(self, run: MunkeyRun) -> None:
        self.images = 0
        run.model.vit.patch_embed.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.images += int(args[0].shape[0])


def _stored(root: Path) -> list[dict]:
    out = []
    for path in sorted((root / predstore.CACHE_DIR).glob("preds-*.npz")):
        with np.load(path, allow_pickle=False) as data:
            out.append({"meta": json.loads(str(data["meta"])), **{a: np.array(data[a]) for a in predstore._ARRAYS}})
    return out


def _without_store(root: Path, dest: Path) -> Path:
    """A copy of the run without its prediction store: what a from-scratch evaluation gives."""
    shutil.copytree(root, dest)
    shutil.rmtree(dest / predstore.CACHE_DIR, ignore_errors=True)
    return dest


def _same(a: dict, b: dict) -> None:
    assert_same_metrics(a, b, METRICS)


def test_a_trained_run_keeps_its_predictions_and_a_fresh_process_reuses_them(tiny_run: Path, tmp_path: Path) -> None:
    assert _stored(tiny_run), "service.train_run primes the store"
    run = MunkeyRun(tiny_run, device="cpu")
    seen = ForwardCounter(run)
    warm = run.evaluate(record=False)
    assert seen.images == 0  # every prediction came from the store
    scratch_run = MunkeyRun(_without_store(tiny_run, tmp_path / "scratch"), device="cpu")
    scratch_seen = ForwardCounter(scratch_run)
    _same(warm, scratch_run.evaluate(record=False))
    assert scratch_seen.images > 0  # the control: without the store the model does the work


def test_a_deletion_purges_the_store_and_the_next_process_recomputes_only_what_it_changed(
        tiny_run: Path, tmp_path: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    run.evaluate(max_samples=0, record=False)  # every row of every table stored
    test_both = run.predict_prepared(run.dataset.test.images, run.split_keys("test"), neighbour_predictions=False)
    victims = list(dict.fromkeys(int(i) for i in test_both.neighbour_ids[:30].ravel()))[:8]
    hit = np.isin(test_both.neighbour_ids, victims).any(axis=1)
    assert 0 < hit.sum() < len(hit)

    run.forget(victims, operator="tester", evaluate=False)  # no evaluation after: the purge alone is on disk
    after_bank = predstore.bank_digest(bank_ids(tiny_run))
    tables = _stored(tiny_run)
    assert len(tables) >= 4  # test split x 3 pathways, train (other tests may have stored more in the template)
    for t in tables:
        assert not np.isin(t["ids"], victims).any() and not np.isin(t["neighbours"], victims).any()
        assert t["meta"]["bank"] == after_bank
    own = json.loads(run._table_desc("test", "both", run.train_cfg.k))
    test_table = next(t for t in tables if t["meta"]["desc"] == own)
    assert len(test_table["rows"]) == len(hit) - hit.sum()  # the rest kept for the next process

    fresh = MunkeyRun(tiny_run, device="cpu")
    seen = ForwardCounter(fresh)
    incremental = fresh.evaluate(max_samples=0, record=False)
    scratch = MunkeyRun(_without_store(tiny_run, tmp_path / "scratch"), device="cpu")
    scratch_seen = ForwardCounter(scratch)
    _same(incremental, scratch.evaluate(max_samples=0, record=False))
    assert 0 < seen.images < scratch_seen.images / 2  # only what the deletion changed, and the deleted rows
    # the evaluation measured FA on the deleted samples; their predictions are not written back
    for t in _stored(tiny_run):
        assert not np.isin(t["ids"], victims).any() and not np.isin(t["neighbours"], victims).any()


def test_a_store_made_with_another_bank_is_never_served(tiny_run: Path, tmp_path: Path) -> None:
    old_store = tmp_path / "old_store"
    shutil.copytree(tiny_run / predstore.CACHE_DIR, old_store)  # made with the bank before the deletion
    run = MunkeyRun(tiny_run, device="cpu")
    run.forget([int(i) for i in run.bank.ids[:5]], operator="tester", evaluate=False)
    shutil.rmtree(tiny_run / predstore.CACHE_DIR)
    shutil.copytree(old_store, tiny_run / predstore.CACHE_DIR)  # put back behind the run's back

    fresh = MunkeyRun(tiny_run, device="cpu")
    seen = ForwardCounter(fresh)
    got = fresh.predict_rows("test", np.arange(len(fresh.dataset.test)))
    assert seen.images == len(fresh.dataset.test)  # nothing loaded: the digest names another bank
    direct = fresh.predict_prepared(fresh.dataset.test.images, fresh.split_keys("test"), neighbour_predictions=False)
    np.testing.assert_allclose(got, direct.probs, atol=1e-5)


def test_a_process_whose_bank_is_behind_the_file_writes_nothing(tiny_run: Path) -> None:
    stale = MunkeyRun(tiny_run, device="cpu")
    other = MunkeyRun(tiny_run, device="cpu")
    other.forget([int(i) for i in other.bank.ids[:5]], operator="tester", evaluate=False)
    before = {p.name: p.read_bytes() for p in (tiny_run / predstore.CACHE_DIR).glob("*.npz")}
    stale.predictions.clear()  # force recomputation with the bank it loaded (the older one)
    stale._tried_store.clear()
    table = stale.predictions.table(("test", "both", stale.train_cfg.k), len(stale.dataset.test),
                                    stale.model_cfg.num_classes, stale.train_cfg.k, stale._cache_state())
    table.put(np.arange(3), np.ones((3, stale.model_cfg.num_classes), np.float32),
              np.zeros((3, stale.train_cfg.k), np.int64))
    desc = json.loads(stale._table_desc("test", "both", stale.train_cfg.k))
    assert not predstore.save_table(tiny_run, desc, stale.dataset.test.ids, stale._bank_ids_sorted(), table, [])
    after = {p.name: p.read_bytes() for p in (tiny_run / predstore.CACHE_DIR).glob("*.npz")}
    assert after == before


def test_a_damaged_store_is_ignored_and_removed_by_the_next_deletion(tiny_run: Path) -> None:
    files = sorted((tiny_run / predstore.CACHE_DIR).glob("preds-*.npz"))
    files[0].write_bytes(b"not a table")
    run = MunkeyRun(tiny_run, device="cpu")
    n = len(run.dataset.test)
    got = run.predict_rows("test", np.arange(n))
    direct = run.predict_prepared(run.dataset.test.images, run.split_keys("test"), neighbour_predictions=False)
    np.testing.assert_allclose(got, direct.probs, atol=1e-5)
    files[0].write_bytes(b"still damaged")
    run.forget([int(run.bank.ids[0])], operator="tester", evaluate=False)
    assert not files[0].exists() or files[0].read_bytes() != b"still damaged"


def test_the_shared_lock_is_not_waited_for_while_another_process_deletes(tiny_run: Path) -> None:
    """Writing the store is optional: a reader never blocks on a deletion's exclusive lock for it."""
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from munkey_core.run.lock import RunLock; l = RunLock(sys.argv[1]); "
        "h = l.hold(exclusive=True); h.__enter__(); print('held', flush=True); time.sleep(60)"), str(tiny_run)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = RunLock(tiny_run)
        with lock.try_hold_shared() as held:
            assert held is False
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tiny_run).try_hold_shared() as held:
        assert held is True
