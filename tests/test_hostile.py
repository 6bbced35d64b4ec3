"""Hostile input and tampering, as an adversarial user would try them (issue 15): every bad input is
refused cleanly (exit status 2, one line, no traceback, nothing changed), no user file is touched,
receipts and log heads are signed, pseudonyms need a key that is not in the run, and reads do not
wait behind a deletion's evaluation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import logging
import os
import re
import shutil
import sqlite3
import stat
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from _helpers import fork, reap, sqlite_exec
from munkey_core.cli import main
from munkey_core.errors import MunkeyError
from munkey_core.run.rows import bank_ids

OP = ("--operator", "Dana Ortiz (DPO)")
REPO = Path(__file__).resolve().parents[1]


def run_cli(capsys: pytest.CaptureFixture, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_clean_refusal(code: int, err: str) -> None:
    """Exit status 2 and exactly one line on stderr, 'error: ...'; never a traceback."""
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under root (the empty lock files aside)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def data_snapshot(root: Path) -> dict[str, str]:
    """The run's data files: what a refused request must never change (its log entry aside)."""
    return {k: v for k, v in snapshot(root).items()
            if k.startswith(("bank.store", "checkpoints/", "forgotten.json", "model.pt", "config.json"))}


def bank(root: Path) -> list[int]:
    return [int(i) for i in bank_ids(root)]


def log_bodies(root: Path) -> list[dict]:
    con = sqlite3.connect(root / "audit.sqlite")
    try:
        return [json.loads(b) for (b,) in con.execute("SELECT body FROM audit_log ORDER BY seq")]
    finally:
        con.close()


def verify(capsys, root: Path, *extra) -> dict:
    code, out, err = run_cli(capsys, "audit", "verify", root, "--json", *extra)
    assert code in (0, 1), err
    return json.loads(out)


# --------------------------------------------------------------------------- 1. ids: the right samples or none


def test_a_quoted_csv_field_never_deletes_the_wrong_sample(tiny_run: Path, tmp_path: Path, capsys) -> None:
    decoy, victim = bank(tiny_run)[3], bank(tiny_run)[5]
    f = tmp_path / "request.csv"
    f.write_text(f'name,id\n"Doe, {decoy}",{victim}\n')
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids-file", f, *OP, "--no-evaluate")
    assert code == 0, err
    assert json.loads((tiny_run / "forgotten.json").read_text())["ids"] == [victim]
    assert decoy in bank(tiny_run) and victim not in bank(tiny_run)
    # the dashboard's preview reads typed and uploaded ids with the very same parser
    from munkey_core.dashboard import views
    from munkey_core.forget import ids as keydelete
    assert views.ids_from_bytes is keydelete.ids_from_bytes
    assert "from munkey_core.forget.ids import parse_ids" in (REPO / "pages" / "deletions.py").read_text()
    with pytest.raises(MunkeyError, match="malformed"):
        keydelete.parse_ids(f'name,value\n"Doe, {decoy}",{victim}\n')  # no id column: refused, nothing guessed


@pytest.mark.parametrize("bad", [str(2 ** 70), str(2 ** 63), "-4", "1e3", "٣"])
def test_ids_outside_int64_are_refused_cleanly_and_the_refusal_is_logged(tiny_run: Path, capsys, bad: str) -> None:
    before = data_snapshot(tiny_run)
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", bad, *OP)
    assert_clean_refusal(code, err)
    assert "recorded in the audit log" in err
    bodies = log_bodies(tiny_run)
    assert [b["kind"] for b in bodies] == ["refused"]
    assert data_snapshot(tiny_run) == before
    assert verify(capsys, tiny_run)["ok"]


def test_an_id_beyond_2_53_not_in_the_bank_is_refused_and_logged(tiny_run: Path, capsys) -> None:
    big = 2 ** 53 + 1
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", f"{bank(tiny_run)[0]},{big}", *OP)
    assert_clean_refusal(code, err)
    (body,) = log_bodies(tiny_run)
    assert body["kind"] == "refused" and body["requested_ids"][1] == str(big)  # exact, as text
    assert bank(tiny_run)[0] in bank(tiny_run)
    assert verify(capsys, tiny_run)["ok"]


def test_repeated_ids_options_are_merged(tiny_run: Path, capsys) -> None:
    a, b = bank(tiny_run)[6], bank(tiny_run)[8]
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", a, "--ids", b, *OP, "--no-evaluate")
    assert code == 0, err
    assert sorted(json.loads((tiny_run / "forgotten.json").read_text())["ids"]) == sorted([a, b])


def test_a_huge_ids_file_is_refused_before_it_is_read(tiny_run: Path, tmp_path: Path, capsys) -> None:
    f = tmp_path / "huge.txt"
    with open(f, "wb") as fh:
        fh.truncate(50 * 1024 * 1024)  # 50 MB, sparse: reading it would take the time the check avoids
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids-file", f, *OP)
    assert_clean_refusal(code, err)
    assert "MB" in err
    assert (tiny_run / "audit.sqlite").stat().st_size < 1_000_000


def test_a_refusal_naming_many_ids_keeps_the_log_small(tiny_run: Path, tmp_path: Path, capsys) -> None:
    unknown = list(range(10 ** 9, 10 ** 9 + 200_000))
    f = tmp_path / "many.txt"
    f.write_text("\n".join(map(str, unknown)))
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids-file", f, *OP)
    assert_clean_refusal(code, err)
    (body,) = log_bodies(tiny_run)
    assert body["requested_count"] == 200_000 and len(body["requested_ids"]) == 100
    assert body["requested_ids_sha256"] == hashlib.sha256(",".join(map(str, unknown)).encode()).hexdigest()
    assert len(json.dumps(body)) < 20_000


# --------------------------------------------------------------------------- 1. images and receipts: limits first


def _npy_header_only(shape: tuple, descr: str = "<f8") -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (118 - len(header) - 1) + "\n"  # 10 + 118 = 128 bytes
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1")


def test_an_npy_header_claiming_a_huge_array_is_refused_before_allocating(tiny_run: Path, tmp_path: Path,
                                                                            capsys) -> None:
    from munkey_core.data.images import decode_image

    data = _npy_header_only((100000, 100000))
    assert len(data) == 128
    with pytest.raises(MunkeyError, match="declares an array"):
        decode_image(data, "bomb.npy")
    with pytest.raises(MunkeyError, match="truncated"):
        decode_image(_npy_header_only((64, 64)), "short.npy")  # a small header whose data is missing
    with pytest.raises(MunkeyError, match="not pixels"):
        decode_image(_npy_header_only((8, 8), "|O"), "objects.npy")
    f = tmp_path / "bomb.npy"
    f.write_bytes(data)
    code, _, err = run_cli(capsys, "predict", tiny_run, f)
    assert_clean_refusal(code, err)


def test_an_image_over_the_pixel_limit_is_refused_before_decoding(tmp_path: Path) -> None:
    from munkey_core.data.images import MAX_PIXELS, decode_image

    buf = io.BytesIO()
    Image.new("1", (13000, 13000)).save(buf, "PNG")  # ~20 KB on disk, 169 M pixels once decoded
    assert 13000 * 13000 > MAX_PIXELS and len(buf.getvalue()) < 100_000
    with pytest.raises(MunkeyError, match="13000 x 13000 pixels"):
        decode_image(buf.getvalue(), "huge.png")


def _a_receipt(tiny_run: Path, capsys) -> Path:
    code, out, err = run_cli(capsys, "forget", tiny_run, "--ids", bank(tiny_run)[0], *OP, "--no-evaluate", "--json")
    assert code == 0, err
    return Path(json.loads(out)["receipt"])


@pytest.mark.parametrize("mutate", [
    lambda r: {**r, "log_head": "x"}, lambda r: {**r, "log_head": {"seq": "a", "hash": 5}},
    lambda r: {**r, "log_head": [1, 2]}, lambda r: {**r, "entry": {**r["entry"], "seq": 2 ** 70}},
    lambda r: {**r, "entry": "oops"}, lambda r: {**r, "receipt_sha256": None},
    lambda r: {k: v for k, v in r.items() if k != "signature"},
])
def test_verify_receipt_on_malformed_fields_is_a_clean_error(tiny_run: Path, tmp_path: Path, capsys, mutate) -> None:
    receipt = json.loads(_a_receipt(tiny_run, capsys).read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(receipt)))
    for argv in (("audit", "verify-receipt", bad, tiny_run), ("audit", "verify-receipt", bad)):
        code, _, err = run_cli(capsys, *argv)
        assert_clean_refusal(code, err)


@pytest.mark.parametrize("text", ["[" * 200_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_verify_receipt_on_deeply_nested_json_is_a_clean_error(tiny_run: Path, tmp_path: Path, capsys,
                                                               text: str) -> None:
    bad = tmp_path / "nested.json"
    bad.write_text(text)
    code, _, err = run_cli(capsys, "audit", "verify-receipt", bad, tiny_run)
    assert_clean_refusal(code, err)


# --------------------------------------------------------------------------- 2. never touching user files


def _user_folder(tmp_path: Path) -> Path:
    d = tmp_path / "my_project"
    (d / "checkpoints").mkdir(parents=True)
    (d / "model.pt").write_bytes(b"my own model")
    (d / "history.json").write_text('{"mine": true}')
    (d / "checkpoints" / "epoch_000.pt").write_bytes(b"my own checkpoint")
    (d / "config.json").write_text('{"dataset": "digits", "note": "not a run"}')
    return d


def test_train_out_on_a_user_folder_or_file_is_refused_and_nothing_is_touched(tmp_path: Path, capsys) -> None:
    folder = _user_folder(tmp_path)
    before = snapshot(folder)
    for arch in ("munkey", "resnet18"):
        code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--profile", "tiny", "--arch", arch,
                               "--out", folder)
        assert_clean_refusal(code, err)
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--out", f)
    assert_clean_refusal(code, err)
    assert snapshot(folder) == before and sorted(p.name for p in folder.rglob("*")) == sorted(
        ["checkpoints", "model.pt", "history.json", "epoch_000.pt", "config.json"]) and f.read_text() == "keep me"


@pytest.mark.parametrize("arch", ["munkey", "resnet18", "vit"])
@pytest.mark.parametrize("option", [("--epochs", "0"), ("--epochs", "-3"), ("--batch-size", "0"), ("--lr", "-1"),
                                    ("--lr", "nan"), ("--k", "0"), ("--tau", "0"), ("--p-retrieval", "2"),
                                    ("--p-drop-image", "-0.1"), ("--augment-shift", "1.5"), ("--max-train", "-5"),
                                    ("--seed", "-1"), ("--weight-decay", "-0.01")])
def test_a_training_option_out_of_range_is_refused_before_any_folder_is_made(tmp_path: Path, capsys, arch: str,
                                                                             option: tuple[str, str]) -> None:
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--profile", "tiny", "--arch", arch, *option,
                           "--out", out)
    assert_clean_refusal(code, err)
    name = option[0][2:].replace("-", "_")
    assert f"{name} ({option[0]}) must be" in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_predict_with_k_zero_is_refused_not_read_as_the_default(tiny_run: Path, tmp_path: Path, capsys) -> None:
    img = tmp_path / "x.png"
    Image.new("L", (8, 8)).save(img)
    code, _, err = run_cli(capsys, "predict", tiny_run, img, "--k", "0")
    assert_clean_refusal(code, err)
    assert "K must be at least 1 (got 0)" in err


def test_predict_on_a_folder_says_it_is_a_folder(tiny_run: Path, tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "predict", tiny_run, tmp_path)
    assert_clean_refusal(code, err)
    assert "is a folder, not an image file" in err and "does not exist" not in err


def test_a_receipt_folder_and_a_negative_n_get_messages_that_say_what_to_give(tiny_run: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "audit", "verify-receipt", tiny_run, tiny_run)
    assert_clean_refusal(code, err)
    assert "is a folder; give one receipt's .json file" in err
    code, _, err = run_cli(capsys, "unact", tiny_run, "--class", "3", "--n", "-4", "--no-save")
    assert_clean_refusal(code, err)
    assert "or 0 for all of them (got -4)" in err  # it said "at least 1", hiding that 0 (the default) means all


def test_a_noise_floor_of_thousands_of_retrainings_is_refused_before_any(tiny_run: Path, tmp_path: Path,
                                                                          capsys) -> None:
    """--noise-floor 100000 began 100,000 retrainings of the model; --noise-floor without --oracle did nothing."""
    assert run_cli(capsys, "forget", tiny_run, "--ids", "3", "--no-evaluate", *OP)[0] == 0
    before = snapshot(tiny_run)
    code, _, err = run_cli(capsys, "evaluate", tiny_run, "--oracle", "--noise-floor", "100000")
    assert_clean_refusal(code, err)
    assert "give 0 to 10" in err and snapshot(tiny_run) == before  # no oracle trained, nothing written
    code, _, err = run_cli(capsys, "evaluate", tiny_run, "--noise-floor", "2")
    assert_clean_refusal(code, err)
    assert "add --oracle" in err
    code, _, err = run_cli(capsys, "bench", "fidelity", "--profile", "tiny", "--floor-oracles", "11",
                           "--work", tmp_path / "w")
    assert_clean_refusal(code, err)
    assert "give 0 to 10" in err and not (tmp_path / "w").exists()


def test_no_command_writes_into_a_folder_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    folder = _user_folder(tmp_path)
    img = tmp_path / "x.png"
    Image.new("L", (8, 8)).save(img)
    before = sorted(p.name for p in folder.rglob("*")), snapshot(folder)
    for argv in (["forget", folder, "--ids", "1", *OP], ["forget", folder, "--ids", "x", *OP],
                 ["audit", "verify", folder], ["audit", "show", folder], ["audit", "receipt", folder, "req-1"],
                 ["evaluate", folder], ["predict", folder, img], ["select", folder, "--out", tmp_path / "sel"],
                 ["unact", folder, "--class", "1", "--method", "keys", "--operator", "x"]):
        code, _, err = run_cli(capsys, *argv)
        assert_clean_refusal(code, err)
        assert (sorted(p.name for p in folder.rglob("*")), snapshot(folder)) == before, argv


def test_audit_verify_of_a_folder_that_is_not_a_run_is_an_error(capsys) -> None:
    code, out, err = run_cli(capsys, "audit", "verify", "/")
    assert_clean_refusal(code, err)
    assert "intact" not in out


# --------------------------------------------------------------------------- 3. class edits carry the trail


def test_class_key_deletion_on_a_run_with_earlier_deletions_verifies(tiny_run: Path, capsys) -> None:
    from munkey_core.run.rows import load_bank

    b = load_bank(tiny_run)
    earlier = [int(i) for i in b.ids[b.labels != 2][:8]]
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", ",".join(map(str, earlier)), *OP, "--no-evaluate")
    assert code == 0, err
    parent_head = json.loads((tiny_run / "audit_head.json").read_text())
    out = tiny_run.parent / "no_twos"
    code, _, err = run_cli(capsys, "unact", tiny_run, "--class", "2", "--n", "5", "--method", "keys", "--operator",
                           "bob", "--out", out)
    assert code == 0, err
    v = verify(capsys, out)
    assert v["ok"], v["message"]
    lineage, deletion = log_bodies(out)
    assert lineage["kind"] == "lineage" and sorted(lineage["inherited_deleted_ids"]) == sorted(earlier)
    assert lineage["parent"]["log_head"] == {"seq": parent_head["seq"], "hash": parent_head["hash"]}
    assert deletion["kind"] == "deletion" and deletion["operator"] == "bob"
    assert verify(capsys, tiny_run)["ok"]  # the parent is untouched


# --------------------------------------------------------------------------- 4. signatures


def _jcs(obj) -> bytes:
    """An independent canonical JSON for objects without floats (what receipts hold with --no-evaluate):
    sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _no_floats(obj) -> bool:
    if isinstance(obj, float):
        return False
    if isinstance(obj, dict):
        return all(_no_floats(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_no_floats(v) for v in obj)
    return True


def test_a_receipt_verifies_with_only_the_public_key(tiny_run: Path, capsys) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    path = _a_receipt(tiny_run, capsys)
    code, out, _ = run_cli(capsys, "audit", "key", "--json")
    public = json.loads(out)["public_key"]
    receipt = json.loads(path.read_text())
    assert receipt["public_key"] == public and _no_floats(receipt)
    # independently of munkey: Ed25519 over the canonical JSON of every field but the signature
    content = _jcs({k: v for k, v in receipt.items() if k != "signature"})
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(public)).verify(
        base64.b64decode(receipt["signature"]["value"]), content)
    code, out, err = run_cli(capsys, "audit", "verify-receipt", path, "--public-key", public)
    assert code == 0 and "VALID" in out, err
    code, out, _ = run_cli(capsys, "audit", "verify-receipt", path, tiny_run, "--public-key", public)
    assert code == 0 and "VALID" in out
    code, out, _ = run_cli(capsys, "audit", "verify-receipt", path, "--public-key", "ab" * 32)
    assert code == 1 and "INVALID" in out  # not the trusted key
    # the private key is outside the run, owner-only
    key_file = Path(json.loads(run_cli(capsys, "audit", "key", "--json")[1])["key_file"])
    assert not key_file.resolve().is_relative_to(tiny_run.resolve())
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    secret = key_file.read_bytes()
    assert not any(secret in p.read_bytes() for p in tiny_run.rglob("*") if p.is_file())


def test_a_changed_issued_time_with_a_recomputed_hash_fails(tiny_run: Path, capsys) -> None:
    from munkey_core.audit.canonical import canonical_bytes

    path = _a_receipt(tiny_run, capsys)
    receipt = json.loads(path.read_text())
    receipt["issued"] = "2020-01-01T00:00:00.000Z"
    rest = {k: v for k, v in receipt.items() if k not in ("receipt_sha256", "signature")}
    receipt["receipt_sha256"] = hashlib.sha256(canonical_bytes(rest)).hexdigest()
    path.write_text(json.dumps(receipt))
    for argv in (("audit", "verify-receipt", path, tiny_run), ("audit", "verify-receipt", path)):
        code, out, err = run_cli(capsys, *argv)
        assert code == 1 and "INVALID" in out and "signature" in out, (out, err)


def test_cutting_a_refused_entry_and_editing_the_head_is_detected(tiny_run: Path, capsys) -> None:
    _a_receipt(tiny_run, capsys)
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", "999999999", *OP)
    assert_clean_refusal(code, err)
    refused = log_bodies(tiny_run)[-1]
    assert refused["kind"] == "refused"
    receipt = tiny_run / "receipts" / f"{refused['request_id']}.json"
    assert receipt.is_file()  # refusals are anchored by a signed receipt too
    first = sqlite3.connect(tiny_run / "audit.sqlite").execute(
        "SELECT entry_hash FROM audit_log WHERE seq = 1").fetchone()[0]
    sqlite_exec(tiny_run, "DELETE FROM audit_log WHERE seq = 2")
    head = json.loads((tiny_run / "audit_head.json").read_text())
    (tiny_run / "audit_head.json").write_text(json.dumps({**head, "seq": 1, "hash": first}))
    v = verify(capsys, tiny_run)
    assert not v["ok"] and v["problem"] == "forged"
    (tiny_run / "audit_head.json").write_text(json.dumps({"seq": 1, "hash": first}))  # signature stripped
    v = verify(capsys, tiny_run)
    assert not v["ok"] and v["problem"] == "unsigned"
    code, out, _ = run_cli(capsys, "audit", "verify-receipt", receipt, tiny_run)
    assert code == 1 and "INVALID" in out


def test_a_stale_bank_store_copied_back_is_reported_not_applied(tiny_run: Path, tmp_path: Path, capsys) -> None:
    from munkey_core.service import MunkeyRun

    shutil.copy2(tiny_run / "bank.store", tmp_path / "bank.store.old")
    victims = bank(tiny_run)[:3]
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", ",".join(map(str, victims)), *OP, "--no-evaluate")
    assert code == 0, err
    shutil.copy2(tmp_path / "bank.store.old", tiny_run / "bank.store")  # deleted rows restored
    run = MunkeyRun(tiny_run, device="cpu")
    assert all(v in run.bank for v in victims)  # opening did not "finish" anything on its own
    assert [b["kind"] for b in log_bodies(tiny_run)] == ["deletion"]  # no entry under operator "unknown"
    v = verify(capsys, tiny_run)
    assert not v["ok"] and "memory bank again" in v["message"]
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", ",".join(map(str, victims)), *OP, "--no-evaluate")
    assert code == 0, err  # filed again by an operator: deleted again, and recorded
    assert not set(victims) & set(bank(tiny_run)) and verify(capsys, tiny_run)["ok"]


def test_an_id_added_to_forgotten_json_is_reported_not_deleted(tiny_run: Path, capsys) -> None:
    from munkey_core.service import MunkeyRun

    victim = bank(tiny_run)[4]
    (tiny_run / "forgotten.json").write_text(json.dumps({"ids": [victim], "requests": []}))
    MunkeyRun(tiny_run, device="cpu")
    assert victim in bank(tiny_run) and not (tiny_run / "audit.sqlite").exists()
    v = verify(capsys, tiny_run)
    assert not v["ok"] and v["problem"] == "inconsistent"


def test_restored_checkpoint_rows_are_detected(tiny_run: Path, tmp_path: Path, capsys) -> None:
    rows = sorted((tiny_run / "checkpoints").glob("epoch_*.rows"))[-1]
    shutil.copy2(rows, tmp_path / "old.rows")
    victims = bank(tiny_run)[:2]
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", ",".join(map(str, victims)), *OP, "--no-evaluate")
    assert code == 0, err
    assert verify(capsys, tiny_run)["ok"]
    shutil.copy2(tmp_path / "old.rows", rows)
    v = verify(capsys, tiny_run)
    assert not v["ok"] and rows.name in v["message"]


# --------------------------------------------------------------------------- 5. pseudonyms and file modes


def test_a_subject_pseudonym_cannot_be_undone_from_the_run(tiny_run: Path, capsys, monkeypatch) -> None:
    subject = "DSR-2026-0042"
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", bank(tiny_run)[0], *OP, "--no-evaluate",
                           "--subject", subject)
    assert code == 0, err
    ref = log_bodies(tiny_run)[0]["subject_ref"]
    assert ref.startswith("hmac-sha256:") and subject not in json.dumps(log_bodies(tiny_run))
    digest = ref.rsplit(":", 1)[1]
    # every hex string stored anywhere in the run, tried as the HMAC key: none reproduces the pseudonym
    tokens = set()
    for p in tiny_run.rglob("*"):
        if p.is_file():
            tokens.update(re.findall(rb"[0-9a-f]{32,128}", p.read_bytes()))
    assert tokens
    for t in tokens:
        for key in (bytes.fromhex(t.decode()) if len(t) % 2 == 0 else b"", t):
            assert hmac.new(key, subject.encode(), hashlib.sha256).hexdigest()[:32] != digest
    assert "subject_salt" not in json.loads((tiny_run / "audit.json").read_text())
    # rotation: another key gives another, visibly different pseudonym
    monkeypatch.setenv("MUNKEY_SUBJECT_KEY", "11" * 32)
    from munkey_core.audit.signing import subject_ref
    other = subject_ref(subject)
    assert other != ref and other.split(":")[1] != ref.split(":")[1]
    assert other.rsplit(":", 1)[1] == hmac.new(b"\x11" * 32, subject.encode(), hashlib.sha256).hexdigest()[:32]


def test_run_files_are_owner_only(tiny_run_template: Path, tiny_run: Path, capsys) -> None:
    def loose(root: Path) -> list[str]:
        return [f"{p.relative_to(root)} {stat.S_IMODE(p.stat().st_mode):o}" for p in [root, *root.rglob("*")]
                if stat.S_IMODE(p.stat().st_mode) & 0o077]

    assert loose(tiny_run_template) == []  # as training wrote it
    os.chmod(tiny_run, 0o700)
    _a_receipt(tiny_run, capsys)  # the CLI's own files: log, anchor, receipts
    new = [p for p in tiny_run.rglob("*") if p.name.startswith(("audit", "receipts")) or "receipts" in p.parts]
    assert new and all(not stat.S_IMODE(p.stat().st_mode) & 0o077 for p in new)


def _make_old_format_run(root: Path) -> dict:
    """What an older version left: a salted binding, an unsigned head and an unsigned receipt (format 1)."""
    from munkey_core.audit import log as audit
    from munkey_core.audit.backends import Row, SqliteStore
    from munkey_core.audit.canonical import canonical_bytes, canonical_json

    run_id = "00000000-0000-4000-8000-000000000001"
    (root / "audit.json").write_text(json.dumps({"format": 1, "run_id": run_id, "created": "2025-01-01T00:00:00Z",
                                                 "subject_salt": "ab" * 16, "backend": "sqlite",
                                                 "location": "audit.sqlite"}))
    body = {"kind": "refused", "request_id": "req-old-1", "run_id": run_id, "reason": "old", "requested_ids": [],
            "operator": "old operator", "subject_ref": None, "received": "2025-01-01T00:00:00.000Z"}
    h = audit.entry_hash(run_id, 1, audit.GENESIS, body)
    store = SqliteStore(root / "audit.sqlite", create=True)
    store.append(run_id, lambda head: Row(1, "req-old-1", "refused", audit.GENESIS, h, canonical_json(body)),
                 lambda row: None)
    store.close()
    (root / "audit_head.json").write_text(json.dumps({"seq": 1, "hash": h}))
    receipt = {"receipt_format": "munkey-receipt/1", "issued": "2025-01-01T00:00:00.000Z", "request_id": "req-old-1",
               "run_id": run_id, "log": "sqlite:audit.sqlite",
               "entry": {"seq": 1, "prev_hash": audit.GENESIS, "entry_hash": h, "body": body},
               "log_head": {"seq": 1, "hash": h}}
    receipt["receipt_sha256"] = hashlib.sha256(canonical_bytes(receipt)).hexdigest()
    (root / "old_receipt.json").write_text(json.dumps(receipt))
    return receipt


def test_a_run_from_before_signing_still_opens_forgets_and_verifies(tiny_run: Path, capsys) -> None:
    _make_old_format_run(tiny_run)
    v = verify(capsys, tiny_run)
    assert v["ok"] and any("unsigned (older format)" in n for n in v["notes"])
    code, out, _ = run_cli(capsys, "audit", "verify-receipt", tiny_run / "old_receipt.json", tiny_run)
    assert code == 0 and "unsigned (older format)" in out
    code, _, err = run_cli(capsys, "forget", tiny_run, "--ids", bank(tiny_run)[0], *OP, "--no-evaluate")
    assert code == 0, err
    v = verify(capsys, tiny_run)
    assert v["ok"] and v["signed_by"] and "subject_salt" not in json.loads((tiny_run / "audit.json").read_text())
    code, out, _ = run_cli(capsys, "audit", "verify-receipt", tiny_run / "old_receipt.json", tiny_run)
    assert code == 0 and "unsigned (older format)" in out


# --------------------------------------------------------------------------- 6. the dashboard


def test_the_dashboard_listens_on_localhost_only() -> None:
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] in ("127.0.0.1", "localhost")


def test_failed_credentials_are_logged_and_slowed(caplog) -> None:
    from munkey_core.dashboard.views import CredentialGate

    slept: list[float] = []
    now = [0.0]
    gate = CredentialGate(base_delay=0.5, max_delay=4.0, lockout=6, window=900, sleep=slept.append,
                          clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="munkey.auth"):
        assert not gate.check("guess-1", "s3cret") and not gate.check("guess-2", "s3cret")
        assert not gate.check("guess-3", "s3cret") and not gate.check("guess-4", "s3cret")
    assert slept == [0.5, 1.0, 2.0, 4.0]  # doubling, capped
    assert len([r for r in caplog.records if "failed operator credential" in r.getMessage()]) == 4
    assert "guess" not in caplog.text and "s3cret" not in caplog.text
    assert gate.check("s3cret", "s3cret") and len(slept) == 4  # the right one: no delay
    locked = CredentialGate(base_delay=0.0, lockout=3, window=900, sleep=slept.append, clock=lambda: now[0])
    for i in range(3):
        assert not locked.check(f"guess-{i}", "s3cret")
    assert not locked.check("s3cret", "s3cret")  # locked out: even the right one is refused until the window passes
    now[0] += 901
    assert locked.check("s3cret", "s3cret")


def test_a_viewer_cannot_start_training_from_the_dashboard(tmp_path: Path, tiny_run: Path, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    token = "correct horse battery staple"
    monkeypatch.setenv("MUNKEY_OPERATOR_TOKEN", token)
    monkeypatch.delenv("MUNKEY_AUTOTRAIN", raising=False)
    monkeypatch.setenv("MUNKEY_PROFILE", "tiny")
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("MUNKEY_RUN", str(fresh))
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60).run()
    assert at.title[0].value == "No MUNKEY run yet"
    assert at.button(key="train_start").disabled  # a credential is configured: training needs it
    time.sleep(1.0)
    at.run()
    assert not fresh.exists()  # nothing was started by a viewer's visit
    at.text_input(key="train_credential").input("a guess").run()
    assert at.button(key="train_start").disabled
    at.text_input(key="train_credential").input(token).run()
    assert not at.button(key="train_start").disabled
    # the class page: training a ResNet-18 beside the run writes a run folder, so it needs the credential
    monkeypatch.setenv("MUNKEY_RUN", str(tiny_run))
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60).run()
    at.switch_page("pages/class_unlearning.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.button(key="train_resnet").disabled
    at.text_input(key="resnet_credential").input(token).run()
    assert not at.button(key="train_resnet").disabled
    assert not (tiny_run.parent / f"{tiny_run.name}_resnet18").exists()


# --------------------------------------------------------------------------- 7. reads during an evaluation


def test_a_predict_is_not_blocked_by_an_evaluated_deletion(tiny_run: Path, tmp_path: Path) -> None:
    from munkey_core.service import MunkeyRun

    pause = tmp_path / "pause"
    pause.write_text("")
    victims = ",".join(map(str, bank(tiny_run)[:5]))
    from _helpers import cli
    pid = fork(cli("forget", str(tiny_run), "--ids", victims, *OP, "--max-samples", "50"),
               env={"MUNKEY_PAUSE_AT": "evaluating", "MUNKEY_PAUSE_FILE": str(pause)})
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{pause}.reached").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Path(f"{pause}.reached").exists(), "the deletion never reached its evaluation"
        os.environ["MUNKEY_LOCK_TIMEOUT"] = "10"
        run = MunkeyRun(tiny_run, device="cpu")  # opening takes the shared lock: not held by the evaluation
        preds = run.predict_images([np.zeros((8, 8, 1), np.uint8)])
        assert len(preds.labels) == 1
        assert (tiny_run / "journal.json").exists() and os.waitpid(pid, os.WNOHANG) == (0, 0)  # still evaluating
        assert all(int(v) not in run.bank for v in victims.split(","))
    finally:
        os.environ.pop("MUNKEY_LOCK_TIMEOUT", None)
        pause.unlink(missing_ok=True)
        code = reap(pid)
    assert code == 0
    assert not (tiny_run / "journal.json").exists()
    body = log_bodies(tiny_run)[-1]
    assert body["kind"] == "deletion" and body["metrics"]["after"] is not None


# --------------------------------------------------------------------------- a corpus of malformed files


def _corpus() -> dict[str, bytes]:
    png = io.BytesIO()
    Image.new("L", (8, 8)).save(png, "PNG")
    return {
        "empty": b"", "nul": b"\x00" * 64, "binary": bytes(range(256)) * 4, "bad_utf8": b"\xff\xfe\xfa\xfb",
        "nested": b"[" * 200_000, "json_list": b"[1, 2]", "npy_bomb": _npy_header_only((100000, 100000)),
        "truncated_png": png.getvalue()[:40], "words": b"hello, world\n", "huge_int": str(2 ** 80).encode(),
    }


@pytest.mark.parametrize("name", list(_corpus()))
def test_malformed_files_fed_to_every_command(tiny_run: Path, tmp_path: Path, capsys, name: str) -> None:
    data = _corpus()[name]
    f = tmp_path / f"{name}.png"
    f.write_bytes(data)
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / f"{name}.npy").write_bytes(data)
    before = data_snapshot(tiny_run)
    for argv in (["predict", tiny_run, f], ["forget", tiny_run, "--ids-file", f, *OP, "--no-evaluate"],
                 ["audit", "verify-receipt", f, tiny_run], ["audit", "verify-receipt", f],
                 ["unact", tiny_run, "--images", folder, "--method", "keys", "--no-save"],
                 ["train", "--dataset", "digits", "--out", f], ["audit", "verify", f], ["evaluate", f],
                 ["forget", f, "--ids", "1", *OP], ["audit", "verify", tiny_run, "--public-key", f]):
        code, _, err = run_cli(capsys, *argv)
        assert_clean_refusal(code, err)
    assert data_snapshot(tiny_run) == before and f.read_bytes() == data


@pytest.mark.parametrize("name", list(_corpus()))
def test_malformed_uploads_fed_to_what_the_pages_call(tiny_run: Path, name: str) -> None:
    from munkey_core.dashboard.auditviews import check_receipt_bytes
    from munkey_core.data.images import decode_image
    from munkey_core.service import MunkeyRun
    from munkey_core.dashboard.views import ids_from_bytes

    data = _corpus()[name]
    run = MunkeyRun(tiny_run, device="cpu")
    for call in (lambda: decode_image(data, f"{name}.png"), lambda: decode_image(data, f"{name}.npy"),
                 lambda: check_receipt_bytes(run, data, name)):
        with pytest.raises(MunkeyError):
            call()
    with pytest.raises(MunkeyError):
        ids_from_bytes(data, name)
