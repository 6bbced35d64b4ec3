"""Membership inference: the cheap attack for live use and an RMIA-style strong attack for benchmarks.

Both report the AUC (percent) of telling forget-set samples from unseen test samples, computed per
true class and averaged with the forget set's class counts as weights (metrics.mia_auc), so a class
imbalance between the two sets cannot fake a signal. 50 = indistinguishable, what a model retrained
without the forget set gives.

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
Reference models (`train_reference_models`) are plain classifiers trained with the target's recipe
on complementary random halves of the training split, so every training sample is "out" for half of
them and every test sample for all of them. Tests: tests/test_mia.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.eval.metrics import MIA_CHEAP, cross_entropy, mia_auc
from munkey_core.atomic import atomic_write_json, read_json

MIA_STRONG = "RMIA-style likelihood ratio vs reference out-models, class-balanced AUC (strong; forget vs test)"
ATTACKS = {"cheap": MIA_CHEAP, "strong": MIA_STRONG}
_EPS = 1e-12


def true_class_prob(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """p(y|x) of each sample's true class: probs (N, C), labels (N,) -> (N,)."""
    return probs[np.arange(len(labels)), labels]


def cheap_mia(forget_probs: np.ndarray, forget_labels: np.ndarray, test_probs: np.ndarray,
              test_labels: np.ndarray) -> float | None:
    """Loss-threshold attack AUC (percent) from the target's probabilities (N, C) on both sets."""
    return mia_auc(cross_entropy(forget_probs, forget_labels), forget_labels,
                   cross_entropy(test_probs, test_labels), test_labels)


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
    from munkey_core.run.classifier import logits_of

    logits = logits_of(model, images, img_size).astype(np.float64)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def half_splits(ids: np.ndarray, n_refs: int, seed: int) -> list[np.ndarray]:
    """`n_refs` (even) member sets: complementary random halves of `ids`, one pair per seed offset."""
    if n_refs < 2 or n_refs % 2:
        raise MunkeyError(f"--mia-refs must be an even number >= 2 (complementary halves), got {n_refs}.")
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    halves = []
    for pair in range(n_refs // 2):
        perm = np.random.default_rng([seed, pair]).permutation(len(ids))
        first = np.sort(ids[perm[: len(ids) // 2]])
        halves += [first, np.setdiff1d(ids, first)]
    return halves


@dataclass
class ReferenceModels:
    """Reference classifiers and which training ids each one saw."""

    models: list  # nn.Module, eval mode
    members: list[np.ndarray]  # per model: sorted training ids it trained on
    img_size: int

    def true_probs(self, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(R, N) true-class probabilities of uint8 images (N, H, W, C)."""
        return np.stack([true_class_prob(classifier_probs(m, images, self.img_size), labels) for m in self.models])

    def member_mask(self, ids: np.ndarray) -> np.ndarray:
        """(R, N) True where reference r trained on sample id n."""
        return np.stack([np.isin(ids, m) for m in self.members])


def train_reference_models(dataset: str, folder: Path, *, n_refs: int, seed: int, profile: str,
                           overrides: dict, data_root: str | None = None, device: str = "auto",
                           progress: bool = True, on_trained: Callable[[], None] | None = None) -> ReferenceModels:
    """Plain ViTs of the target's recipe on complementary halves of the training split, cached in
    `folder/ref_<i>/` (a re-run reuses them; `on_trained` is called after each model actually trained).

    `overrides` is the target's recipe, its seed included: the seed also fixes the carved data splits,
    so the references must keep it (they differ from each other by their data)."""
    from munkey_core.data import datasets as data_mod
    from munkey_core.run.classifier import ClassifierRun, train_classifier_run
    from munkey_core.config import resolve_profile, with_overrides

    folder = Path(folder)
    meta = folder / "references.json"
    if not meta.exists():
        recipe = with_overrides(resolve_profile(profile).train, overrides)
        ds = data_mod.load_dataset(dataset, data_root, seed=recipe.seed, max_train=recipe.max_train or None)
        halves = half_splits(ds.train.ids, n_refs, seed)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(meta, {"seed": seed, "train_ids": ds.train.ids.tolist(),
                                 "halves": [h.tolist() for h in halves]})
    info = read_json(meta)
    if len(info["halves"]) != n_refs:
        raise MunkeyError(f"{folder} holds {len(info['halves'])} reference models, not {n_refs}; "
                          "delete it or ask for that many.")
    train_ids = np.asarray(info["train_ids"], dtype=np.int64)
    models, members = [], []
    for i, half in enumerate(info["halves"]):
        member = np.asarray(half, dtype=np.int64)
        path = folder / f"ref_{i}"
        if not (path / "config.json").exists():
            train_classifier_run(dataset, path, arch="vit", profile=profile, data_root=data_root, device=device,
                                 overrides=overrides, progress=progress,
                                 exclude_ids=np.setdiff1d(train_ids, member).tolist())
            if on_trained is not None:
                on_trained()
        run = ClassifierRun(path, device=device)
        models.append(run.model)
        members.append(member)
    return ReferenceModels(models, members, run.cfg.img_size)


class StrongAttack:
    """The strong attack bound to one forget set and one test set: the references' probabilities are
    computed once, then `auc(forget_probs, test_probs)` scores any target on those sets."""

    def __init__(self, refs: ReferenceModels, forget: tuple[np.ndarray, np.ndarray, np.ndarray],
                 test: tuple[np.ndarray, np.ndarray]) -> None:
        f_img, self.f_y, f_ids = forget  # (Nf, H, W, C) uint8, (Nf,), (Nf,)
        t_img, self.t_y = test
        self.f_ref, self.f_member = refs.true_probs(f_img, self.f_y), refs.member_mask(f_ids)  # (R, Nf) x2
        self.t_ref = refs.true_probs(t_img, self.t_y)  # (R, Nt)

    def auc(self, forget_probs: np.ndarray, test_probs: np.ndarray) -> float | None:
        """Percent AUC for a target's class probabilities on the forget (Nf, C) and test (Nt, C) sets."""
        return rmia_auc(true_class_prob(forget_probs, self.f_y), self.f_ref, self.f_member, self.f_y,
                        true_class_prob(test_probs, self.t_y), self.t_ref, self.t_y)


__all__ = ["MIA_CHEAP", "MIA_STRONG", "ATTACKS", "cheap_mia", "rmia_scores", "rmia_auc", "half_splits",
           "ReferenceModels", "train_reference_models", "StrongAttack", "true_class_prob"]
