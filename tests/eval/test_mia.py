"""Membership inference: the RMIA-style strong attack on hand-made scores and on real tiny models (digits)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from munkey_core.errors import MunkeyError
from munkey_core.eval.mia import (RMIA_A, ReferenceModels, StrongAttack, cheap_mia, classifier_probs,
                                   classifier_references, half_splits, rmia_auc, rmia_scores)


def test_rmia_score_calibrates_by_the_references() -> None:
    # sample 0 is easy for everyone, sample 1 is hard for the references but the target is sure of it
    target = np.array([0.99, 0.99])
    refs = np.array([[0.98, 0.05], [0.97, 0.10]])  # (R=2, N=2)
    s = rmia_scores(target, refs, a=1.0)
    assert s[1] > s[0] + 2.0
    assert s[0] == pytest.approx(np.log(0.99 / 0.975))


def test_rmia_leaves_the_in_models_out() -> None:
    target = np.array([0.9])
    refs = np.array([[0.9], [0.1]])
    member = np.array([[True], [False]])  # reference 0 trained on the sample: only reference 1 counts
    assert rmia_scores(target, refs, member, a=1.0)[0] == pytest.approx(np.log(9.0))
    # no reference left it out (cannot happen with complementary halves): all of them are used
    assert rmia_scores(target, refs, np.array([[True], [True]]), a=1.0)[0] == pytest.approx(np.log(0.9 / 0.5))


def test_rmia_auc_separates_memorised_samples_and_is_fifty_otherwise() -> None:
    rng = np.random.default_rng(0)
    n = 400
    y = rng.integers(0, 4, n)
    ref_f, ref_t = rng.uniform(0.2, 0.9, (2, n)), rng.uniform(0.2, 0.9, (2, n))
    memorised = np.clip(ref_f.mean(0) + 0.3, 0, 1)  # the target is surer than the references on members
    unseen = ref_t.mean(0)
    assert rmia_auc(memorised, ref_f, None, y, unseen, ref_t, y) > 90
    same = rng.uniform(0.2, 0.9, (2, n))
    assert rmia_auc(same.mean(0), same, None, y, unseen, ref_t, y) == pytest.approx(50, abs=6)


def test_half_splits_are_complementary_and_seeded() -> None:
    ids = np.arange(100, 151)
    halves = half_splits(ids, 4, seed=3)
    assert len(halves) == 4
    for a, b in (halves[0:2], halves[2:4]):
        assert not np.intersect1d(a, b).size and np.array_equal(np.union1d(a, b), ids)
    assert not np.array_equal(halves[0], halves[2])
    assert all(np.array_equal(x, y) for x, y in zip(halves, half_splits(ids, 4, seed=3)))
    with pytest.raises(MunkeyError, match="even"):
        half_splits(ids, 3, seed=0)


@pytest.fixture(scope="module")
def digits_models():
    """On 300 random training rows of digits: a memorising target on a random half A (A plays the forget
    set), a target of the same recipe trained on the other half B (never saw A), and 2 references on
    complementary halves of B, so they never saw A nor the test split (symmetric scoring)."""
    from munkey_core.data import datasets as data_mod
    from munkey_core.training.classifier import classifier_recipe, train_classifier

    ds = data_mod.load_dataset("digits", seed=0)
    pool = np.sort(np.random.default_rng(0).choice(len(ds.train), 300, replace=False))  # rows of ds.train

    def train(rows: np.ndarray, seed: int):
        cfg, tc, _ = classifier_recipe("vit", "tiny", ds.num_classes, ds.channels,
                                       {"epochs": 80, "augment_shift": 0.0, "seed": seed})
        return train_classifier(cfg, tc, ds.train.images[rows], ds.train.labels[rows], progress=False)[0], cfg.img_size

    a_ids, b_ids = half_splits(ds.train.ids[pool], 2, seed=7)
    a_rows, b_rows = np.flatnonzero(np.isin(ds.train.ids, a_ids)), np.flatnonzero(np.isin(ds.train.ids, b_ids))
    (member_model, size), (other_model, _) = train(a_rows, 1), train(b_rows, 1)
    ref_halves = half_splits(b_ids, 2, seed=0)
    refs = [train(np.flatnonzero(np.isin(ds.train.ids, h)), 10 + i)[0] for i, h in enumerate(ref_halves)]
    test_rows = np.arange(len(ds.test))
    attack = StrongAttack(classifier_references(refs, ref_halves, ds, size), ds, a_rows, test_rows)
    return attack, ds, a_rows, member_model, other_model, size, refs, ref_halves


def test_strong_attack_on_real_models(digits_models) -> None:
    attack, ds, a_rows, member_model, other_model, size, _, _ = digits_models
    assert attack.symmetric and attack.family == "vit" and attack.n_refs == 2
    forget_images, forget_labels = ds.train.images[a_rows], ds.train.labels[a_rows]
    probs = {name: (classifier_probs(m, forget_images, size), classifier_probs(m, ds.test.images, size))
             for name, m in (("member", member_model), ("other", other_model))}
    member, other = attack.metrics(*probs["member"]), attack.metrics(*probs["other"])
    assert member["MIA"] > 60  # the target memorised its training half (the positive control)
    assert other["MIA"] == pytest.approx(50, abs=6)  # never saw it
    # the TPRs at low FPR against sklearn's ROC on the attack's own scores, test samples weighted by hand
    # to the forget set's class mix
    from sklearn.metrics import roc_curve

    f, t = attack.scores(*probs["member"])
    fy, ty = ds.train.labels[a_rows], ds.test.labels
    w = np.array([np.mean(fy == c) / np.mean(ty == c) for c in ty])
    fp, tp, _ = roc_curve(np.r_[np.ones(len(f)), np.zeros(len(t))], np.r_[f, t], sample_weight=np.r_[np.ones(len(f)), w],
                          drop_intermediate=False)
    for key, fpr in (("TPR@1%", 0.01), ("TPR@0.1%", 0.001)):
        assert member[key] == pytest.approx(100 * tp[fp <= fpr + 1e-12].max())
    assert attack.auc(*probs["member"]) == member["MIA"]
    # the cheap attack agrees in direction
    assert cheap_mia(probs["member"][0], forget_labels, probs["member"][1], ds.test.labels) > 60


def test_forget_and_test_samples_are_scored_against_the_same_references(digits_models) -> None:
    attack, ds, a_rows, member_model, _, size, refs, ref_halves = digits_models
    # by hand: every reference is out for both sets, so each score uses the mean over all of them
    f_ref = np.stack([classifier_probs(m, ds.train.images[a_rows], size)[np.arange(len(a_rows)),
                                                                            ds.train.labels[a_rows]] for m in refs])
    target = classifier_probs(member_model, ds.train.images[a_rows], size)[np.arange(len(a_rows)),
                                                                           ds.train.labels[a_rows]]
    p_ref = 0.5 * ((1 + RMIA_A) * f_ref.mean(0) + 1 - RMIA_A)
    forget_scores, _ = attack.scores(classifier_probs(member_model, ds.train.images[a_rows], size),
                                     classifier_probs(member_model, ds.test.images, size))
    np.testing.assert_allclose(forget_scores, np.log(target) - np.log(p_ref), rtol=1e-6, atol=1e-9)
    # references that trained on forget samples make the scoring asymmetric, and the attack says so
    leaky = StrongAttack(classifier_references(refs, [ds.train.ids[a_rows], ref_halves[1]], ds, size), ds, a_rows,
                         np.arange(len(ds.test)))
    assert not leaky.symmetric


def test_reference_member_mask() -> None:
    refs = ReferenceModels([], [np.array([1, 3]), np.array([2, 4])], "vit")
    np.testing.assert_array_equal(refs.member_mask(np.array([1, 2, 5])), [[True, False, False], [False, True, False]])
