"""The committed ELPV step-matched comparison (docs/results/elpv_step_matched/): its tables are what
`scripts/fidelity_seed_variance.py gaps` prints from the committed per-model lines beside them, and the
--oracle-set table's pooled figures are recomputed here from those lines, so a `gaps --oracle-set` that
paired runs with the wrong oracles (the 80-epoch ones, or none) would fail."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "results" / "elpv_step_matched"
GAPS = ("TA", "RA", "FA", "MIA")


def _gaps_output(*extra: str) -> str:
    env = {**os.environ, "SEEDVAR_DIR": str(FOLDER)}
    out = subprocess.run([sys.executable, "scripts/fidelity_seed_variance.py", "gaps", "--markdown", *extra],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_committed_tables_are_what_their_lines_render() -> None:
    assert _gaps_output() == (FOLDER / "gaps_cheap.txt").read_text()
    assert _gaps_output("--oracle-set", "epochs=89") == (FOLDER / "gaps_cheap_oracle89.txt").read_text()


def _avg_gap(a: dict, b: dict) -> float:
    return sum(abs(a[k] - b[k]) for k in GAPS) / 4


def _pooled(text: str) -> str:
    return next(x for x in text.splitlines() if x.strip().startswith("elpv, 10%, recipe") and "run vs oracle" in x)


def test_oracle_set_pairs_the_runs_with_the_step_matched_oracles_only() -> None:
    runs, oracles = {}, {80: {}, 89: {}}  # split -> training seed -> measurements
    for line in (FOLDER / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        epochs = r["recipe"].get("epochs", 80)
        if r["exclude"] == "none":
            runs.setdefault(r["split_seed"], {})[r["train_seed"]] = r["after_deletion"]
        elif r["exclude"] == "forget":
            oracles[epochs].setdefault(r["split_seed"], {})[r["train_seed"]] = r["as_trained"]
    assert sorted(runs) == sorted(oracles[80]) == sorted(oracles[89]) == list(range(5))
    pooled = {}
    for epochs, orcs in oracles.items():
        cross = [_avg_gap(a, o) for s in runs for a in runs[s].values() for o in orcs[s].values()]
        floor = [_avg_gap(a, b) for s in orcs for a, b in itertools.combinations(orcs[s].values(), 2)]
        ta = [np.mean([a["TA"] for a in runs[s].values()]) - np.mean([o["TA"] for o in orcs[s].values()])
              for s in sorted(runs)]
        pooled[epochs] = (f"run vs oracle {np.mean(cross):.2f} (n={len(cross)}",
                          f"against a floor of {np.mean(floor):.2f} (n={len(floor)}", f"TA {np.mean(ta):+.2f}")
    for epochs, text in ((80, (FOLDER / "gaps_cheap.txt").read_text()),
                         (89, (FOLDER / "gaps_cheap_oracle89.txt").read_text())):
        line = _pooled(text)
        assert pooled[epochs][0] in line and pooled[epochs][1] in line, (epochs, line)
        assert any(pooled[epochs][2] in x for x in text.splitlines() if "run - oracle, signed" in x), epochs
    assert pooled[80][:2] != pooled[89][:2]  # the two tables use different oracles
    assert "epochs 89 (--oracle-set)" in (FOLDER / "gaps_cheap_oracle89.txt").read_text()


def test_the_random_90_percent_control_in_the_docs_is_what_the_lines_say() -> None:
    """forgetting_at_defaults.md's reading (the undeleted run against a model of another random 90%, per split:
    the lines with exclude randN) recomputed from the committed lines."""
    undeleted, rand = {}, {}
    for line in (FOLDER / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["exclude"] == "none":
            undeleted[r["split_seed"]] = r["as_trained"]["TA"]
        elif r["exclude"].startswith("rand"):
            rand[r["split_seed"]] = r["as_trained"]["TA"]
    assert sorted(rand) == sorted(undeleted) == list(range(5))
    diff = [undeleted[s] - rand[s] for s in range(5)]
    se = np.std(diff, ddof=1) / np.sqrt(len(diff))
    doc = (ROOT / "docs" / "results" / "forgetting_at_defaults.md").read_text()
    assert f"undeleted run is **{-np.mean(diff):.2f} points below it**" in doc
    assert f"(standard error {se:.2f}; lower on {sum(d < 0 for d in diff)} of 5 splits)" in doc
    for s in range(5):
        assert f"| {s} | {undeleted[s]:.2f} / " in doc and f" | {rand[s]:.2f} | {diff[s]:+.2f} |" in doc


def test_bad_oracle_set_is_refused_with_a_message() -> None:
    env = {**os.environ, "SEEDVAR_DIR": str(FOLDER)}
    for bad, says in (("nope=1", "ModelConfig/TrainConfig field"), ("epochs=x", "must be a number"),
                      ("epochs=80", "base value")):  # the profile's own epochs: would quietly give the usual table
        out = subprocess.run([sys.executable, "scripts/fidelity_seed_variance.py", "gaps", "--oracle-set", bad],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode != 0 and f"--oracle-set {bad!r}" in out.stderr and says in out.stderr
        assert "Traceback" not in out.stderr
