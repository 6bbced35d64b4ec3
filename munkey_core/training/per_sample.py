"""Per-sample gradient clipping with Gaussian noise (DP-SGD style) for the weights a deletion keeps.

A key deletion removes a sample's exemplar row; what it cannot remove is the sample's influence on the
shared weights (backbone, adapter, null tokens). Clipping every sample's gradient of those weights to
norm <= C bounds that influence per step; Gaussian noise of std sigma x C on the clipped sum hides what
is left (Abadi et al. 2016, "Deep Learning with Differential Privacy"; with sigma = 0 it is clipping
alone, which bounds but does not hide). The step then uses the batch mean:
    g = (sum_i min(1, C / ||g_i||) g_i + sigma C xi) / B,   xi ~ N(0, I) from the training generator.
The exemplar rows are not clipped: row i's gradient comes from sample i alone and leaves with its key.
No privacy accounting is claimed: the K' neighbours' exemplars a sample reads are themselves trained
on those neighbours, a channel the clip does not bound (docs/results/forgetting_at_defaults.md).

Per-sample gradients come from torch.func (functional_call + vmap(grad)); the cost is one vmapped
backward, which holds B x (shared parameters) floats at once.
Tests: tests/training/test_per_sample.py (against B separate backward passes).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn
from torch.func import functional_call, grad, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from munkey_core.config import TrainConfig
from munkey_core.training.losses import hardest_absent, step_loss


def clipped_backward(model: nn.Module, x: torch.Tensor, token: torch.Tensor, drop_img: torch.Tensor,
                     drop_tok: torch.Tensor, y: torch.Tensor, absent: torch.Tensor, q: torch.Tensor,
                     cfg: TrainConfig, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Set `.grad` of `model`'s parameters to the clipped, noised batch mean and backpropagate each
    sample's token gradient / B into `token`'s graph (the exemplar rows). Returns (logits (B, C), the
    summed per-sample loss after skipping), both detached.

    x (B, C, S, S) images, token (B, Dv) exemplar vectors (with the graph to the rows), drop_img /
    drop_tok / absent (B,) masks, y (B,) labels, q (B, C) neighbour label distributions.
    The loss is losses.step_loss's, sample by sample; its batch-level skipping of the hardest absent
    samples is applied to the per-sample losses before clipping (a skipped sample gives no gradient).
    """
    b = len(y)
    one = replace(cfg, absent_skip_hardest=0.0)  # skipping is a batch decision, taken below
    params = {k: p.detach() for k, p in model.named_parameters()}
    buffers = {k: t.detach() for k, t in model.named_buffers()}

    def sample_loss(p: dict, tok: torch.Tensor, xi: torch.Tensor, di: torch.Tensor, dt: torch.Tensor,
                    yi: torch.Tensor, ai: torch.Tensor, qi: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        logits = functional_call(model, (p, buffers), (xi[None], tok[None], di[None], dt[None]))  # (1, C)
        loss = step_loss(logits, yi[None], ai[None], qi[None], one)
        return loss, (loss.detach(), logits.detach()[0])

    with sdpa_kernel(SDPBackend.MATH):  # attention as matmuls, which vmap batches (the fused CPU kernel it loops)
        per_sample = vmap(grad(sample_loss, argnums=(0, 1), has_aux=True), randomness="different",
                          in_dims=(None, 0, 0, 0, 0, 0, 0, 0))  # the weights are shared, the rest per sample
        (g_params, g_token), (per, logits) = per_sample(params, token.detach(), x, drop_img, drop_tok, y, absent, q)
    keep = torch.ones(b, dtype=per.dtype, device=per.device)
    if cfg.absent_skip_hardest > 0:
        keep = (~hardest_absent(per, absent, cfg.absent_skip_hardest)).to(per.dtype)
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in g_params.values()))  # (B,)
    scale = keep * torch.clamp(cfg.per_sample_clip / (norms + 1e-12), max=1.0)  # (B,)
    noise_std = cfg.per_sample_noise * cfg.per_sample_clip
    for name, p in model.named_parameters():
        total = torch.einsum("b,b...->...", scale, g_params[name])
        if noise_std > 0:
            total = total + (noise_std * torch.randn(p.shape, generator=gen)).to(total.device, total.dtype)
        p.grad = total / b
    token.backward(g_token * (keep / b)[:, None])
    return logits, (per * keep).sum()
