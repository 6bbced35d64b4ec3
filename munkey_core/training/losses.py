"""The MUNKEY training loss, per sample and per batch (train.py's module docstring has the recipe).

Kept apart from the loop so the batch step (train.py) and the per-sample clipped step (per_sample.py)
compute the same loss. Tests: tests/training/test_train.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from munkey_core.config import TrainConfig


def step_loss(logits: torch.Tensor, y: torch.Tensor, absent: torch.Tensor, q: torch.Tensor,
              cfg: TrainConfig, reduction: str = "sum") -> torch.Tensor:
    """Cross-entropy ("sum" or "mean" over the batch) of logits (B, C); where `absent` (B,) the target
    mixes in the neighbours' label distribution q (B, C) by cfg.absent_target_mix, and the
    cfg.absent_skip_hardest share of the absent samples with the highest loss count zero (train.py's module docstring).
    The mean divides by B either way, so skipped samples lower the step, they do not reweight the rest."""
    if cfg.absent_target_mix <= 0:
        per = F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing, reduction="none")  # (B,)
    else:
        target = (torch.arange(logits.shape[1], device=y.device) == y[:, None]).to(logits.dtype)  # one-hot (B, C), vmap-safe
        a = cfg.absent_target_mix * absent.to(logits.dtype)[:, None]  # (B, 1)
        target = (1 - a) * target + a * q.to(logits.dtype)
        if cfg.label_smoothing:
            target = (1 - cfg.label_smoothing) * target + cfg.label_smoothing / logits.shape[1]
        per = -(target * F.log_softmax(logits, dim=1)).sum(dim=1)  # (B,)
    if cfg.absent_skip_hardest > 0:
        per = per * ~hardest_absent(per.detach(), absent, cfg.absent_skip_hardest)
    return per.sum() if reduction == "sum" else per.mean()


def hardest_absent(per: torch.Tensor, absent: torch.Tensor, share: float) -> torch.Tensor:
    """(B,) mask of the floor(share x number absent) absent samples with the highest loss `per` (B,)."""
    n_skip = int(share * int(absent.sum()))
    mask = torch.zeros_like(absent)
    if n_skip > 0:
        ranked = torch.where(absent, per, torch.full_like(per, -float("inf")))
        mask[ranked.topk(n_skip).indices] = True
    return mask
