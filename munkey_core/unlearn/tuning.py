"""Hyperparameters of the post-hoc baselines, chosen on a validation forget split (never the test split).

The field tunes NegGrad+, SCRUB, SSD and Amnesiac before comparing them (Kurmanji et al. 2023; the
MUNKEY paper does too), so a fair table gives them the same chance. For one trained plain ViT and one
real forget set F (its training split D), `tune_posthoc`:
1. draws a seeded *validation forget split* V of |F| samples from the retain set D \\ F (disjoint
   from F by construction);
2. trains (or reuses) the split's T-oracle: the ViT's recipe retrained without V and without F, cached
   in RUN/oracles/ like every other oracle (so it never saw a real forget sample either);
3. runs every point of each method's grid (`GRIDS`) on the original ViT with forget = V and retain =
   D \\ (V u F): the real forget samples are never given to a method;
4. scores each result and the oracle on the dataset's *validation* split in the role of "test", the
   retain rows D \\ (V u F) and V: TA, RA, FA, the cheap MIA (the strong attack's references are
   trained on halves that include V), Avg Gap against the oracle;
5. chooses per method the grid point with the lowest validation Avg Gap (ties: the earlier point).
The caller then applies the chosen settings to the real forget set and measures on the test split.
What the tuner evaluated and gave to the methods is recorded by sample id (`evaluated_ids`,
`given_ids`) so a reader can check it touched neither the test split nor F.
Tests: tests/unlearn/test_tuning.py.
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.eval.metrics import MIA_CHEAP
from munkey_core.eval.oracles import classifier_scorer, eval_sets, forget_tag, gaps, measure, train_oracle
from munkey_core.eval.selection import ValidationView
from munkey_core.run.loaded import ClassifierRun
from munkey_core.unlearn.posthoc import DEFAULTS, METHODS, method_settings, run_posthoc

_VAL_SEED_STEP = 7907  # the validation split of seed s is drawn with seed s + 7907 (never a forget set's draw)


def _grid(**axes: Sequence) -> list[dict]:
    """Every combination of the named values, in order (the first axis varies slowest)."""
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*axes.values())]


# The documented grids (docs/results/fidelity.md). NegGrad+: beta weighs the retain loss (1 - beta the
# ascended forget loss); SCRUB: max_epochs = passes that push away from the teacher on the forget set;
# SSD: alpha selects the parameters (I_f > alpha I_D), lam sets how hard they are dampened.
GRIDS: dict[str, list[dict]] = {
    "neggrad+": _grid(epochs=(1, 3, 5), lr=(1e-4, 5e-4), beta=(0.9, 0.95, 0.99)),
    "scrub": [g for g in _grid(epochs=(3, 5), max_epochs=(1, 3), lr=(2e-4, 5e-4)) if g["max_epochs"] <= g["epochs"]],
    "ssd": _grid(alpha=(1.0, 5.0, 10.0, 50.0), lam=(0.5, 1.0)),
    "amnesiac": _grid(epochs=(1, 3, 5), lr=(1e-4, 5e-4)),
}


def settings_text(settings: dict) -> str:
    """`epochs=3 lr=0.0005 beta=0.95`: a method's settings in one short line."""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in settings.items())


def parse_settings(text: str) -> tuple[str, dict]:
    """`neggrad+:epochs=5 lr=0.0005 beta=0.95` (commas also separate) -> ("neggrad+", {...}): the form the
    fidelity table prints a tuned method's settings in, so a chosen setting can be handed to another bench.
    Each value takes the type of the method's default (an epoch count must be a whole number)."""
    method, sep, body = text.partition(":")
    method = method.strip()
    if not sep or method not in METHODS:
        raise MunkeyError(f"Settings are written METHOD:NAME=VALUE ... with METHOD one of {', '.join(METHODS)} "
                          f"(e.g. 'neggrad+:epochs=5 lr=0.0005 beta=0.95'); got {text!r}.")
    out: dict = {}
    for item in body.replace(",", " ").split():
        name, eq, value = item.partition("=")
        if not eq or name not in DEFAULTS[method]:
            raise MunkeyError(f"{method} takes {', '.join(f'{k}=VALUE' for k in DEFAULTS[method])}; got {item!r}.")
        try:
            out[name] = type(DEFAULTS[method][name])(value)
        except ValueError:
            kind = "a whole number" if isinstance(DEFAULTS[method][name], int) else "a number"
            raise MunkeyError(f"{method}'s {name} must be {kind}; got {value!r}.") from None
    return method, out


def validation_forget_ids(train_ids: np.ndarray, forget_ids: Sequence[int], seed: int) -> list[int]:
    """A seeded random set of |forget_ids| training ids drawn from the rest (the retain set), sorted."""
    pool = np.setdiff1d(np.asarray(train_ids, dtype=np.int64), np.asarray(list(forget_ids), dtype=np.int64))
    n = len(forget_ids)
    if n == 0 or n > len(pool) // 2:
        raise MunkeyError(f"A validation forget split of {n} samples needs at least {2 * max(n, 1)} retained "
                          f"training samples; this forget set leaves {len(pool)}.")
    chosen = np.random.default_rng(seed + _VAL_SEED_STEP).choice(pool, size=n, replace=False)
    return sorted(int(i) for i in chosen)


def tune_posthoc(vit: ClassifierRun, ds, forget_ids: Sequence[int], methods: Sequence[str], *, seed: int = 0,
                 max_samples: int = 2000, grids: dict[str, list[dict]] | None = None, device: str = "auto",
                 progress: bool = True, on_trained: Callable[[], None] | None = None) -> dict:
    """Choose each method's settings on a validation forget split of `vit`'s training data (see the
    module docstring); `ds` is the run's dataset (its test split is never read). Returns a JSON-ready
    dict: the split, its oracle's metrics, every grid point's metrics and Avg Gap, the chosen settings."""
    grids = GRIDS if grids is None else grids
    bad = [m for m in methods if m not in METHODS or not grids.get(m)]
    if bad:
        raise MunkeyError(f"No tuning grid for {bad}; methods with one: {', '.join(m for m in METHODS if grids.get(m))}.")
    for m in methods:
        for point in grids[m]:
            method_settings(m, point)  # a bad grid fails before minutes of training
    forget_ids = sorted(int(i) for i in forget_ids)
    val_ids = validation_forget_ids(ds.train.ids, forget_ids, seed)
    excluded = sorted(set(val_ids) | set(forget_ids))
    path, trained = train_oracle(vit.config, vit.root, excluded, "vit", device=device, progress=progress)
    if trained and on_trained is not None:
        on_trained()
    view = ValidationView(ds)  # the validation split plays "test"
    sets = eval_sets(view, val_ids, max_samples=max_samples, seed=seed, also_deleted=forget_ids)
    size = vit.cfg.img_size

    def score(model) -> dict:
        return measure(classifier_scorer(model, view, size), view, sets)

    oracle = score(ClassifierRun(path, device=device).model)
    none = score(vit.model)
    v = np.isin(ds.train.ids, val_ids)
    keep = ~np.isin(ds.train.ids, excluded)
    val_forget, retain = (ds.train.images[v], ds.train.labels[v]), (ds.train.images[keep], ds.train.labels[keep])
    out: dict = {
        "val_forget": forget_tag(val_ids), "n_val_forget": len(val_ids), "oracle_path": str(path),
        "oracle_trained": trained, "MIA_attack": MIA_CHEAP, "oracle": oracle,
        "no_unlearning": {**none, "AvgGap": gaps(none, oracle)["AvgGap"]},
        "evaluated_ids": {"heldout": view.test.ids[sets.test].tolist(), "retain": ds.train.ids[sets.retain].tolist(),
                          "forget": ds.train.ids[sets.forget].tolist()},
        "given_ids": {"forget": ds.train.ids[v].tolist(), "retain": ds.train.ids[keep].tolist()},
        "methods": {},
    }
    for m in methods:
        points = []
        for point in grids[m]:
            res = run_posthoc(m, vit.model, vit.to_input, val_forget, retain, num_classes=ds.num_classes, seed=seed,
                              settings=point)
            metrics = score(res.model)
            points.append({"settings": res.details["settings"], **metrics, "AvgGap": gaps(metrics, oracle)["AvgGap"],
                           "seconds": res.seconds})
        best = min(range(len(points)), key=lambda i: (points[i]["AvgGap"], i))
        out["methods"][m] = {"grid": points, "chosen": points[best]["settings"], "AvgGap": points[best]["AvgGap"],
                             "index": best}
    return out

