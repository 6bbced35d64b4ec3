"""The metrics of a loaded MUNKEY run with its current bank (`munkey evaluate`, before/after a deletion).

- `evaluate`: TA (test), RA (samples still in the bank), FA (every sample deleted so far), the
  cheap membership attack's AUC (forget vs test, metrics.mia_auc), Ps from the image-only,
  token-only and both pathways; optionally appended to metrics.json.
- `accuracy_on_ids`: FA on some training samples (a request's, before it deletes them).
- `request_accuracy_and_mia`: FA and MIA (with its TPR at 1% / 0.1% FPR) of one request's samples,
  next to the accuracy on *unseen test samples of the same classes* (weighted to the request's
  class mix, `same_class_comparison`) and what that comparison does and does not show
  (`SAME_CLASS_NOTE`): its receipt's evidence.
- both add `metrics.remembered_reference`: the same FA and MIA on training samples the model still
  holds, of the deleted samples' classes: what "still remembered" reads, the verdicts' positive control.
FA and MIA are computed by one function (`_forget_accuracy_and_mia`) in all three.
Each set is a seeded subsample of at most `max_samples` (0 = all); the retain and forget samples are
the first rows of one seeded permutation, so a deletion changes them only by the rows it moves.
Cost: every prediction comes from `LoadedMunkeyRun.predict_rows` (run/predcache.py): the first
evaluation of a bank runs K forwards per image over <= max_samples test images (three times: both
pathways, image, token), retain and forget images; after a deletion only the deleted samples and
the queries that had retrieved one of them are predicted again, the rest is reused.
Tests: tests/test_service.py (FA before/after), tests/audit/test_audit.py (a request's evidence),
tests/eval/test_incremental.py (incremental = from scratch; no stale prediction after a bank change).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from munkey_core.eval.metrics import (MIA_CHEAP, accuracy, class_weights, cross_entropy, mia_auc, mia_tprs,
                                     pathway_sensitivity, remembered_reference)
from munkey_core.eval.verdicts import effective_count, proportion_difference_interval
from munkey_core.run.loaded import LoadedMunkeyRun
from munkey_core.run.paths import utc_now

Progress = Callable[[str, float], None]  # (stage, fraction done)

SAME_CLASS_NOTE = (
    "The deleted samples are compared with unseen test samples of the same classes (weighted to the deleted "
    "samples' class mix). A difference whose 95 % interval contains 0 (an interval that counts the uncertainty of "
    "both sides, wide when few samples were deleted), and a membership-attack AUC near 50, say "
    "the model now treats the deleted samples, on average, like samples it never saw. This is a population "
    "comparison: it does not show that no single deleted sample is still recognised (a per-example attack, "
    "'munkey bench ulira', measures that), nor that the model matches one retrained without them (only a "
    "retrained oracle shows that, next to its noise floor: 'munkey evaluate RUN --oracle --noise-floor 2').")


def _subsample(index: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    if cap and len(index) > cap:
        return np.sort(rng.choice(index, size=cap, replace=False))
    return index


def _first_in_order(mask: np.ndarray, cap: int, order: np.ndarray) -> np.ndarray:
    """The rows where `mask` holds, at most `cap` of them (0 = all): the first ones in the seeded
    permutation `order` of all rows, sorted. A uniform random subset like `_subsample`, but stable
    under deletions: deleting ids changes it only by the rows they leave or join, so the rows kept
    are the same rows as before and their cached predictions are reused (run/predcache.py)."""
    if not cap or mask.sum() <= cap:
        return np.flatnonzero(mask)
    return np.sort(order[mask[order]][:cap])


def _train_rows(run: LoadedMunkeyRun, ids: Sequence[int]) -> np.ndarray:
    """Rows of the training split holding `ids` (unknown ids are skipped)."""
    return np.flatnonzero(np.isin(run.dataset.train.ids, np.asarray(list(ids), dtype=np.int64)))


def _forget_accuracy_and_mia(run: LoadedMunkeyRun, rows: np.ndarray, test_probs: np.ndarray,
                             test_labels: np.ndarray) -> tuple[float, float | None, dict]:
    """FA (percent) on training rows `rows` with the current bank and the cheap MIA AUC (percent) of
    those rows against test images whose ensemble probabilities (M, C) are `test_probs`; plus the
    pieces the receipt adds (predicted labels, labels, both losses)."""
    fy = run.dataset.train.labels[rows]
    probs = run.predict_rows("train", rows)
    pred = probs.argmax(axis=1)
    f_loss, t_loss = cross_entropy(probs, fy), cross_entropy(test_probs, test_labels)
    parts = {"pred": pred, "labels": fy, "forget_loss": f_loss, "test_loss": t_loss}
    return accuracy(pred, fy), mia_auc(f_loss, fy, t_loss, test_labels), parts


def _eval_rows(run: LoadedMunkeyRun, max_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Test, retain and forget rows of an evaluation (each at most `max_samples`): the test rows a
    seeded subsample, retain and forget rows the first ones in one seeded permutation (`_first_in_order`),
    so every evaluation of one bank state predicts the same rows and the cache serves them."""
    ds = run.dataset
    rng = np.random.default_rng(seed)
    test_idx = _subsample(np.arange(len(ds.test)), max_samples, rng)
    order = rng.permutation(len(ds.train))
    retain_idx = _first_in_order(np.isin(ds.train.ids, run.bank.ids), max_samples, order)
    forget_idx = _first_in_order(np.isin(ds.train.ids, run.forgotten_ids), max_samples, order)
    return test_idx, retain_idx, forget_idx


def evaluate(run: LoadedMunkeyRun, *, max_samples: int = 2000, seed: int = 0, record: bool = True,
             progress: Progress | None = None) -> dict:
    """TA, RA, FA (percent), cheap MIA AUC (percent), Ps; FA and MIA are None when nothing is deleted.
    Counts, bank size and both fingerprints come with them; `record` appends the result to metrics.json.

    Incremental: every prediction comes from `run.predict_rows`, which reuses the predictions a
    deletion cannot have changed (run/predcache.py); after deleting a few ids only the deleted
    samples and the queries that retrieved one of them are run through the model. The result equals
    a from-scratch evaluation of the same bank (tests/eval/test_incremental.py)."""
    ds = run.dataset
    report = progress or (lambda stage, frac: None)
    test_idx, retain_idx, forget_idx = _eval_rows(run, max_samples, seed)
    report("test", 0.0)
    test_y = ds.test.labels[test_idx]
    both = run.predict_rows("test", test_idx)
    report("pathways", 0.3)
    a_img = accuracy(run.predict_rows("test", test_idx, pathway="image").argmax(axis=1), test_y)
    a_tok = accuracy(run.predict_rows("test", test_idx, pathway="token").argmax(axis=1), test_y)
    ta = accuracy(both.argmax(axis=1), test_y)
    report("retain", 0.6)
    ret = run.predict_rows("train", retain_idx)
    result = {
        "TA": ta, "RA": accuracy(ret.argmax(axis=1), ds.train.labels[retain_idx]), "FA": None, "MIA": None,
        "MIA_attack": MIA_CHEAP, "Ps": pathway_sensitivity(a_img, a_tok, ta), "A_img": a_img, "A_tok": a_tok,
        "A_both": ta, "n_test": int(len(test_idx)), "n_retain": int(len(retain_idx)),
        "n_forget": int(len(forget_idx)), "bank_size": len(run.bank), "deleted": len(run.forgotten_ids),
        "bank_fingerprint": run.bank.fingerprint(), "model_fingerprint": run.model_fingerprint,
    }
    if len(forget_idx):
        report("forget", 0.85)
        result["FA"], result["MIA"], _ = _forget_accuracy_and_mia(run, forget_idx, both, test_y)
        result.update(remembered_reference(ret, ds.train.labels[retain_idx], both, test_y,
                                           ds.train.labels[forget_idx]))
    report("done", 1.0)
    if record:
        run.append_metrics({"time": utc_now(), **result})
    return result


def accuracy_on_ids(run: LoadedMunkeyRun, ids: Sequence[int]) -> float | None:
    """Ensemble accuracy (percent) on the given training samples with the current bank."""
    idx = _train_rows(run, ids)
    if len(idx) == 0:
        return None
    return accuracy(run.predict_rows("train", idx).argmax(axis=1), run.dataset.train.labels[idx])


def request_accuracy_and_mia(run: LoadedMunkeyRun, ids: Sequence[int], max_samples: int = 2000) -> dict:
    """FA (percent) on `ids` with the current bank, the cheap MIA AUC (percent) of those samples
    against the test split with its TPR at 1% / 0.1% FPR (null when undefined), and the same-class
    comparison (`same_class_comparison`)."""
    ds = run.dataset
    idx = _train_rows(run, ids)
    test_idx, retain_idx, _ = _eval_rows(run, max_samples, 0)  # evaluate's rows: their predictions are cached
    if len(idx) == 0:
        return {"FA": None, "MIA": None, "MIA_attack": MIA_CHEAP, "n": 0, "n_test": int(len(test_idx))}
    test = run.predict_rows("test", test_idx)
    ty = ds.test.labels[test_idx]
    fa, mia, p = _forget_accuracy_and_mia(run, idx, test, ty)
    held = remembered_reference(run.predict_rows("train", retain_idx), ds.train.labels[retain_idx], test, ty,
                                p["labels"])
    return {"FA": fa, "MIA": mia, **mia_tprs(-p["forget_loss"], p["labels"], -p["test_loss"], ty),
            "MIA_attack": MIA_CHEAP, "n": int(len(idx)), "n_test": int(len(test_idx)), **held,
            **same_class_comparison(p["pred"] == p["labels"], p["labels"], test.argmax(axis=1) == ty, ty)}


def same_class_comparison(forget_correct: np.ndarray, forget_labels: np.ndarray, test_correct: np.ndarray,
                          test_labels: np.ndarray) -> dict:
    """FA next to the accuracy on unseen test samples of the same classes, reweighted to the forget
    samples' class mix (percent), their difference, its standard error (binomial, both sides) and its
    95 % interval (`proportion_difference_interval`, with the reweighted test mean's effective count:
    the standard error is 0 on the forget side when FA is 0 or 100 %, which one deleted sample always is)."""
    keep, w = class_weights(forget_labels, test_labels)  # w sums to 1 over the test samples of shared classes
    if not keep.any():
        return {"TA_same_classes": None, "FA_minus_TA_same_classes": None, "difference_se": None,
                "difference_interval": None, "same_class_note": SAME_CLASS_NOTE}
    fa = float(np.mean(forget_correct[keep]))
    ta = float(np.sum(w * test_correct))
    var_f = fa * (1 - fa) / keep.sum()
    var_t = sum(w[test_labels == c].sum() ** 2 * _binom_var(test_correct[test_labels == c])
                for c in np.unique(forget_labels[keep]))
    low, high = proportion_difference_interval(100.0 * fa, int(keep.sum()), 100.0 * ta, effective_count(w))
    return {"TA_same_classes": 100.0 * ta, "FA_minus_TA_same_classes": 100.0 * (fa - ta),
            "difference_se": 100.0 * float(np.sqrt(var_f + var_t)), "difference_interval": [low, high],
            "same_class_note": SAME_CLASS_NOTE}


def _binom_var(correct: np.ndarray) -> float:
    """Variance of the mean of 0/1 outcomes."""
    p = float(np.mean(correct))
    return p * (1 - p) / len(correct)
