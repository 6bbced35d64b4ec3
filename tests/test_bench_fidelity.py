"""`munkey bench fidelity` smoke test on digits (tiny profile, 3 epochs): every method measured against
its oracle, tables written, and a re-run resumes from the cache without training anything."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from munkey_core.cli import main


def test_bench_fidelity_runs_and_resumes(cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["bench", "fidelity", "--dataset", "digits", "--profile", "tiny", "--seeds", "1", "--rates", "0.1",
            "--epochs", "3", "--mia", "strong", "--methods", "neggrad+,ssd", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out"), "--select", "--max-ps", "10"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "trained 7 model(s)" in first  # MUNKEY, ViT, M-oracle, T-oracle, 2 reference ViTs, selection's M-oracle
    rows = list(csv.DictReader(open(tmp_path / "out" / "fidelity_digits.csv")))
    methods = [r["method"] for r in rows]
    assert methods == ["Retrain (M-oracle)", "MUNKEY (key deletion)", "Retrain (T-oracle)", "ViT, no unlearning",
                       "neggrad+", "ssd", "MUNKEY (selected checkpoint)"]
    by = {r["method"]: r for r in rows}
    assert float(by["Retrain (M-oracle)"]["AvgGap"]) == 0.0 and by["MUNKEY (key deletion)"]["oracle"] == "M"
    assert by["ssd"]["oracle"] == "T" and float(by["ssd"]["seconds"]) > 0
    # the selected checkpoint: one of the three epochs, measured against the same M-oracle
    sel = json.loads((tmp_path / "work" / "digits_tiny" / "seed_0" / "selection.json").read_text())["selection"]
    chosen = by["MUNKEY (selected checkpoint)"]
    assert chosen["oracle"] == "M" and int(chosen["epoch"]) in (1, 2, 3)
    assert sel["selected"] == f"epoch_{int(chosen['epoch']):03d}.pt" and len(sel["scores"]) == 3
    if chosen["epoch"] == "3":  # the final epoch is the run itself: the same measurements as the plain row
        assert chosen["AvgGap"] == by["MUNKEY (key deletion)"]["AvgGap"]
    assert all("RMIA" in r["MIA_attack"] for r in rows)
    oracles = sorted(p.name for p in (tmp_path / "work" / "digits_tiny" / "seed_0" / "munkey" / "oracles").iterdir())
    assert len(oracles) == 2 and all(o.startswith("random_") and o.endswith("_munkey") for o in oracles)
    md = (tmp_path / "out" / "fidelity_digits.md").read_text()
    assert "| MUNKEY (key deletion) | M |" in md and "forget 10%" in md and "Selected checkpoints" in md
    # the audited request ran on a copy: the cached run is as trained, the copy is gone
    audited = json.loads((tmp_path / "work" / "digits_tiny" / "seed_0" / "rate_0.1_audited.json").read_text())
    config = tmp_path / "work" / "digits_tiny" / "seed_0" / "munkey" / "config.json"
    n_train = json.loads(config.read_text())["train_size"]
    assert audited["deleted"] == round(0.1 * n_train) and audited["bank_size"] == n_train - audited["deleted"]
    assert audited["request_seconds"] >= audited["deletion_seconds"] > 0
    assert not (tmp_path / "work" / "digits_tiny" / "seed_0" / "munkey" / "forgotten.json").exists()
    assert not (tmp_path / "work" / "digits_tiny" / "seed_0" / "_audited_copy").exists()
    assert "audited, durable" in md
    # resume: the cached cell; then, with the cell's rows removed, the cached models (nothing trained)
    assert main(argv) == 0
    assert "trained 0 model(s)" in capsys.readouterr().out
    (tmp_path / "work" / "digits_tiny" / "seed_0" / "rate_0.1.json").unlink()
    assert main(argv) == 0
    assert "trained 0 model(s)" in capsys.readouterr().out
    again = list(csv.DictReader(open(tmp_path / "out" / "fidelity_digits.csv")))
    drop_time = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert drop_time(again) == drop_time(rows)  # the same measurements from the cached models


def test_bench_fidelity_rejects_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "fidelity", "--rates", "10", "--work", str(tmp_path)]) == 2
    assert "--rates" in capsys.readouterr().err
    assert main(["bench", "fidelity", "--methods", "retrain", "--work", str(tmp_path)]) == 2
    assert "Unknown method" in capsys.readouterr().err
