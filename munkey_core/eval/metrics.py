"""Unlearning metrics in percent: accuracy, a cheap membership-inference AUC, Ps and Avg Gap.

- `mia_auc`: the "cheap" attack for live use. Score = minus the per-sample cross-entropy of the
  model's own probabilities (members tend to have lower loss); the AUC of telling forget-set
  samples from unseen test samples, computed per true class and averaged with the forget set's
  class counts as weights, so a class imbalance between the two sets cannot fake a signal.
  50 = indistinguishable (what a model that never saw the forget set gives).
- `pathway_sensitivity`: Ps = |A_img - A_tok| / (A_both + eps), a ratio (not percent); lower is
  more balanced; the paper selects models with Ps <= 0.3.
- `avg_gap`: mean absolute difference to an oracle over TA, RA, FA, MIA.
Tests: tests/test_metrics.py (auc and mia_auc against sklearn.metrics.roc_auc_score, ties included).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

MIA_CHEAP = "loss-threshold AUC, class-balanced (cheap; forget vs test)"
GAP_KEYS = ("TA", "RA", "FA", "MIA")


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float | None:
    """Percent of correct predictions; None for an empty set."""
    if len(labels) == 0:
        return None
    return float(100.0 * np.mean(np.asarray(predicted) == np.asarray(labels)))


def cross_entropy(probs: np.ndarray, labels: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Per-sample -log p(label) from probabilities (N, C)."""
    return -np.log(np.clip(probs[np.arange(len(labels)), labels], eps, 1.0))


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score_pos > score_neg) + 0.5 P(tie), via ranks (Mann-Whitney U), in [0, 1]."""
    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    scores = np.concatenate([pos, neg])
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    # average ranks for ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(avg, counts)
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0
    return float(u / (len(pos) * len(neg)))


def mia_auc(forget_loss: np.ndarray, forget_labels: np.ndarray, test_loss: np.ndarray,
            test_labels: np.ndarray) -> float | None:
    """Class-balanced loss-attack AUC in percent (see module docstring); None if undefined."""
    total, weighted = 0, 0.0
    for c in np.unique(forget_labels):
        f, t = forget_loss[forget_labels == c], test_loss[test_labels == c]
        if len(f) == 0 or len(t) == 0:
            continue
        weighted += len(f) * auc(-f, -t)
        total += len(f)
    return None if total == 0 else 100.0 * weighted / total


def pathway_sensitivity(a_img: float, a_tok: float, a_both: float, eps: float = 1e-8) -> float:
    """Ps = |A_img - A_tok| / (A_both + eps): 0 = both pathways equally able alone."""
    return abs(a_img - a_tok) / (a_both + eps)


def avg_gap(metrics: Mapping[str, float], oracle: Mapping[str, float], keys: tuple[str, ...] = GAP_KEYS) -> float:
    """Mean |metric - oracle| over `keys` (percent points)."""
    return float(np.mean([abs(metrics[k] - oracle[k]) for k in keys]))
