"""eval/verdicts.py: intervals checked against textbook values, verdicts on hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from munkey_core.eval import verdicts as V


def test_wilson_interval_matches_the_textbook_formula() -> None:
    # Wilson (1927), written out independently: p=0.8, n=10, z=1.96 -> (0.4902, 0.9433)
    lo, hi = V.wilson_interval(80.0, 10)
    assert lo == pytest.approx(49.02, abs=0.02) and hi == pytest.approx(94.33, abs=0.02)
    lo, hi = V.wilson_interval(100.0, 5)
    assert hi == 100.0 and lo == pytest.approx(56.55, abs=0.05)


def test_auc_interval_matches_hanley_mcneil() -> None:
    # Hanley & McNeil (1982) by hand for A=0.9, nA=nN=50: Q1 = 0.9/1.1 = 0.81818, Q2 = 1.62/1.9 = 0.85263,
    # var = (0.09 + 49 * 0.00818 + 49 * 0.04263) / 2500 = 0.0010319, SE = 0.03212
    lo, hi = V.auc_interval(90.0, 50, 50)
    assert lo == pytest.approx(100 * (0.9 - 1.96 * 0.03212), abs=0.02)
    assert hi == pytest.approx(100 * (0.9 + 1.96 * 0.03212), abs=0.02)
    assert V.auc_interval(50.0, 0, 10) == (0.0, 100.0)


def test_verdicts_say_forgotten_not_yet_and_cannot_tell() -> None:
    # the case: 5 deleted, MIA 81.6 against 359 unseen -> still distinguishable: not yet
    mia = V.verdict("MIA", 81.6, 50.0, n=5, n_ref=359)
    assert mia["verdict"] == V.NOT_YET and mia["interval"][0] > 50
    # FA 100 % on 5 samples vs 97 % on unseen samples: too few to tell
    assert V.verdict("FA", 100.0, 97.0, n=5)["verdict"] == V.CANNOT_TELL
    # FA 96 % on 400 samples vs 97 %: forgotten
    assert V.verdict("FA", 96.0, 97.0, n=400)["verdict"] == V.FORGOTTEN
    # the demo's case: FA 91.3 % on 126 deleted vs 95.2 % on unseen same-class samples; retrained models
    # score 91-92 % on the same samples, so the screen may not claim more forgetting than retraining
    below = V.verdict("FA", 91.27, 95.21, n=126)
    assert below["verdict"] == V.FORGOTTEN and below["interval"][1] < 95.21
    assert "retrained model would" not in below["reason"] and "only a retrained model shows" in below["reason"]
    # a class still recognised 29.7 % of the time on 37 test images, target 0: not yet
    assert V.verdict("Af", 29.7, 0.0, n=37)["verdict"] == V.NOT_YET
    assert V.verdict("Af", 0.0, 0.0, n=37)["verdict"] == V.FORGOTTEN
    for v in (V.verdict("MIA", None, 50.0, n=5), V.verdict("FA", float("nan"), 97.0, n=5),
              V.verdict("FA", 90.0, None, n=50)):
        assert v["verdict"] == V.CANNOT_TELL and v["reason"] and "nan" not in v["reason"].lower()
    assert V.overall([mia, V.verdict("Af", 0.0, 0.0, n=37)]) == V.NOT_YET
    assert V.overall([V.verdict("Af", 0.0, 0.0, n=37)]) == V.FORGOTTEN


def test_class_matched_accuracy_weights_classes_by_the_forget_set() -> None:
    labels = np.array([0, 0, 1, 1, 1, 1])
    correct = np.array([1, 1, 0, 0, 1, 1], bool)  # class 0: 100 %, class 1: 50 %
    assert V.class_matched_accuracy(labels, correct, np.array([0, 1, 1, 1])) == pytest.approx(62.5)
    assert V.class_matched_accuracy(labels, correct, np.array([2])) is None


def test_an_mia_verdict_on_samples_never_trained_on_is_rarely_not_yet() -> None:
    """Calibration against known truth: "deleted" samples drawn from the same loss distribution as the 359
    unseen ones (a model that never saw them). "not yet" must come at most about as often as a 95 % interval
    allows (2.5 % one-sided) at every request size, single images included. Positive control: the bare
    Hanley-McNeil interval on one sample misses 50 far more often (about 10 %): the check has power."""
    rng = np.random.default_rng(0)
    trials = 2000
    for n in (1, 2, 3, 5, 10, 40):
        not_yet = bare_misses = 0
        for _ in range(trials):
            neg, pos = rng.normal(size=359), rng.normal(size=n)
            auc = 100 * float((pos[:, None] > neg[None, :]).mean())
            not_yet += V.verdict("MIA", auc, 50.0, n=n, n_ref=359)["verdict"] == V.NOT_YET
            bare_misses += V.auc_interval(auc, n, 359)[0] > 50
        assert not_yet / trials <= 0.04, (n, not_yet / trials)
        if n == 1:
            assert bare_misses / trials >= 0.06, bare_misses / trials
    one = V.verdict("MIA", 97.2, 50.0, n=1, n_ref=359)
    assert one["verdict"] == V.CANNOT_TELL and "too few to tell" in one["reason"]


def test_an_fa_verdict_carries_the_uncertainty_of_its_measured_target() -> None:
    """Calibration against known truth: the deleted samples and the unseen test samples share one accuracy
    (a model that never saw either). With the target's own sample count given, "not yet" stays near the
    nominal 2.5 % at every request size; the Wilson interval of FA alone (the positive control) calls such
    a model "not yet" for over 10 % of 2,000-sample requests. A real gap is still caught."""
    rng = np.random.default_rng(1)
    trials, n_test = 2000, 359
    for p in (0.8, 0.95):
        for n in (20, 126, 500, 2000):
            fa = 100 * rng.binomial(n, p, size=trials) / n
            ta = 100 * rng.binomial(n_test, p, size=trials) / n_test
            with_target = np.mean([V.verdict("FA", f, t, n=n, target_n=n_test)["verdict"] == V.NOT_YET
                                   for f, t in zip(fa, ta)])
            assert with_target <= 0.04, (p, n, with_target)
            if n == 2000:
                alone = np.mean([V.verdict("FA", f, t, n=n)["verdict"] == V.NOT_YET for f, t in zip(fa, ta)])
                assert alone >= 0.10, (p, alone)
    caught = V.verdict("FA", 100.0, 80.0, n=126, target_n=n_test)
    assert caught["verdict"] == V.NOT_YET and "target's own uncertainty" in caught["reason"]


def test_class_matched_n_is_the_effective_size_of_the_weighted_target() -> None:
    test = np.repeat(np.arange(10), 36)  # 36 unseen samples per class
    assert V.class_matched_n(test, np.full(7, 3)) == pytest.approx(36)  # one class: its 36 samples
    assert V.class_matched_n(test, np.repeat(np.arange(10), 5)) == pytest.approx(360)  # the test mix: all 360
    # two classes, 3:1 -> 1 / (0.75^2 / 36 + 0.25^2 / 36) = 57.6
    assert V.class_matched_n(test, np.array([1, 1, 1, 2])) == pytest.approx(57.6)
    assert V.class_matched_n(test, np.array([11])) is None


def test_difference_interval_matches_newcombes_worked_examples() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (hybrid score):
    # 56/70 - 48/80 -> (0.0524, 0.3339); 9/10 - 3/10 -> (0.1705, 0.8090)
    lo, hi = V.proportion_difference_interval(100 * 56 / 70, 70, 100 * 48 / 80, 80)
    assert lo == pytest.approx(5.24, abs=0.01) and hi == pytest.approx(33.39, abs=0.01)
    lo, hi = V.proportion_difference_interval(90.0, 10, 30.0, 10)
    assert lo == pytest.approx(17.05, abs=0.01) and hi == pytest.approx(80.90, abs=0.01)
    # the interval of the value itself stays inside 0-100
    assert V.difference_interval(90.0, 10, 30.0, 10) == pytest.approx((47.05, 100.0), abs=0.01)


def test_forgotten_needs_an_interval_that_leaves_out_what_remembered_samples_read() -> None:
    """The positive control: a verdict may say "forgotten" only where the measure could have told a
    remembered sample apart. A small request the model still knows fully (FA 100 % on 30 images, unseen
    samples of those classes at 92 %, samples still held at 99.5 %) fits both readings: cannot tell."""
    still_known = V.verdict("FA", 100.0, 92.0, n=30, target_n=359, remembered=99.5)
    assert still_known["verdict"] == V.CANNOT_TELL and "99.5 %" in still_known["reason"]
    assert V.verdict("FA", 100.0, 92.0, n=30, target_n=359)["verdict"] == V.FORGOTTEN  # what it said before
    gone = V.verdict("FA", 90.5, 92.0, n=126, target_n=359, remembered=99.5)
    assert gone["verdict"] == V.FORGOTTEN and gone["remembered"] == 99.5
    # MIA: 25 deleted images at AUC 60 against 359 unseen: the interval holds 50 and an undeleted 62 alike
    assert V.verdict("MIA", 60.0, 50.0, n=25, n_ref=359, remembered=62.0)["verdict"] == V.CANNOT_TELL
    assert V.verdict("MIA", 51.0, 50.0, n=400, n_ref=359, remembered=62.0)["verdict"] == V.FORGOTTEN
    # FA and MIA from an evaluation without the remembered reading (an older metrics entry): never "forgotten"
    old = V.forgetting_verdicts({"FA": 90.5, "MIA": 51.0, "n_forget": 400, "n_test": 359}, fa_target=92.0,
                                fa_target_label="(unseen)", fa_target_n=359)
    assert [v["verdict"] for v in old] == [V.CANNOT_TELL] * 2 and "munkey evaluate" in old[0]["reason"]
    new = V.forgetting_verdicts({"FA": 90.5, "MIA": 51.0, "n_forget": 400, "n_test": 359, "FA_remembered": 99.5,
                                 "MIA_remembered": 62.0}, fa_target=92.0, fa_target_label="(unseen)", fa_target_n=359)
    assert V.overall(new) == V.FORGOTTEN


def test_samples_still_remembered_are_rarely_called_forgotten() -> None:
    """Simulated requests whose samples the model still knows (accuracy 99.5 %, as on the samples it
    holds) against unseen samples at 92 %: at every request size "forgotten" comes at most 5 % of the
    time (before the positive control it came for nearly every request of 30 images or fewer)."""
    rng = np.random.default_rng(2)
    trials, n_test = 1000, 359
    for n_held in (200, 2000):  # a class mix the evaluated held samples cover thinly, or well
        for n in (5, 10, 30, 60, 126, 500):
            fa = 100 * rng.binomial(n, 0.995, size=trials) / n
            ta = 100 * rng.binomial(n_test, 0.92, size=trials) / n_test
            held = 100 * rng.binomial(n_held, 0.995, size=trials) / n_held
            said = np.mean([V.verdict("FA", f, t, n=n, target_n=n_test, remembered=h, remembered_n=n_held)["verdict"]
                            == V.FORGOTTEN for f, t, h in zip(fa, ta, held)])
            assert said <= 0.05, (n_held, n, said)
    # and samples truly forgotten (read like unseen ones, 92 %) are still called so once the request is large
    fa = 100 * rng.binomial(126, 0.92, size=trials) / 126
    ta = 100 * rng.binomial(n_test, 0.92, size=trials) / n_test
    said = np.mean([V.verdict("FA", f, t, n=126, target_n=n_test, remembered=99.5, remembered_n=2000)["verdict"]
                    == V.FORGOTTEN for f, t in zip(fa, ta)])
    assert said >= 0.9, said


def test_a_control_that_reads_like_unseen_samples_cannot_support_forgotten() -> None:
    """Held samples at or below the target (a model that never fit its training data, or an attack with no
    power on it): nothing could have shown a remembered sample, so no "forgotten"; class removal's Af,
    which has no such control, keeps its own reading."""
    weak = V.verdict("FA", 93.0, 92.0, n=500, target_n=359, remembered=85.0, remembered_n=2000)
    assert weak["verdict"] == V.CANNOT_TELL and "no higher than unseen ones" in weak["reason"]
    assert V.verdict("MIA", 50.5, 50.0, n=500, n_ref=359, remembered=49.0, remembered_n=2000)["verdict"] == V.CANNOT_TELL
    af = V.verdict("Af", 0.0, 0.0, n=36)
    assert af["verdict"] == V.FORGOTTEN and af["reason"].endswith("as if never trained on.")
    whole_class = V.forgetting_verdicts({"FA": 90.0, "MIA": 50.0, "n_forget": 300, "n_test": 359, "FA_remembered": None,
                                         "MIA_remembered": None, "n_remembered": 0}, fa_target=92.0,
                                        fa_target_label="(unseen)", fa_target_n=359)
    assert [v["verdict"] for v in whole_class] == [V.CANNOT_TELL] * 2
    assert "no training sample of these classes" in whole_class[0]["reason"]


def test_a_one_class_requests_attack_is_judged_on_that_classs_unseen_samples() -> None:
    """The class-balanced AUC of a one-class request rests on that class's unseen samples (36 of 359 on
    digits), so its interval, and the control's, widen by that count (`fa_target_n`), not the whole test set:
    60 images at AUC 52 against held samples at 63.3 cannot tell apart what 359 negatives would have."""
    after = {"FA": 88.0, "MIA": 52.0, "n_forget": 60, "n_test": 359, "FA_remembered": 100.0, "MIA_remembered": 63.3,
             "n_remembered": 113.0}
    one_class = V.forgetting_verdicts(after, fa_target=90.0, fa_target_label="(unseen)", fa_target_n=36)
    assert one_class[1]["verdict"] == V.CANNOT_TELL
    assert V.verdict("MIA", 52.0, 50.0, n=60, n_ref=359, remembered=63.3, remembered_n=113)["verdict"] == V.FORGOTTEN
    every_class = V.forgetting_verdicts({**after, "n_forget": 400, "n_remembered": 1000.0}, fa_target=90.0,
                                        fa_target_label="(unseen)", fa_target_n=359)
    assert every_class[1]["verdict"] == V.FORGOTTEN


def test_the_power_table_script_prints_what_the_docs_show() -> None:
    """scripts/verdict_power.py, the table of evaluation.md section 5: it runs, and at its committed seed and
    trial count it prints the committed table (docs/results/verdict_power.txt)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "scripts/verdict_power.py"], cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == (root / "docs" / "results" / "verdict_power.txt").read_text()
