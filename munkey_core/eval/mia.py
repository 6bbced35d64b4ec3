"""Membership inference: the cheap attack for live use and an RMIA-style strong attack for benchmarks.

Both report the AUC (percent) of telling forget-set samples from unseen test samples, computed per
true class and averaged with the forget set's class counts as weights (metrics.mia_auc), so a class
imbalance between the two sets cannot fake a signal, and beside it the TPR at 1% and 0.1% FPR
(metrics.mia_tprs, test samples reweighted to the forget set's class mix): `attack_metrics`.
50 = indistinguishable, what a model retrained without the forget set gives.

- cheap (`cheap_mia`): score = minus the target model's own cross-entropy. No extra model.
- strong (`rmia_auc`, after RMIA, Zarifzadeh et al. 2024, offline variant): score = log of the
  likelihood ratio p_target(y|x) / p_ref(y|x), with p_ref = ((1 + a) mean_out + (1 - a)) / 2 and
  mean_out the mean of p_r(y|x) over the reference models r that did *not* train on x ("out" models).
  A sample that is merely easy has a high probability under the references too; only what the target
  memorised stands out. `a` is RMIA's offline correction for having no "in" models (a = 1: pure ratio
  to the out-models; a = 0: the references are ignored); default 0.3, RMIA's offline range, and on
  digits with 2 tiny references it beats a = 1 (their noise dominates a pure ratio). RMIA's comparison with population samples z
  (Pr_z[LR(x) / LR(z) > gamma]) is monotone in LR(x) for a fixed population, so it leaves the AUC of
  the ratio unchanged and is not computed.
Reference models (`oracles.train_reference_models`) are of the target's own family (MUNKEY references
for a MUNKEY target, plain ViTs for a ViT and the post-hoc methods), trained with its recipe on random
halves of the training split *minus the forget sets*, so every forget sample and every test sample is
"out" for every reference: both sets are scored against the same references (symmetric), with all
of them in the mean. Tests: tests/eval/test_mia.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.eval.metrics import MIA_CHEAP, cross_entropy, mia_auc, mia_tprs

MIA_STRONG = ("RMIA-style likelihood ratio vs same-family reference models that trained on neither set, "
              "class-balanced AUC (strong; forget vs test)")
Scorer = Callable[[str, np.ndarray], np.ndarray]  # (split "train" | "test", row index (n,)) -> probs (n, C)
ATTACKS = {"cheap": MIA_CHEAP, "strong": MIA_STRONG}
_EPS = 1e-12


def true_class_prob(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """p(y|x) of each sample's true class: probs (N, C), labels (N,) -> (N,)."""
    return probs[np.arange(len(labels)), labels]


def attack_metrics(forget_score: np.ndarray, forget_labels: np.ndarray, test_score: np.ndarray,
                   test_labels: np.ndarray) -> dict:
    """{"MIA": class-balanced AUC, "TPR@1%", "TPR@0.1%"} (percent) of a membership score (higher = member)."""
    f, t = np.asarray(forget_score, dtype=np.float64), np.asarray(test_score, dtype=np.float64)
    return {"MIA": mia_auc(-f, forget_labels, -t, test_labels), **mia_tprs(f, forget_labels, t, test_labels)}


def cheap_mia(forget_probs: np.ndarray, forget_labels: np.ndarray, test_probs: np.ndarray,
              test_labels: np.ndarray) -> float | None:
    """Loss-threshold attack AUC (percent) from the target's probabilities (N, C) on both sets."""
    return mia_auc(cross_entropy(forget_probs, forget_labels), forget_labels,
                   cross_entropy(test_probs, test_labels), test_labels)


def cheap_attack(forget_probs: np.ndarray, forget_labels: np.ndarray, test_probs: np.ndarray,
                 test_labels: np.ndarray) -> dict:
    """The cheap attack's AUC and TPRs at low FPR (`attack_metrics` of minus the cross-entropy)."""
    return attack_metrics(-cross_entropy(forget_probs, forget_labels), forget_labels,
                          -cross_entropy(test_probs, test_labels), test_labels)


RMIA_A = 0.3


def rmia_scores(target_p: np.ndarray, ref_p: np.ndarray, ref_member: np.ndarray | None = None,
                a: float = RMIA_A) -> np.ndarray:
    """log p_target(y|x) - log p_ref(y|x), p_ref = ((1 + a) mean over out-models of p_r(y|x) + 1 - a) / 2.

    target_p (N,), ref_p (R, N) true-class probabilities; ref_member (R, N) True where reference r
    trained on sample n (those are left out of its mean; a sample no reference left out, which the
    complementary halves never produce, falls back to all of them)."""
    ref_p = np.asarray(ref_p, dtype=np.float64)
    out = np.ones_like(ref_p, dtype=bool) if ref_member is None else ~np.asarray(ref_member, dtype=bool)
    none_out = ~out.any(axis=0)
    out[:, none_out] = True
    mean_out = (ref_p * out).sum(axis=0) / out.sum(axis=0)  # (N,)
    p_ref = 0.5 * ((1.0 + a) * mean_out + (1.0 - a))
    return np.log(np.clip(target_p, _EPS, 1.0)) - np.log(np.clip(p_ref, _EPS, 1.0))


def rmia_auc(forget_p: np.ndarray, forget_ref_p: np.ndarray, forget_ref_member: np.ndarray | None,
             forget_labels: np.ndarray, test_p: np.ndarray, test_ref_p: np.ndarray,
             test_labels: np.ndarray) -> float | None:
    """Strong attack AUC (percent): class-balanced AUC of the RMIA score, forget set against test set.
    *_p (N,) target true-class probabilities, *_ref_p (R, N) the references'."""
    f = rmia_scores(forget_p, forget_ref_p, forget_ref_member)
    t = rmia_scores(test_p, test_ref_p, None)
    return mia_auc(-f, forget_labels, -t, test_labels)  # mia_auc ranks by minus a "loss"


def classifier_probs(model, images: np.ndarray, img_size: int) -> np.ndarray:
    """Softmax probabilities (N, C) of a plain classifier on uint8 images (N, H, W, C)."""
    from munkey_core.model.classifiers import logits_of

    logits = logits_of(model, images, img_size).astype(np.float64)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def check_n_refs(n_refs: int) -> None:
    """Reference models come in complementary pairs of halves: refuse any other count before training."""
    if n_refs < 2 or n_refs % 2:
        raise MunkeyError(f"--mia-refs must be an even number >= 2 (complementary halves), got {n_refs}.")


def half_splits(ids: np.ndarray, n_refs: int, seed: int) -> list[np.ndarray]:
    """`n_refs` (even) member sets: complementary random halves of `ids`, one pair per seed offset
    (every id is in exactly half of them)."""
    check_n_refs(n_refs)
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    halves = []
    for pair in range(n_refs // 2):
        perm = np.random.default_rng([seed, pair]).permutation(len(ids))
        first = np.sort(ids[perm[: len(ids) // 2]])
        halves += [first, np.setdiff1d(ids, first)]
    return halves


@dataclass
class ReferenceModels:
    """Reference models of one family: how to score them and which training ids each one saw."""

    scorers: list  # Scorer per reference: (split, rows) -> class probabilities (n, C)
    members: list[np.ndarray]  # per reference: sorted training ids it trained on
    family: str  # "munkey" or "vit": the targets they may attack

    def true_probs(self, split: str, rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(R, N) true-class probabilities of rows of a split."""
        return np.stack([true_class_prob(score(split, rows), labels) for score in self.scorers])

    def member_mask(self, ids: np.ndarray) -> np.ndarray:
        """(R, N) True where reference r trained on sample id n."""
        return np.stack([np.isin(ids, m) for m in self.members])


def classifier_references(models: Sequence, members: Sequence[np.ndarray], ds, img_size: int) -> ReferenceModels:
    """Plain classifiers (nn.Module, eval mode) on a dataset's splits as a ViT-family ReferenceModels."""
    def scorer(model) -> Scorer:
        return lambda split, rows: classifier_probs(model, ds.split(split).images[rows], img_size)

    return ReferenceModels([scorer(m) for m in models], [np.asarray(m) for m in members], "vit")


class StrongAttack:
    """The strong attack bound to one forget set and one test set (rows of the training and test splits):
    the references' probabilities are computed once, then `metrics(forget_probs, test_probs)` scores any
    target of their family on those sets. `symmetric`: no reference trained on a forget sample, so both
    sets are scored against the same references."""

    def __init__(self, refs: ReferenceModels, ds, forget_rows: np.ndarray, test_rows: np.ndarray) -> None:
        self.family = refs.family
        self.n_refs = len(refs.scorers)
        self.f_y, self.t_y = ds.train.labels[forget_rows], ds.test.labels[test_rows]
        self.f_ref = refs.true_probs("train", forget_rows, self.f_y)  # (R, Nf)
        self.f_member = refs.member_mask(ds.train.ids[forget_rows])  # (R, Nf)
        self.t_ref = refs.true_probs("test", test_rows, self.t_y)  # (R, Nt)
        self.symmetric = not self.f_member.any()

    def scores(self, forget_probs: np.ndarray, test_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """RMIA scores (Nf,), (Nt,) of a target's class probabilities on the forget and test sets."""
        return (rmia_scores(true_class_prob(forget_probs, self.f_y), self.f_ref, self.f_member),
                rmia_scores(true_class_prob(test_probs, self.t_y), self.t_ref, None))

    def metrics(self, forget_probs: np.ndarray, test_probs: np.ndarray) -> dict:
        """AUC and TPR at low FPR (percent) for a target's probabilities on forget (Nf, C) and test (Nt, C)."""
        f, t = self.scores(forget_probs, test_probs)
        return attack_metrics(f, self.f_y, t, self.t_y)

    def auc(self, forget_probs: np.ndarray, test_probs: np.ndarray) -> float | None:
        """Percent AUC for a target's class probabilities on the forget (Nf, C) and test (Nt, C) sets."""
        return self.metrics(forget_probs, test_probs)["MIA"]


__all__ = ["MIA_CHEAP", "MIA_STRONG", "ATTACKS", "Scorer", "attack_metrics", "cheap_mia", "cheap_attack",
           "rmia_scores", "rmia_auc", "half_splits", "ReferenceModels", "classifier_references", "StrongAttack",
           "true_class_prob"]
