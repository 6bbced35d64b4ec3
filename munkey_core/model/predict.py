"""Retrieval inference: K nearest keys in the *current* bank -> aggregation -> prediction + evidence.

Aggregation modes (all one model; SPEC.md section 2):
- `ensemble` (default, the paper's best): p = sum_j w_j softmax(f([z, h(v_j)])), w = softmax(sim / tau).
  K forwards per image (the patch embedding is shared).
- `softmax_fusion`: one forward with the token h(sum_j w_j v_j). Lowest latency.
- `rank_fusion`: one forward with the token h(sum_j r_j v_j), r_j proportional to 1 / (rank_j + 1),
  i.e. reciprocal-rank weights that ignore the similarity values.
Pathway ablations for Ps: `image` (token replaced by null_tok) and `token` (patches by null_img).

Every prediction carries its evidence: the neighbours' ids, labels, similarities, weights and
each neighbour's own predicted class (the argmax of its forward; computed with extra forwards in
the fusion modes only when asked for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Protocol, Sequence

import numpy as np
import torch

from munkey_core.errors import MunkeyError
from munkey_core.bank.memory import MemoryBank
from munkey_core.model.munkey_vit import MunkeyViT

Mode = Literal["ensemble", "softmax_fusion", "rank_fusion"]
Pathway = Literal["both", "image", "token"]
MODES: tuple[str, ...] = ("ensemble", "softmax_fusion", "rank_fusion")
PATHWAYS: tuple[str, ...] = ("both", "image", "token")


class TopK(Protocol):
    """Something that finds the k nearest rows of the bank being predicted with (MemoryBank.search's
    contract): the bank itself (exact) or a run's bank/search.py `BankSearch` (exact or IVF)."""

    def search(self, queries: torch.Tensor | np.ndarray, k: int,
               exclude: Sequence[Iterable[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class Neighbour:
    """One retrieved training case and its part in a prediction."""

    id: int
    label: int
    similarity: float
    weight: float
    predicted: int | None


@dataclass
class Predictions:
    """A batch of predictions: class probabilities and per-neighbour evidence, all (B, ...) arrays."""

    probs: np.ndarray              # (B, C)
    neighbour_ids: np.ndarray      # (B, K)
    neighbour_labels: np.ndarray   # (B, K)
    similarities: np.ndarray       # (B, K)
    weights: np.ndarray            # (B, K)
    neighbour_preds: np.ndarray | None  # (B, K) or None when not computed
    mode: str

    @property
    def labels(self) -> np.ndarray:
        return self.probs.argmax(axis=1)

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(axis=1)

    def neighbours(self, i: int) -> list[Neighbour]:
        """The evidence for prediction i, most similar first."""
        return [
            Neighbour(int(self.neighbour_ids[i, j]), int(self.neighbour_labels[i, j]),
                      float(self.similarities[i, j]), float(self.weights[i, j]),
                      None if self.neighbour_preds is None else int(self.neighbour_preds[i, j]))
            for j in range(self.neighbour_ids.shape[1])
        ]


def neighbour_weights(sims: torch.Tensor, tau: float, mode: str) -> torch.Tensor:
    """Aggregation weights (B, K) from similarities (B, K) sorted best first."""
    if mode == "rank_fusion":
        ranks = torch.arange(sims.shape[1], device=sims.device, dtype=sims.dtype)
        w = 1.0 / (ranks + 1.0)
        return (w / w.sum()).expand_as(sims)
    return torch.softmax(sims / tau, dim=1)


@torch.inference_mode()
def predict(model: MunkeyViT, bank: MemoryBank, images: torch.Tensor, query_keys: torch.Tensor | np.ndarray,
            *, k: int, tau: float, mode: str = "ensemble", pathway: str = "both",
            exclude: Sequence[Sequence[int]] | None = None, neighbour_predictions: bool = True,
            batch_size: int | None = None, searcher: TopK | None = None) -> Predictions:
    """Predict preprocessed `images` (B, C, S, S) whose keys are `query_keys` (B, Dk).

    `exclude[i]` lists ids image i may not retrieve (used to evaluate a training sample as if its
    own entry were gone). `searcher` finds the neighbours in `bank` (default: `bank.search`, exact).
    """
    if mode not in MODES:
        raise MunkeyError(f"Unknown aggregation mode '{mode}'; choose one of {', '.join(MODES)}.")
    if pathway not in PATHWAYS:
        raise MunkeyError(f"Unknown pathway '{pathway}'; choose one of {', '.join(PATHWAYS)}.")
    if k < 1:
        raise MunkeyError(f"K must be at least 1 (got {k}).")
    model.eval()
    device = next(model.parameters()).device
    if batch_size is None:  # ~256 sequences per call on CPU: within K plain forwards (docs/performance.md)
        batch_size = 256 if device.type == "cuda" else max(1, 256 // k)
    q = torch.as_tensor(query_keys, dtype=torch.float32)
    parts = []
    for start in range(0, len(images), batch_size):
        sl = slice(start, start + batch_size)
        ex = None if exclude is None else exclude[sl]
        parts.append(_predict_batch(model, bank, searcher or bank, images[sl].to(device), q[sl], k, tau, mode,
                                    pathway, ex, neighbour_predictions))
    columns = [None if parts[0][i] is None else np.concatenate([p[i] for p in parts]) for i in range(6)]
    return Predictions(*columns, mode=mode)


def _predict_batch(model: MunkeyViT, bank: MemoryBank, searcher: TopK, x: torch.Tensor, q: torch.Tensor, k: int,
                   tau: float, mode: str, pathway: str, exclude, neighbour_predictions: bool) -> tuple:
    device = x.device
    sims, rows = searcher.search(q, k, exclude=exclude)  # (B, K)
    sims, rows = sims.to(device), rows.to(device)
    w = neighbour_weights(sims, tau, mode)  # (B, K)
    v = bank.values.to(device)[rows]  # (B, K, Dv)
    drop_img, drop_tok = pathway == "token", pathway == "image"
    per_neighbour = None
    if mode == "ensemble" and not drop_tok:
        per_neighbour = torch.softmax(model.forward_multi(x, v, drop_image=drop_img), dim=-1)  # (B, K, C)
        probs = (w[..., None] * per_neighbour).sum(dim=1)
    else:
        fused = (w[..., None] * v).sum(dim=1)[:, None, :]  # (B, 1, Dv)
        probs = torch.softmax(model.forward_multi(x, fused, drop_image=drop_img, drop_token=drop_tok)[:, 0], -1)
    preds = None
    if neighbour_predictions:
        if per_neighbour is None:
            per_neighbour = model.forward_multi(x, v, drop_image=drop_img)
        preds = per_neighbour.argmax(dim=-1).cpu().numpy()
    rows_np = rows.cpu().numpy()
    return (probs.float().cpu().numpy(), bank.ids[rows_np], bank.labels[rows_np], sims.cpu().numpy(),
            w.cpu().numpy(), preds)
