"""Post-hoc tuning on a validation forget split (unlearn/tuning.py), on a real tiny plain ViT trained on digits:
the chosen point is the grid's lowest validation Avg Gap (recomputed here from the recorded metrics), the
recorded metrics are real accuracies on the validation split, and tuning reads neither the test split nor
the real forget set (a dataset without a test split and with the forget images scrambled gives the same
scores)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from munkey_core.data.datasets import Split
from munkey_core.data.sampling import random_ids
from munkey_core.errors import MunkeyError
from munkey_core.unlearn.tuning import GRIDS, parse_settings, settings_text, tune_posthoc, validation_forget_ids
from munkey_core.model.classifiers import predict_labels
from munkey_core.run.loaded import ClassifierRun
from munkey_core.training.classifier import train_classifier_run
from munkey_core.unlearn.posthoc import DEFAULTS, run_posthoc

# small grids: enough points for the choice to matter, seconds on the tiny profile
SMALL = {
    "neggrad+": [{"epochs": 1, "lr": 1e-4, "beta": 0.99}, {"epochs": 2, "lr": 5e-3, "beta": 0.5},
                 {"epochs": 1, "lr": 1e-3, "beta": 0.9}],
    "ssd": [{"alpha": 1.0, "lam": 1.0}, {"alpha": 0.1, "lam": 0.1}, {"alpha": 50.0, "lam": 1.0}],
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory):
    """A tiny plain ViT fitted to digits, a random 10% forget set, and its tuning on the small grids."""
    path = tmp_path_factory.mktemp("tuning") / "vit"
    train_classifier_run("digits", path, arch="vit", profile="tiny", device="cpu", progress=False,
                         overrides={"epochs": 20, "augment_shift": 0.0})
    run = ClassifierRun(path, device="cpu")
    ds = run.dataset
    forget = random_ids(ds.train.ids, 0.1, seed=0)
    out = tune_posthoc(run, ds, forget, ["neggrad+", "ssd"], seed=0, grids=SMALL, device="cpu", progress=False)
    return run, ds, forget, out


def test_the_tuner_picks_the_lowest_validation_avg_gap(tuned) -> None:
    run, ds, forget, out = tuned
    oracle = out["oracle"]
    for method, grid in SMALL.items():
        rec = out["methods"][method]
        assert [p["settings"] for p in rec["grid"]] == grid  # every point of the grid, in order
        # Avg Gap recomputed from the recorded metrics: mean |metric - oracle's| over TA, RA, FA, MIA
        mine = [sum(abs(p[k] - oracle[k]) for k in ("TA", "RA", "FA", "MIA")) / 4 for p in rec["grid"]]
        assert [p["AvgGap"] for p in rec["grid"]] == pytest.approx(mine)
        best = int(np.argmin(mine))
        assert rec["chosen"] == grid[best] and rec["AvgGap"] == pytest.approx(min(mine))
        assert len({round(g, 6) for g in mine}) > 1  # the grid's points differ: the choice is a real one
    # a recorded TA is the accuracy on the *validation* split of the method run with those settings
    val_ids = out["given_ids"]["forget"]
    v = np.isin(ds.train.ids, val_ids)
    keep = ~np.isin(ds.train.ids, list(val_ids) + list(forget))
    point = out["methods"]["neggrad+"]["grid"][1]
    res = run_posthoc("neggrad+", run.model, run.to_input, (ds.train.images[v], ds.train.labels[v]),
                      (ds.train.images[keep], ds.train.labels[keep]), num_classes=10, seed=0, settings=point["settings"])
    held = np.isin(ds.val.ids, out["evaluated_ids"]["heldout"])
    acc = 100 * np.mean(predict_labels(res.model, ds.val.images[held], run.cfg.img_size) == ds.val.labels[held])
    assert point["TA"] == pytest.approx(acc)
    assert settings_text(point["settings"]) == "epochs=2 lr=0.005 beta=0.5"


def test_tuning_never_reads_the_test_split_or_the_real_forget_set(tuned) -> None:
    run, ds, forget, out = tuned
    fset = set(forget)
    val_ids = out["given_ids"]["forget"]
    # the validation forget split: |F| retained training samples, disjoint from F, what is evaluated as "forget"
    assert len(val_ids) == len(forget) and not fset & set(val_ids) and set(val_ids) <= set(ds.train.ids.tolist())
    assert sorted(out["evaluated_ids"]["forget"]) == sorted(val_ids)
    assert val_ids == validation_forget_ids(ds.train.ids, forget, 0)
    # no real forget sample is evaluated or given to a method; "test" is the validation split
    for ids in (out["evaluated_ids"]["retain"], out["given_ids"]["retain"]):
        assert not fset & set(ids) and not set(val_ids) & set(ids)
    assert set(out["given_ids"]["retain"]) == set(ds.train.ids.tolist()) - fset - set(val_ids)
    assert set(out["evaluated_ids"]["heldout"]) <= set(ds.val.ids.tolist())
    assert not set(out["evaluated_ids"]["heldout"]) & set(ds.test.ids.tolist())
    # the split's T-oracle never trained on a validation or a real forget sample
    cfg = json.loads(open(f"{out['oracle_path']}/config.json").read())
    assert cfg["excluded_ids"] == 2 * len(forget) and cfg["train_size"] == len(ds.train) - 2 * len(forget)
    # behaviour: without a test split, and with the real forget samples' images and labels scrambled, the
    # tuner gives the same scores (it reads them nowhere; the model's weights are the only trace of F)
    f = np.isin(ds.train.ids, forget)
    images, labels = ds.train.images.copy(), ds.train.labels.copy()
    images[f] = np.random.default_rng(1).integers(0, 256, images[f].shape, dtype=np.uint8)
    labels[f] = (labels[f] + 3) % 10
    blind = dataclasses.replace(ds, train=Split(images, labels, ds.train.ids), test=None)
    again = tune_posthoc(run, blind, forget, ["neggrad+", "ssd"], seed=0, grids=SMALL, device="cpu", progress=False)
    assert not again["oracle_trained"]  # the cached oracle of the same split
    drop = lambda m: [{k: v for k, v in p.items() if k != "seconds"} for p in m["grid"]]  # noqa: E731
    for method in SMALL:
        assert drop(again["methods"][method]) == drop(out["methods"][method])
    assert again["oracle"] == out["oracle"] and again["evaluated_ids"] == out["evaluated_ids"]


def test_bad_grids_and_splits_are_refused(tuned) -> None:
    run, ds, forget, _ = tuned
    with pytest.raises(MunkeyError, match="no setting"):
        tune_posthoc(run, ds, forget, ["ssd"], grids={"ssd": [{"alpha": 1.0, "epochs": 3}]}, device="cpu")
    with pytest.raises(MunkeyError, match="No tuning grid"):
        tune_posthoc(run, ds, forget, ["ssd"], grids={"ssd": []}, device="cpu")
    with pytest.raises(MunkeyError, match="validation forget split"):
        validation_forget_ids(ds.train.ids, ds.train.ids[: len(ds.train) // 2 + 1].tolist(), 0)
    assert all(GRIDS[m] for m in ("neggrad+", "scrub", "ssd", "amnesiac"))


def test_settings_text_reads_back_for_every_grid_point() -> None:
    """What the fidelity table prints for a tuned method is what `--settings` of another bench accepts."""
    for method, grid in GRIDS.items():
        for point in grid:
            name, parsed = parse_settings(f"{method}:{settings_text(point)}")
            assert name == method and parsed == point
            assert [type(v) for v in parsed.values()] == [type(DEFAULTS[method][k]) for k in parsed]
    assert parse_settings("neggrad+:epochs=5,lr=5e-4") == ("neggrad+", {"epochs": 5, "lr": 0.0005})
    assert parse_settings("ssd:") == ("ssd", {})
    for bad, says in (("neggrad+ epochs=5", "METHOD:NAME=VALUE"), ("sgd:lr=1", "METHOD:NAME=VALUE"),
                      ("scrub:beta=0.9", "scrub takes"), ("amnesiac:epochs=1.5", "whole number"),
                      ("ssd:alpha=high", "a number")):
        with pytest.raises(MunkeyError, match=says):
            parse_settings(bad)
