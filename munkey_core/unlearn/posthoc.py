"""Post-hoc random-forgetting baselines on a conventional classifier (the plain ViT), timed.

`run_posthoc(method, model, ...)` edits a *copy* of the model and returns it with its forgetting
time (seconds of the method itself, evaluation excluded). Methods (the MUNKEY paper's baselines):
- `neggrad+` (neggrad.py), `scrub` (scrub.py): fine-tuning on retain and forget data;
- `ssd` (ssd.py): Selective Synaptic Dampening with I_f on the forget set and I_D on the whole
  training set (retain + forget, as SSD defines it), alpha 5 for ViTs, lambda 1; I_D is computed
  inside the timed part (a "cold" request);
- `amnesiac` (Graves et al. 2021): the forget samples get random wrong labels and the model is
  fine-tuned for one epoch on them together with the retain set (AdamW lr 1e-4, batch 64).
All need labels and backprop; NegGrad+, SCRUB and Amnesiac also need the retain data.
`settings` overrides a method's hyperparameters (`DEFAULTS` lists them with the values used when
none are given; unlearn/tuning.py picks them on a validation forget split).
Tests: tests/unlearn/test_posthoc.py.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from munkey_core.errors import MunkeyError
from munkey_core.unlearn.finetune import Labelled, ToInput, adamw, batch_of, batches

METHODS = ("neggrad+", "scrub", "ssd", "amnesiac")
# each method's tunable hyperparameters and their values when none are given
DEFAULTS: dict[str, dict] = {
    "neggrad+": {"epochs": 1, "lr": 1e-4, "beta": 0.95},
    "scrub": {"epochs": 3, "max_epochs": 1, "lr": 2e-4},
    "ssd": {"alpha": 5.0, "lam": 1.0},
    "amnesiac": {"epochs": 1, "lr": 1e-4},
}


@dataclass
class PosthocResult:
    method: str
    model: nn.Module
    seconds: float
    details: dict = field(default_factory=dict)


def amnesiac(model: nn.Module, to_input: ToInput, forget: Labelled, retain: Labelled, num_classes: int, *,
             epochs: int = 1, lr: float = 1e-4, batch_size: int = 64, seed: int = 0) -> None:
    """Amnesiac unlearning in place: relabel the forget set at random (never its true class), then
    fine-tune on it together with the retain set."""
    rng = np.random.default_rng(seed)
    wrong = (forget[1] + rng.integers(1, num_classes, len(forget[1]))) % num_classes  # (Nf,), != true label
    data = (np.concatenate([retain[0], forget[0]]), np.concatenate([retain[1], wrong]))
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = adamw(model, lr)
    model.train()
    for _ in range(epochs):
        for rows in batches(len(data[1]), batch_size, gen):
            x, y = batch_of(data, rows, to_input, device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()


def method_settings(method: str, settings: dict | None = None) -> dict:
    """`method`'s hyperparameters: its DEFAULTS with `settings` on top (unknown names refused)."""
    if method not in METHODS:
        raise MunkeyError(f"Unknown post-hoc method '{method}'; choose one of: {', '.join(METHODS)}.")
    bad = sorted(set(settings or {}) - set(DEFAULTS[method]))
    if bad:
        raise MunkeyError(f"{method} has no setting(s) {bad}; it takes {', '.join(DEFAULTS[method])}.")
    return {**DEFAULTS[method], **(settings or {})}


def run_posthoc(method: str, model: nn.Module, to_input: ToInput, forget: Labelled, retain: Labelled, *,
                num_classes: int, seed: int = 0, settings: dict | None = None) -> PosthocResult:
    """Apply `method` (with `settings` over its DEFAULTS) to a copy of `model`; the original is left
    untouched. The result's details hold the settings used."""
    cfg = method_settings(method, settings)
    if len(forget[1]) == 0:
        raise MunkeyError("The forget set is empty; there is nothing to unlearn.")
    work = copy.deepcopy(model).eval()
    details: dict = {"settings": cfg}
    t0 = time.perf_counter()
    if method == "neggrad+":
        from munkey_core.unlearn.neggrad import NegGradConfig, neggrad_plus

        neggrad_plus(work, to_input, forget, retain, NegGradConfig(**cfg, seed=seed))
    elif method == "scrub":
        from munkey_core.unlearn.scrub import SCRUBConfig, scrub

        scrub(work, to_input, forget, retain, SCRUBConfig(**cfg, seed=seed))
    elif method == "ssd":
        from munkey_core.unlearn.ssd import SSDConfig, dampen, importance

        ssd = SSDConfig(method="ssd", alpha=float(cfg["alpha"]), lam=float(cfg["lam"]))
        full = (np.concatenate([retain[0], forget[0]]), np.concatenate([retain[1], forget[1]]))
        i_d = importance(work, to_input, full[0], full[1], "ssd", ssd.batch_size)
        i_f = importance(work, to_input, forget[0], forget[1], "ssd", ssd.batch_size)
        details["dampened"] = dampen(work, i_f, i_d, ssd.alpha, ssd.lam)
        work.zero_grad(set_to_none=True)
    else:
        amnesiac(work, to_input, forget, retain, num_classes, epochs=int(cfg["epochs"]), lr=float(cfg["lr"]),
                 seed=seed)
    return PosthocResult(method, work.eval(), time.perf_counter() - t0, details)
