"""run/bankonly.py and `munkey forget --no-evaluate`: a deletion without evaluation runs without torch
(nor the other modules of HEAVY) and leaves the same bank, checkpoint rows, forgotten ids, audit entry
and receipt as the full run's `MunkeyRun.forget` on a copy of the same run (tiny digits run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from munkey_core.audit.log import open_log, verify_run
from munkey_core.run import rows
from munkey_core.run.paths import RunPaths

ROOT = Path(__file__).resolve().parents[2]
VOLATILE = {"request_id", "run_id", "received", "executed", "time", "issued", "signature", "entry_hash", "prev_hash",
            "hash", "receipt_sha256"}
# modules a deletion without evaluation does without: the model's libraries, and what it once imported
# for nothing (the receipt page's template engine, Pillow for arrays already decoded, numpy.ma behind
# np.unique, concurrent.futures and the logging it imports, the key-file formats of cryptography)
HEAVY = ("torch", "timm", "torchvision", "jinja2", "PIL", "numpy.ma", "concurrent.futures",
         "cryptography.hazmat.primitives.serialization")
# the CLI in a fresh interpreter; prints which heavy modules it imported by the time it returned
_CHILD = ("import json, sys\nfrom munkey_core.cli import main\nrc = main(sys.argv[1:])\n"
          f"print(json.dumps({{'rc': rc, 'loaded': sorted(m for m in {HEAVY!r} if m in sys.modules)}}))")


def _cli(args: list[str], env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _scrub(obj):
    """The entry or receipt without what differs between two requests by nature (ids, clocks, hashes
    chained on them, signatures)."""
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


def _diff(a, b, at: str = "") -> list[str]:
    """Where two JSON-like values differ (paths), for the failure message."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b)) for p in _diff(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _diff(x, y, f"{at}[{i}]")]
    return [] if a == b else [at]


def _arrays(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k].tolist() for k in data.files}


def _state(run: Path) -> dict:
    """What a deletion leaves on disk, comparable across two copies of a run."""
    bank = rows.load_bank(run)
    forgotten = json.loads(RunPaths(run).forgotten.read_text())
    log = open_log(run, None)
    with log:
        entries = [_scrub(e.body) for e in log.entries()]
    # in log order: two requests in the same second have request ids ordered by their random suffix
    receipts = sorted((json.loads(p.read_text()) for p in (run / "receipts").glob("*.json")),
                      key=lambda r: r["entry"]["seq"])
    return {"bank_ids": bank.ids.tolist(), "bank_fp": bank.fingerprint(),
            "bank_bytes": (run / "bank.store").read_bytes(),
            "rows": {p.name: p.read_bytes() for p in rows.row_files(RunPaths(run).checkpoints)},
            "forgotten": forgotten["ids"], "requests": [r["ids"] for r in forgotten["requests"]],
            "entries": entries, "receipts": [_scrub(r) for r in receipts],
            "derived": {str(p.relative_to(run)): _arrays(p) for p in sorted(run.rglob("*.npz"))},
            "files": sorted(str(p.relative_to(run)) for p in run.rglob("*") if "receipts" not in p.parts
                            and p.name not in {".lock", ".deletion.lock"})}


def test_the_model_fingerprint_read_without_torch_is_the_loaded_models(tiny_run_template: Path,
                                                                       tmp_path: Path) -> None:
    from munkey_core.run.bankonly import weights_fingerprint
    from munkey_core.run.loaded import LoadedMunkeyRun

    run = LoadedMunkeyRun(tiny_run_template, device="cpu")
    assert weights_fingerprint(RunPaths(tiny_run_template).model) == run.model_fingerprint
    other = tmp_path / "not_weights.pt"
    other.write_bytes(b"not a zip")
    assert weights_fingerprint(other) is None


def test_forget_without_evaluation_loads_no_torch_and_matches_the_full_run(tiny_run_template: Path,
                                                                           tmp_path: Path) -> None:
    from munkey_core.service import MunkeyRun

    cli_run, lib_run = tmp_path / "cli", tmp_path / "lib"
    shutil.copytree(tiny_run_template, cli_run)
    shutil.copytree(tiny_run_template, lib_run)
    ids = [int(i) for i in rows.bank_ids(cli_run)[::7][:40]]
    for batch in (ids[:30], ids[25:]):  # the second names 5 ids deleted already
        out = _cli(["forget", str(cli_run), "--ids", ",".join(map(str, batch)), "--operator", "dana", "--no-evaluate"])
        assert out == {"rc": 0, "loaded": []}
        MunkeyRun(lib_run, device="cpu").forget(batch, operator="dana", evaluate=False, source="ids")
    got, want = _state(cli_run), _state(lib_run)
    assert got.keys() == want.keys()
    for key in got:
        assert got[key] == want[key], (key, _diff(got[key], want[key]))
    assert not set(ids) & set(got["bank_ids"]) and len(got["entries"]) == 2 and len(got["receipts"]) == 2
    assert got["entries"][1]["already_deleted"] == ids[25:30]
    assert verify_run(cli_run, None).ok  # the log and its receipts verify


def test_what_the_model_free_path_cannot_read_goes_to_the_full_run(tiny_run_template: Path, tmp_path: Path) -> None:
    """An empty key cache (the evidence's test keys need the encoder) and an unfinished deletion (finishing
    it may evaluate): the command opens the run in full and still deletes; a refused request is recorded
    by the model-free path as by the full one."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run_template, run)
    ids = [int(i) for i in rows.bank_ids(run)[:3]]
    out = _cli(["forget", str(run), "--ids", str(ids[0]), "--operator", "dana", "--no-evaluate"],
               env={"MUNKEY_CACHE": str(tmp_path / "empty-cache")})
    assert out["rc"] == 0 and "torch" in out["loaded"]
    (run / "journal.json").write_text("{}")  # stands for an unfinished deletion: the full path must look at it
    from munkey_core.forget.request import forget_without_model

    assert forget_without_model(run, [ids[1]], operator="dana") is None
    (run / "journal.json").unlink()
    proc = subprocess.run([sys.executable, "-m", "munkey_core.cli", "forget", str(run), "--ids", "99999999",
                           "--operator", "dana", "--no-evaluate"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert proc.returncode != 0 and "recorded in the audit log" in proc.stderr
    log = open_log(run, None)
    with log:
        kinds = [e.body["kind"] for e in log.entries()]
    assert kinds == ["deletion", "refused"]
    assert np.isin(ids[0], rows.bank_ids(run), invert=True)


def test_the_receipt_fingerprints_each_sample_by_its_bank_row_and_its_image(tiny_run_template: Path,
                                                                            tmp_path: Path) -> None:
    """memory_sha256 = sha256(key bytes + exemplar bytes, float32), image_sha256 = sha256("dtype|shape|"
    + pixel bytes), computed here from the run as it was before the request."""
    import hashlib

    from munkey_core.run.bankonly import BankOnlyRun

    before = BankOnlyRun(tiny_run_template)
    run = tmp_path / "run"
    shutil.copytree(tiny_run_template, run)
    ids = [int(i) for i in rows.bank_ids(run)[3::5][:25]]
    out = _cli(["forget", str(run), "--ids", ",".join(map(str, ids)), "--operator", "dana", "--no-evaluate"])
    assert out == {"rc": 0, "loaded": []}
    receipt = json.loads(next((run / "receipts").glob("*.json")).read_text())
    images = before.dataset.lookup(ids).images
    want = []
    for j, i in enumerate(ids):
        r = int(before.bank.rows_of([i])[0])
        img = np.ascontiguousarray(images[j])
        want.append({"id": i,
                     "memory_sha256": hashlib.sha256(before.bank.keys[r].astype(np.float32).tobytes()
                                                     + before.bank.values[r].astype(np.float32).tobytes()).hexdigest(),
                     "image_sha256": hashlib.sha256(f"{img.dtype.str}|{img.shape}|".encode()
                                                    + img.tobytes()).hexdigest()})
    assert receipt["entry"]["body"]["samples"] == want
