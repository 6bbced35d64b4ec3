"""Physical purge: after a deletion no file of the run directory holds the bytes of a deleted key,
exemplar vector or optimiser-moment row (bank, checkpoints, audit log, receipts, journal, caches)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from _helpers import deleted_byte_patterns, files_holding
from munkey_core.cli import main
from munkey_core.errors import MunkeyError
from munkey_core.forget.evidence import own_keys, retrieval_evidence
from munkey_core.run.lock import RunLock
from munkey_core.run.rows import load_bank
from munkey_core.service import MunkeyRun


def test_deleted_vectors_occur_in_no_file_of_the_run(tiny_run: Path, capsys) -> None:
    bank = load_bank(tiny_run)
    # first, last (the swap-with-last edge case) and a few in between
    victims = [int(bank.ids[r]) for r in (0, 1, 200, 777, len(bank) - 2, len(bank) - 1)]
    patterns = deleted_byte_patterns(tiny_run, victims)
    kinds = {name.split("[")[0].split(":")[-1] for name in patterns}
    assert {"keys", "values", "moment_exp_avg", "moment_exp_avg_sq"} <= kinds and len(patterns) > 6 * 4
    before = files_holding(tiny_run, patterns)
    assert all("bank.store" in before[k] for k in patterns if "epoch_" not in k)  # the scan does see them
    assert any(k.startswith("epoch_") for k in before)
    assert main(["forget", str(tiny_run), "--ids", ",".join(map(str, victims[:3])), "--operator", "o",
                 "--no-evaluate"]) == 0
    assert main(["forget", str(tiny_run), "--ids", ",".join(map(str, victims[2:])), "--operator", "o",
                 "--max-samples", "50"]) == 0  # overlapping: one id already deleted; with evaluation
    assert main(["forget", str(tiny_run), "--ids", "999999", "--operator", "o", "--no-evaluate"]) == 2
    capsys.readouterr()
    leftovers = files_holding(tiny_run, patterns)
    assert not leftovers, leftovers
    after = load_bank(tiny_run)
    assert len(after) == len(bank) - len(victims) and not set(victims) & set(after.ids.tolist())
    # the log: only fingerprints, no journal or WAL file beside it, no free page that could keep old bytes
    assert not list(tiny_run.glob("audit.sqlite-*")) and not (tiny_run / "journal.json").exists()
    con = sqlite3.connect(tiny_run / "audit.sqlite")
    assert con.execute("PRAGMA freelist_count").fetchone()[0] == 0
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert con.execute("SELECT count(*) FROM audit_log").fetchone()[0] == 3
    con.close()
    assert sorted(json.loads((tiny_run / "forgotten.json").read_text())["ids"]) == sorted(victims)


def test_retrieval_evidence_fails_for_samples_still_in_the_bank(tiny_run: Path) -> None:
    """The receipt's check is not vacuous: samples that were never deleted are found everywhere."""
    run = MunkeyRun(tiny_run, device="cpu")
    ids = [int(i) for i in run.bank.ids[:3]]
    ev = retrieval_evidence(run, ids, own_keys(run, ids))
    assert not ev["passed"]
    assert set(ev["own_key_search"]["retrieved"]) == set(ids) == set(ev["in_memory_bank"]) == set(ev["in_bank_file"])
    assert ev["checkpoints_checked"] >= 1 and set(ev["in_checkpoints"]) and all(
        set(found) == set(ids) for found in ev["in_checkpoints"].values())


def test_retrieval_evidence_reads_the_files_between_deletions(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bank and checkpoint row files change in place during a deletion: the check waits for the
    run lock (here it times out while another process, played by a second lock handle, holds it)."""
    run = MunkeyRun(tiny_run, device="cpu")
    ids = [int(run.bank.ids[0])]
    monkeypatch.setenv("MUNKEY_LOCK_TIMEOUT", "0.2")
    with RunLock(run.paths.root).hold(exclusive=True):
        with pytest.raises(MunkeyError, match="too long"):
            retrieval_evidence(run, ids, own_keys(run, ids))
    assert not retrieval_evidence(run, ids, own_keys(run, ids))["passed"]
