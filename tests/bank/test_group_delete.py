"""One group commit over several bank stores (bank/store.py `delete_many`) leaves every file as a delete
on its own would, and a crash inside the group is finished store by store when each is reopened."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from munkey_core.bank.store import BankStore, delete_many


def _make(path: Path, n: int, key_dim: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, key_dim)).astype(np.float32)
    values = rng.normal(size=(n, 6)).astype(np.float32)
    BankStore.from_arrays(path, np.arange(100, 100 + n), np.arange(n) % 3, keys, values,
                          {"exp_avg": values * 0.5} if key_dim else None).close()


def _three(root: Path) -> list[Path]:
    root.mkdir()
    paths = [root / "bank.store", root / "epoch_001.rows", root / "epoch_002.rows"]
    for j, (p, kd) in enumerate(zip(paths, (5, 0, 0))):
        _make(p, 40, kd, seed=j)
    return paths


REQUESTS = ([100, 117, 139, 120, 5], [101, 102, 139, 999], [])  # absent ids and an empty request too


def test_a_group_delete_writes_what_one_delete_per_store_writes(tmp_path: Path) -> None:
    group, single = _three(tmp_path / "group"), _three(tmp_path / "single")
    stores = [BankStore(p) for p in group]
    results = delete_many(list(zip(stores, REQUESTS)))
    for s in stores:
        s.close()
    for p, ids in zip(single, REQUESTS):
        with BankStore(p) as s:
            one = s.delete(ids)
        r = results[single.index(p)]
        assert (r.deleted, r.absent, r.moves) == (one.deleted, one.absent, one.moves)
    for a, b in zip(group, single):
        assert a.read_bytes() == b.read_bytes()  # every byte of every file, zeroed tails included
    assert [r.deleted for r in results] == [[100, 117, 139, 120], [101, 102, 139], []]


def test_a_crash_after_the_records_are_flushed_is_finished_when_each_store_is_reopened(tmp_path: Path) -> None:
    group, expected = _three(tmp_path / "group"), _three(tmp_path / "expected")
    for p, ids in zip(expected, REQUESTS):
        with BankStore(p) as s:
            s.delete(ids)
    stores = [BankStore(p) for p in group]
    stores[1]._apply = lambda *a: None  # killed in the apply round: this store's rows never moved
    for s in stores:
        s._clear_redo = lambda: None  # ... and no record was invalidated
    delete_many(list(zip(stores, REQUESTS)))
    for s in stores:
        s.close()
    assert group[1].read_bytes() != expected[1].read_bytes()  # the crash left it unfinished
    for p in group:
        BankStore(p).close()  # opening replays its record
    for a, b in zip(group, expected):
        with BankStore(a) as sa, BankStore(b) as sb:
            assert len(sa) == len(sb) and sa.fingerprint() == sb.fingerprint()
        deleted_rows = [i for i in REQUESTS[group.index(a)] if 100 <= i < 140]
        with BankStore(a) as sa:
            assert not np.isin(deleted_rows, sa.ids).any()


def test_a_forked_child_can_group_delete_after_its_parent_did(tmp_path: Path) -> None:
    """The flush threads live for one call: a child forked after a group delete (the crash tests fork
    `munkey forget`) must not wait for threads it did not inherit."""
    import os
    import signal
    import time

    first, second = _three(tmp_path / "first"), _three(tmp_path / "second")
    stores = [BankStore(p) for p in first]
    delete_many(list(zip(stores, REQUESTS)))
    for s in stores:
        s.close()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            child = [BankStore(p) for p in second]
            delete_many(list(zip(child, REQUESTS)))
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child never finished its group delete")
    assert os.waitstatus_to_exitcode(status) == 0
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes()


def test_a_failed_flush_is_raised_after_every_flush_and_before_any_row_moves(tmp_path: Path) -> None:
    import pytest

    group, untouched = _three(tmp_path / "group"), _three(tmp_path / "untouched")
    stores = [BankStore(p) for p in group]
    calls: list[int] = []

    def ok(fd: int, j: int) -> None:
        calls.append(j)

    def broken(fd: int) -> None:
        calls.append(1)
        raise OSError(5, "Input/output error")

    stores[0].fsync, stores[1].fsync = (lambda fd: ok(fd, 0)), broken
    with pytest.raises(OSError, match="Input/output error"):
        delete_many(list(zip(stores, REQUESTS)))
    assert sorted(calls) == [0, 1]  # both stores that change were flushed (the third deletes nothing)
    for s in stores:
        s.close()
    for a, b in zip(group, untouched):
        assert a.read_bytes() == b.read_bytes()  # the rows never moved: the error came before the apply round


def test_ids_given_as_one_array_plan_the_same_deletes_as_a_list(tmp_path: Path) -> None:
    """run/rows.py converts a request's ids once (bank/store.py `unique_ids`) for every store."""
    from munkey_core.bank.store import unique_ids

    rng = np.random.default_rng(3)
    for _ in range(200):  # repeats kept in their first-occurrence order, as dict.fromkeys keeps them
        ids = rng.integers(90, 150, size=int(rng.integers(0, 40))).astype(np.int64)
        assert unique_ids(ids).tolist() == list(dict.fromkeys(ids.tolist()))
    as_list, as_array = _three(tmp_path / "list"), _three(tmp_path / "array")
    request = [139, 100, 117, 139, 5, 120, 100]
    for a, b in zip(as_list, as_array):
        with BankStore(a) as s:
            one = s.delete(request)
        with BankStore(b) as s:
            other = s.delete(np.asarray(request, dtype=np.int64))
        assert (one.deleted, one.absent, one.moves) == (other.deleted, other.absent, other.moves)
        assert a.read_bytes() == b.read_bytes()


def test_a_group_delete_replaces_its_files_before_any_row_moves(tmp_path: Path) -> None:
    """`files` join the group: renamed (then `after_files` runs) before the rows move, durable on return."""
    paths = _three(tmp_path / "g")
    (tmp_path / "g" / "forgotten.json").write_bytes(b"old")
    seen = []
    stores = [BankStore(p) for p in paths]
    delete_many(list(zip(stores, REQUESTS)), files=[(tmp_path / "g" / "forgotten.json", b"new"),
                                                     (tmp_path / "g" / "sub" / "x.json", b"x")],
                after_files=lambda: seen.append(((tmp_path / "g" / "forgotten.json").read_bytes(),
                                                 100 in BankStore(paths[0], readonly=True).ids)))
    for s in stores:
        s.close()
    assert seen == [(b"new", True)]  # the file new, the rows not moved yet
    assert (tmp_path / "g" / "sub" / "x.json").read_bytes() == b"x"
    assert not [p for p in (tmp_path / "g").rglob("*.tmp")]
    with BankStore(paths[0]) as s:
        assert 100 not in s.ids
