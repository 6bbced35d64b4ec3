"""NegGrad+: fine-tune on the retain set while ascending the loss on the forget set.

Per step: loss = beta * CE(retain batch) - (1 - beta) * CE(forget batch) (Kurmanji et al. 2023), one
pass over the retain set per epoch with forget batches cycled. Needs labels, retain data and
backprop. Our defaults (the paper does not fix them for our models): 1 epoch, AdamW lr 1e-4,
beta 0.95, batch 64. Tests: tests/unlearn/test_posthoc.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from munkey_core.unlearn.finetune import Labelled, ToInput, adamw, batch_of, batches, cycling


@dataclass(frozen=True)
class NegGradConfig:
    epochs: int = 1
    lr: float = 1e-4
    beta: float = 0.95       # weight of the retain loss; 1 - beta on the (negated) forget loss
    batch_size: int = 64
    seed: int = 0


def neggrad_plus(model: nn.Module, to_input: ToInput, forget: Labelled, retain: Labelled,
                 cfg: NegGradConfig = NegGradConfig()) -> None:
    """Run NegGrad+ on `model` in place (left in eval mode)."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = adamw(model, cfg.lr)
    forget_rows = cycling(len(forget[1]), cfg.batch_size, gen)
    model.train()
    for _ in range(cfg.epochs):
        for rows in batches(len(retain[1]), cfg.batch_size, gen):
            xr, yr = batch_of(retain, rows, to_input, device)
            xf, yf = batch_of(forget, next(forget_rows), to_input, device)
            loss = cfg.beta * F.cross_entropy(model(xr), yr) - (1 - cfg.beta) * F.cross_entropy(model(xf), yf)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
