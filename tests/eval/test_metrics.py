"""Metric code on hand-made cases, and the AUCs against scikit-learn's roc_auc_score as the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from munkey_core.eval.metrics import (accuracy, auc, avg_gap, cross_entropy, mia_auc, mia_tprs, pathway_sensitivity,
                                      tpr_at_fpr)


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


def _brute_force_tpr(pos: np.ndarray, neg: np.ndarray, fpr: float, w: np.ndarray) -> float:
    """Every threshold tried: the best TPR whose weighted FPR stays <= fpr (percent)."""
    best = 0.0
    for t in np.r_[np.unique(np.r_[pos, neg]), np.inf]:
        if w[neg >= t].sum() / w.sum() <= fpr + 1e-12:
            best = max(best, float((pos >= t).mean()))
    return 100.0 * best


@pytest.mark.parametrize("weighted", [False, True])
def test_tpr_at_low_fpr_matches_sklearn_and_a_threshold_sweep(weighted: bool) -> None:
    from sklearn.metrics import roc_curve

    rng = np.random.default_rng(1)
    for trial in range(8):
        pos = np.round(rng.normal(1.0, 1.0, 200), 1)  # rounding makes ties across and within the sets
        neg = np.round(rng.normal(0.0, 1.0, 1200), 1)
        w = rng.uniform(0.2, 3.0, len(neg)) if weighted else np.ones(len(neg))
        y, scores = np.r_[np.ones(len(pos)), np.zeros(len(neg))], np.r_[pos, neg]
        fp, tp, _ = roc_curve(y, scores, sample_weight=np.r_[np.ones(len(pos)), w], drop_intermediate=False)
        for fpr in (0.1, 0.01, 0.001):
            got = tpr_at_fpr(pos, neg, fpr, w if weighted else None)
            assert got == pytest.approx(100.0 * tp[fp <= fpr + 1e-12].max())
            assert got == pytest.approx(_brute_force_tpr(pos, neg, fpr, w))
    # hand case: 1 of 4 positives above every negative; 1 negative of 100 (1%) above two more; then a second
    pos, neg = np.array([10.0, 2.0, 2.0, 0.5]), np.r_[np.zeros(98), 3.0, 1.0]
    assert tpr_at_fpr(pos, neg, 0.001) == 25.0 and tpr_at_fpr(pos, neg, 0.01) == 75.0
    assert tpr_at_fpr(pos, neg, 0.02) == 100.0


def test_mia_tprs_are_class_balanced() -> None:
    # the score depends on the class only, and the forget set is mostly class 0 where the test set is
    # mostly class 1: pooled, the forget samples would look like members; reweighted, they do not
    rng = np.random.default_rng(0)
    f_y, t_y = np.r_[np.zeros(180, int), np.ones(20, int)], np.r_[np.zeros(150, int), np.ones(19850, int)]
    f_s, t_s = f_y * -1.0 + rng.normal(0, 0.01, 200), t_y * -1.0 + rng.normal(0, 0.01, 20000)
    assert tpr_at_fpr(f_s, t_s, 0.01) > 80  # unweighted: the 150 class-0 test samples fit under 1% FPR
    tprs = mia_tprs(f_s, f_y, t_s, t_y)
    # reweighted, the test set has the forget set's class mix: at 1% FPR about 1% of the forget samples
    assert set(tprs) == {"TPR@1%", "TPR@0.1%"} and tprs["TPR@1%"] < 5
    assert mia_tprs(f_s, np.full(200, 5), t_s, t_y) == {"TPR@1%": None, "TPR@0.1%": None}


def test_remembered_reference_weights_each_class_by_the_deleted_samples_and_matches_sklearn() -> None:
    """The verdicts' positive control: accuracy and loss-attack AUC on samples still held, per class of
    the deleted samples, weighted by their counts; a class with no held sample drops out. Computed here with
    scikit-learn's roc_auc_score per class and a weighted mean written out by hand."""
    from sklearn.metrics import roc_auc_score

    from munkey_core.eval.metrics import remembered_reference

    rng = np.random.default_rng(3)
    r_y, t_y = rng.integers(0, 3, size=300), rng.integers(0, 4, size=200)  # held: classes 0-2; test: 0-3
    r_p, t_p = rng.dirichlet(np.ones(4) * 0.5, size=300), rng.dirichlet(np.ones(4), size=200)
    f_y = np.array([0] * 6 + [2] * 2 + [3] * 5)  # class 3: no held sample, left out
    got = remembered_reference(r_p, r_y, t_p, t_y, f_y)
    r_loss, t_loss = -np.log(r_p[np.arange(300), r_y]), -np.log(t_p[np.arange(200), t_y])
    acc = {c: np.mean(r_p[r_y == c].argmax(1) == c) for c in (0, 2)}
    roc = {c: roc_auc_score(np.r_[np.ones((r_y == c).sum()), np.zeros((t_y == c).sum())],
                            -np.r_[r_loss[r_y == c], t_loss[t_y == c]]) for c in (0, 2)}
    assert got["FA_remembered"] == pytest.approx(100 * (6 * acc[0] + 2 * acc[2]) / 8)
    assert got["MIA_remembered"] == pytest.approx(100 * (6 * roc[0] + 2 * roc[2]) / 8)
    # what the weighted mean is worth (Kish): 1 / sum over held samples of their squared weights
    w = np.where(r_y == 0, 6 / 8 / (r_y == 0).sum(), 0.0) + np.where(r_y == 2, 2 / 8 / (r_y == 2).sum(), 0.0)
    assert got["n_remembered"] == pytest.approx(w.sum() ** 2 / (w ** 2).sum())
    none = remembered_reference(r_p, r_y, t_p, t_y, np.array([3, 3]))
    assert none == {"FA_remembered": None, "MIA_remembered": None, "n_remembered": 0}
