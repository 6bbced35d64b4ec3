"""Memory bank: exact search, exclusion, physical deletion, atomic save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from munkey_core.errors import MunkeyError
from munkey_core.bank.memory import MemoryBank


def _bank(n: int = 50, dk: int = 12, dv: int = 6, seed: int = 0, moments: bool = False) -> MemoryBank:
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, dk)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    ids = rng.permutation(10_000)[:n]
    values = rng.normal(size=(n, dv)).astype(np.float32)
    mom = {"exp_avg": rng.normal(size=(n, dv)).astype(np.float32),
           "exp_avg_sq": rng.random(size=(n, dv)).astype(np.float32)} if moments else None
    return MemoryBank(ids, ids % 3, keys, values, mom)


def test_search_matches_brute_force() -> None:
    bank = _bank()
    q = bank.keys[:7] + 0.1 * torch.randn(7, bank.key_dim, generator=torch.Generator().manual_seed(1))
    q = q / q.norm(dim=1, keepdim=True)
    sims, rows = bank.search(q, 5)
    brute = (q.numpy() @ bank.keys.numpy().T)
    expected_rows = np.argsort(-brute, axis=1)[:, :5]
    np.testing.assert_array_equal(rows.numpy(), expected_rows)
    np.testing.assert_allclose(sims.numpy(), np.take_along_axis(brute, expected_rows, 1), rtol=1e-5, atol=1e-6)


def test_search_excludes_given_ids_and_clips_k() -> None:
    bank = _bank(n=10)
    sims, rows = bank.search(bank.keys[:3], 4, exclude=[[int(bank.ids[0])], [int(bank.ids[1])], []])
    assert int(bank.ids[0]) not in bank.ids[rows[0].numpy()]
    assert int(bank.ids[1]) not in bank.ids[rows[1].numpy()]
    assert rows[2, 0].item() == 2 and sims[2, 0].item() == pytest.approx(1.0, abs=1e-6)
    _, rows_all = bank.search(bank.keys[:1], 100)
    assert rows_all.shape == (1, 10)


def test_delete_removes_every_field_and_keeps_the_rest_addressable() -> None:
    bank = _bank(moments=True)
    before = {int(i): (bank.keys[r].clone(), bank.values[r].clone(), bank.moments["exp_avg"][r].clone())
              for r, i in enumerate(bank.ids)}
    victims = [int(bank.ids[0]), int(bank.ids[-1]), int(bank.ids[17])]
    result = bank.delete(victims + [123456789])
    assert result.deleted == victims and result.absent == [123456789]
    assert len(bank) == 47 and all(v not in bank for v in victims)
    for sample_id, (k, v, m) in before.items():
        if sample_id in victims:
            continue
        r = bank.rows_of([sample_id])[0]
        assert torch.equal(bank.keys[r], k) and torch.equal(bank.values[r], v)
        assert torch.equal(bank.moments["exp_avg"][r], m)
    # nothing ever retrieves a deleted id again
    _, rows = bank.search(torch.stack([before[v][0] for v in victims]), 47)
    assert not set(bank.ids[rows.numpy()].ravel()) & set(victims)


def test_deleted_bytes_are_gone_from_memory_and_disk(tmp_path) -> None:
    bank = _bank(moments=True)
    victim = int(bank.ids[len(bank) - 1])  # the last row: the case a plain truncation would leave behind
    r = bank.rows_of([victim])[0]
    secrets = [bank.keys[r].numpy().tobytes(), bank.values[r].numpy().tobytes(),
               bank.moments["exp_avg_sq"][r].numpy().tobytes()]
    storage_before = bank.values.untyped_storage()
    bank.delete([victim])
    raw = bytes(storage_before)  # the old storage, including the dropped tail
    assert secrets[1] not in raw
    bank.save(tmp_path / "bank.npz")
    data = (tmp_path / "bank.npz").read_bytes()
    assert all(s not in data for s in secrets)


def test_save_load_round_trip_and_fingerprint(tmp_path) -> None:
    bank = _bank(moments=True)
    bank.save(tmp_path / "b.npz")
    loaded = MemoryBank.load(tmp_path / "b.npz")
    assert loaded.fingerprint() == bank.fingerprint()
    assert set(loaded.moments) == {"exp_avg", "exp_avg_sq"}
    loaded.delete([int(loaded.ids[3])])
    assert loaded.fingerprint() != bank.fingerprint()
    assert not list(tmp_path.glob("*.tmp"))


def test_damaged_or_missing_bank_gives_clear_error(tmp_path) -> None:
    bank = _bank()
    bank.save(tmp_path / "b.npz")
    data = (tmp_path / "b.npz").read_bytes()
    (tmp_path / "b.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(MunkeyError, match="damaged or truncated"):
        MemoryBank.load(tmp_path / "b.npz")
    with pytest.raises(MunkeyError, match="No memory bank"):
        MemoryBank.load(tmp_path / "missing.npz")


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(MunkeyError, match="unique"):
        MemoryBank(np.array([1, 1]), np.array([0, 0]), np.eye(2, dtype=np.float32), np.zeros((2, 3), np.float32))
