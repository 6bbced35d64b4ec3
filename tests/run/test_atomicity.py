"""A deletion is all or nothing: SIGKILLed at every step it leaves the run wholly before or wholly after
(once reopened), loadable, with an intact log; two processes deleting at once are serialised."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _helpers import cli, deleted_byte_patterns, files_holding, fork, forked, reap
from munkey_core.audit import log as audit
from munkey_core.audit import receipts
from munkey_core.forget.request import CRASH_STEPS
from munkey_core.run.lock import RunLock
from munkey_core.service import MunkeyRun
from munkey_core.run.rows import load_bank

VICTIMS = [5, 17, 300]


@pytest.fixture(scope="module")
def template(tiny_run_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny run with its probe keys cached (so forked children never load the key encoder)."""
    MunkeyRun(tiny_run_template, device="cpu").split_keys("test")
    return tiny_run_template


def _copy(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    return dest


def _state(run: Path) -> dict:
    """Open the run (finishing any interrupted deletion) and describe it."""
    r = MunkeyRun(run, device="cpu")
    v = audit.verify_run(run)
    assert v.ok, v.message
    log = audit.open_log(run)
    entries = [] if log is None else [e for e in log.entries() if e.kind == "deletion"]
    return {"bank": r.bank.fingerprint(), "forgotten": r.forgotten_ids,
            "deleted_by_log": [[s["id"] for s in e.body["samples"]] for e in entries],
            "journal": (run / "journal.json").exists(), "entries": entries}


def _expect_after(run: Path, after: dict, patterns: dict) -> None:
    s = _state(run)
    assert (s["bank"], s["forgotten"], s["deleted_by_log"]) == (after["bank"], VICTIMS, [VICTIMS])
    entry = s["entries"][0]
    assert entry.body["evidence"]["passed"]
    res = receipts.verify_receipt(receipts.load_receipt(run / "receipts" / f"{entry.request_id}.json"), run)
    assert res["ok"], res["message"]
    assert not files_holding(run, patterns)  # no copy of a deleted vector survived the crash
    assert not list(run.rglob(".*.tmp")) and not (run / "audit_pending.json").exists()


def test_sigkill_at_every_step_leaves_the_run_before_or_after(template: Path, tmp_path: Path) -> None:
    before = _state(_copy(template, tmp_path / "before"))
    clean = _copy(template, tmp_path / "clean")
    patterns = deleted_byte_patterns(clean, VICTIMS)
    assert forked(cli("forget", str(clean), "--ids", ",".join(map(str, VICTIMS)), "--operator", "t",
                      "--no-evaluate")) == 0
    after = _state(clean)
    assert after["bank"] != before["bank"] and after["forgotten"] == VICTIMS
    for step in CRASH_STEPS:
        run = _copy(template, tmp_path / step)
        code = forked(cli("forget", str(run), "--ids", ",".join(map(str, VICTIMS)), "--operator", "t",
                          "--no-evaluate"), env={"MUNKEY_CRASH_AT": step})
        assert code == -9, f"the crash point {step!r} was not reached"
        if step == "validated":  # killed before the commit point: nothing happened
            s = _state(run)
            assert (s["bank"], s["forgotten"], s["deleted_by_log"], s["journal"]) == \
                   (before["bank"], [], [], False)
        else:
            _expect_after(run, after, patterns)


def test_a_crash_during_recovery_is_recovered_too(template: Path, tmp_path: Path) -> None:
    run = _copy(template, tmp_path / "run")
    patterns = deleted_byte_patterns(run, VICTIMS)
    ids = ",".join(map(str, VICTIMS))
    assert forked(cli("forget", str(run), "--ids", ids, "--operator", "t", "--no-evaluate"),
                  env={"MUNKEY_CRASH_AT": "journal"}) == -9
    # the next command to open the run starts the recovery, and is killed in the middle of it
    assert forked(lambda: MunkeyRun(run, device="cpu") and 0, env={"MUNKEY_CRASH_AT": "checkpoint"}) == -9
    clean = _copy(template, tmp_path / "clean")
    MunkeyRun(clean, device="cpu").forget(VICTIMS, operator="t")
    _expect_after(run, _state(clean), patterns)
    assert _state(run)["entries"][0].body["recovered"] is True


def test_the_crash_hook_works_in_a_fresh_interpreter(template: Path, tmp_path: Path) -> None:
    run = _copy(template, tmp_path / "run")
    env = {**os.environ, "MUNKEY_CRASH_AT": "bank"}
    proc = subprocess.run([sys.executable, "-m", "munkey_core.cli", "forget", str(run), "--ids", "5",
                           "--operator", "t", "--no-evaluate"], env=env, capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert (run / "journal.json").exists()
    r = MunkeyRun(run, device="cpu")
    assert 5 not in r.bank and r.forgotten_ids == [5] and not (run / "journal.json").exists()


def test_two_processes_deleting_at_once_are_serialised(template: Path, tmp_path: Path) -> None:
    run = _copy(template, tmp_path / "run")
    bank0 = load_bank(run)
    n0 = len(bank0)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    groups = [bank0.ids[10:13].tolist(), bank0.ids[400:402].tolist()]

    def worker(ids: list[int]):
        def body() -> int:
            r = MunkeyRun(run, device="cpu")  # both load the bank before either deletes
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            r.forget(ids, operator=f"worker {ids[0]}")
            return 0
        return body

    lock = RunLock(run)
    pids = [fork(worker(g)) for g in groups]
    for _ in groups:
        os.read(ready_r, 1)
    with lock.hold(exclusive=True):  # both now wait on the lock together
        os.write(go_w, b"xx")
        time.sleep(0.5)
    codes = [reap(pid) for pid in pids]
    assert codes == [0, 0]
    bank = load_bank(run)
    assert len(bank) == n0 - 5 and not {i for g in groups for i in g} & set(bank.ids.tolist())
    assert sorted(json.loads((run / "forgotten.json").read_text())["ids"]) == sorted(i for g in groups for i in g)
    v = audit.verify_run(run)
    assert v.ok and v.entries == 2, v.message
    first, second = [e.body for e in audit.open_log(run).entries()]
    assert second["bank"]["before"] == first["bank"]["after"]  # the second saw the first's result
    assert sorted([[s["id"] for s in b["samples"]] for b in (first, second)]) == sorted(groups)
