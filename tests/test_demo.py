"""`munkey demo` (munkey_core/demo.py) on a copy of the tiny run: the prediction says whether it is right,
the deletion takes the seeded 10%, and the closing lines read the receipt's evidence in words."""

from __future__ import annotations

import json
from pathlib import Path

from munkey_core.data.sampling import random_ids
from munkey_core.demo import run_demo
from munkey_core.service import MunkeyRun


def test_demo_reports_its_prediction_deletion_and_receipt_reading(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    ds = run.dataset
    pred = int(run.predict_images(list(ds.test.images[:1])).labels[0])
    want_ids = random_ids(run.bank.ids, 0.1, seed=0)
    bank_before = len(run.bank.ids)
    del run

    lines: list[str] = []
    out = run_demo(tiny_run, profile="tiny", device="cpu", print_fn=lines.append)
    text = "\n".join(lines)

    right = "right" if pred == int(ds.test.labels[0]) else "wrong"
    assert f"predicted {run_names(tiny_run)[pred]} ({right})" in text
    assert sorted(out["deleted"]) == sorted(int(i) for i in want_ids)
    assert f"bank now {bank_before - len(want_ids)}" in text
    receipt = json.loads(next((tiny_run / "receipts").glob("*.json")).read_text())
    evidence = receipt["entry"]["body"]["evidence"]
    fa_line = next(line for line in lines if line.startswith("  FA: "))
    assert f"vs {evidence['TA_same_classes']:.1f} % on unseen test samples of the same classes" in fa_line
    assert f"FA {evidence['request_FA_after']:.1f} %" in fa_line
    assert any(line.startswith("  MIA: ") for line in lines)
    assert "None" not in text and "nan" not in text


def run_names(run_dir: Path) -> list[str]:
    return MunkeyRun(run_dir, device="cpu").class_names
