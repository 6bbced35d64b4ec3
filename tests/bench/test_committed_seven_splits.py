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


DRAWS = ("", "skip015/", "draw2/", "skip015/draw2/", "clip1/draw2/")  # each recipe's draws of training seeds
# (folder, attack) pairs with a committed table: the per-sample clip's first draw was measured with the cheap attack only
TABLES = [(d, a) for d in DRAWS for a in ("cheap", "strong")] + [("clip1/", "cheap")]
BOTH = [(r, a) for r in ("", "skip015/") for a in ("cheap", "strong")] + [("clip1/", "cheap")]
# models per split and draw: (runs, M-oracles) at 10%; the clip's draws have one run and two oracles per split
PER_SPLIT = {"": (2, 2), "skip015/": (2, 2), "draw2/": (2, 2), "skip015/draw2/": (2, 2), "clip1/": (1, 2),
             "clip1/draw2/": (1, 2)}


@pytest.mark.parametrize(("folder", "attack"), TABLES)
def test_committed_seven_split_table_is_what_its_lines_render(folder: str, attack: str) -> None:
    assert _gaps_output(attack, FOLDER / folder) == (FOLDER / folder / f"gaps_{attack}.txt").read_text()


@pytest.mark.parametrize(("recipe", "attack"), BOTH)
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


_LINES = {"cheap": "results.jsonl", "strong": "strong.jsonl"}


@pytest.mark.parametrize(("draws", "table", "attack"),
                         [((d,), f"{d}gaps_{a}.txt", a) for d, a in TABLES]
                         + [((r, f"{r}draw2/"), f"{r}both_draws_{a}.txt", a) for r, a in BOTH])
def test_committed_seven_split_pooled_figures_recomputed(attack: str, draws: tuple, table: str) -> None:
    """10%: the pooled run-vs-oracle gap, the oracle-pair floor and the signed FA offset per split, from
    the JSON lines directly (runs after deletion against every oracle of their split)."""
    lines = _LINES[attack]
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
    text = (FOLDER / table).read_text()
    pooled = next(x for x in text.splitlines() if x.strip().startswith("digits, 10%, recipe") and "run vs oracle" in x)
    n_runs, n_oracles = (sum(PER_SPLIT[d][i] for d in draws) for i in (0, 1))  # per split, over the draws pooled
    assert len(cross) == 7 * n_runs * n_oracles and len(floor) == 7 * n_oracles * (n_oracles - 1) // 2
    assert f"run vs oracle {np.mean(cross):.2f} (n={len(cross)}" in pooled
    assert f"against a floor of {np.mean(floor):.2f} (n={len(floor)}" in pooled
    offsets = next(x for x in text.splitlines() if "run - oracle, signed" in x and f"FA {np.mean(fa):+.2f}" in x)
    assert " ".join(f"{v:+.2f}" for v in fa) in offsets


def test_the_shipped_marker_follows_the_profile_recipe() -> None:
    """`gaps` marks the rows of the recipe `munkey train` gives digits today: the default's (skip 0.15) and not
    the per-sample clip's, an option (trained with `--set per_sample_clip=1`; a whole number read as the
    float field it sets, so the mark would follow the clip if the profile's recipe set 1.0)."""
    from munkey_core.config import PROFILES

    assert PROFILES["cpu"].train_for("digits").per_sample_clip == 0.0  # the premise: the clip is an option
    for folder, shipped in (("clip1/draw2/", False), ("skip015/draw2/", True)):
        rows = [x for x in (FOLDER / folder / "gaps_cheap.txt").read_text().splitlines() if "10% forget set, split" in x]
        assert len(rows) == 7 and all(("(shipped)" in x) is shipped for x in rows), folder
        assert all('"per_sample_clip": 1.0' in x for x in rows) is (folder == "clip1/draw2/"), folder
