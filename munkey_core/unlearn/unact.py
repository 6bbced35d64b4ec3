"""UnAct: erase a class from a trained classifier with forward passes only (SPEC.md section 4).

A request is a handful of images of the class (no label, no retain data). Each round scores the late
units on the *current* model, selects those at or above the p-th percentile and multiplies their
"in" and "out" weights by gamma; k rounds, stopping early when the edit would change nothing.

Scopes (which units, how they are scored, which weights an edit touches):
- `ResNetScope`: the 8w output channels of the last residual block; score = mean over the images of
  the spatially averaged post-ReLU activation; in = that channel's conv filter and BatchNorm scale and
  shift, out = the classifier column. BatchNorm statistics stay frozen (eval mode).
- `ViTScope`: the MLP hidden neurons of the last four blocks at [CLS]; score = first-order logit
  attribution `mean_x g_j(x) (w_j . u_c) / sigma(x)` (g_j the GELU output, w_j the out-weight column,
  u_c the pseudo-class logit direction through the final LayerNorm's scale, sigma(x) that LayerNorm's
  per-sample scale); in = row j of fc1 and its bias, out = column j of fc2. Works on any timm
  VisionTransformer given its forward (plain ViT, or the MUNKEY backbone with the exemplar token
  replaced by null_tok, so the bank is not read).
The pseudo-label c is the argmax of the *original* model's mean logits over the images.

Cost: one batched forward over the n images per round (the first also gives the pseudo-label); no autograd graph is ever built (everything
runs under torch.no_grad) and no parameter's requires_grad is touched. Deterministic given model,
images and (p, gamma, k). Tests: tests/test_unact.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np
import torch
import torch.nn as nn

from munkey_core.errors import MunkeyError

_BATCH = 256
# Paper working points (SPEC.md section 4): ResNet-18 CIFAR-10 and ViT-B/16 CIFAR-10.
DEFAULTS = {"resnet18": (99.0, 0.01, 20), "vit": (85.0, 0.1, 5),
            # the MUNKEY backbone (its image pathway, after class key deletion): our measured point on
            # fashion-mnist (docs/results/unact_fashion-mnist.md); the ViT point left Af far higher there
            "munkey": (99.0, 0.01, 20)}


@dataclass(frozen=True)
class UnActConfig:
    """p: percentile in [0, 100]; gamma: damping factor in (0, 1); k: rounds (>= 1)."""

    p: float = 99.0
    gamma: float = 0.01
    k: int = 20
    score: str = "activation"   # ResNet only: activation (the paper's) | attribution

    def check(self) -> None:
        """Raise a clear MunkeyError for values outside their ranges."""
        if not (isinstance(self.p, (int, float)) and 0.0 <= float(self.p) <= 100.0) or math.isnan(float(self.p)):
            raise MunkeyError(f"p must be a percentile between 0 and 100 (got {self.p}).")
        if not (isinstance(self.gamma, (int, float)) and 0.0 < float(self.gamma) < 1.0):
            raise MunkeyError(f"gamma must be strictly between 0 and 1 (got {self.gamma}): it multiplies the "
                              "selected units' weights.")
        if not (isinstance(self.k, int) and self.k >= 1):
            raise MunkeyError(f"k (rounds) must be a whole number >= 1 (got {self.k}).")


@dataclass
class RoundInfo:
    round: int
    selected: list[int]          # unit indices dampened this round
    top_score: float             # the highest unit score before this round's edit
    seconds: float


@dataclass
class UnActResult:
    pseudo_label: int
    mean_logits: list[float]     # the original model's mean logits over the images
    n_images: int
    n_units: int
    config: UnActConfig
    rounds: list[RoundInfo] = field(default_factory=list)
    seconds: float = 0.0         # the edit itself (time spent in the on_round callback excluded)
    stopped_early: bool = False


class UnitScope(Protocol):
    """The units UnAct may edit in one model."""

    n_units: int
    input_shape: tuple[int, int, int]  # (C, S, S) the model expects

    def forward_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, classes) and the per-image, class-independent part of the unit scores (B, U)."""

    def unit_weights(self, target: int) -> torch.Tensor | None:
        """The class-dependent factor of the unit scores (U,), or None when scores ignore the class."""

    def dampen(self, units: torch.Tensor, gamma: float) -> bool:
        """Multiply the in/out weights of `units` by gamma; False when that changes nothing."""


def select_units(scores: np.ndarray, p: float) -> np.ndarray:
    """Units at or above the p-th percentile: exactly the top `n - ceil((n - 1) p / 100)` by score,
    ties broken by the lower index. Returns indices in rank order."""
    scores = np.asarray(scores, dtype=np.float64)
    n = len(scores)
    m = max(1, n - math.ceil((n - 1) * float(p) / 100.0))
    order = np.lexsort((np.arange(n), -scores))  # primary: score descending; then index ascending
    return order[:m]


class ResNetScope:
    """The last residual block's output channels of a CIFAR-stem ResNet (munkey_core.model.classifiers.ResNet18).

    `score="activation"` (the paper's rule): the channel's mean pooled post-ReLU activation.
    `score="attribution"` (our option, the ViT rule carried over): that activation times the channel's
    weight towards the pseudo-class logit relative to the mean logit, `a_j (W[c, j] - mean_c' W[c', j])`,
    exact for the logits since they are linear in the pooled features; it spares channels that every
    class uses."""

    SCORES = ("activation", "attribution")

    def __init__(self, model: nn.Module, score: str = "activation") -> None:
        if score not in self.SCORES:
            raise MunkeyError(f"Unknown ResNet scoring '{score}'; choose one of {', '.join(self.SCORES)}.")
        self.model, self.score = model, score
        self.block = model.layer4[-1]
        self.n_units = model.fc.in_features
        self.input_shape = (model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size)

    def forward_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.model.forward_head(self.model.forward_features(x), pre_logits=True)  # (B, U)
        return self.model.fc(pooled), pooled

    def unit_weights(self, target: int) -> torch.Tensor | None:
        if self.score == "activation":
            return None
        w = self.model.fc.weight  # (classes, U)
        return w[target] - w.mean(dim=0)

    def logits_and_scores(self, x: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, classes) and per-image unit scores (B, U)."""
        return _logits_and_scores(self, x, target)

    def dampen(self, units: torch.Tensor, gamma: float) -> bool:
        conv, bn, fc = self.block.conv2.weight, self.block.bn2, self.model.fc.weight
        changed = bool(conv[units].abs().sum() + bn.weight[units].abs().sum() + bn.bias[units].abs().sum()
                       + fc[:, units].abs().sum() > 0)
        conv[units] *= gamma          # in: the filters producing the channels
        bn.weight[units] *= gamma     # and their BatchNorm scale and shift
        bn.bias[units] *= gamma
        fc[:, units] *= gamma         # out: the classifier columns
        return changed


class ViTScope:
    """MLP hidden neurons of the last `last_blocks` blocks of a timm VisionTransformer, read at [CLS].

    `forward(x)` must run the model to its logits through `vit.blocks`, `vit.norm` and `vit.head`
    (the plain ViT's own forward, or the MUNKEY backbone's image pathway)."""

    def __init__(self, vit: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor],
                 input_shape: tuple[int, int, int], last_blocks: int = 4) -> None:
        self.vit, self.forward = vit, forward
        self.blocks = list(vit.blocks)[-last_blocks:]
        self.hidden = self.blocks[0].mlp.fc1.out_features
        self.n_units = self.hidden * len(self.blocks)
        self.input_shape = input_shape

    def forward_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and g_j(x) / sigma(x) for every unit (B, U): the score without its class factor."""
        acts: list[torch.Tensor] = []
        resid: list[torch.Tensor] = []
        hooks = [b.mlp.act.register_forward_hook(lambda m, i, o: acts.append(o[:, 0, :])) for b in self.blocks]
        hooks.append(self.vit.norm.register_forward_hook(lambda m, i, o: resid.append(i[0][:, 0, :])))
        try:
            logits = self.forward(x)
        finally:
            for h in hooks:
                h.remove()
        sigma = torch.sqrt(resid[-1].var(dim=1, unbiased=False) + self.vit.norm.eps)  # (B,) final LN scale
        return logits, torch.cat(acts, dim=1) / sigma[:, None]

    def unit_weights(self, target: int) -> torch.Tensor:
        """w_j . u_c for every unit (U,): u_c = (head row c - mean head row) * final LayerNorm weight."""
        head = self.vit.head.weight  # (classes, D)
        u = (head[target] - head.mean(dim=0)) * self.vit.norm.weight  # (D,)
        return torch.cat([b.mlp.fc2.weight.T @ u for b in self.blocks])

    def logits_and_scores(self, x: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, classes) and per-image unit scores (B, U)."""
        return _logits_and_scores(self, x, target)

    def dampen(self, units: torch.Tensor, gamma: float) -> bool:
        changed = False
        for bi, block in enumerate(self.blocks):
            local = units[(units >= bi * self.hidden) & (units < (bi + 1) * self.hidden)] - bi * self.hidden
            if len(local) == 0:
                continue
            fc1, fc2 = block.mlp.fc1, block.mlp.fc2
            changed |= bool(fc1.weight[local].abs().sum() + fc2.weight[:, local].abs().sum() > 0)
            fc1.weight[local] *= gamma    # in: row j of the first linear
            if fc1.bias is not None:
                fc1.bias[local] *= gamma  # and its bias
            fc2.weight[:, local] *= gamma  # out: column j of the second
        return changed


def _check_images(images: torch.Tensor, scope: UnitScope) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or len(images) == 0:
        raise MunkeyError("UnAct needs at least one image of the class to forget (a batch of shape (n, C, S, S)).")
    if tuple(images.shape[1:]) != tuple(scope.input_shape):
        c, s, _ = scope.input_shape
        raise MunkeyError(f"The images have shape {tuple(images.shape[1:])} (channels, height, width) but the model "
                          f"expects ({c}, {s}, {s}); prepare them with the run's image loader.")
    if not torch.isfinite(images).all():
        raise MunkeyError("The images contain NaN or infinite values.")


def _logits_and_scores(scope: UnitScope, x: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits, base = scope.forward_stats(x)
    w = scope.unit_weights(target)
    return logits, base if w is None else base * w[None, :]


def _mean_stats(scope: UnitScope, images: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean logits (classes,) and the mean class-independent score part (U,), accumulated in float64.
    The class factor does not depend on the image, so mean(score) = mean(part) * factor."""
    logit_sum, base_sum = None, None
    for start in range(0, len(images), _BATCH):
        logits, base = scope.forward_stats(images[start:start + _BATCH])
        ls, bs = logits.double().sum(0).cpu(), base.double().sum(0).cpu()
        logit_sum = ls if logit_sum is None else logit_sum + ls
        base_sum = bs if base_sum is None else base_sum + bs
    return (logit_sum / len(images)).numpy(), (base_sum / len(images)).numpy()


def _scores(scope: UnitScope, base_mean: np.ndarray, target: int) -> np.ndarray:
    w = scope.unit_weights(target)
    return base_mean if w is None else base_mean * w.double().cpu().numpy()


def unact(scope: UnitScope, images: torch.Tensor, cfg: UnActConfig,
          on_round: Callable[[RoundInfo], None] | None = None) -> UnActResult:
    """Edit the scope's model in place to suppress the class of `images`; returns what was done.

    Validates everything first: on bad input it raises MunkeyError and the model is unchanged.
    The caller passes the model in eval mode (a copy, when the original must stay untouched).
    """
    cfg.check()
    _check_images(images, scope)
    t0 = time.perf_counter()
    callback_seconds = 0.0
    with torch.no_grad():
        mean_logits, base_mean = _mean_stats(scope, images)  # this pass also scores round 1
        target = int(np.argmax(mean_logits))  # the pseudo-label: no label is read
        result = UnActResult(target, [float(v) for v in mean_logits], len(images), scope.n_units, cfg)
        for r in range(1, cfg.k + 1):
            tr = time.perf_counter()
            if r > 1:
                _, base_mean = _mean_stats(scope, images)  # re-score the edited model
            scores = _scores(scope, base_mean, target)
            units = select_units(scores, cfg.p)
            changed = scope.dampen(torch.as_tensor(units, device=images.device), float(cfg.gamma))
            if not changed:
                result.stopped_early = True
                break
            info = RoundInfo(r, [int(u) for u in units], float(scores[units[0]]), time.perf_counter() - tr)
            result.rounds.append(info)
            if on_round is not None:
                tc = time.perf_counter()
                on_round(info)
                callback_seconds += time.perf_counter() - tc
    result.seconds = time.perf_counter() - t0 - callback_seconds
    return result


def scope_for(model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
              input_shape: Sequence[int] | None = None, score: str = "activation") -> UnitScope:
    """The UnAct scope of a ResNet-18, a plain timm ViT or a MUNKEY ViT (image pathway)."""
    from timm.models.vision_transformer import VisionTransformer

    from munkey_core.model.classifiers import ResNet18
    from munkey_core.model.munkey_vit import MunkeyViT

    if isinstance(model, ResNet18):
        return ResNetScope(model, score)
    if isinstance(model, MunkeyViT):
        c = model.cfg
        return ViTScope(model.vit, forward or munkey_image_forward(model), (c.in_chans, c.img_size, c.img_size))
    if isinstance(model, VisionTransformer):
        shape = input_shape or (model.patch_embed.proj.in_channels, *model.patch_embed.img_size)
        return ViTScope(model, forward or model, tuple(shape))
    raise MunkeyError(f"UnAct supports ResNet-18 and ViT models, not {type(model).__name__}.")


def munkey_image_forward(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MUNKEY ViT's image pathway: the exemplar token is null_tok, so no bank entry is read."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        tok = model.null_tok.expand(len(x), 1, -1)
        return model.forward_head(model.forward_tokens(model.embed_image(x), tok))
    return forward
