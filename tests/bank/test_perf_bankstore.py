"""BankStore: the same contents and search results as MemoryBank on random data, physical purge on
disk, durability across reopen, and crash recovery through the redo record."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from munkey_core.bank.store import BankStore
from munkey_core.errors import MunkeyError
from munkey_core.bank.memory import MemoryBank


def _arrays(n: int = 300, dk: int = 48, dv: int = 8, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, dk)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    ids = rng.permutation(100_000)[:n]
    return {"ids": ids, "labels": ids % 7, "keys": keys, "values": rng.normal(size=(n, dv)).astype(np.float32),
            "moments": {"exp_avg": rng.normal(size=(n, dv)).astype(np.float32),
                        "exp_avg_sq": rng.random(size=(n, dv)).astype(np.float32)}}


def _pair(tmp_path: Path, **kw) -> tuple[MemoryBank, BankStore, dict]:
    a = _arrays(**kw)
    # the bank gets its own copies: MemoryBank shares numpy memory and reorders it on delete
    bank = MemoryBank(a["ids"], a["labels"], a["keys"].copy(), a["values"].copy(),
                      {k: v.copy() for k, v in a["moments"].items()})
    store = BankStore.from_arrays(tmp_path / "bank.store", a["ids"], a["labels"], a["keys"], a["values"], a["moments"])
    return bank, store, a


def _assert_same_search(bank: MemoryBank, store: BankStore, q: np.ndarray, k: int) -> None:
    s1, r1 = bank.search(q, k)
    s2, r2 = store.search(q, k)
    np.testing.assert_allclose(s2.numpy(), s1.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(store.ids[r2.numpy()], bank.ids[r1.numpy()])


def test_store_matches_memory_bank_through_random_deletions(tmp_path: Path) -> None:
    bank, store, a = _pair(tmp_path)
    rng = np.random.default_rng(1)
    q = rng.normal(size=(20, 48)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    assert store.fingerprint() == bank.fingerprint()
    _assert_same_search(bank, store, q, 10)
    live = list(a["ids"])
    for step in range(12):
        size = 1 if step % 2 == 0 else int(rng.integers(2, 40))
        victims = [int(v) for v in rng.choice(live, size, replace=False)] + [999_999]
        r_bank, r_store = bank.delete(victims), store.delete(victims)
        assert r_store.deleted == r_bank.deleted and r_store.absent == r_bank.absent == [999_999]
        live = [i for i in live if i not in set(victims)]
        assert len(store) == len(bank) == len(live)
        assert store.fingerprint() == bank.fingerprint()
        _assert_same_search(bank, store, q, 10)
        for moment in ("exp_avg", "exp_avg_sq"):
            rows_b, rows_s = bank.rows_of(live), store.rows_of(live)
            np.testing.assert_array_equal(store.moment(moment)[rows_s], bank.moments[moment].numpy()[rows_b])
    reopened = BankStore(store.path)
    assert reopened.fingerprint() == bank.fingerprint() and len(reopened) == len(live)


def test_search_exclude_and_chunking_match_memory_bank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import munkey_core.bank.store as bs

    monkeypatch.setattr(bs, "_SEARCH_ROWS", 37)  # many chunks, ragged last one
    bank, store, a = _pair(tmp_path, n=200)
    q = a["keys"][:15]
    exclude = [[int(i)] for i in a["ids"][:15]]
    s1, r1 = bank.search(q, 6, exclude=exclude)
    s2, r2 = store.search(q, 6, exclude=exclude)
    np.testing.assert_allclose(s2.numpy(), s1.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(r2.numpy(), r1.numpy())
    assert not any(int(a["ids"][j]) in store.ids[r2[j].numpy()] for j in range(15))
    _, rows_all = store.search(q[:1], 1000)
    assert rows_all.shape == (1, 200)


def test_deleted_bytes_are_gone_from_every_file(tmp_path: Path) -> None:
    _, store, a = _pair(tmp_path)
    victims_rows = [0, 5, len(a["ids"]) - 1, 100]
    victims = [int(a["ids"][r]) for r in victims_rows]
    store.delete(victims[:1])
    store.delete(victims[1:])
    files = [p for p in tmp_path.iterdir() if p.is_file()]
    blobs = b"".join(p.read_bytes() for p in files)
    for r in victims_rows:
        for arr in (a["keys"][r], a["values"][r], a["moments"]["exp_avg"][r], a["moments"]["exp_avg_sq"][r]):
            assert arr.tobytes() not in blobs
    # a kept row is still found the same way (the scan would see the bytes)
    kept = [r for r in range(len(a["ids"])) if r not in victims_rows][0]
    assert a["keys"][kept].tobytes() in blobs
    # the vacated tail of every region is zero
    n = len(store)
    assert not np.any(store._mm["keys"][n:n + 4]) and not np.any(store._mm["ids"][n:n + 4])


def test_crash_after_redo_is_completed_on_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bank, store, a = _pair(tmp_path)
    victims = [int(i) for i in a["ids"][[3, 50, 299]]]
    victim_keys = [a["keys"][r].tobytes() for r in (3, 50, 299)]  # copies: bank.delete reorders a's arrays
    calls = {"n": 0}
    real_pwrite = __import__("os").pwrite

    def dying_pwrite(fd: int, data: bytes, offset: int) -> int:
        if fd == store._fd:
            calls["n"] += 1
            if calls["n"] > 3:  # the apply step dies after three row writes
                raise KeyboardInterrupt("simulated crash")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr("munkey_core.bank.store.os.pwrite", dying_pwrite)
    with pytest.raises(KeyboardInterrupt):
        store.delete(victims)
    monkeypatch.undo()
    assert (tmp_path / "bank.store.redo").stat().st_size > 0
    bank.delete(victims)
    recovered = BankStore(tmp_path / "bank.store")
    assert recovered.fingerprint() == bank.fingerprint()
    assert (tmp_path / "bank.store.redo").read_bytes()[:8] == bytes(8)  # the record was invalidated
    blobs = (tmp_path / "bank.store").read_bytes()
    assert all(key not in blobs for key in victim_keys)


def test_torn_redo_record_leaves_store_unchanged(tmp_path: Path) -> None:
    bank, store, a = _pair(tmp_path)
    fp = store.fingerprint()
    store.close()
    (tmp_path / "bank.store.redo").write_bytes(b"MKYREDO1" + (10_000).to_bytes(8, "little") + b"\x01" * 500)
    reopened = BankStore(tmp_path / "bank.store")
    assert reopened.fingerprint() == fp and len(reopened) == len(a["ids"])


def test_float16_store_halves_bytes_and_keeps_neighbours(tmp_path: Path) -> None:
    a = _arrays()
    s32 = BankStore.from_arrays(tmp_path / "a.store", a["ids"], a["labels"], a["keys"], a["values"])
    s16 = BankStore.from_arrays(tmp_path / "b.store", a["ids"], a["labels"], a["keys"], a["values"], dtype="float16")
    assert s16.row_bytes - 16 == (s32.row_bytes - 16) // 2
    sims32, r32 = s32.search(a["keys"][:10], 5)
    sims16, r16 = s16.search(a["keys"][:10], 5)
    np.testing.assert_allclose(sims16.numpy(), sims32.numpy(), atol=2e-3)
    assert (r16[:, 0] == r32[:, 0]).all()


def test_user_errors_raise_munkey_error(tmp_path: Path) -> None:
    a = _arrays(n=10)
    store = BankStore.from_arrays(tmp_path / "s.store", a["ids"], a["labels"], a["keys"], a["values"])
    with pytest.raises(MunkeyError, match="at most"):
        store.append(a["ids"] + 10**6, a["labels"], a["keys"], a["values"])
    with pytest.raises(MunkeyError, match="not in the memory bank"):
        store.rows_of([-5])
    (tmp_path / "bad.store").write_bytes(b"nope" * 2000)
    with pytest.raises(MunkeyError, match="not a MUNKEY bank store"):
        BankStore(tmp_path / "bad.store")
    with pytest.raises(MunkeyError, match="No bank store"):
        BankStore(tmp_path / "missing.store")
    store.delete(list(a["ids"]))
    with pytest.raises(MunkeyError, match="empty"):
        store.search(a["keys"][:1], 3)


def test_from_bank_round_trips(tmp_path: Path) -> None:
    a = _arrays(n=40)
    bank = MemoryBank(a["ids"], a["labels"], a["keys"], a["values"], a["moments"])
    store = BankStore.from_bank(tmp_path / "s.store", bank, capacity=64)
    back = store.to_bank()
    assert back.fingerprint() == bank.fingerprint()
    assert torch.equal(back.moments["exp_avg_sq"], bank.moments["exp_avg_sq"])
