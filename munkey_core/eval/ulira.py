"""Per-example unlearning attack in the spirit of U-LiRA (Hayes et al., SaTML 2025): the statistics.

Question asked per target example x: is this model one from which x was *unlearned*, or one that was
*retrained without* x? An attacker who can tell is evidence that unlearning left a trace of x that
retraining does not, which population attacks (forget vs test AUC) average away.

Input: shadow models, each trained on a random half of a pool that contains T target examples; the
targets a shadow trained on are then unlearned from it. For shadow s and target t, `obs[s, t]` is
the model's per-example statistic on x_t (`logit_confidence`: log p_y / (1 - p_y) of the true class,
LiRA's choice, near-Gaussian over models) and `unlearned[s, t]` says whether x_t was in (and then
unlearned from) shadow s; otherwise s never saw x_t, so it plays a model retrained without it.

`ulira_scores` plays each shadow in turn as the attacked model (leave one model out): per target, a
Gaussian is fitted to the other shadows' statistics where the target was unlearned and one where it
was out, and the score is the log likelihood ratio log N(o; unlearned) - log N(o; retrained).
Variance: one per side pooled over targets (LiRA's "fixed variance", stable with few shadows), or
per target. `ulira_report` turns the (S, T) scores into the attack's accuracy (decide "unlearned"
when the ratio favours it, the Bayes rule at equal priors), AUC and TPR at 1% / 0.1% FPR, each with a
95% bootstrap interval over target examples (the unit the claim is about). 50% accuracy and AUC =
unlearned models look exactly like retrained ones. Tests: tests/eval/test_ulira.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.eval.metrics import auc, tpr_at_fpr

LOW_FPRS = (0.01, 0.001)
_EPS = 1e-6


def logit_confidence(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """log p_y - log(1 - p_y) of each sample's true class: probs (N, C), labels (N,) -> (N,)."""
    p = np.clip(probs[np.arange(len(labels)), labels].astype(np.float64), _EPS, 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


def _gauss_logpdf(x: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    return -0.5 * (np.log(2.0 * np.pi * var) + (x - mu) ** 2 / var)


def ulira_scores(obs: np.ndarray, unlearned: np.ndarray, *, variance: str = "global",
                 min_var: float = 1e-4) -> np.ndarray:
    """Leave-one-model-out log likelihood ratios (S, T): > 0 = looks unlearned, < 0 = looks retrained.

    obs (S, T) per-example statistics; unlearned (S, T) bool. Each target needs at least two shadows
    of each kind besides the one attacked (else MunkeyError)."""
    obs, unl = np.asarray(obs, dtype=np.float64), np.asarray(unlearned, dtype=bool)
    if obs.shape != unl.shape or obs.ndim != 2:
        raise MunkeyError(f"obs and unlearned must both be (shadows, targets); got {obs.shape} and {unl.shape}.")
    if variance not in ("global", "per-example"):
        raise MunkeyError(f"variance must be 'global' or 'per-example', got {variance!r}.")
    n_in, n_out = unl.sum(0), (~unl).sum(0)  # (T,)
    if (n_in < 3).any() or (n_out < 3).any():
        raise MunkeyError("Every target needs at least 3 shadow models that unlearned it and 3 that never saw it "
                          "(one is left out at a time); train more shadow models.")
    s_count = obs.shape[0]
    scores = np.empty_like(obs)
    for s in range(s_count):
        keep = np.arange(s_count) != s
        o, u = obs[keep], unl[keep]  # (S-1, T)
        sides = []
        for mask in (u, ~u):
            n = mask.sum(0)  # (T,)
            mu = (o * mask).sum(0) / n
            dev2 = ((o - mu) ** 2 * mask)  # (S-1, T)
            if variance == "global":
                var = np.full_like(mu, dev2.sum() / max(1, int(n.sum()) - len(n)))
            else:
                var = dev2.sum(0) / np.maximum(n - 1, 1)
            sides.append((mu, np.maximum(var, min_var)))
        (mu_u, var_u), (mu_r, var_r) = sides
        scores[s] = _gauss_logpdf(obs[s], mu_u, var_u) - _gauss_logpdf(obs[s], mu_r, var_r)
    return scores


def ulira_metrics(scores: np.ndarray, unlearned: np.ndarray) -> dict:
    """Accuracy (LR > 0 decides 'unlearned'), AUC, TPR at LOW_FPRS, in percent, pooled over (s, t)."""
    pos, neg = scores[unlearned], scores[~unlearned]
    pred = scores > 0
    acc = 0.5 * (pred[unlearned].mean() + (~pred[~unlearned]).mean())  # balanced: in and out may differ in count
    out = {"accuracy": 100.0 * float(acc), "AUC": 100.0 * auc(pos, neg)}
    for f in LOW_FPRS:
        out[f"TPR@{f * 100:g}%"] = tpr_at_fpr(pos, neg, f)
    return out


@dataclass(frozen=True)
class UliraReport:
    """The attack on one unlearning method: point values and 95% bootstrap intervals (percent)."""

    method: str
    n_shadows: int
    n_targets: int
    n_pairs_unlearned: int
    n_pairs_retrained: int
    values: dict
    ci: dict  # metric -> [low, high]

    def to_dict(self) -> dict:
        return asdict(self)


def ulira_report(method: str, scores: np.ndarray, unlearned: np.ndarray, *, n_boot: int = 1000,
                 seed: int = 0) -> UliraReport:
    """Accuracy, AUC, TPR@1%/0.1% FPR of `scores` (S, T) with bootstrap intervals over targets."""
    unl = np.asarray(unlearned, dtype=bool)
    values = ulira_metrics(scores, unl)
    rng = np.random.default_rng(seed)
    t = scores.shape[1]
    boots: dict[str, list[float]] = {k: [] for k in values}
    for _ in range(n_boot):
        pick = rng.integers(0, t, t)
        m = ulira_metrics(scores[:, pick], unl[:, pick])
        for k, v in m.items():
            boots[k].append(v)
    ci = {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for k, v in boots.items()}
    return UliraReport(method, int(scores.shape[0]), int(t), int(unl.sum()), int((~unl).sum()), values, ci)
