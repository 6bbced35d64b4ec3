"""SSD and LFSSD: post-hoc class forgetting by dampening parameters important to the forget set.

- SSD (Selective Synaptic Dampening): importance I = mean over batches of grad^2 of the cross-entropy,
  on the forget set (I_f) and on the full training set (I_D). Every parameter element with
  I_f > alpha * I_D is multiplied by beta = min(lambda * I_D / I_f, 1). Needs labels and backprop,
  and depends on the batch size.
- LFSSD (label-free SSD): the same selection with loss = mean squared L2 norm of the model output and
  importance = mean over batches of |grad|.
Defaults: lambda = 1, alpha = 10 (ViT: alpha = 5), batch size 64.

Batch order of I_D (`reference_order`): the reference code (if-loops/selective-synaptic-dampening,
`forget_full_class_main.py`) computes I_D over `ConcatDataset(retain, forget)` unshuffled, the retain
data sorted by class (dataset order within a class) followed by the forget class, so the forget class
sits in batches of its own. The order changes I_D (mean over batches of the squared *batch-mean*
gradient): mixing the class into every batch shrinks I_D for the class's parameters and makes SSD
dampen far more of the network. I_D therefore depends on the forget class and is cached per class.

I_D is the expensive part (a backward pass over the whole training set); `importance` results are
cached on disk by `cached_importance` (keyed by the model's fingerprint, method and batch size), so a
request can be timed "cold" (I_D computed) and "warm" (I_D read). The model is kept in eval mode
(BatchNorm statistics frozen). Tests: tests/unlearn/test_ssd.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from munkey_core.errors import MunkeyError
from munkey_core.atomic import atomic_torch_save
from munkey_core.training.torchfix import odd_batch_guard

METHODS = ("ssd", "lfssd")
Importance = dict[str, torch.Tensor]


@dataclass(frozen=True)
class SSDConfig:
    method: str = "ssd"      # ssd | lfssd
    alpha: float = 10.0      # selection threshold (ViT: 5)
    lam: float = 1.0         # lambda in beta = min(lambda I_D / I_f, 1)
    batch_size: int = 64


def reference_order(labels: np.ndarray, forget_class: int) -> np.ndarray:
    """Indices of the training data in the order the reference code feeds I_D: every retain class in
    ascending class order (dataset order inside a class), then the forget class."""
    labels = np.asarray(labels)
    index = np.arange(len(labels))
    return np.lexsort((index, labels, labels == forget_class))  # last key first: retain before forget


def importance(model: nn.Module, to_input: Callable[[np.ndarray], torch.Tensor], images: np.ndarray,
               labels: np.ndarray | None, method: str, batch_size: int = 64) -> Importance:
    """Mean over batches of grad^2 of the cross-entropy (ssd) or |grad| of the output's squared L2 norm
    (lfssd), per parameter. `to_input` turns uint8 images (B, H, W, C) into the model's input."""
    if method not in METHODS:
        raise MunkeyError(f"Unknown method '{method}'; choose ssd or lfssd.")
    if len(images) == 0:
        raise MunkeyError("No images to compute parameter importance on.")
    if method == "ssd" and labels is None:
        raise MunkeyError("SSD needs the labels of the images (LFSSD does not).")
    model.eval()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    batches = 0
    for start in range(0, len(images), batch_size):
        x = to_input(images[start:start + batch_size])
        with odd_batch_guard(len(x)):
            out = model(x)
            if method == "ssd":
                y = torch.as_tensor(labels[start:start + batch_size], dtype=torch.long, device=out.device)
                loss = F.cross_entropy(out, y)
            else:
                loss = out.pow(2).sum(dim=1).mean()
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for (n, _), g in zip(params.items(), grads):
            if g is not None:
                total[n] += g.pow(2) if method == "ssd" else g.abs()
        batches += 1
    return {n: t / batches for n, t in total.items()}


@torch.no_grad()
def dampen(model: nn.Module, forget_imp: Importance, full_imp: Importance, alpha: float, lam: float) -> int:
    """Multiply parameter elements with I_f > alpha I_D by min(lam I_D / I_f, 1); returns how many."""
    count = 0
    for name, p in model.named_parameters():
        if name not in forget_imp or name not in full_imp:
            continue
        i_f, i_d = forget_imp[name], full_imp[name]
        mask = i_f > alpha * i_d
        beta = torch.clamp(lam * i_d / i_f.clamp_min(1e-30), max=1.0)
        p[mask] *= beta[mask]
        count += int(mask.sum())
    return count


def cached_importance(cache_dir: Path, model_fp: str, method: str, batch_size: int,
                      compute: Callable[[], Importance], refresh: bool = False,
                      order: str = "") -> tuple[Importance, bool]:
    """(I_D, was_cached): read from `cache_dir` when this model's importance was computed before with
    the same batch order (`order`, e.g. "c3": the reference order for forget class 3);
    `refresh` recomputes it (a "cold" request) and stores the result for the next one."""
    tag = f"_{order}" if order else ""
    path = Path(cache_dir) / f"{method}_b{batch_size}{tag}_{model_fp[:16]}.pt"
    if path.exists() and not refresh:
        try:
            return torch.load(path, weights_only=True), True
        except Exception:
            path.unlink(missing_ok=True)  # a damaged cache is recomputed
    imp = compute()
    atomic_torch_save(path, {k: v.detach().cpu() for k, v in imp.items()})
    return imp, False


@dataclass
class SSDResult:
    method: str
    dampened: int                # parameter elements dampened
    seconds: float
    full_importance_cached: bool
    dampened_pct: float = 0.0    # of all parameter elements


def ssd_forget(model: nn.Module, to_input: Callable[[np.ndarray], torch.Tensor], forget_images: np.ndarray,
               forget_labels: np.ndarray | None, full_importance: Callable[[], tuple[Importance, bool]],
               cfg: SSDConfig) -> SSDResult:
    """Run SSD/LFSSD on `model` in place. `full_importance()` returns (I_D, was it cached)."""
    t0 = time.perf_counter()
    i_d, cached = full_importance()
    device = next(model.parameters()).device
    i_d = {k: v.to(device) for k, v in i_d.items()}
    i_f = importance(model, to_input, forget_images, forget_labels, cfg.method, cfg.batch_size)
    n = dampen(model, i_f, i_d, cfg.alpha, cfg.lam)
    model.zero_grad(set_to_none=True)
    total = sum(p.numel() for p in model.parameters())
    return SSDResult(cfg.method, n, time.perf_counter() - t0, cached, 100.0 * n / max(total, 1))
