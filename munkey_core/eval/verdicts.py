"""Verdicts on forgetting: each number against its target, with an interval and a plain word.

A forgetting number means nothing alone: FA = 100 % is fine when unseen samples of the same classes
also score ~100 %, and alarming when they score 60 %. `verdict` puts a measured value next to its
target (what a model that never saw the data gives) and a 95 % interval from the sample counts, and
says one of three words:

- "forgotten": the interval holds the target (or the value is on the forgotten side of it), it is
  narrow enough (half-width <= `tolerance`) to mean something, and the value is clearly below what a
  remembered sample reads (`remembered`: the same measure on training samples the model still holds, of
  the same classes; metrics.remembered_reference), so the measure could have told a remembered sample apart;
- "not yet": the whole interval is on the remembered side of the target;
- "cannot tell": nothing measured, too few samples for the interval to decide, a value not clearly below
  the remembered one (a request of 30 images at FA 100 % against unseen samples at 92 % fits both), a
  remembered value no higher than the target (no power), or, for FA and MIA, no remembered value.

Targets: FA against the accuracy on unseen (test) samples of the same classes (`class_matched_accuracy`)
or an oracle's FA; MIA (AUC %) against 50 (indistinguishable from unseen data); Af against the
class oracle's Af or 0. Intervals: Wilson score for accuracies; Newcombe's hybrid score interval where the
target is itself measured on samples (FA against unseen samples); Hanley & McNeil (1982) for an AUC, with
no verdict below MIN_AUC_SAMPLES.
The dashboard and the receipts use these same functions. Tests: tests/eval/test_verdicts.py.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from munkey_core.eval.metrics import class_weights

FORGOTTEN, NOT_YET, CANNOT_TELL = "forgotten", "not yet", "cannot tell"
Z95 = 1.959963984540054
TOLERANCE = {"FA": 15.0, "MIA": 15.0, "Af": 10.0}  # widest half-interval (points) that still decides "forgotten"
# Fewest deleted samples an AUC verdict is given on. Below it the Hanley-McNeil interval is too narrow: with
# 1 / 2 / 3 / 5 samples never trained on (against 359 unseen) it misses 50 for 10 / 5 / 3.5 / 2.9 % of
# requests instead of 2.5 % (simulated; tests/eval/test_verdicts.py), so "not yet" would be a false alarm
# for one single-image request in ten.
MIN_AUC_SAMPLES = 5
NO_HELD_SAMPLE = ("the model holds no training sample of these classes any more (or none among the evaluated "
                  "ones), so nothing shows the measure could tell a remembered sample apart, here or against a "
                  "retrained model (a whole class deleted: its samples can no longer be retrieved, which the "
                  "retrieval check shows).")


def finite_number(x) -> bool:
    """A real, finite number (not None, nan or inf): what a verdict can be computed from."""
    return x is not None and isinstance(x, (int, float, np.floating, np.integer)) and math.isfinite(float(x))


def wilson_interval(percent: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95 % Wilson score interval (percent) of an accuracy measured as `percent` on n samples."""
    if n <= 0:
        return (0.0, 100.0)
    p = percent / 100.0
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (100 * max(0.0, centre - half), 100 * min(1.0, centre + half))


def auc_interval(auc_percent: float, n_pos: int, n_neg: int, z: float = Z95) -> tuple[float, float]:
    """95 % interval (percent) of an AUC from the Hanley & McNeil (1982) standard error."""
    if n_pos <= 0 or n_neg <= 0:
        return (0.0, 100.0)
    a = min(max(auc_percent / 100.0, 1e-6), 1 - 1e-6)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    se = math.sqrt(max(var, 0.0))
    return (100 * max(0.0, a - z * se), 100 * min(1.0, a + z * se))


def class_matched_accuracy(test_labels: np.ndarray, test_correct: np.ndarray, forget_labels: np.ndarray) -> float | None:
    """Accuracy (percent) on unseen test samples, per class weighted by the forget set's class counts:
    the FA a model that never saw the forget set is expected to reach. None when a class has no test sample."""
    w = _matched_weights(test_labels, forget_labels)
    return None if w is None else 100.0 * float(w @ np.asarray(test_correct, float))


def class_matched_n(test_labels: np.ndarray, forget_labels: np.ndarray) -> float | None:
    """How many samples `class_matched_accuracy` is worth (Kish's effective size of its weighted mean,
    (sum w)^2 / sum w^2): the test count when the forget set has the test split's class mix, one class's
    count when all the forget samples share that class. None when a class has no test sample."""
    w = _matched_weights(test_labels, forget_labels)
    return None if w is None else effective_count(w)


def effective_count(weights: np.ndarray) -> float:
    """Kish's effective sample size of a weighted mean with these (N,) weights: (sum w)^2 / sum w^2."""
    return float(weights.sum() ** 2 / np.sum(weights ** 2))


def _matched_weights(test_labels: np.ndarray, forget_labels: np.ndarray) -> np.ndarray | None:
    """Test-sample weights (N_test,) giving the forget set's class mix (metrics.class_weights), or None
    when the forget set is empty or has a class with no test sample (no unseen target for it)."""
    keep, w = class_weights(forget_labels, test_labels)
    return w if len(keep) and keep.all() else None


def difference_interval(value: float, n: int, target: float, target_n: float,
                        z: float = Z95) -> tuple[float, float]:
    """95 % interval (percent) of an accuracy `value` on n samples, widened by the uncertainty of a
    `target` that was itself measured on `target_n` samples: `proportion_difference_interval` shifted
    back onto `value`. Comparing `value` with a measured target through the value's Wilson interval
    alone calls a model that never saw the samples "not yet" for 8-21 % of 500-2,000-sample requests
    (against 359 unseen), not 2.5 %."""
    low, high = proportion_difference_interval(value, n, target, target_n, z)
    return max(0.0, target + low), min(100.0, target + high)


def proportion_difference_interval(value: float, n: int, target: float, target_n: float,
                                   z: float = Z95) -> tuple[float, float]:
    """95 % interval (points) of value - target, two accuracies (percent) on n and target_n samples:
    Newcombe's hybrid score interval (1998, method 10), from each side's Wilson interval. Unlike
    value +- 2 binomial standard errors it does not shrink to nothing at 0 or 100 % on few samples."""
    l1, u1 = wilson_interval(value, n, z)
    l2, u2 = wilson_interval(target, max(1, int(round(target_n))), z)
    d = value - target
    return d - math.hypot(value - l1, u2 - target), d + math.hypot(u1 - value, target - l2)


def verdict(metric: str, value: float | None, target: float | None, *, n: int | None = None,
            n_ref: int | None = None, target_label: str = "", tolerance: float | None = None,
            target_n: float | None = None, remembered: float | None = None, remembered_n: float | None = None,
            needs_remembered: bool = False, no_remembered_reason: str = "") -> dict:
    """One forgetting number against its target. metric: "FA" or "Af" (accuracy %, n samples) or "MIA"
    (AUC %, n forget vs n_ref unseen samples; target 50). `target_n`: for an accuracy whose target was
    measured on samples (FA against unseen samples of the same classes: `class_matched_n`), their
    effective count; the interval then carries the target's uncertainty too (`difference_interval`).
    `remembered`: what the measure reads on samples the model still holds (the positive control), on
    `remembered_n` samples (their effective count); "forgotten" needs the value clearly below it
    (`clear_of_remembered`), else "cannot tell"; so does its absence when `needs_remembered`, with
    `no_remembered_reason` as the reason. Returns a JSON-ready dict: metric, value, target, target_label,
    interval, n, remembered, verdict, reason."""
    tol = TOLERANCE.get(metric, 15.0) if tolerance is None else tolerance
    out = {"metric": metric, "value": float(value) if finite_number(value) else None,
           "target": float(target) if finite_number(target) else None, "target_label": target_label,
           "interval": None, "n": int(n) if n is not None else None,
           "remembered": float(remembered) if finite_number(remembered) else None, "verdict": CANNOT_TELL,
           "reason": ""}
    if not finite_number(value):
        out["reason"] = f"{metric} was not measured (nothing deleted yet, or no samples to measure it on)."
        return out
    if not finite_number(target):
        out["reason"] = f"{metric} = {value:.1f} %, but there is no target to compare it with ({target_label or 'none'})."
        return out
    if not n:
        out["reason"] = f"{metric} has no sample count, so its uncertainty is unknown."
        return out
    with_target_noise = metric != "MIA" and finite_number(target_n) and target_n > 0
    if metric == "MIA":
        lo, hi = auc_interval(float(value), int(n), int(n_ref or 0))
    elif with_target_noise:
        lo, hi = difference_interval(float(value), int(n), float(target), float(target_n))
    else:
        lo, hi = wilson_interval(float(value), int(n))
    out["interval"] = [round(lo, 2), round(hi, 2)]
    t = float(target)
    of_target = "; with the target's own uncertainty" if with_target_noise else ""
    what = (f"{metric} {value:.1f} % (95 % interval {lo:.1f}-{hi:.1f}, {n} samples{of_target}) vs {t:.1f} % "
            f"{target_label}").rstrip()
    if metric == "MIA" and int(n) < MIN_AUC_SAMPLES:
        out["reason"] = (f"MIA {value:.1f} % on {n} deleted sample(s): too few to tell; an AUC over fewer than "
                         f"{MIN_AUC_SAMPLES} samples is often far from 50 by chance alone, even for samples never "
                         "trained on.")
    elif lo > t:
        out["verdict"] = NOT_YET
        out["reason"] = f"{what}: still above the target, so the model still remembers these samples."
    elif (hi - lo) / 2 > tol and hi >= t:
        out["reason"] = f"{what}: too few samples to tell (the interval is wider than ±{tol:.0f} points)."
    elif out["remembered"] is not None and out["remembered"] <= t:
        out["reason"] = (f"{what}: training samples the model still holds read {out['remembered']:.1f} %, no higher "
                         "than unseen ones, so this measure cannot show a remembered sample here.")
    elif out["remembered"] is not None and not clear_of_remembered(metric, float(value), int(n), n_ref,
                                                                   out["remembered"], remembered_n):
        out["reason"] = (f"{what}: not clearly below the {out['remembered']:.1f} % that training samples the model "
                         "still holds read: these numbers fit samples still remembered as well as forgotten ones "
                         "(more deleted samples narrow the interval; a retrained oracle tells more).")
    elif out["remembered"] is None and needs_remembered:
        out["reason"] = f"{what}: " + (no_remembered_reason or "no reading of training samples the model still holds.")
    else:
        out["verdict"] = FORGOTTEN
        if hi >= t and out["remembered"] is None:  # Af: a class's accuracy against a model that never learnt it
            out["reason"] = f"{what}: at or below the target, as if never trained on."
        elif hi >= t:
            out["reason"] = (f"{what}: at or below the target, and clearly below the {out['remembered']:.1f} % that "
                             "training samples the model still holds read: like unseen samples on average.")
        else:
            out["reason"] = (f"{what}: below the target: not recognised better than unseen samples (these may "
                             "simply be harder than average; only a retrained model shows whether more was "
                             "forgotten than needed).")
    return out


def clear_of_remembered(metric: str, value: float, n: int, n_ref: int | None, remembered: float,
                        remembered_n: float | None) -> bool:
    """Whether `value` (on n samples) lies below `remembered` (on `remembered_n`; None: taken as exact) by
    more than both 95 % uncertainties together (Newcombe's hybrid rule: the distance against the hypot of
    the value's upper and the remembered value's lower half-interval). Accuracies: the value's exact
    (Clopper-Pearson) upper bound, since near 100 % Wilson's is too low (29 of 30 right would clear 99.5 %,
    which a model still knowing them at 99.5 % gives 14 % of the time), and Wilson's lower bound for the
    remembered value; AUCs: Hanley-McNeil against n_ref unseen samples."""
    if metric == "MIA":
        v_hi = auc_interval(value, n, int(n_ref or 0))[1]
        r_lo = auc_interval(remembered, int(remembered_n), int(n_ref or 0))[0] if remembered_n else remembered
    else:
        from scipy.stats import beta

        right = int(round(value / 100.0 * n))
        v_hi = 100.0 if right >= n else 100.0 * float(beta.ppf(1 - (1 - 0.95) / 2, right + 1, n - right))
        r_lo = wilson_interval(remembered, int(remembered_n))[0] if remembered_n else remembered
    return remembered - value > math.hypot(v_hi - value, remembered - r_lo)


def forgetting_verdicts(after: dict, *, fa_target: float | None, fa_target_label: str,
                        n_ref: int | None = None, fa_target_n: float | None = None) -> list[dict]:
    """Verdicts for an evaluation's FA and MIA (the `evaluate` dict: FA, MIA, n_forget, n_test, and
    FA_remembered / MIA_remembered / n_remembered, metrics.remembered_reference: without them neither says
    "forgotten").
    `fa_target_n`: the effective count of the samples `fa_target` was measured on (`class_matched_n`)."""
    n_forget = after.get("n_forget")
    # the class-balanced AUC compares each class's deleted samples with that class's unseen ones: its
    # negatives are worth the reweighted test set's effective count (a one-class request: that class's), not all
    n_ref = n_ref or (int(fa_target_n) if finite_number(fa_target_n) and fa_target_n >= 1 else after.get("n_test"))
    why = (NO_HELD_SAMPLE if "FA_remembered" in after else  # measured: no held sample of these classes
           "this evaluation predates the reading of training samples the model still holds, so nothing shows "
           "the measure could tell a remembered sample apart; evaluate again (`munkey evaluate RUN`).")
    control = {"remembered_n": after.get("n_remembered"), "needs_remembered": True, "no_remembered_reason": why}
    return [verdict("FA", after.get("FA"), fa_target, n=n_forget, target_label=fa_target_label,
                    target_n=fa_target_n, remembered=after.get("FA_remembered"), **control),
            verdict("MIA", after.get("MIA"), 50.0, n=n_forget, n_ref=n_ref,
                    target_label="(50 = indistinguishable from unseen data)",
                    remembered=after.get("MIA_remembered"), **control)]


def overall(verdicts: Sequence[dict]) -> str:
    """One word for several verdicts: "not yet" if any is, "forgotten" if all are, else "cannot tell"."""
    words = [v["verdict"] for v in verdicts]
    if NOT_YET in words:
        return NOT_YET
    if words and all(w == FORGOTTEN for w in words):
        return FORGOTTEN
    return CANNOT_TELL
