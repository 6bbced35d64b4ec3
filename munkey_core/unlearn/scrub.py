"""SCRUB (Kurmanji et al. 2023): a student, initialised as the trained model, moves away from the
frozen original ("teacher") on the forget set and stays close to it on the retain set.

Each epoch: while epoch < max_epochs, one "max" pass over the forget set minimising
-KL(teacher || student); then one "min" pass over the retain set minimising
gamma * CE + alpha * KL(teacher || student), both at temperature T. Needs labels, retain data and
backprop. Our defaults: 3 epochs, 1 max epoch, AdamW lr 2e-4, T 4, alpha 0.5, gamma 1, batch 64.
Tests: tests/unlearn/test_posthoc.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from munkey_core.unlearn.finetune import Labelled, ToInput, adamw, batch_of, batches


@dataclass(frozen=True)
class SCRUBConfig:
    epochs: int = 3
    max_epochs: int = 1
    lr: float = 2e-4
    temperature: float = 4.0
    alpha: float = 0.5   # weight of the retain-set KL
    gamma: float = 1.0   # weight of the retain-set cross-entropy
    batch_size: int = 64
    seed: int = 0


def distill_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) of the temperature-softened distributions, mean over the batch (B, C)."""
    t = temperature
    return F.kl_div(F.log_softmax(student_logits / t, 1), F.log_softmax(teacher_logits / t, 1),
                    reduction="batchmean", log_target=True) * t * t


def scrub(model: nn.Module, to_input: ToInput, forget: Labelled, retain: Labelled,
          cfg: SCRUBConfig = SCRUBConfig()) -> None:
    """Run SCRUB on `model` (the student) in place; the teacher is a frozen copy taken first."""
    device = next(model.parameters()).device
    teacher = copy.deepcopy(model).eval()
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = adamw(model, cfg.lr)
    model.train()

    def step(loss: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for epoch in range(cfg.epochs):
        if epoch < cfg.max_epochs:
            for rows in batches(len(forget[1]), cfg.batch_size, gen):
                x, _ = batch_of(forget, rows, to_input, device)
                with torch.no_grad():
                    t_logits = teacher(x)
                step(-distill_kl(model(x), t_logits, cfg.temperature))
        for rows in batches(len(retain[1]), cfg.batch_size, gen):
            x, y = batch_of(retain, rows, to_input, device)
            with torch.no_grad():
                t_logits = teacher(x)
            logits = model(x)
            step(cfg.gamma * F.cross_entropy(logits, y) + cfg.alpha * distill_kl(logits, t_logits, cfg.temperature))
    model.eval()
