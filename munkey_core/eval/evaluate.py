"""The metrics of a loaded MUNKEY run with its current bank (`munkey evaluate`, before/after a deletion).

- `evaluate`: TA (test), RA (samples still in the bank), FA (every sample deleted so far), the
  cheap membership attack's AUC (forget vs test, metrics.mia_auc), Ps from the image-only,
  token-only and both pathways; optionally appended to metrics.json.
- `accuracy_on_ids`: FA on some training samples (a request's, before it deletes them).
- `request_accuracy_and_mia`: FA and MIA (with its TPR at 1% / 0.1% FPR) of one request's samples,
  next to the accuracy on *unseen test samples of the same classes* (weighted to the request's
  class mix, `same_class_comparison`) and what that comparison does and does not show
  (`SAME_CLASS_NOTE`): its receipt's evidence.
FA and MIA are computed by one function (`_forget_accuracy_and_mia`) in all three.
Each set is a seeded subsample of at most `max_samples` (0 = all). Cost: K forwards per image over
<= max_samples test images (three times: both pathways, image, token), retain and forget images.
Tests: tests/test_service.py (FA before/after), tests/audit/test_audit.py (a request's evidence).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from munkey_core.eval.metrics import (MIA_CHEAP, accuracy, class_weights, cross_entropy, mia_auc, mia_tprs,
                                     pathway_sensitivity)
from munkey_core.run.loaded import LoadedMunkeyRun
from munkey_core.run.paths import utc_now

Progress = Callable[[str, float], None]  # (stage, fraction done)

SAME_CLASS_NOTE = (
    "The deleted samples are compared with unseen test samples of the same classes (weighted to the deleted "
    "samples' class mix). A difference within about two standard errors, and a membership-attack AUC near 50, say "
    "the model now treats the deleted samples, on average, like samples it never saw. This is a population "
    "comparison: it does not show that no single deleted sample is still recognised (a per-example attack, "
    "'munkey bench ulira', measures that), nor that the model matches one retrained without them (only a "
    "retrained oracle shows that, next to its noise floor: 'munkey evaluate RUN --oracle --noise-floor 2').")


def _subsample(index: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    if cap and len(index) > cap:
        return np.sort(rng.choice(index, size=cap, replace=False))
    return index


def _train_rows(run: LoadedMunkeyRun, ids: Sequence[int]) -> np.ndarray:
    """Rows of the training split holding `ids` (unknown ids are skipped)."""
    return np.flatnonzero(np.isin(run.dataset.train.ids, np.asarray(list(ids), dtype=np.int64)))


def _forget_accuracy_and_mia(run: LoadedMunkeyRun, rows: np.ndarray, test_probs: np.ndarray,
                             test_labels: np.ndarray) -> tuple[float, float | None, dict]:
    """FA (percent) on training rows `rows` with the current bank and the cheap MIA AUC (percent) of
    those rows against test images whose ensemble probabilities (M, C) are `test_probs`; plus the
    pieces the receipt adds (predicted labels, labels, both losses)."""
    ds = run.dataset
    fy = ds.train.labels[rows]
    fgt = run.predict_prepared(ds.train.images[rows], run.split_keys("train")[rows], neighbour_predictions=False)
    f_loss, t_loss = cross_entropy(fgt.probs, fy), cross_entropy(test_probs, test_labels)
    parts = {"pred": fgt.labels, "labels": fy, "forget_loss": f_loss, "test_loss": t_loss}
    return accuracy(fgt.labels, fy), mia_auc(f_loss, fy, t_loss, test_labels), parts


def evaluate(run: LoadedMunkeyRun, *, max_samples: int = 2000, seed: int = 0, record: bool = True,
             progress: Progress | None = None) -> dict:
    """TA, RA, FA (percent), cheap MIA AUC (percent), Ps; FA and MIA are None when nothing is deleted.
    Counts, bank size and both fingerprints come with them; `record` appends the result to metrics.json."""
    ds = run.dataset
    report = progress or (lambda stage, frac: None)
    rng = np.random.default_rng(seed)
    train_keys = run.split_keys("train")
    in_bank = np.isin(ds.train.ids, run.bank.ids)
    forgotten = np.isin(ds.train.ids, run.forgotten_ids)
    test_idx = _subsample(np.arange(len(ds.test)), max_samples, rng)
    retain_idx = _subsample(np.flatnonzero(in_bank), max_samples, rng)
    forget_idx = _subsample(np.flatnonzero(forgotten), max_samples, rng)
    report("test", 0.0)
    test_keys = run.split_keys("test")[test_idx]
    test_imgs, test_y = ds.test.images[test_idx], ds.test.labels[test_idx]
    both = run.predict_prepared(test_imgs, test_keys, neighbour_predictions=False)
    report("pathways", 0.3)
    a_img = accuracy(run.predict_prepared(test_imgs, test_keys, pathway="image",
                                          neighbour_predictions=False).labels, test_y)
    a_tok = accuracy(run.predict_prepared(test_imgs, test_keys, pathway="token",
                                          neighbour_predictions=False).labels, test_y)
    ta = accuracy(both.labels, test_y)
    report("retain", 0.6)
    ret = run.predict_prepared(ds.train.images[retain_idx], train_keys[retain_idx], neighbour_predictions=False)
    result = {
        "TA": ta, "RA": accuracy(ret.labels, ds.train.labels[retain_idx]), "FA": None, "MIA": None,
        "MIA_attack": MIA_CHEAP, "Ps": pathway_sensitivity(a_img, a_tok, ta), "A_img": a_img, "A_tok": a_tok,
        "A_both": ta, "n_test": int(len(test_idx)), "n_retain": int(len(retain_idx)),
        "n_forget": int(len(forget_idx)), "bank_size": len(run.bank), "deleted": len(run.forgotten_ids),
        "bank_fingerprint": run.bank.fingerprint(), "model_fingerprint": run.model_fingerprint,
    }
    if len(forget_idx):
        report("forget", 0.85)
        result["FA"], result["MIA"], _ = _forget_accuracy_and_mia(run, forget_idx, both.probs, test_y)
    report("done", 1.0)
    if record:
        run.append_metrics({"time": utc_now(), **result})
    return result


def accuracy_on_ids(run: LoadedMunkeyRun, ids: Sequence[int]) -> float | None:
    """Ensemble accuracy (percent) on the given training samples with the current bank."""
    ds = run.dataset
    idx = _train_rows(run, ids)
    if len(idx) == 0:
        return None
    preds = run.predict_prepared(ds.train.images[idx], run.split_keys("train")[idx], neighbour_predictions=False)
    return accuracy(preds.labels, ds.train.labels[idx])


def request_accuracy_and_mia(run: LoadedMunkeyRun, ids: Sequence[int], max_samples: int = 2000) -> dict:
    """FA (percent) on `ids` with the current bank, the cheap MIA AUC (percent) of those samples
    against the test split with its TPR at 1% / 0.1% FPR (null when undefined), and the same-class
    comparison (`same_class_comparison`)."""
    ds = run.dataset
    idx = _train_rows(run, ids)
    test_idx = _subsample(np.arange(len(ds.test)), max_samples, np.random.default_rng(0))
    if len(idx) == 0:
        return {"FA": None, "MIA": None, "MIA_attack": MIA_CHEAP, "n": 0, "n_test": int(len(test_idx))}
    test = run.predict_prepared(ds.test.images[test_idx], run.split_keys("test")[test_idx],
                                neighbour_predictions=False)
    ty = ds.test.labels[test_idx]
    fa, mia, p = _forget_accuracy_and_mia(run, idx, test.probs, ty)
    return {"FA": fa, "MIA": mia, **mia_tprs(-p["forget_loss"], p["labels"], -p["test_loss"], ty),
            "MIA_attack": MIA_CHEAP, "n": int(len(idx)), "n_test": int(len(test_idx)),
            **same_class_comparison(p["pred"] == p["labels"], p["labels"], test.labels == ty, ty)}


def same_class_comparison(forget_correct: np.ndarray, forget_labels: np.ndarray, test_correct: np.ndarray,
                          test_labels: np.ndarray) -> dict:
    """FA next to the accuracy on unseen test samples of the same classes, reweighted to the forget
    samples' class mix (percent), their difference and its standard error (binomial, both sides)."""
    keep, w = class_weights(forget_labels, test_labels)  # w sums to 1 over the test samples of shared classes
    if not keep.any():
        return {"TA_same_classes": None, "FA_minus_TA_same_classes": None, "difference_se": None,
                "same_class_note": SAME_CLASS_NOTE}
    fa = float(np.mean(forget_correct[keep]))
    ta = float(np.sum(w * test_correct))
    var_f = fa * (1 - fa) / keep.sum()
    var_t = sum(w[test_labels == c].sum() ** 2 * _binom_var(test_correct[test_labels == c])
                for c in np.unique(forget_labels[keep]))
    return {"TA_same_classes": 100.0 * ta, "FA_minus_TA_same_classes": 100.0 * (fa - ta),
            "difference_se": 100.0 * float(np.sqrt(var_f + var_t)), "same_class_note": SAME_CLASS_NOTE}


def _binom_var(correct: np.ndarray) -> float:
    """Variance of the mean of 0/1 outcomes."""
    p = float(np.mean(correct))
    return p * (1 - p) / len(correct)
