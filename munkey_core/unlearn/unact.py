"""UnAct: erase a class from a trained classifier with forward passes only (SPEC.md section 4).

A request is a handful of images of the class (no label, no retain data). Each round scores the late
units on the *current* model, selects those at or above the p-th percentile and multiplies their
"in" and "out" weights by gamma; k rounds, stopping early when the edit would change nothing.

Selection (the reference code's rule, abdulmuizz0903/UnAct `_mask_from`): within each group of units,
the threshold is `torch.quantile(scores, p / 100)` (linear interpolation) and every unit scoring
`>=` it is selected, so tied units (dead channels scoring exactly 0) are all selected together.
Groups: the ResNet's channels form one group; a ViT's edited blocks are one group each (the reference
selects per block: the percentile is taken inside each block's neurons separately).

Scopes (which units, how they are scored, which weights an edit touches):
- `ResNetScope`: the 8w output channels of the last residual block; score = mean over the images of
  the spatially averaged post-ReLU activation; in = that channel's conv filter and BatchNorm scale and
  shift, out = the classifier column. BatchNorm statistics stay frozen (eval mode).
- `ViTScope`: the MLP hidden neurons of the last third of the blocks (`vit_blocks(depth)` =
  ceil(depth / 3): 4 of 12 as in the paper's ViT-B/16, 2 of the cpu profile's 4, 1 of the tiny
  profile's 2) at [CLS]; score = first-order logit attribution `mean_x g_j(x) (w_j . u_c) / sigma(x)`
  (g_j the GELU output, w_j the out-weight column, u_c the pseudo-class logit direction through the
  final LayerNorm's scale and centred, `u - mean(u)`, which accounts for the LayerNorm's mean
  subtraction as the reference's `_class_direction` does; sigma(x) that LayerNorm's per-sample scale);
  in = row j of fc1 and its bias, out = column j of fc2. Works on any timm VisionTransformer given a
  forward: the plain ViT's own, the MUNKEY backbone's image pathway (`munkey_image_forward`: the
  exemplar token is null_tok), or the path MUNKEY inference takes (`munkey_ensemble_forward`: each
  image with its K retrieved neighbours' exemplar tokens, weighted as the ensemble weighs them).
The pseudo-label c is the argmax of the *original* model's mean logits over the images, unless the
caller names the class (`target`; class removal on a MUNKEY run passes the class the run predicts).

Stopping: `stop="rounds"` runs the k rounds (the paper's rule); `stop="forgotten"` also stops as soon
as no request image is predicted as c any more and c's mean probability over them is below
n / (n + margin) times chance (1 / classes; n the request's images; margin 0 = chance, the rule for
ResNets and ViTs). A margin asks a few images for more than a flip: with 5 images the request
images stop giving c before the class's other images do (the MUNKEY default, margin 15: a quarter
of chance at n = 5, 0.9 of it for a 125-image class). `tail` (a multiple of chance) also asks every
request image for c's probability below tail x chance: a mean below chance still leaves the class's
most typical images near it, and the class's unseen images spread further than the request's, so
the least forgotten of them keep c (the MUNKEY default, tail 2: on the digits demo run class 2's
request stopped with one test image of 35 still given c, at 0.22, while its request images reached
0.24 at most; docs/results/unact_digits.md). Each round's scoring pass gives those probabilities
for free; stopping edits fewer units per request, which sequential requests need.

Kept classes (`RetainProbe`, forward-only like the rest; both off in the paper's rule): a request
may bring a small probe of images of the classes it must keep, with their labels, scored by a scope
over the same model whose forward feeds them as inference does. `guard` (points): a round's edit is
kept only while the probe's accuracy stays within `guard` points of its value when the request
started and, with `class_guard`, no kept class's own accuracy on the probe falls more than
`class_guard` points: a round can trade errors between kept classes (one collapses while another
gains) with the probe's accuracy unchanged (on a tiny digits run, removing class 8 after four
other classes raised the probe's accuracy 70 -> 74 % while its class 9 went 2/10 -> 0/10 and the
kept classes' test accuracy 78 -> 71 %). Both are counts of right answers, so they ignore the
general loss of confidence forgetting brings (on the digits demo run the probe's mean probability
of the right class falls 91.6 -> 77 % over a removal whose kept-class test accuracy rises). The
round that would breach either is undone (its weights restored from a copy taken before it) and
the request stops ("retain guard"), so a request that can no longer remove its class without
costing the kept ones says so instead of collapsing the model. `backoff` (a percentile above p): at
the first undo, the request goes on with that finer percentile (only the top units of each group a
round) and stops at the next breach. `protect` (a ratio rho): each round's
selection spares the units whose score for c is at most rho times their largest kept-class score
(the per-class mean, over the probe's images of that class, of the unit's attribution towards it).
Each round then costs one more batched forward, over the probe. Why sequential requests need the
guard: the selection takes a fixed share of each group a round whatever the scores, and after a few
requests nearly every unit in scope has been dampened; the units the kept classes still read are the
last ones left to take (docs/results/unact_digits.md measures it).

Cost: one batched forward over the n images per round (the first also gives the pseudo-label); no
autograd graph is ever built (everything runs under torch.no_grad) and no parameter's requires_grad
is touched. Deterministic given model, images and (p, gamma, k). Tests: tests/unlearn/test_unact.py.
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
STOPS = ("rounds", "forgotten")
# Working points (p, gamma, k). Paper (SPEC.md section 4): ResNet-18 CIFAR-10 and ViT-B/16 CIFAR-10.
# "munkey": the MUNKEY backbone scored along its inference path after class key deletion, measured on
# the digits demo run (docs/results/unact_digits.md).
DEFAULTS = {"resnet18": (99.0, 0.01, 20), "vit": (85.0, 0.1, 5), "munkey": (90.0, 0.01, 20)}

# A scope's forward: images (B, C, S, S) and their rows in the request -> (logits (B*K, classes),
# ensemble weights (B, K) or None when each image is one forward, K = 1).
ScopeForward = Callable[[torch.Tensor, slice], "tuple[torch.Tensor, torch.Tensor | None]"]


@dataclass(frozen=True)
class UnActConfig:
    """p: percentile in [0, 100]; gamma: damping factor in (0, 1); k: rounds (>= 1)."""

    p: float = 99.0
    gamma: float = 0.01
    k: int = 20
    score: str = "activation"   # ResNet only: activation (the paper's) | attribution
    stop: str = "rounds"        # rounds (the paper's: all k) | forgotten (also stop once the images no longer give c)
    protect: float | None = None  # spare units whose score for c is at most this times their kept-class one (probe)
    guard: float | None = None  # undo the round and stop once the probe's accuracy falls more than this (points)
    class_guard: float | None = None  # with guard (inert without): also once one kept class's probe accuracy falls more
    backoff: float | None = None  # after the guard's first undo, retry with this percentile before stopping
    margin: float = 0.0         # "forgotten" needs c's mean probability below n / (n + margin) x chance (n images)
    tail: float | None = None   # "forgotten" also needs c's largest probability over the images below tail x chance

    def check(self) -> None:
        """Raise a clear MunkeyError for values outside their ranges."""
        if not (isinstance(self.p, (int, float)) and 0.0 <= float(self.p) <= 100.0) or math.isnan(float(self.p)):
            raise MunkeyError(f"p must be a percentile between 0 and 100 (got {self.p}).")
        if not (isinstance(self.gamma, (int, float)) and 0.0 < float(self.gamma) < 1.0):
            raise MunkeyError(f"gamma must be strictly between 0 and 1 (got {self.gamma}): it multiplies the "
                              "selected units' weights.")
        if not (isinstance(self.k, int) and self.k >= 1):
            raise MunkeyError(f"k (rounds) must be a whole number >= 1 (got {self.k}).")
        if self.stop not in STOPS:
            raise MunkeyError(f"Unknown stopping rule '{self.stop}'; choose one of {', '.join(STOPS)}.")
        if not (isinstance(self.margin, (int, float)) and float(self.margin) >= 0.0):
            raise MunkeyError(f"margin must be a number of images >= 0 (got {self.margin}).")
        if self.tail is not None and not (isinstance(self.tail, (int, float)) and float(self.tail) > 0.0):
            raise MunkeyError(f"tail must be a multiple of chance above 0 (got {self.tail}).")
        if self.protect is not None and not (isinstance(self.protect, (int, float)) and float(self.protect) >= 0.0):
            raise MunkeyError(f"protect must be a ratio >= 0 (got {self.protect}).")
        if self.guard is not None and not (isinstance(self.guard, (int, float)) and 0.0 <= float(self.guard) <= 100.0):
            raise MunkeyError(f"guard must be a number of accuracy points between 0 and 100 (got {self.guard}).")
        if self.class_guard is not None and not (
                isinstance(self.class_guard, (int, float)) and 0.0 <= float(self.class_guard) <= 100.0):
            raise MunkeyError(f"class_guard must be accuracy points between 0 and 100 (got {self.class_guard}).")
        if self.backoff is not None and (self.guard is None or not (isinstance(self.backoff, (int, float))
                                                                     and float(self.p) < float(self.backoff) <= 100.0)):
            raise MunkeyError(f"backoff must be a percentile above p (got {self.backoff}) and needs a guard.")

    @property
    def needs_probe(self) -> bool:
        """Whether the request needs images of the kept classes (RetainProbe)."""
        return self.protect is not None or self.guard is not None


@dataclass
class RoundInfo:
    round: int                   # 1, 2, ... over the rounds kept (a round the retain guard undid is not one)
    selected: list[int]          # unit indices dampened this round
    top_score: float             # the highest unit score before this round's edit
    seconds: float
    still_predicted: float = 1.0  # fraction of the request's images predicted as c before this round's edit
    protected: int = 0           # units the percentile selected but `protect` spared (they carry a kept class)
    probe_accuracy: float | None = None  # the kept-class probe's accuracy (%) after this round's edit
    probe_class_drop: float | None = None  # the largest fall of one kept class's probe accuracy so far (points)


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
    stop_reason: str = ""        # "" (all k rounds) | "nothing left to change" | "forgotten" | "retain guard"
    probe_start: float | None = None  # the probe's accuracy (%) when the request started
    probe_class_start: dict[int, float] = field(default_factory=dict)  # each kept class's probe accuracy (%), then
    undone: list[int] = field(default_factory=list)  # units of the round the guard undid last
    backed_off: int | None = None  # the round whose edit the guard undid first, when `backoff` took over
    # the request's images on the final model, scored when a stop rule ends the request early ("forgotten",
    # "retain guard"): the fraction still predicted as c, and c's mean and largest probability over them
    left_predicted: float | None = None
    left_mean_prob: float | None = None
    left_max_prob: float | None = None


class UnitScope(Protocol):
    """The units UnAct may edit in one model."""

    n_units: int
    groups: list[tuple[int, int]]      # [start, end) unit ranges selected separately (per block)
    input_shape: tuple[int, int, int]  # (C, S, S) the model expects

    def forward_stats(self, x: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, classes) and the per-image, class-independent part of the unit scores (B, U)
        for images x, which are rows `rows` of the request."""

    def unit_weights(self, target: int) -> torch.Tensor | None:
        """The class-dependent factor of the unit scores (U,), or None when scores ignore the class."""

    def dampen(self, units: torch.Tensor, gamma: float) -> bool:
        """Multiply the in/out weights of `units` by gamma; False when that changes nothing."""

    def tensors(self) -> list[torch.Tensor]:
        """Every weight tensor `dampen` may write (copied before a guarded round, to undo it)."""


@dataclass
class RetainProbe:
    """Images of the classes a request keeps, with their labels (a few per class), and the scope that
    scores them: a scope over the same model whose forward feeds these images as inference does."""

    scope: "UnitScope"
    images: torch.Tensor   # (m, C, S, S)
    labels: np.ndarray     # (m,) their classes (never the forgotten one)
    ids: np.ndarray | None = None  # (m,) their sample ids, when they come from a run's data


def forgotten_below(cfg: UnActConfig, n: int) -> float:
    """The fraction of chance c's mean probability must fall below for `stop="forgotten"`: n / (n + margin)."""
    return float(n) / (float(n) + float(cfg.margin))


def select_units(scores: np.ndarray, p: float) -> np.ndarray:
    """The reference rule: every unit whose score is >= the p-th percentile of `scores`
    (torch.quantile, linear interpolation), so ties at the threshold are all selected.
    Returns indices in rank order (score descending, then index)."""
    s = torch.as_tensor(np.asarray(scores, dtype=np.float64))
    threshold = torch.quantile(s, float(p) / 100.0)
    chosen = torch.nonzero(s >= threshold).flatten().numpy()
    return chosen[np.lexsort((chosen, -s.numpy()[chosen]))]


def select_grouped(scores: np.ndarray, p: float, groups: Sequence[tuple[int, int]]) -> np.ndarray:
    """`select_units` inside each [start, end) group separately; global indices, group by group."""
    return np.concatenate([start + select_units(scores[start:end], p) for start, end in groups])


def vit_blocks(depth: int) -> int:
    """How many final blocks UnAct edits in a ViT: the last third, ceil(depth / 3) (4 of 12, 2 of 4)."""
    return max(1, math.ceil(depth / 3))


class ResNetScope:
    """The last residual block's output channels of a CIFAR-stem ResNet (munkey_core.classifiers.ResNet18).

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
        self.groups = [(0, self.n_units)]
        self.input_shape = (model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size)

    def forward_stats(self, x: torch.Tensor, rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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

    def tensors(self) -> list[torch.Tensor]:
        bn = self.block.bn2
        return [self.block.conv2.weight, bn.weight, bn.bias, self.model.fc.weight]

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

    `forward(x, rows)` must run the model to its logits through `vit.blocks`, `vit.norm` and `vit.head`
    and return (logits (B*K, classes), ensemble weights (B, K) or None); with weights, an image's
    score part is the weighted sum over its K forwards and its logits are the log of the ensemble's
    probabilities (what inference predicts from)."""

    def __init__(self, vit: nn.Module, forward: ScopeForward, input_shape: tuple[int, int, int],
                 last_blocks: int | None = None, head: bool = False) -> None:
        self.vit, self.forward = vit, forward
        n = vit_blocks(len(vit.blocks)) if last_blocks is None else int(last_blocks)
        if not 1 <= n <= len(vit.blocks):
            raise MunkeyError(f"UnAct can edit 1 to {len(vit.blocks)} final blocks of this ViT (got {n}).")
        self.blocks = list(vit.blocks)[-n:]
        self.hidden = self.blocks[0].mlp.fc1.out_features
        self.n_mlp = self.hidden * len(self.blocks)
        self.groups = [(i * self.hidden, (i + 1) * self.hidden) for i in range(len(self.blocks))]
        self.head = bool(head)
        if self.head:  # the D classifier inputs: one more group
            self.groups.append((self.n_mlp, self.n_mlp + vit.head.in_features))
        self.n_units = self.groups[-1][1]
        self.input_shape = input_shape

    def forward_stats(self, x: torch.Tensor, rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and g_j(x) / sigma(x) for every unit (B, U): the score without its class factor."""
        acts: list[torch.Tensor] = []
        resid: list[torch.Tensor] = []
        hooks = [b.mlp.act.register_forward_hook(lambda m, i, o: acts.append(o[:, 0, :])) for b in self.blocks]
        hooks.append(self.vit.norm.register_forward_hook(lambda m, i, o: resid.append(i[0][:, 0, :])))
        feats: list[torch.Tensor] = []
        if self.head:
            hooks.append(self.vit.head.register_forward_hook(lambda m, i, o: feats.append(i[0])))
        try:
            logits, weights = self.forward(x, slice(0, len(x)) if rows is None else rows)
        finally:
            for h in hooks:
                h.remove()
        sigma = torch.sqrt(resid[-1].var(dim=1, unbiased=False) + self.vit.norm.eps)  # (B*K,) final LN scale
        r = len(sigma)
        # blocks before the exemplar token joins run once per image: repeat them for its K forwards
        acts = [a if len(a) == r else a.repeat_interleave(r // len(a), dim=0) for a in acts]
        base = torch.cat(acts, dim=1) / sigma[:, None]  # (B*K, U_mlp)
        if self.head:
            base = torch.cat([base, feats[-1]], dim=1)  # + the classifier inputs (B*K, D): (B*K, U)
        if weights is None:
            return logits, base
        b, k = weights.shape
        w = weights.to(base.dtype)[..., None]  # (B, K, 1)
        probs = (w * torch.softmax(logits.reshape(b, k, -1), dim=-1)).sum(1)  # the ensemble's output (B, classes)
        return probs.clamp_min(1e-30).log(), (w * base.reshape(b, k, -1)).sum(1)

    def unit_weights(self, target: int) -> torch.Tensor:
        """w_j . u_c for every unit (U,): u = (head row c - mean head row) * final LayerNorm weight,
        centred (u - mean(u)): the LayerNorm subtracts the mean, so only u's centred part is read."""
        head = self.vit.head.weight  # (classes, D)
        u = (head[target] - head.mean(dim=0)) * self.vit.norm.weight  # (D,)
        u = u - u.mean()
        parts = [b.mlp.fc2.weight.T @ u for b in self.blocks]
        if self.head:
            parts.append(head[target] - head.mean(dim=0))  # a classifier input's weight towards c vs the mean
        return torch.cat(parts)

    def logits_and_scores(self, x: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, classes) and per-image unit scores (B, U)."""
        return _logits_and_scores(self, x, target)

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for block in self.blocks:
            fc1, fc2 = block.mlp.fc1, block.mlp.fc2
            out += [fc1.weight, fc2.weight] + ([fc1.bias] if fc1.bias is not None else [])
        return out + ([self.vit.head.weight] if self.head else [])

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
        if self.head:
            dims = units[units >= self.n_mlp] - self.n_mlp
            if len(dims):
                w = self.vit.head.weight
                changed |= bool(w[:, dims].abs().sum() > 0)
                w[:, dims] *= gamma  # a classifier input: its column of the head (the reference's head scope)
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
    logits, base = scope.forward_stats(x, slice(0, len(x)))
    w = scope.unit_weights(target)
    return logits, base if w is None else base * w[None, :]


def _mean_stats(scope: UnitScope, images: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean logits (classes,), the mean class-independent score part (U,), accumulated in float64, and
    each image's class probabilities (n, classes). The class factor does not depend on the image, so
    mean(score) = mean(part) * factor."""
    logit_sum, base_sum, probs = None, None, []
    for start in range(0, len(images), _BATCH):
        rows = slice(start, min(start + _BATCH, len(images)))
        logits, base = scope.forward_stats(images[rows], rows)
        ls, bs = logits.double().sum(0).cpu(), base.double().sum(0).cpu()
        logit_sum = ls if logit_sum is None else logit_sum + ls
        base_sum = bs if base_sum is None else base_sum + bs
        probs.append(torch.softmax(logits.double(), dim=1).cpu().numpy())
    return (logit_sum / len(images)).numpy(), (base_sum / len(images)).numpy(), np.concatenate(probs)


def _scores(scope: UnitScope, base_mean: np.ndarray, target: int) -> np.ndarray:
    w = scope.unit_weights(target)
    return base_mean if w is None else base_mean * w.double().cpu().numpy()


def _probe_stats(probe: RetainProbe) -> tuple[float, dict[int, float], np.ndarray]:
    """The probe's accuracy (%), each kept class's accuracy on it (%), and for every unit the largest,
    over the kept classes, of its mean attribution towards that class (U,): how much the unit carries
    some kept class."""
    correct, right, sums, counts = 0, {}, {}, {}
    labels = np.asarray(probe.labels)
    for start in range(0, len(probe.images), _BATCH):
        rows = slice(start, min(start + _BATCH, len(probe.images)))
        logits, base = probe.scope.forward_stats(probe.images[rows], rows)  # (B, classes), (B, U)
        lab = labels[rows]
        hit = logits.argmax(1).cpu().numpy() == lab  # (B,)
        correct += int(hit.sum())
        base = base.double().cpu()
        for c in np.unique(lab):
            mine = lab == c  # (B,) this batch's images of kept class c
            right[int(c)] = right.get(int(c), 0) + int(hit[mine].sum())
            part = base[torch.as_tensor(mine)].sum(0)
            sums[int(c)] = part if int(c) not in sums else sums[int(c)] + part
            counts[int(c)] = counts.get(int(c), 0) + int(mine.sum())
    kept = np.stack([_scores(probe.scope, (sums[c] / counts[c]).numpy(), c) for c in sorted(sums)]).max(0)
    return 100.0 * correct / len(labels), {c: 100.0 * right[c] / counts[c] for c in sorted(counts)}, kept


def unact(scope: UnitScope, images: torch.Tensor, cfg: UnActConfig,
          on_round: Callable[[RoundInfo], None] | None = None, target: int | None = None,
          retain: RetainProbe | None = None) -> UnActResult:
    """Edit the scope's model in place to suppress the class of `images`; returns what was done.

    `target`: the class to suppress; None (the default) = the pseudo-label, the argmax of the model's
    mean logits over the images. `retain`: the kept classes' probe, needed when `cfg.protect` or
    `cfg.guard` is set. Validates everything first: on bad input it raises MunkeyError and the model
    is unchanged. The caller passes the model in eval mode (a copy, when the original must stay
    untouched).
    """
    cfg.check()
    _check_images(images, scope)
    if cfg.needs_probe:
        if retain is None or len(retain.images) == 0:
            raise MunkeyError("This UnAct setting protects the kept classes: it needs a few images of the classes "
                              "to keep (a retain probe); turn protect and guard off to run without one.")
        _check_images(retain.images, retain.scope)
        if len(retain.labels) != len(retain.images):
            raise MunkeyError("The retain probe needs one label per image.")
    t0 = time.perf_counter()
    callback_seconds = 0.0
    with torch.no_grad():
        mean_logits, base_mean, probs = _mean_stats(scope, images)  # this pass also scores round 1
        if target is None:
            target = int(np.argmax(mean_logits))  # the pseudo-label: no label is read
        elif not 0 <= int(target) < len(mean_logits):
            raise MunkeyError(f"Class {target} does not exist in this model (classes 0-{len(mean_logits) - 1}).")
        target = int(target)
        result = UnActResult(target, [float(v) for v in mean_logits], len(images), scope.n_units, cfg)
        if cfg.needs_probe:
            if np.any(np.asarray(retain.labels) == target):
                raise MunkeyError(f"The retain probe holds images of class {target}, the class being removed.")
            result.probe_start, result.probe_class_start, kept = _probe_stats(retain)
        p = float(cfg.p)
        for r in range(1, cfg.k + 1):
            tr = time.perf_counter()
            if r > 1:
                _, base_mean, probs = _mean_stats(scope, images)  # re-score the edited model
            still = float(np.mean(probs.argmax(axis=1) == target))
            left = (still, float(probs[:, target].mean()), float(probs[:, target].max()))  # the model as it stands
            if (r > 1 and cfg.stop == "forgotten" and still == 0.0  # the stop reads the numbers it reports
                    and left[1] < forgotten_below(cfg, len(images)) / probs.shape[1]
                    and (cfg.tail is None or left[2] < float(cfg.tail) / probs.shape[1])):
                result.stopped_early, result.stop_reason = True, "forgotten"
                result.left_predicted, result.left_mean_prob, result.left_max_prob = left
                break
            scores = _scores(scope, base_mean, target)
            units = select_grouped(scores, p, scope.groups)
            spared = 0
            if cfg.protect is not None:  # a unit that carries a kept class about as much as c stays
                mine = scores[units] > float(cfg.protect) * kept[units]
                spared, units = int((~mine).sum()), units[mine]
                if len(units) == 0:
                    result.stopped_early, result.stop_reason = True, "nothing left to change"
                    break
            saved = [t.clone() for t in scope.tensors()] if cfg.guard is not None else None
            changed = scope.dampen(torch.as_tensor(units, device=images.device), float(cfg.gamma))
            if not changed:
                result.stopped_early, result.stop_reason = True, "nothing left to change"
                break
            accuracy = drop = None
            if cfg.needs_probe:
                kept_before = kept
                accuracy, per_class, kept = _probe_stats(retain)  # the edited model: also next round's kept scores
                drop = max(result.probe_class_start[c] - a for c, a in per_class.items())
                if cfg.guard is not None and (accuracy < result.probe_start - float(cfg.guard) or (
                        cfg.class_guard is not None and drop > float(cfg.class_guard))):
                    for t, old in zip(scope.tensors(), saved):
                        t.copy_(old)  # undo this round: the kept classes were starting to pay for it
                    kept = kept_before
                    if cfg.backoff is not None and p < float(cfg.backoff):
                        p = float(cfg.backoff)  # retry with finer steps: only the top units of each group
                        result.backed_off = r
                        continue
                    result.undone = [int(u) for u in units]
                    result.stopped_early, result.stop_reason = True, "retain guard"
                    result.left_predicted, result.left_mean_prob, result.left_max_prob = left  # the undone round's start
                    break
            info = RoundInfo(len(result.rounds) + 1, [int(u) for u in units], float(scores[units].max()),
                             time.perf_counter() - tr, still, spared, accuracy, drop)
            result.rounds.append(info)
            if on_round is not None:
                tc = time.perf_counter()
                on_round(info)
                callback_seconds += time.perf_counter() - tc
    result.seconds = time.perf_counter() - t0 - callback_seconds
    return result


def scope_for(model: nn.Module, forward: ScopeForward | None = None, input_shape: Sequence[int] | None = None,
              score: str = "activation", blocks: int | None = None, head: bool = False) -> UnitScope:
    """The UnAct scope of a ResNet-18, a plain timm ViT or a MUNKEY ViT (default: its image pathway).
    ViTs: `blocks` = how many final blocks' MLP neurons to edit (default `vit_blocks(depth)`, the last
    third); `head` adds the classifier's inputs as one more group."""
    from timm.models.vision_transformer import VisionTransformer

    from munkey_core.model.classifiers import ResNet18
    from munkey_core.model.munkey_vit import MunkeyViT

    if isinstance(model, ResNet18):
        return ResNetScope(model, score)
    if isinstance(model, MunkeyViT):
        c = model.cfg
        return ViTScope(model.vit, forward or munkey_image_forward(model), (c.in_chans, c.img_size, c.img_size),
                        blocks, head)
    if isinstance(model, VisionTransformer):
        shape = input_shape or (model.patch_embed.proj.in_channels, *model.patch_embed.img_size)
        return ViTScope(model, forward or (lambda x, rows: (model(x), None)), tuple(shape), blocks, head)
    raise MunkeyError(f"UnAct supports ResNet-18 and ViT models, not {type(model).__name__}.")


def munkey_image_forward(model: nn.Module) -> ScopeForward:
    """The MUNKEY ViT's image pathway: the exemplar token is null_tok, so no bank entry is read."""
    def forward(x: torch.Tensor, rows: slice | None = None) -> tuple[torch.Tensor, None]:
        tok = model.null_tok.expand(len(x), 1, -1)
        return model.forward_head(model.forward_tokens(model.embed_image(x), tok)), None
    return forward


def munkey_ensemble_forward(model: nn.Module, values: torch.Tensor, weights: torch.Tensor) -> ScopeForward:
    """The path MUNKEY inference takes: request image i with each of its K retrieved neighbours'
    exemplars `values[i]` (n, K, Dv), weighted by the ensemble weights `weights[i]` (n, K).
    Retrieval reads only keys, so the neighbours (from the bank the request leaves) are found once."""
    def forward(x: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        v, w = values[rows].to(x.device), weights[rows].to(x.device)
        logits = model.forward_multi(x, v)  # (B, K, classes)
        return logits.reshape(-1, logits.shape[-1]), w
    return forward
