"""Run storage format 2: a deletion changes the bank and checkpoint row files in place (same inode, same
size: no rewrite), a format-1 run (bank.npz, rows inside each checkpoint) is migrated on first open,
and a crash at any migration step leaves a run that the next open migrates to the same result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from _helpers import deleted_byte_patterns, files_holding, forked
from munkey_core.audit import log as audit
from munkey_core.bank.store import BankStore
from munkey_core.run.paths import RunPaths
from munkey_core.run.rows import (MIGRATION_CRASH_STEPS, STORE_FORMAT, checkpoint_ids_present,
                                  checkpoints, load_bank, load_checkpoint, purge_checkpoint_rows, rows_path,
                                  write_checkpoint)
from munkey_core.service import MunkeyRun

VICTIMS = [5, 17, 300]


def _to_format1(run: Path) -> Path:
    """Rewrite a run as the previous version wrote it: bank.npz, rows inside each epoch_NNN.pt."""
    load_bank(run).save(RunPaths(run).legacy_bank)
    for p in (RunPaths(run).bank, run / f"{RunPaths(run).bank.name}.redo"):
        p.unlink(missing_ok=True)
    for ck in checkpoints(run / "checkpoints"):
        c = load_checkpoint(ck)
        torch.save(c, ck)
        for p in (rows_path(ck), Path(f"{rows_path(ck)}.redo")):
            p.unlink(missing_ok=True)
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "format": 1}))
    return run


def _snapshot(run: Path) -> dict:
    cks = {ck.name: load_checkpoint(ck) for ck in checkpoints(run / "checkpoints")}
    return {"bank": load_bank(run).fingerprint(),
            "moments": {k: v.numpy().tobytes() for k, v in sorted(load_bank(run).moments.items())},
            "ckpt": {n: (c["ids"].tolist(), c["values"].numpy().tobytes(), c["epoch"]) for n, c in cks.items()}}


def _is_format2(run: Path) -> None:
    assert not (RunPaths(run).legacy_bank).exists() and (RunPaths(run).bank).exists()
    assert json.loads((run / "config.json").read_text())["format"] == STORE_FORMAT
    for ck in checkpoints(run / "checkpoints"):
        assert rows_path(ck).exists()
        assert "ids" not in torch.load(ck, weights_only=True) and "values" not in torch.load(ck, weights_only=True)


def test_a_deletion_writes_the_row_files_in_place(tiny_run: Path) -> None:
    files = [RunPaths(tiny_run).bank] + [rows_path(ck) for ck in checkpoints(tiny_run / "checkpoints")]
    assert len(files) > 2
    stat0 = {f: (f.stat().st_ino, f.stat().st_size) for f in files}
    pt0 = {ck: ck.stat().st_mtime_ns for ck in checkpoints(tiny_run / "checkpoints")}
    patterns = deleted_byte_patterns(tiny_run, VICTIMS)
    run = MunkeyRun(tiny_run, device="cpu")
    run.forget(VICTIMS, operator="t")
    assert {f: (f.stat().st_ino, f.stat().st_size) for f in files} == stat0  # no file was replaced or resized
    assert {ck: ck.stat().st_mtime_ns for ck in pt0} == pt0  # the weights files are not touched at all
    assert not files_holding(tiny_run, patterns)
    found, n = checkpoint_ids_present(tiny_run / "checkpoints", VICTIMS)
    assert found == {} and n == len(pt0)
    assert not set(VICTIMS) & set(load_bank(tiny_run).ids.tolist())


def test_a_format1_run_is_migrated_on_open_and_then_deletes_in_place(tiny_run: Path) -> None:
    want = _snapshot(tiny_run)
    _to_format1(tiny_run)
    assert _snapshot(tiny_run) == want  # the format-1 run holds the same rows
    patterns = deleted_byte_patterns(tiny_run, VICTIMS)
    run = MunkeyRun(tiny_run, device="cpu")
    _is_format2(tiny_run)
    assert run.bank.fingerprint() == want["bank"] and _snapshot(tiny_run) == want
    ino = (RunPaths(tiny_run).bank).stat().st_ino
    run.forget(VICTIMS, operator="t")
    assert (RunPaths(tiny_run).bank).stat().st_ino == ino
    assert not files_holding(tiny_run, patterns)
    assert audit.verify_run(tiny_run).ok


def test_a_format1_run_with_an_interrupted_deletion_is_migrated_then_rolled_forward(tiny_run: Path) -> None:
    clean = tiny_run.parent / "clean"
    shutil.copytree(tiny_run, clean)
    MunkeyRun(clean, device="cpu").forget(VICTIMS, operator="t")
    _to_format1(tiny_run)
    patterns = deleted_byte_patterns(tiny_run, VICTIMS)
    assert forked(lambda: MunkeyRun(tiny_run, device="cpu").forget(VICTIMS, operator="t") and 0,
                  env={"MUNKEY_CRASH_AT": "checkpoints"}) == -9  # a format-1 deletion is migrated first
    run = MunkeyRun(tiny_run, device="cpu")
    _is_format2(tiny_run)
    assert run.bank.fingerprint() == MunkeyRun(clean, device="cpu").bank.fingerprint()
    assert run.forgotten_ids == VICTIMS and not (tiny_run / "journal.json").exists()
    assert not files_holding(tiny_run, patterns)


@pytest.mark.parametrize("step", MIGRATION_CRASH_STEPS)
def test_a_crash_during_migration_is_finished_by_the_next_open(tiny_run: Path, step: str) -> None:
    want = _snapshot(tiny_run)
    _to_format1(tiny_run)
    assert forked(lambda: MunkeyRun(tiny_run, device="cpu") and 0, env={"MUNKEY_CRASH_AT": step}) == -9
    run = MunkeyRun(tiny_run, device="cpu")
    _is_format2(tiny_run)
    assert run.bank.fingerprint() == want["bank"] and _snapshot(tiny_run) == want
    assert not list(tiny_run.rglob(".*.tmp"))


def test_purge_of_row_files_is_idempotent_and_survives_a_crash_inside_a_file(tmp_path: Path) -> None:
    values = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    ck = tmp_path / "epoch_001.pt"
    write_checkpoint(ck, {"epoch": 1, "model": {}}, np.arange(10, 16), np.arange(6) % 2, values)
    assert "ids" not in torch.load(ck, weights_only=True)
    with BankStore(rows_path(ck)) as store:  # killed after the redo record, before the rows moved
        store._apply = lambda *a: None
        store._clear_redo = lambda: None
        store.delete([11])
    assert purge_checkpoint_rows(tmp_path, [11, 14, 99]) == 1  # opening replays the record first
    c = load_checkpoint(ck)
    assert sorted(c["ids"].tolist()) == [10, 12, 13, 15]
    for i, v in zip(c["ids"].tolist(), c["values"].numpy()):
        np.testing.assert_array_equal(v, values[i - 10])
    for victim in (1, 4):
        assert not any(values[victim].tobytes() in p.read_bytes() for p in tmp_path.iterdir())
    assert purge_checkpoint_rows(tmp_path, [11, 14]) == 0


def test_the_forget_storage_bench_runs_both_formats(tmp_path: Path) -> None:
    from munkey_core.bench.forget_storage import bench_forget

    (table,) = bench_forget([1500], True, 0, tmp_path, checkpoints=2)
    row = table.strip().splitlines()[-1].split("|")[1:-1]
    assert row[0].strip() == "1,500" and row[-1].strip() == "yes" and "-" not in (row[2].strip(), row[5].strip())
    assert not list(tmp_path.iterdir())  # the run directories are removed


def test_a_readonly_open_never_replays_or_writes(tmp_path: Path) -> None:
    from munkey_core.errors import MunkeyError

    path = tmp_path / "r.rows"
    BankStore.from_arrays(path, np.arange(4), np.zeros(4), np.zeros((4, 0), np.float32), np.eye(4, dtype=np.float32))
    with BankStore(path) as store:  # a writer killed after its redo record, before the rows moved
        store._apply = lambda *a: None
        store._clear_redo = lambda: None
        store.delete([1])
    before = path.read_bytes()
    with BankStore(path, readonly=True) as ro:
        assert len(ro) == 4 and path.read_bytes() == before  # left to the writer, who holds the lock
        with pytest.raises(MunkeyError, match="read-only"):
            ro.delete([2])
    with BankStore(path) as rw:
        assert sorted(rw.ids.tolist()) == [0, 2, 3]


def test_a_row_moved_by_one_request_and_deleted_by_a_shorter_one_leaves_no_copy(tmp_path: Path) -> None:
    """The redo record of a big request holds the moved (kept) rows; a later, shorter record must not
    leave that request's tail, with a row deleted since, in the redo file."""
    rng = np.random.default_rng(3)
    n = 200
    keys = rng.normal(size=(n, 16)).astype(np.float32)
    values = rng.normal(size=(n, 8)).astype(np.float32)
    path = tmp_path / "bank.store"
    BankStore.from_arrays(path, np.arange(n), np.zeros(n), keys, values, {"exp_avg": values * 3}).close()
    with BankStore(path) as store:
        store.delete(list(range(40)))  # rows 160..199 move into the holes: their images go to the redo record
    victim = n - 1  # moved by the first request
    with BankStore(path) as store:
        store.delete([victim])  # a one-row record, far shorter than the first
    for pattern in (keys[victim].tobytes(), values[victim].tobytes(), (values[victim] * 3).tobytes()):
        assert not [p.name for p in tmp_path.iterdir() if pattern in p.read_bytes()]


def test_a_migration_that_fails_on_disk_is_a_clear_error_and_leaves_format1(tiny_run: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from munkey_core.run import rows as runstore
    from munkey_core.errors import MunkeyError

    want = _snapshot(tiny_run)
    _to_format1(tiny_run)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runstore, "write_checkpoint", full)
    with pytest.raises(MunkeyError, match="free disk space"):
        MunkeyRun(tiny_run, device="cpu")
    assert json.loads((tiny_run / "config.json").read_text())["format"] == 1 and (RunPaths(tiny_run).legacy_bank).exists()
    monkeypatch.undo()
    assert MunkeyRun(tiny_run, device="cpu").bank.fingerprint() == want["bank"] and _snapshot(tiny_run) == want
    _is_format2(tiny_run)


def test_a_run_this_process_may_not_write_opens_read_only(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only copy or mount of a run (EACCES/EROFS on every write open) still loads and predicts, as it
    did with bank.npz; an unfinished deletion that it cannot finish is a clear error, not a traceback."""
    import errno
    import os

    from munkey_core.errors import MunkeyError

    want = load_bank(tiny_run).fingerprint()
    real_open = os.open

    def no_write(path, flags, *a, **k):
        if str(path).startswith(str(tiny_run)) and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", no_write)
    before = {p: p.read_bytes() for p in tiny_run.rglob("*") if p.is_file()}
    run = MunkeyRun(tiny_run, device="cpu")
    assert run.bank.fingerprint() == want
    ds = run.dataset
    assert len(run.predict_prepared(ds.test.images[:4], run.split_keys("test")[:4]).labels) == 4
    assert {p: p.read_bytes() for p in tiny_run.rglob("*") if p.is_file()} == before
    monkeypatch.undo()
    with BankStore(RunPaths(tiny_run).bank) as store:  # a writer killed after its redo record
        store._apply = lambda *a: None
        store._clear_redo = lambda: None
        store.delete([int(store.ids[0])])
    monkeypatch.setattr(os, "open", no_write)
    with pytest.raises(MunkeyError, match="unfinished deletion"):
        MunkeyRun(tiny_run, device="cpu")
    monkeypatch.undo()
    assert len(MunkeyRun(tiny_run, device="cpu").bank) == len(run.bank) - 1  # with write access: finished
