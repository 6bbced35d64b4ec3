"""Membership inference: the RMIA-style strong attack on hand-made scores and on real tiny models (digits)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from munkey_core.errors import MunkeyError
from munkey_core.eval.mia import (ReferenceModels, StrongAttack, cheap_mia, classifier_probs, half_splits, rmia_auc,
                             rmia_scores)


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
    """On 300 random training images of digits: 2 references on complementary halves, a memorising target on
    another random half, and a target of the same recipe trained on the other half (never saw it)."""
    from munkey_core.data import datasets as data_mod
    from munkey_core.run.classifier import classifier_recipe, train_classifier

    ds = data_mod.load_dataset("digits", seed=0)
    pool = ds.train.subset(np.sort(np.random.default_rng(0).choice(len(ds.train), 300, replace=False)))

    def train(ids: np.ndarray, seed: int):
        keep = np.isin(pool.ids, ids)
        cfg, tc, _ = classifier_recipe("vit", "tiny", ds.num_classes, ds.channels,
                                       {"epochs": 80, "augment_shift": 0.0, "seed": seed})
        return train_classifier(cfg, tc, pool.images[keep], pool.labels[keep], progress=False)[0], cfg.img_size

    ref_halves = half_splits(pool.ids, 2, seed=0)
    refs = [train(h, 0)[0] for h in ref_halves]
    target_halves = half_splits(pool.ids, 2, seed=7)
    (member_model, size), (other_model, _) = train(target_halves[0], 1), train(target_halves[1], 1)
    forget = pool.subset(np.isin(pool.ids, target_halves[0]))
    attack = StrongAttack(ReferenceModels(refs, ref_halves, size), (forget.images, forget.labels, forget.ids),
                          (ds.test.images, ds.test.labels))
    return attack, forget, ds.test, member_model, other_model, size


def test_strong_attack_on_real_models(digits_models) -> None:
    attack, forget, test, member_model, other_model, size = digits_models
    probs = {name: (classifier_probs(m, forget.images, size), classifier_probs(m, test.images, size))
             for name, m in (("member", member_model), ("other", other_model))}
    assert attack.auc(*probs["member"]) > 60  # the target memorised its training half
    assert attack.auc(*probs["other"]) == pytest.approx(50, abs=6)  # never saw it
    # the cheap attack agrees in direction
    assert cheap_mia(probs["member"][0], forget.labels, probs["member"][1], test.labels) > 60


def test_reference_member_mask() -> None:
    refs = ReferenceModels([], [np.array([1, 3]), np.array([2, 4])], img_size=8)
    np.testing.assert_array_equal(refs.member_mask(np.array([1, 2, 5])), [[True, False, False], [False, True, False]])
