"""The audit log, receipts and refused requests: canonical encoding, tamper detection, CLI, bad input."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from _helpers import sqlite_exec
from munkey_core.audit import log as audit
from munkey_core.audit import receipts
from munkey_core.audit.canonical import canonical_json
from munkey_core.cli import main
from munkey_core.run.rows import load_bank

OP = ("--operator", "Dana Ortiz (DPO)")


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------- canonical encoding


@pytest.mark.parametrize("value, text", [
    (333333333.33333329, "333333333.3333333"), (1e30, "1e+30"), (4.50, "4.5"), (2e-3, "0.002"),
    (0.000000000000000000000000001, "1e-27"), (0.0, "0"), (-0.0, "0"), (1.0, "1"), (1e21, "1e+21"),
    (1e20, "100000000000000000000"), (123.456, "123.456"), (5e-324, "5e-324"), (-1.5e-7, "-1.5e-7"),
    (1.7976931348623157e308, "1.7976931348623157e+308"), (0.000001, "0.000001"), (9007199254740992.0,
                                                                                    "9007199254740992"),
])
def test_numbers_follow_rfc8785(value: float, text: str) -> None:
    assert canonical_json(value) == text
    assert float(json.loads(text)) == value


def test_canonical_json_sorts_keys_escapes_and_round_trips() -> None:
    obj = {"b": 1, "a": [True, None, "é\n\"\\\u0001"], "€": {"z": 2.5, "y": []}, "\U0001f600": 0}
    text = canonical_json(obj)
    assert text == '{"a":[true,null,"é\\n\\"\\\\\\u0001"],"b":1,"€":{"y":[],"z":2.5},"\U0001f600":0}'
    assert canonical_json(json.loads(text)) == text
    for bad in (math.nan, math.inf, 2 ** 60, object()):
        with pytest.raises((ValueError, TypeError)):
            canonical_json({"x": bad})


# --------------------------------------------------------------------------- the chain


def _log_with(tmp_path: Path, n: int = 5) -> audit.AuditLog:
    log = audit.open_log(tmp_path, create=True)
    for i in range(1, n + 1):
        log.append({"kind": "deletion", "request_id": f"r{i}", "run_id": log.run_id, "n": i, "samples": []})
    return log


def _forged(log: audit.AuditLog, seq: int, prev: str, request_id: str = "forged") -> str:
    body = {"kind": "deletion", "request_id": request_id, "run_id": log.run_id, "n": 99, "samples": []}
    h = audit.entry_hash(log.run_id, seq, prev, body)
    return (f"INSERT INTO audit_log VALUES ('{log.run_id}', {seq}, '{request_id}', 'deletion', '{prev}', '{h}', "
            f"'{canonical_json(body)}')")


def test_an_untouched_chain_verifies_and_links(tmp_path: Path) -> None:
    log = _log_with(tmp_path)
    v = log.verify()
    assert v.ok and v.entries == 5 and v.head_seq == 5
    es = log.entries()
    assert es[0].prev_hash == audit.GENESIS
    assert all(b.prev_hash == a.entry_hash for a, b in zip(es, es[1:]))
    head = json.loads((tmp_path / "audit_head.json").read_text())
    assert (head["seq"], head["hash"]) == (5, es[-1].entry_hash) and head["signature"]["algorithm"] == "ed25519"
    con = sqlite3.connect(tmp_path / "audit.sqlite", isolation_level=None)
    for sql in ("UPDATE audit_log SET kind = 'x'", "DELETE FROM audit_log"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            con.execute(sql)
    con.close()


def test_a_new_log_is_made_whole_beside_its_place_with_its_binding(tmp_path: Path) -> None:
    """open_log builds the empty SQLite log in a temporary file and renames it in with the binding (one
    group write): owner-only, the append-only schema, the signing key named in the binding, no temporary
    file left; appends and the chain work as on a log made in place."""
    import stat

    from munkey_core.audit import signing

    log = audit.open_log(tmp_path, create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.json", "audit.sqlite"]
    assert stat.S_IMODE((tmp_path / "audit.sqlite").stat().st_mode) == 0o600
    binding = json.loads((tmp_path / "audit.json").read_text())
    assert binding["signing_keys"] == [signing.signer(tmp_path).public_key]
    log.append({"kind": "deletion", "request_id": "r1", "run_id": log.run_id, "samples": []})
    log.close()
    assert json.loads((tmp_path / "audit.json").read_text()) == binding  # the first signature rewrote nothing
    con = sqlite3.connect(tmp_path / "audit.sqlite", isolation_level=None)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # no WAL: one file
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        con.execute("DELETE FROM audit_log")
    con.close()
    again = audit.open_log(tmp_path)
    assert again.verify().ok and [e.request_id for e in again.entries()] == ["r1"]
    again.close()


def _tamper(case: str, log: audit.AuditLog) -> list[str]:
    es = {e.seq: e for e in log.entries()}
    rid = log.run_id
    if case == "edit":
        return ["UPDATE audit_log SET body = replace(body, '\"n\":3', '\"n\":4') WHERE seq = 3"]
    if case in ("edit-rehash", "edit-last-rehash"):
        seq = 3 if case == "edit-rehash" else 5
        body = {**es[seq].body, "operator": "someone else"}
        h = audit.entry_hash(rid, seq, es[seq].prev_hash, body)
        return [f"UPDATE audit_log SET body = '{canonical_json(body)}', entry_hash = '{h}' WHERE seq = {seq}"]
    if case == "remove":
        return ["DELETE FROM audit_log WHERE seq = 3"]
    if case == "remove-renumber":
        return ["DELETE FROM audit_log WHERE seq = 3", "UPDATE audit_log SET seq = seq + 100 WHERE seq > 3",
                "UPDATE audit_log SET seq = seq - 101 WHERE seq > 100"]
    if case == "truncate":
        return ["DELETE FROM audit_log WHERE seq = 5"]
    if case == "insert":
        return ["UPDATE audit_log SET seq = seq + 100 WHERE seq >= 3", "UPDATE audit_log SET seq = seq - 99 "
                "WHERE seq > 100", _forged(log, 3, es[2].entry_hash)]
    if case == "append":
        return [_forged(log, 6, es[5].entry_hash)]
    if case == "reorder":
        return ["UPDATE audit_log SET seq = 100 WHERE seq = 2", "UPDATE audit_log SET seq = 2 WHERE seq = 3",
                "UPDATE audit_log SET seq = 3 WHERE seq = 100"]
    raise AssertionError(case)


@pytest.mark.parametrize("case, seq, problem", [
    ("edit", 3, "edited"), ("edit-rehash", 3, "edited"), ("remove", 3, "removed"),
    ("remove-renumber", 3, "removed"), ("truncate", 5, "truncated"), ("insert", 3, "inserted"),
    ("append", 6, "inserted"), ("reorder", 2, "reordered"), ("edit-last-rehash", 5, "edited"),
])
def test_verify_names_the_first_tampered_entry(tmp_path: Path, case: str, seq: int, problem: str) -> None:
    log = _log_with(tmp_path)
    sqlite_exec(tmp_path, *_tamper(case, log))
    v = log.verify()
    assert not v.ok and (v.first_bad_seq, v.problem) == (seq, problem), v.message
    assert f"#{seq}" in v.message


def test_an_append_interrupted_before_its_anchor_is_not_tampering(tmp_path: Path) -> None:
    log = _log_with(tmp_path, 2)
    head = json.loads((tmp_path / "audit_head.json").read_text())
    log.append({"kind": "deletion", "request_id": "r3", "run_id": log.run_id, "samples": []})
    new = log.head()
    # as if killed between the commit and the anchor write
    (tmp_path / "audit_head.json").write_text(json.dumps(head))
    (tmp_path / "audit_pending.json").write_text(json.dumps({"seq": 3, "hash": new.entry_hash}))
    v = log.verify()
    assert v.ok and v.notes
    log.settle()
    assert json.loads((tmp_path / "audit_head.json").read_text())["seq"] == 3
    assert not (tmp_path / "audit_pending.json").exists() and log.verify().ok and not log.verify().notes


# --------------------------------------------------------------------------- requests on a real run


def test_forget_records_entry_and_receipt_that_verify(tiny_run: Path, capsys) -> None:
    ids = load_bank(tiny_run).ids[:4].tolist()
    code, out, err = run_cli(capsys, "forget", str(tiny_run), *OP, "--subject", "case 2024-117", "--ids",
                             ",".join(map(str, ids)), "--max-samples", "120", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["deleted"] == ids and res["evidence_passed"] and res["request_id"].startswith("req-")
    rec = receipts.load_receipt(res["receipt"])
    body = rec["entry"]["body"]
    assert body["kind"] == "deletion" and body["operator"] == "Dana Ortiz (DPO)" and body["method"] == "key_deletion"
    assert [s["id"] for s in body["samples"]] == ids
    assert all(len(s["memory_sha256"]) == 64 and len(s["image_sha256"]) == 64 for s in body["samples"])
    assert body["subject_ref"].startswith("hmac-sha256:") and "2024-117" not in json.dumps(rec)
    assert body["model"]["before"] == body["model"]["after"]
    assert body["bank"]["after"]["size"] == body["bank"]["before"]["size"] - 4
    assert body["bank"]["after"]["fingerprint"] == load_bank(tiny_run).fingerprint()
    assert body["received"] <= body["executed"]
    m = body["metrics"]
    assert m["before"]["TA"] is not None and m["after"]["FA"] is not None and m["after"]["MIA"] is not None
    assert m["after_source"] == "evaluated after the deletion"
    ev = body["evidence"]
    assert ev["passed"] and ev["own_key_search"]["queries"] == 4 and ev["probe_search"]["queries"] > 100
    assert ev["request_FA_before"] is not None and ev["request_FA_after"] is not None
    assert ev["oracle"] is None and ev["oracle_gaps"] is None and "oracle" in ev["oracle_note"]
    # the deleted samples against unseen test samples of their own classes, not TA overall
    assert ev["FA_minus_TA_same_classes"] == pytest.approx(ev["request_FA_after"] - ev["TA_same_classes"])
    assert ev["difference_se"] > 0 and "does not show" in ev["same_class_note"] and ev["TPR@1%"] is not None
    assert rec["log_head"] == {"seq": rec["entry"]["seq"], "hash": rec["entry"]["entry_hash"]}
    page = Path(res["receipt_html"]).read_text()
    assert res["request_id"] in page and "deleted and verified" in page and "<script" not in page
    # the verdicts' positive control, on the page as recorded in the signed evidence
    assert "Training samples still held, same classes" in page
    assert f"{ev['FA_remembered']:.2f} / {ev['MIA_remembered']:.2f}" in page
    code, out, _ = run_cli(capsys, "audit", "verify-receipt", res["receipt"], str(tiny_run))
    assert code == 0 and "receipt VALID" in out
    code, out, _ = run_cli(capsys, "audit", "verify", str(tiny_run), "--json")
    assert code == 0 and json.loads(out)["ok"] and json.loads(out)["entries"] == 1
    # the same subject maps to the same pseudonym; no run file holds the subject's reference
    code, out, _ = run_cli(capsys, "forget", str(tiny_run), *OP, "--subject", "case 2024-117", "--ids",
                           str(ids[0]), "--no-evaluate", "--json")
    second = receipts.load_receipt(json.loads(out)["receipt"])["entry"]["body"]
    assert second["subject_ref"] == body["subject_ref"] and second["already_deleted"] == [ids[0]]
    assert second["metrics"]["after_source"].startswith("unchanged")
    assert not any(b"2024-117" in p.read_bytes() for p in tiny_run.rglob("*") if p.is_file())
    # an altered receipt, then an altered log, are both caught
    forged = dict(rec, request_id="req-other")
    bad = tiny_run / "forged.json"
    bad.write_text(json.dumps(forged))
    code, out, _ = run_cli(capsys, "audit", "verify-receipt", str(bad), str(tiny_run))
    assert code == 1 and "altered" in out
    sqlite_exec(tiny_run, "UPDATE audit_log SET body = replace(body, 'Dana Ortiz', 'Eve') WHERE seq = 1")
    code, out, _ = run_cli(capsys, "audit", "verify", str(tiny_run))
    assert code == 1 and "entry #1 was edited" in out
    code, out, _ = run_cli(capsys, "audit", "verify-receipt", res["receipt"], str(tiny_run))
    assert code == 1 and "not intact" in out


def test_refused_requests_are_logged_and_change_nothing(tiny_run: Path, tmp_path: Path, capsys) -> None:
    fp = load_bank(tiny_run).fingerprint()
    binary = tmp_path / "ids.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    good = int(load_bank(tiny_run).ids[0])
    for args, message in [(["--ids", "999999"], "not training samples"), (["--ids", "3,x"], "malformed"),
                          (["--ids", " "], "names no sample id"), (["--ids-file", str(binary)], "not a text file"),
                          (["--ids", f"{good},424242"], "424242"), (["--random-fraction", "2"], "between 0 and 1")]:
        code, out, err = run_cli(capsys, "forget", str(tiny_run), *OP, "--no-evaluate", *args)
        assert code == 2 and message in err and "recorded in the audit log" in err and out == ""
    assert load_bank(tiny_run).fingerprint() == fp
    assert not (tiny_run / "forgotten.json").exists() and not list((tiny_run / "checkpoints").glob(".*"))
    code, out, _ = run_cli(capsys, "audit", "show", str(tiny_run), "--json")
    entries = json.loads(out)["entries"]
    assert [e["kind"] for e in entries] == ["refused"] * 6 and all(e["reason"] for e in entries)
    assert entries[0]["operator"] == "Dana Ortiz (DPO)"
    assert run_cli(capsys, "audit", "verify", str(tiny_run))[0] == 0
    code, _, _ = run_cli(capsys, "forget", str(tiny_run), "--operator", " ", "--ids", str(good), "--no-evaluate")
    code, text, _ = run_cli(capsys, "audit", "show", str(tiny_run))  # the listing in words: no None for nobody
    assert len(text.splitlines()) == 7 and "(no operator named)" in text.splitlines()[-1] and "None" not in text
    # a refused request gets a receipt on demand
    code, out, _ = run_cli(capsys, "audit", "receipt", str(tiny_run), entries[0]["request_id"], "--json")
    page = Path(json.loads(out)["receipt_html"]).read_text()
    assert code == 0 and "Refused deletion request" in page and "nothing was deleted" in page


def test_a_tampered_log_refuses_deletions_and_is_not_extended(tiny_run: Path, capsys) -> None:
    ids = load_bank(tiny_run).ids[:3].tolist()
    assert run_cli(capsys, "forget", str(tiny_run), *OP, "--ids", str(ids[0]), "--no-evaluate")[0] == 0
    sqlite_exec(tiny_run, "DELETE FROM audit_log WHERE seq = 1")
    fp = load_bank(tiny_run).fingerprint()
    code, _, err = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids", str(ids[1]), "--no-evaluate")
    assert code == 2 and "audit log is not intact" in err and "Nothing was deleted" in err
    assert load_bank(tiny_run).fingerprint() == fp
    assert sqlite3.connect(tiny_run / "audit.sqlite").execute("SELECT count(*) FROM audit_log").fetchone()[0] == 0
    code, out, _ = run_cli(capsys, "audit", "verify", str(tiny_run))
    assert code == 1 and "removed from the end" in out


def test_damaged_run_or_log_gives_a_clear_message(tiny_run: Path, tmp_path: Path, capsys) -> None:
    ids = load_bank(tiny_run).ids[:2].tolist()
    data = (tiny_run / "bank.store").read_bytes()
    (tiny_run / "bank.store").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids", str(ids[0]), "--no-evaluate")
    assert code == 2 and "damaged or truncated" in err and "Traceback" not in err
    assert "recorded in the audit log" in err  # the log itself is intact
    (tiny_run / "bank.store").write_bytes(data)
    (tiny_run / "audit.sqlite").write_bytes(b"not a database at all" * 100)
    code, _, err = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids", str(ids[0]), "--no-evaluate")
    assert code == 2 and "audit log" in err and "damaged" in err
    assert ids[0] in load_bank(tiny_run)
    code, _, err = run_cli(capsys, "audit", "verify", str(tiny_run))
    assert code == 2 and "damaged" in err
    (tiny_run / "audit.json").unlink()
    code, _, err = run_cli(capsys, "audit", "verify", str(tiny_run))
    assert code == 2 and "audit.json is missing" in err
    code, _, err = run_cli(capsys, "audit", "verify", str(tmp_path / "nowhere"))
    assert code == 2 and "does not exist" in err
    not_a_receipt = tmp_path / "r.json"
    not_a_receipt.write_bytes(b"\x00\x01binary")
    code, _, err = run_cli(capsys, "audit", "verify-receipt", str(not_a_receipt), str(tiny_run))
    assert code == 2 and "not a receipt" in err


def test_audit_views_are_read_only_and_check_uploaded_receipts(tiny_run: Path) -> None:
    from munkey_core.dashboard import auditviews
    from munkey_core.service import MunkeyRun

    run = MunkeyRun(tiny_run, device="cpu")
    assert auditviews.audit_rows(run) == [] and auditviews.audit_status(run)["ok"]
    res = run.forget(run.bank.ids[:2].tolist(), operator="viewer test")
    files = {p: p.stat().st_mtime_ns for p in tiny_run.rglob("*") if p.is_file()}
    rows = auditviews.audit_rows(run)
    assert [(r["kind"], r["n_deleted"], r["operator"]) for r in rows] == [("deletion", 2, "viewer test")]
    js, page = auditviews.receipt_documents(run, res.request_id)
    assert b"Deletion receipt" in page and auditviews.check_receipt_bytes(run, js)["ok"]
    assert not auditviews.check_receipt_bytes(run, js.replace(b"viewer test", b"someone"))["ok"]
    with pytest.raises(Exception, match="not a receipt"):
        auditviews.check_receipt_bytes(run, b"\x89PNG garbage")
    assert {p: p.stat().st_mtime_ns for p in tiny_run.rglob("*") if p.is_file()} == files  # nothing written
    assert auditviews.refuse_unauthorised(run, [1, 2], "mallory")
    assert auditviews.audit_rows(run)[-1]["kind"] == "refused"
    auditviews.refuse_unauthorised(run, [3], "")  # nobody named: logged with no operator
    table = auditviews.audit_table(auditviews.audit_rows(run))
    assert [r["operator"] for r in table] == ["viewer test", "mallory", "(no operator named)"]
    assert [r["checks passed"] for r in table] == ["yes", "—", "—"] and table[0]["reason refused"] == ""
    assert table[0]["bank size after"] == str(len(run.bank.ids)) and table[2]["executed (UTC)"] == "—"
    assert not any(v is None or str(v) in ("None", "nan") for r in table for v in r.values()), table


@pytest.mark.parametrize("failure", ["full disk", "damaged row file"])
def test_a_request_that_fails_after_its_commit_point_is_not_logged_as_refused(tiny_run: Path, capsys, failure: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk or a damaged checkpoint row file met after journal.json is written: the request is
    committed, so the CLI must not append a 'refused' entry for it (nor show a traceback); the next
    open finishes it."""
    import errno

    from munkey_core.forget import request as deletion
    from munkey_core.errors import MunkeyError
    from munkey_core.service import MunkeyRun

    ids = load_bank(tiny_run).ids[:2].tolist()

    def fail(*a, **k):
        if failure == "full disk":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise MunkeyError("The bank store epoch_015.rows is damaged or truncated (wrong size).")

    monkeypatch.setattr(deletion, "purge_checkpoint_rows", fail)
    code, _, err = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids", ",".join(map(str, ids)), "--no-evaluate")
    assert code == 2 and "committed" in err and "Traceback" not in err and "refused request" not in err
    assert (tiny_run / "journal.json").exists()
    with pytest.raises(MunkeyError, match="is damaged" if failure != "full disk" else "interrupted deletion"):
        MunkeyRun(tiny_run, device="cpu")  # while the cause lasts, opening says so (no traceback)
    monkeypatch.undo()
    run = MunkeyRun(tiny_run, device="cpu")  # the next open finishes the committed request
    assert not set(ids) & set(run.bank.ids.tolist()) and not (tiny_run / "journal.json").exists()
    code, out, _ = run_cli(capsys, "audit", "show", str(tiny_run), "--json")
    kinds = [e["kind"] for e in json.loads(out)["entries"]]
    assert kinds == ["deletion"], kinds
    assert run_cli(capsys, "audit", "verify", str(tiny_run))[0] == 0


def test_same_class_comparison_reweights_the_test_set_to_the_deleted_classes() -> None:
    from munkey_core.eval.evaluate import same_class_comparison

    # deleted: 3 of class 0 (2 right), 1 of class 1 (right); test: class 0 50% right, class 1 100% right,
    # class 2 (absent from the request) 0% right: it must not count
    f_y, f_ok = np.array([0, 0, 0, 1]), np.array([True, True, False, True])
    t_y = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2])
    t_ok = np.array([True, False, True, False, True, True, False, False, False])
    r = same_class_comparison(f_ok, f_y, t_ok, t_y)
    assert r["TA_same_classes"] == pytest.approx(100 * (0.75 * 0.5 + 0.25 * 1.0))  # not 4/9 overall
    assert r["FA_minus_TA_same_classes"] == pytest.approx(75.0 - 62.5)
    se = np.sqrt(0.75 * 0.25 / 4 + 0.75 ** 2 * 0.25 / 4 + 0.25 ** 2 * 0.0)
    assert r["difference_se"] == pytest.approx(100 * se)
    # its 95 % interval: Newcombe's hybrid score interval, written out here from Wilson's bounds, with the
    # reweighted test mean worth Kish's 1 / sum(share^2 / n_class) = 1 / (0.75^2 / 4 + 0.25^2 / 2) ~ 6 samples
    def wilson(p: float, n: int, z: float = 1.959964) -> tuple[float, float]:
        mid, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)

    (l1, u1), (l2, u2) = wilson(0.75, 4), wilson(0.625, 6)
    low, high = 0.125 - np.hypot(0.75 - l1, u2 - 0.625), 0.125 + np.hypot(u1 - 0.75, 0.625 - l2)
    assert r["difference_interval"] == pytest.approx([100 * low, 100 * high], abs=1e-6)


def test_one_deleted_sample_gets_an_interval_not_a_zero_error() -> None:
    """A single deleted sample is always 0 or 100 % right, so FA's binomial error is 0 and "+77.78 ± 14"
    reads as a sure leak; its 95 % interval says one sample cannot tell (it contains 0)."""
    from munkey_core.eval.evaluate import same_class_comparison

    t_y, t_ok = np.zeros(9, int), np.arange(9) < 2  # 2 of 9 unseen samples of its class right
    r = same_class_comparison(np.array([True]), np.array([0]), t_ok, t_y)
    low, high = r["difference_interval"]
    assert r["FA_minus_TA_same_classes"] == pytest.approx(100 - 200 / 9)
    assert low < 0 < r["FA_minus_TA_same_classes"] < high <= 100
    assert low < r["FA_minus_TA_same_classes"] - 2 * r["difference_se"]  # wider than the error said
