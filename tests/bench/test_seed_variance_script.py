"""scripts/fidelity_seed_variance.py `train` on a cached model: its results line records the recipe the
model was trained with, and a model whose recipe differs from the one asked for is refused, not
recorded under the wrong recipe (as a re-measure after the profile's default changed would be)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from munkey_core.config import PROFILES

ROOT = Path(__file__).resolve().parents[2]


def _train(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SEEDVAR_DIR": str(folder), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "scripts/fidelity_seed_variance.py", "train", "m", "--split-seed", "0",
                           "--train-seed", "0", *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_cached_model_of_another_recipe_is_refused_then_recorded_with_its_own(tiny_run_template: Path,
                                                                               tmp_path: Path) -> None:
    folder = tmp_path / "seedvar"
    shutil.copytree(tiny_run_template, folder / "m")  # cached: `train` measures it, trains nothing
    own = json.loads((folder / "m" / "config.json").read_text())["train"]
    asked = PROFILES["cpu"].dataset_recipe["digits"]
    assert any(own[k] != v for k, v in asked.items())  # the tiny run is not of the cpu digits recipe

    refused = _train(folder)
    assert refused.returncode != 0 and "was trained with" in refused.stderr
    assert not (folder / "results.jsonl").exists()  # nothing recorded

    sets = [x for k in asked for x in ("--set", f"{k}={own[k]}")]
    done = _train(folder, *sets)
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads((folder / "results.jsonl").read_text())
    assert line["recipe"] == {k: own[k] for k in asked} and line["after_deletion"]["TA"] > 0


def test_a_whole_number_set_on_a_float_field_is_the_profiles_recipe(monkeypatch) -> None:
    """`--set per_sample_clip=1` records 1 where a profile recipe would say 1.0: one recipe for `gaps`, so
    the "(shipped)" mark follows a recipe whatever way it was written; base-valued fields drop out."""
    import dataclasses
    import importlib.util

    spec = importlib.util.spec_from_file_location("seedvar", ROOT / "scripts" / "fidelity_seed_variance.py")
    seedvar = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seedvar)
    line = {"recipe": {"augment_shift": 0.2, "absent_skip_hardest": 0.15, "per_sample_clip": 1, "per_sample_noise": 0}}
    assert seedvar.effective_recipe(line) == {"augment_shift": 0.2, "absent_skip_hardest": 0.15, "per_sample_clip": 1.0}
    recipe = json.dumps(seedvar.effective_recipe(line), sort_keys=True)
    assert recipe != seedvar.shipped("digits")  # today's digits default has no clip
    cpu = PROFILES["cpu"]
    clipped = dataclasses.replace(cpu, dataset_recipe={"digits": {**cpu.dataset_recipe["digits"], "per_sample_clip": 1.0}})
    monkeypatch.setitem(PROFILES, "cpu", clipped)
    assert recipe == seedvar.shipped("digits")
