"""A run's search path (bank/search.py) and the IVF index over an in-memory bank: with every list
probed it returns numpy brute force's top-K, deleted ids never come back (rows moved by the
swap-delete included), `auto` is exact below its threshold, a re-read bank keeps the lists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from munkey_core.bank.ann import IVFIndex
from munkey_core.bank.memory import MemoryBank
from munkey_core.bank.search import BankSearch, default_nlist, recall_at_k
from munkey_core.config import SearchConfig
from munkey_core.errors import MunkeyError


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _bank_and_held_out(n: int = 600, d: int = 24, seed: int = 0) -> tuple[MemoryBank, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(15, d)))
    keys = _unit(centres[rng.integers(0, 15, n)] + 0.35 * rng.normal(size=(n, d)))
    ids = np.arange(n) * 5 + 3
    bank = MemoryBank(ids, ids % 7, keys, rng.normal(size=(n, 6)).astype(np.float32))
    held_out = _unit(centres[rng.integers(0, 15, 240)] + 0.35 * rng.normal(size=(240, d)))
    return bank, held_out


def _brute_force_ids(keys: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """The reference: every score, a full sort (independent of both search paths)."""
    scores = queries.astype(np.float64) @ keys.astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return ids[order]


def _full_probe(bank: MemoryBank, held_out: np.ndarray, nlist: int = 12) -> BankSearch:
    search = BankSearch(bank, SearchConfig(mode="ivf", nlist=nlist, nprobe=nlist), lambda: held_out)
    search.ivf()
    return search


def test_ivf_with_every_list_probed_equals_brute_force_through_deletions() -> None:
    bank, held_out = _bank_and_held_out()
    search = _full_probe(bank, held_out)
    queries = held_out[:30]
    rng = np.random.default_rng(1)
    deleted: set[int] = set()
    for step in range(5):
        expect = _brute_force_ids(bank.keys.numpy(), bank.ids, queries, 8)
        sims, rows = search.search(queries, 8)
        np.testing.assert_array_equal(bank.ids[rows.numpy()], expect)
        np.testing.assert_allclose(sims.numpy(), np.sort(queries @ bank.keys.numpy().T, axis=1)[:, ::-1][:, :8],
                                   rtol=1e-5, atol=1e-6)
        # delete ids that queries retrieve now (their rows are refilled by the bank's last rows)
        hit = bank.ids[rows.numpy()[:, 0]]
        victims = list(dict.fromkeys(hit.tolist()))[:3] + rng.choice(bank.ids, 10 if step % 2 else 1,
                                                                     replace=False).tolist()
        victims = list(dict.fromkeys(victims))
        bank.delete(victims)
        deleted |= set(victims)
        _, after = search.search(queries, 60)
        assert not deleted & set(bank.ids[after.numpy()].ravel().tolist())
    assert search.index is not None and sum(search.index._len) == len(bank)  # never rebuilt: one index throughout


def test_moved_rows_are_found_under_their_new_row() -> None:
    bank, held_out = _bank_and_held_out(n=200)
    search = _full_probe(bank, held_out, nlist=6)
    last_id = int(bank.ids[-1])
    last_key = bank.keys[-1].clone().numpy()
    bank.delete([int(bank.ids[0])])  # swap-delete: the last row moves into row 0
    assert bank.rows_of([last_id])[0] == 0
    _, rows = search.search(last_key[None], 1)
    assert int(bank.ids[rows[0, 0]]) == last_id
    lists = np.concatenate([search.index.list_rows(i) for i in range(search.index.nlist)])
    np.testing.assert_array_equal(np.sort(lists), np.arange(len(bank)))


def test_partial_probe_still_returns_k_rows_and_honours_exclude() -> None:
    bank, held_out = _bank_and_held_out(n=300)
    search = BankSearch(bank, SearchConfig(mode="ivf", nlist=30, nprobe=1), lambda: held_out)
    k = 40  # more than one list holds: more lists are probed
    sims, rows = search.search(held_out[:10], k)
    assert rows.shape == (10, k) and (rows >= 0).all() and torch.isfinite(sims).all()
    assert all(len(set(r.tolist())) == k for r in rows)
    own = [[int(i)] for i in bank.ids[:10]]
    _, rows = search.search(bank.keys[:10], 5, exclude=own)
    for ex, r in zip(own, rows.numpy()):
        assert ex[0] not in bank.ids[r].tolist()


def test_auto_is_exact_below_the_threshold_and_ivf_from_it() -> None:
    bank, held_out = _bank_and_held_out(n=300)
    below = BankSearch(bank, SearchConfig(mode="auto", exact_below=301), lambda: held_out)
    assert below.mode == "exact"
    sims, rows = below.search(held_out[:5], 4)
    np.testing.assert_array_equal(bank.ids[rows.numpy()], _brute_force_ids(bank.keys.numpy(), bank.ids,
                                                                            held_out[:5], 4))
    assert below.index is None  # exact never builds the index
    at = BankSearch(bank, SearchConfig(mode="auto", exact_below=300), lambda: held_out)
    assert at.mode == "ivf"
    at.search(held_out[:5], 4)
    assert at.index is not None and at.describe()["nlist"] == default_nlist(300, 240)
    bank.delete([int(bank.ids[0])])  # below the threshold now: exact again, the index kept up to date
    assert at.mode == "exact" and sum(at.index._len) == len(bank)
    assert BankSearch(bank, SearchConfig(mode="exact", exact_below=0)).mode == "exact"


def test_rebind_keeps_each_remaining_ids_list_without_reading_keys() -> None:
    bank, held_out = _bank_and_held_out(n=400)
    search = _full_probe(bank, held_out, nlist=10)
    list_of_id = {int(i): int(search.index.list_of[r]) for r, i in enumerate(bank.ids)}
    # another process deletes: the run re-reads the bank from disk (a new object, new row order)
    keep = np.sort(np.random.default_rng(2).choice(len(bank), 350, replace=False))[::-1].copy()
    reread = MemoryBank(bank.ids[keep], bank.labels[keep], bank.keys[torch.from_numpy(keep)],
                        bank.values[torch.from_numpy(keep)])
    search.rebind(reread)
    assert search.bank is reread
    for r, i in enumerate(reread.ids):
        assert int(search.index.list_of[r]) == list_of_id[int(i)]
    expect = _brute_force_ids(reread.keys.numpy(), reread.ids, held_out[:20], 6)
    _, rows = search.search(held_out[:20], 6)
    np.testing.assert_array_equal(reread.ids[rows.numpy()], expect)
    reread.delete([int(reread.ids[5])])  # the new bank's deletions are followed too
    assert sum(search.index._len) == len(reread)


def test_recall_is_one_with_every_list_and_the_index_holds_no_keys() -> None:
    bank, held_out = _bank_and_held_out()
    search = _full_probe(bank, held_out)
    assert recall_at_k(search.index, bank, held_out[:50], 10) == 1.0
    arrays = [v for v in vars(search.index).values() if isinstance(v, np.ndarray)]
    arrays += search.index._lists
    assert all(a.dtype.kind == "i" for a in arrays)  # row numbers only
    assert search.index.centroids.shape == (12, bank.key_dim)


def test_ivf_without_held_out_keys_is_a_clear_error() -> None:
    bank, _ = _bank_and_held_out(n=50)
    with pytest.raises(MunkeyError, match="validation keys"):
        BankSearch(bank, SearchConfig(mode="ivf"), lambda: np.zeros((0, bank.key_dim), np.float32)).search(
            bank.keys[:1], 3)
    with pytest.raises(MunkeyError, match="search mode"):
        SearchConfig(mode="fast")


def test_ivf_index_over_a_memory_bank_is_subscribed_once() -> None:
    bank, held_out = _bank_and_held_out(n=100)
    index = IVFIndex.fit(bank, held_out, nlist=4, nprobe=4)
    assert bank.listeners == [index]


def test_nprobe_is_calibrated_to_the_target_recall_on_the_held_out_keys() -> None:
    rng = np.random.default_rng(0)
    d, n = 32, 3000
    centres = _unit(rng.normal(size=(40, d)))
    keys = _unit(centres[rng.integers(0, 40, n)] + 0.6 * rng.normal(size=(n, d)))  # diffuse: 8 lists are too few
    held_out = _unit(centres[rng.integers(0, 40, 600)] + 0.6 * rng.normal(size=(600, d)))
    bank = MemoryBank(np.arange(n), np.zeros(n), keys, np.zeros((n, 2), np.float32))
    search = BankSearch(bank, SearchConfig(mode="ivf", nlist=100), lambda: held_out)
    index = search.ivf()
    assert index.nprobe in (16, 32, 64, 100)

    def recall(queries: np.ndarray, nprobe: int) -> float:  # brute force as the reference
        expect = _brute_force_ids(keys, bank.ids, queries, 10)
        got = bank.ids[index.search(queries, 10, nprobe=nprobe)[1].numpy()]
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(expect, got)]))

    calib = held_out[np.random.default_rng(0).permutation(len(held_out))[:512]]
    assert search.recall == pytest.approx(recall(calib, index.nprobe)) and search.recall >= 0.95
    assert recall(calib, index.nprobe // 2) < 0.95  # the smallest nprobe of the ladder that reaches it
    assert recall(held_out[::3], index.nprobe) >= 0.9  # held-out keys beyond the calibration ones
