"""Metric code on hand-made cases, and the AUCs against scikit-learn's roc_auc_score as the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from munkey_core.eval.metrics import accuracy, auc, avg_gap, cross_entropy, mia_auc, pathway_sensitivity


def test_accuracy_and_empty_set() -> None:
    assert accuracy(np.array([1, 2, 3, 4]), np.array([1, 2, 0, 4])) == 75.0
    assert accuracy(np.array([]), np.array([])) is None


def test_auc_hand_cases() -> None:
    assert auc([3, 4], [1, 2]) == 1.0
    assert auc([1, 2], [3, 4]) == 0.0
    assert auc([1, 1], [1, 1]) == 0.5
    assert auc([1, 3], [2]) == 0.5
    rng = np.random.default_rng(0)
    assert auc(rng.normal(size=4000), rng.normal(size=4000)) == pytest.approx(0.5, abs=0.03)


def test_cross_entropy() -> None:
    probs = np.array([[0.5, 0.5], [0.9, 0.1]])
    np.testing.assert_allclose(cross_entropy(probs, np.array([0, 1])), [np.log(2), -np.log(0.1)])


def test_mia_separates_members_and_is_fifty_for_the_same_distribution() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 5, size=600)
    member_loss = rng.exponential(0.05, size=600)
    unseen_loss = rng.exponential(1.0, size=600)
    assert mia_auc(member_loss, labels, unseen_loss, labels) > 90
    same = rng.exponential(1.0, size=600)
    assert mia_auc(same, labels, unseen_loss, labels) == pytest.approx(50, abs=4)


def test_mia_is_class_balanced() -> None:
    # class 0 is easy (low loss), class 1 hard; the forget set is mostly class 0, the test set mostly
    # class 1. A pooled AUC would report strong "membership"; per class there is no signal at all.
    rng = np.random.default_rng(2)
    f_labels = np.array([0] * 900 + [1] * 100)
    t_labels = np.array([0] * 100 + [1] * 900)
    def loss(labels):
        return np.where(labels == 0, rng.exponential(0.1, len(labels)), rng.exponential(2.0, len(labels)))
    f_loss, t_loss = loss(f_labels), loss(t_labels)
    assert 100 * auc(-f_loss, -t_loss) > 80
    assert mia_auc(f_loss, f_labels, t_loss, t_labels) == pytest.approx(50, abs=5)


def test_mia_undefined_without_shared_classes() -> None:
    assert mia_auc(np.array([0.1]), np.array([0]), np.array([0.2]), np.array([1])) is None


def test_pathway_sensitivity() -> None:
    assert pathway_sensitivity(80.0, 60.0, 100.0) == pytest.approx(0.2)
    assert pathway_sensitivity(60.0, 80.0, 100.0) == pytest.approx(0.2)


def test_avg_gap_reproduces_the_papers_cifar10_row() -> None:
    munkey = {"TA": 92.63, "RA": 99.94, "FA": 92.53, "MIA": 51.40}
    oracle = {"TA": 92.38, "RA": 99.93, "FA": 92.05, "MIA": 49.90}
    assert round(avg_gap(munkey, oracle), 2) == 0.56


# --------------------------------------------------------------------------- oracle: scikit-learn


def _sklearn_auc(pos, neg) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.r_[np.ones(len(pos)), np.zeros(len(neg))], np.r_[pos, neg]))


@pytest.mark.parametrize("seed", range(6))
def test_auc_equals_sklearns_roc_auc_with_and_without_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_pos, n_neg = rng.integers(1, 400, size=2)
    cases = {
        "continuous": (rng.normal(0.3, 1, n_pos), rng.normal(0, 1, n_neg)),
        "heavy ties": (rng.integers(0, 4, n_pos).astype(float), rng.integers(0, 5, n_neg).astype(float)),
        "ties across and within": (np.round(rng.normal(0, 1, n_pos), 1), np.round(rng.normal(0, 1, n_neg), 1)),
        "one positive": (rng.normal(size=1), rng.normal(size=n_neg)),
        "all tied": (np.full(n_pos, 2.5), np.full(n_neg, 2.5)),
        "losses (cross-entropy scale)": (-rng.exponential(0.05, n_pos), -rng.exponential(1.0, n_neg)),
    }
    for name, (pos, neg) in cases.items():
        assert auc(pos, neg) == pytest.approx(_sklearn_auc(pos, neg), abs=1e-12), name


def test_mia_auc_is_the_class_weighted_mean_of_sklearns_per_class_auc() -> None:
    rng = np.random.default_rng(7)
    f_labels, t_labels = rng.integers(0, 4, 300), rng.integers(0, 5, 500)  # class 4 only in the test set
    f_loss = np.round(rng.exponential(0.5, 300), 2)                       # rounded: ties occur
    t_loss = np.round(rng.exponential(1.0, 500), 2)
    per_class = [(np.sum(f_labels == c), _sklearn_auc(-f_loss[f_labels == c], -t_loss[t_labels == c]))
                 for c in np.unique(f_labels)]
    expected = 100 * sum(n * a for n, a in per_class) / sum(n for n, _ in per_class)
    assert mia_auc(f_loss, f_labels, t_loss, t_labels) == pytest.approx(expected, abs=1e-9)
