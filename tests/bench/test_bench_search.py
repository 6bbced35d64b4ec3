"""`munkey bench search`: its tables say what they measure (no timing is asserted here): recall on a
real run's own keys, and at scale the deletions followed by the product's IVF search."""

from __future__ import annotations

from pathlib import Path

import pytest

from munkey_core.bench.search import run_table, scale_table
from munkey_core.cli import main


def _rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| bank rows")
             and not line.startswith("| nprobe")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_run_table_reports_recall_on_validation_and_test_keys(tiny_run: Path) -> None:
    text = run_table(tiny_run, [4, 8, 35])
    rows = _rows(text)
    assert [r[0] for r in rows] == ["4", "8", "35"]
    recall_val = [float(r[1]) for r in rows]
    assert recall_val == sorted(recall_val)  # more lists probed: never fewer true neighbours
    assert rows[1][-1] == "yes"  # the default nprobe is marked
    assert float(rows[1][1]) >= 0.95 and float(rows[1][2]) >= 0.95
    assert "validation keys" in text


def test_scale_table_follows_deletions_at_a_small_size() -> None:
    rows = _rows(scale_table([3000], seed=0, nprobe=10**6))  # every list probed: IVF must equal exact
    assert len(rows) == 1 and rows[0][0] == "3,000" and rows[0][-1] == "yes"
    assert rows[0][1] == rows[0][2] and float(rows[0][9]) == 1.0


def test_bench_search_refuses_without_a_run_or_sizes(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "search"]) == 2
    assert "Name a run directory" in capsys.readouterr().err
    assert main(["bench", "search", "--rows", "10", "--nprobe", "8"]) == 2
