"""IVF index: exhaustive probing equals exact search, before and after deletions; lists track rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from munkey_core.bank.ann import IVFIndex, spherical_kmeans
from munkey_core.bank.store import BankStore


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _store(tmp_path: Path, n: int = 400, d: int = 32) -> tuple[BankStore, np.ndarray]:
    rng = np.random.default_rng(0)
    centers = _unit(rng.normal(size=(12, d)))
    keys = _unit(centers[rng.integers(0, 12, n)] + 0.3 * rng.normal(size=(n, d)))
    ids = np.arange(n) * 3 + 7
    store = BankStore.from_arrays(tmp_path / "s.store", ids, ids % 5, keys, rng.normal(size=(n, 4)).astype(np.float32))
    held_out = _unit(centers[rng.integers(0, 12, 200)] + 0.3 * rng.normal(size=(200, d)))
    return store, held_out


def _check_lists(index: IVFIndex, store: BankStore) -> None:
    rows = np.sort(np.concatenate([index.list_rows(i) for i in range(index.nlist)]))
    np.testing.assert_array_equal(rows, np.arange(len(store)))
    for lst in range(index.nlist):
        for pos, row in enumerate(index.list_rows(lst)):
            assert index.list_of[row] == lst and index.pos_of[row] == pos


def test_full_probe_equals_exact_through_deletions(tmp_path: Path) -> None:
    store, held_out = _store(tmp_path)
    index = IVFIndex.fit(store, held_out, nlist=10, nprobe=10)
    rng = np.random.default_rng(3)
    q = held_out[:25]
    for step in range(6):
        s_exact, r_exact = store.search(q, 8)
        s_ivf, r_ivf = index.search(q, 8)
        np.testing.assert_allclose(s_ivf.numpy(), s_exact.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(store.ids[r_ivf.numpy()], store.ids[r_exact.numpy()])
        _check_lists(index, store)
        victims = rng.choice(store.ids, 1 if step % 2 else 30, replace=False)
        store.delete(victims)
        _, r_after = index.search(q, 50)
        assert not set(victims.tolist()) & set(store.ids[r_after.numpy()[r_after.numpy() >= 0]].tolist())


def test_partial_probe_has_high_recall_on_clustered_keys(tmp_path: Path) -> None:
    store, held_out = _store(tmp_path)
    index = IVFIndex.fit(store, held_out, nlist=10, nprobe=4)
    _, r_exact = store.search(held_out[:50], 5)
    _, r_ivf = index.search(held_out[:50], 5)
    recall = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(r_exact.numpy(), r_ivf.numpy())])
    assert recall > 0.8


def test_kmeans_centroids_are_unit_norm() -> None:
    x = _unit(np.random.default_rng(0).normal(size=(100, 8)))
    c = spherical_kmeans(x, 5, iters=3)
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-5)
