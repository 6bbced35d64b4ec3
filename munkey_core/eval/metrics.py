"""Unlearning metrics in percent: accuracy, a cheap membership-inference AUC, Ps and Avg Gap.

- `mia_auc`: the "cheap" attack for live use. Score = minus the per-sample cross-entropy of the
  model's own probabilities (members tend to have lower loss); the AUC of telling forget-set
  samples from unseen test samples, computed per true class and averaged with the forget set's
  class counts as weights, so a class imbalance between the two sets cannot fake a signal.
  50 = indistinguishable (what a model that never saw the forget set gives).
- `pathway_sensitivity`: Ps = |A_img - A_tok| / (A_both + eps), a ratio (not percent); lower is
  more balanced; the paper selects models with Ps <= 0.3.
- `avg_gap`: mean absolute difference to an oracle over TA, RA, FA, MIA.
- `remembered_reference`: FA and the cheap attack's AUC on training samples the model still holds, of the
  deleted samples' classes and weighted to their mix: what a sample still remembered reads (the
  forgetting verdicts' positive control).
- `tpr_at_fpr` / `mia_tprs`: an attack's true-positive rate at a low false-positive rate (1%, 0.1%),
  the figure membership attacks are judged by (LiRA, Carlini et al. 2022), not AUC alone. The
  negatives (test samples) are reweighted to the forget set's class mix, the pooled analogue of the
  class-balanced AUC. With n negatives an FPR below 1/n means "above every negative".
Tests: tests/eval/test_metrics.py (auc and mia_auc against sklearn.metrics.roc_auc_score, ties included; the TPRs
against sklearn.metrics.roc_curve and a threshold sweep).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

MIA_CHEAP = "loss-threshold AUC, class-balanced (cheap; forget vs test)"
GAP_KEYS = ("TA", "RA", "FA", "MIA")
LOW_FPRS = (0.01, 0.001)  # the false-positive rates every attack's TPR is reported at


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


def remembered_reference(retain_probs: np.ndarray, retain_labels: np.ndarray, test_probs: np.ndarray,
                         test_labels: np.ndarray, forget_labels: np.ndarray) -> dict:
    """What the model gives now on training samples it still holds, of the deleted samples' classes and
    weighted to their class mix: accuracy (FA_remembered) and the cheap attack's AUC against the test
    samples (MIA_remembered), both in percent, and how many samples they are worth (n_remembered: Kish's
    effective count of the reweighted mean, as `class_matched_n`; the verdicts widen by it).

    The forgetting verdicts' positive control (eval/verdicts.py; the oracle verdict's too, eval/floors.py):
    a deleted sample the model still remembered would read like these, so "forgotten" needs a value clearly
    below them; where it is not, the numbers cannot tell forgotten from remembered. Probabilities (N, C);
    labels (N,).
    None where no class of the deleted samples has a retained and a test sample."""
    r_loss, t_loss = cross_entropy(retain_probs, retain_labels), cross_entropy(test_probs, test_labels)
    r_ok = retain_probs.argmax(axis=1) == retain_labels
    total, acc, mia, shares = 0, 0.0, 0.0, []  # shares: (deleted count of a class, its held count)
    for c, n in zip(*np.unique(forget_labels, return_counts=True)):
        r, t = retain_labels == c, test_labels == c
        if r.any() and t.any():  # each class weighted by its count among the deleted samples, as mia_auc does
            acc, mia = acc + n * r_ok[r].mean(), mia + n * auc(-r_loss[r], -t_loss[t])
            total, shares = total + n, shares + [(int(n), int(r.sum()))]
    if total == 0:
        return {"FA_remembered": None, "MIA_remembered": None, "n_remembered": 0}
    effective = 1.0 / sum((n / total) ** 2 / held for n, held in shares)  # each held sample weighs share / held
    return {"FA_remembered": 100.0 * acc / total, "MIA_remembered": 100.0 * mia / total, "n_remembered": effective}


def pathway_sensitivity(a_img: float, a_tok: float, a_both: float, eps: float = 1e-8) -> float:
    """Ps = |A_img - A_tok| / (A_both + eps): 0 = both pathways equally able alone."""
    return abs(a_img - a_tok) / (a_both + eps)


def avg_gap(metrics: Mapping[str, float], oracle: Mapping[str, float], keys: tuple[str, ...] = GAP_KEYS) -> float:
    """Mean |metric - oracle| over `keys` (percent points)."""
    return float(np.mean([abs(metrics[k] - oracle[k]) for k in keys]))


def roc_points(pos: np.ndarray, neg: np.ndarray, neg_weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) of the rule "score >= t" at every distinct score t, from (0, 0) up; higher = member.

    `neg_weight` (len(neg),) reweights the negatives (class balancing), else each counts the same."""
    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    w = np.ones(len(neg)) if neg_weight is None else np.asarray(neg_weight, dtype=np.float64)
    scores = np.concatenate([pos, neg])
    tp = np.concatenate([np.full(len(pos), 1.0 / len(pos)), np.zeros(len(neg))])
    fp = np.concatenate([np.zeros(len(pos)), w / w.sum()])
    order = np.argsort(-scores, kind="mergesort")
    s, ctp, cfp = scores[order], np.cumsum(tp[order]), np.cumsum(fp[order])
    last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # the last row of each distinct score
    return np.r_[0.0, cfp[last]], np.r_[0.0, ctp[last]]


def tpr_at_fpr(pos: np.ndarray, neg: np.ndarray, fpr: float, neg_weight: np.ndarray | None = None) -> float:
    """Percent of positives caught at a false-positive rate of at most `fpr` (a fraction): the best
    TPR over thresholds whose FPR stays <= fpr (LiRA's low-FPR metric). With n negatives, FPRs below
    1/n can only be met by catching positives that score above every negative."""
    f, t = roc_points(pos, neg, neg_weight)
    return float(100.0 * t[f <= fpr + 1e-12].max())


def class_weights(forget_labels: np.ndarray, test_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forget mask, test weights) that give the test samples the forget set's class mix: each test
    sample of class c weighs share_forget(c) / share_test(c); forget samples of a class with no test
    sample are left out (as `mia_auc` does)."""
    forget_labels, test_labels = np.asarray(forget_labels), np.asarray(test_labels)
    classes = np.intersect1d(np.unique(forget_labels), np.unique(test_labels))
    keep = np.isin(forget_labels, classes)
    w = np.zeros(len(test_labels))
    nf = keep.sum()
    for c in classes:
        in_t = test_labels == c
        w[in_t] = ((forget_labels[keep] == c).sum() / max(nf, 1)) / in_t.sum()
    return keep, w


def mia_tprs(forget_score: np.ndarray, forget_labels: np.ndarray, test_score: np.ndarray, test_labels: np.ndarray,
             fprs: tuple[float, ...] = LOW_FPRS) -> dict[str, float | None]:
    """{"TPR@1%": ..., "TPR@0.1%": ...}: percent of forget samples flagged at those FPRs on test samples
    reweighted to the forget set's class mix (higher score = member); None when undefined."""
    keep, w = class_weights(forget_labels, test_labels)
    if not keep.any():
        return {tpr_key(f): None for f in fprs}
    return {tpr_key(f): tpr_at_fpr(np.asarray(forget_score)[keep], test_score, f, w) for f in fprs}


def tpr_key(fpr: float) -> str:
    """Column name of the TPR at `fpr` (a fraction): 0.01 -> "TPR@1%"."""
    return f"TPR@{fpr * 100:g}%"
