"""`munkey bench fidelity` smoke test on digits (tiny profile, 3 epochs): every method measured against
its oracle, tables written, and a re-run resumes from the cache without training anything."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from munkey_core.cli import main


def test_bench_fidelity_runs_and_resumes(cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["bench", "fidelity", "--dataset", "digits", "--profile", "tiny", "--seeds", "1", "--rates", "0.1",
            "--epochs", "3", "--mia", "strong", "--methods", "neggrad+,ssd", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "trained 6 model(s)" in first  # MUNKEY, ViT, M-oracle, T-oracle, 2 reference ViTs
    rows = list(csv.DictReader(open(tmp_path / "out" / "fidelity_digits.csv")))
    methods = [r["method"] for r in rows]
    assert methods == ["Retrain (M-oracle)", "MUNKEY (key deletion)", "Retrain (T-oracle)", "ViT, no unlearning",
                       "neggrad+", "ssd"]
    by = {r["method"]: r for r in rows}
    assert float(by["Retrain (M-oracle)"]["AvgGap"]) == 0.0 and by["MUNKEY (key deletion)"]["oracle"] == "M"
    assert by["ssd"]["oracle"] == "T" and float(by["ssd"]["seconds"]) > 0
    assert all("RMIA" in r["MIA_attack"] for r in rows)
    oracles = sorted(p.name for p in (tmp_path / "work" / "digits_tiny" / "seed_0" / "munkey" / "oracles").iterdir())
    assert len(oracles) == 1 and oracles[0].startswith("random_") and oracles[0].endswith("_munkey")
    md = (tmp_path / "out" / "fidelity_digits.md").read_text()
    assert "| MUNKEY (key deletion) | M |" in md and "forget 10%" in md
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
