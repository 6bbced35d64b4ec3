"""The committed seven-split tables of the digits default (docs/results/default_seven_splits/) are what
`scripts/fidelity_seed_variance.py gaps` prints from the committed per-model lines beside them, and their
pooled figures are recomputed here from those lines without the script's own pooling."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "results" / "default_seven_splits"
GAPS = ("TA", "RA", "FA", "MIA")


def _gaps_output(attack: str, folder: Path = FOLDER, *also: Path) -> str:
    env = {**os.environ, "SEEDVAR_DIR": str(folder)}
    extra = [x for f in also for x in ("--also", str(f))]
    out = subprocess.run([sys.executable, "scripts/fidelity_seed_variance.py", "gaps", "--attack", attack,
                          "--markdown", *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


DRAWS = ("", "skip015/", "draw2/", "skip015/draw2/")  # each recipe's first and second draw of training seeds


@pytest.mark.parametrize(("attack", "table"), [(a, f"{d}gaps_{a}.txt") for d in DRAWS for a in ("cheap", "strong")])
def test_committed_seven_split_table_is_what_its_lines_render(attack: str, table: str) -> None:
    folder = (FOLDER / table).parent
    assert _gaps_output(attack, folder) == (FOLDER / table).read_text()


@pytest.mark.parametrize("recipe", ("", "skip015/"))
@pytest.mark.parametrize("attack", ("cheap", "strong"))
def test_committed_both_draws_table_is_what_both_folders_render(attack: str, recipe: str) -> None:
    assert (_gaps_output(attack, FOLDER / recipe, FOLDER / recipe / "draw2")
            == (FOLDER / recipe / f"both_draws_{attack}.txt").read_text())


def test_gaps_refuses_a_model_counted_twice() -> None:
    """--also with the same folder again would count every model twice: refused, not pooled (within one
    folder a re-measure's later line replaces the earlier, as before --also existed)."""
    env = {**os.environ, "SEEDVAR_DIR": str(FOLDER / "draw2")}
    out = subprocess.run([sys.executable, "scripts/fidelity_seed_variance.py", "gaps", "--also", str(FOLDER / "draw2")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "--also names folders of other models" in out.stderr


def _avg_gap(a: dict, b: dict) -> float:
    return sum(abs(a[k] - b[k]) for k in GAPS) / 4


@pytest.mark.parametrize(("draws", "table"), [((d,), f"{d}gaps_{{}}.txt") for d in DRAWS]
                         + [((r, f"{r}draw2/"), f"{r}both_draws_{{}}.txt") for r in ("", "skip015/")])
@pytest.mark.parametrize(("attack", "lines"), [("cheap", "results.jsonl"), ("strong", "strong.jsonl")])
def test_committed_seven_split_pooled_figures_recomputed(attack: str, lines: str, draws: tuple, table: str) -> None:
    """10%: the pooled run-vs-oracle gap, the oracle-pair floor and the signed FA offset per split, from
    the JSON lines directly (runs after deletion against every oracle of their split)."""
    runs, oracles = {}, {}
    for line in [x for d in draws for x in (FOLDER / d / lines).read_text().splitlines()]:
        r = json.loads(line)
        if r.get("rate", 0.1) != 0.1:
            continue
        if r["exclude"] == "none":
            runs.setdefault(r["split_seed"], {})[r["train_seed"]] = r["after_deletion"]
        elif r["exclude"] == "forget":
            oracles.setdefault(r["split_seed"], {})[r["train_seed"]] = r["as_trained"]
    assert sorted(runs) == sorted(oracles) == list(range(7))
    cross = [_avg_gap(a, o) for s in runs for a in runs[s].values() for o in oracles[s].values()]
    floor = [_avg_gap(a, b) for s in oracles for a, b in itertools.combinations(oracles[s].values(), 2)]
    fa = [np.mean([a["FA"] for a in runs[s].values()]) - np.mean([o["FA"] for o in oracles[s].values()])
          for s in sorted(runs)]
    text = (FOLDER / table.format(attack)).read_text()
    pooled = next(x for x in text.splitlines() if x.strip().startswith("digits, 10%, recipe") and "run vs oracle" in x)
    n = 2 * len(draws)  # two runs and two oracles on each of seven splits per draw
    assert len(cross) == 7 * n * n and len(floor) == 7 * n * (n - 1) // 2
    assert f"run vs oracle {np.mean(cross):.2f} (n={len(cross)}" in pooled
    assert f"against a floor of {np.mean(floor):.2f} (n={len(floor)}" in pooled
    offsets = next(x for x in text.splitlines() if "run - oracle, signed" in x and f"FA {np.mean(fa):+.2f}" in x)
    assert " ".join(f"{v:+.2f}" for v in fa) in offsets
