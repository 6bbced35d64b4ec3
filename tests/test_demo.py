"""`munkey demo` (munkey_core/demo.py) on a copy of the tiny run: its example is the first test sample it gets
right (and says how many before it were wrong), the prediction says whether it is right,
the deletion takes the seeded 10%, and the closing lines read the receipt's evidence in words."""

from __future__ import annotations

import json
from pathlib import Path

from munkey_core.data.sampling import random_ids
from munkey_core.cli import main
from munkey_core.demo import run_demo
from munkey_core.service import MunkeyRun


def test_demo_reports_its_prediction_deletion_and_receipt_reading(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    ds = run.dataset
    # the example: the first of the first 20 test samples predicted right, each predicted on its own here
    singles = [int(run.predict_images([img]).labels[0]) for img in ds.test.images[:20]]
    i = next((j for j, p in enumerate(singles) if p == int(ds.test.labels[j])), 0)
    pred = singles[i]
    want_ids = random_ids(run.bank.ids, 0.1, seed=0)
    bank_before = len(run.bank.ids)
    del run

    lines: list[str] = []
    out = run_demo(tiny_run, profile="tiny", device="cpu", print_fn=lines.append)
    text = "\n".join(lines)

    right = "right" if pred == int(ds.test.labels[i]) else "wrong"
    assert f"\ntest sample {int(ds.test.ids[i])} (" in text
    assert f"predicted {run_names(tiny_run)[pred]} ({right})" in text
    assert (f"the {i} before it are predicted wrongly" if i > 1 else "the one before it is" if i == 1
            else "(the first test sample;") in text
    assert sorted(out["deleted"]) == sorted(int(i) for i in want_ids)
    assert f"bank now {bank_before - len(want_ids)}" in text
    receipt = json.loads(next((tiny_run / "receipts").glob("*.json")).read_text())
    evidence = receipt["entry"]["body"]["evidence"]
    fa_line = next(line for line in lines if line.startswith("  FA: "))
    assert f"vs {evidence['TA_same_classes']:.1f} % on unseen test samples of the same classes" in fa_line
    assert f"FA {evidence['request_FA_after']:.1f} %" in fa_line
    assert any(line.startswith("  MIA: ") for line in lines)
    assert "None" not in text and "nan" not in text

    # a second demo on the same run would cut another 10% for good: refused, nothing changed
    def state() -> tuple:
        return (MunkeyRun(tiny_run, device="cpu").bank.fingerprint(), (tiny_run / "forgotten.json").read_bytes(),
                (tiny_run / "audit_head.json").read_bytes(), sorted(p.name for p in (tiny_run / "receipts").iterdir()))

    before = state()
    assert main(["demo", "--out", str(tiny_run), "--profile", "tiny", "--device", "cpu"]) == 2
    assert main(["demo", "--out", str(tiny_run), "--profile", "tiny", "--fraction", "1.5"]) == 2
    assert state() == before


def run_names(run_dir: Path) -> list[str]:
    return MunkeyRun(run_dir, device="cpu").class_names
