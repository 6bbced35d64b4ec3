"""Shared pieces of the gradient-based post-hoc unlearning methods (NegGrad+, SCRUB, Amnesiac).

Labelled uint8 image sets are `(images (N, H, W, C), labels (N,))` pairs; `to_input` turns a uint8
batch into the model's input tensor. Every loop is seeded, so a method is deterministic on CPU.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn as nn

from munkey_core.model.classifiers import param_groups

Labelled = tuple[np.ndarray, np.ndarray]  # images (N, H, W, C) uint8, labels (N,)
ToInput = Callable[[np.ndarray], torch.Tensor]


def batches(n: int, batch_size: int, gen: torch.Generator) -> Iterator[np.ndarray]:
    """A seeded random permutation of range(n), cut into batches of row indices."""
    perm = torch.randperm(n, generator=gen).numpy()
    for start in range(0, n, batch_size):
        yield perm[start:start + batch_size]


def cycling(n: int, batch_size: int, gen: torch.Generator) -> Iterator[np.ndarray]:
    """Endless seeded batches of range(n) (a new permutation each pass)."""
    while True:
        yield from batches(n, batch_size, gen)


def adamw(model: nn.Module, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the model's parameters (no decay on biases, norms, positions, class token)."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr)


def batch_of(data: Labelled, rows: np.ndarray, to_input: ToInput, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input (B, C, S, S), labels (B,)) for the given rows of a labelled set."""
    images, labels = data
    return to_input(images[rows]), torch.as_tensor(labels[rows], dtype=torch.long, device=device)
