"""What makes an answer on the dashboard trustworthy, as plain functions of a `MunkeyRun` (no Streamlit):

- copies: is an upload a resized / re-encoded / lightly cropped copy of a training image
  (`copy_index`, `find_copies`, `copy_verdict`; the pixel search is data/duplicates.py), so that a
  data subject's own photo finds their own sample first, whatever size it was sent at;
- out of distribution: a per-run similarity threshold calibrated on the validation split
  (`similarity_calibration`) and `assess_evidence`, which says in plain words what the retrieved
  training cases show ("6 of 8 similar training cases are 5s"), warns when they are far or
  disagree, and abstains from a confident answer then.

Costs: `copy_index` (run/copycache.py) is one pass over the training images; its calibration is made
with the run (service.train_run) and cached in it; `similarity_calibration` is one bank search of <= 1,000
validation keys. Tests: tests/dashboard/test_trust.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from munkey_core.data.duplicates import NearDuplicateIndex
from munkey_core.errors import MunkeyError
from munkey_core.model.predict import Predictions
from munkey_core.run.copycache import copy_index  # noqa: F401  (the run's calibrated index; re-exported for the pages)
from munkey_core.service import MunkeyRun

KEY_CANDIDATES = 20  # key-encoder neighbours added to the pixel search's candidates (they survive crops)
OOD_QUANTILE = 0.01


# --------------------------------------------------------------------------- copies of training images


def _key_rows(run: MunkeyRun, index: NearDuplicateIndex, images: Sequence[np.ndarray]) -> list[list[int]]:
    """Per upload: index rows of its key-encoder nearest neighbours still in the bank."""
    if len(run.bank) == 0:
        return [[] for _ in images]
    keys = run.encoder.encode(run.prepare_images(images))
    ids = run.search(keys, min(KEY_CANDIDATES, len(run.bank))).ids  # the run's search mode, under its lock
    return [index.positions(r) for r in ids]


def find_copies(run: MunkeyRun, index: NearDuplicateIndex, images: Sequence[np.ndarray], *,
                top: int = 5) -> list[dict]:
    """For each upload: `copy_verdict` of its best matches (pixel search at native resolution; the
    key encoder's neighbours are added as candidates). A deleted sample is named only when the upload
    is a copy of it (its sender holds that picture: the verdict says it was deleted); it is never
    shown or named as a look-alike of another upload."""
    if len(images) == 0:
        return []
    extra = _key_rows(run, index, images)
    names = run.class_names
    in_bank = set(int(i) for i in run.bank.ids)
    deleted = min(len(index) - len(in_bank), 50)  # deleted rows that may come first, left out below
    out = []
    for img, rows in zip(images, extra):
        matches = index.search(img, top=top + max(deleted, 0), extra_rows=rows)
        matches = [m for j, m in enumerate(matches)
                   if m.id in in_bank or (j == 0 and m.score >= index.threshold)][:top]
        labels = run.dataset.lookup([m.id for m in matches]).labels if matches else []
        hits = [{"id": m.id, "score": m.score, "label": int(lab), "label_name": names[int(lab)],
                 "in_bank": m.id in in_bank} for m, lab in zip(matches, labels)]
        out.append(copy_verdict(hits, index.threshold))
    return out


def copy_verdict(hits: list[dict], threshold: float) -> dict:
    """{found, id, score, threshold, in_bank, message, matches}: whether the best match is a copy, in words."""
    best = hits[0] if hits else None
    found = best is not None and best["score"] >= threshold
    if found:
        where = "" if best["in_bank"] else " (already deleted from the model's memory)"
        msg = (f"Exact match found: training id {best['id']} (similarity {best['score']:.3f}, threshold "
               f"{threshold:.3f}){where}. This upload is a copy of that training image.")
    elif best is not None:
        msg = (f"No match above threshold: the closest training image, id {best['id']}, has similarity "
               f"{best['score']:.3f} < {threshold:.3f}. This upload is not a copy of a training image; the "
               "candidates below only look alike.")
    else:
        msg = "No match above threshold: the run has no training images to compare with."
    return {"found": found, "id": best["id"] if found else None, "score": best["score"] if best else None,
            "threshold": threshold, "in_bank": bool(best["in_bank"]) if found else None, "message": msg,
            "matches": hits}


# --------------------------------------------------------------------------- out of distribution


@dataclass(frozen=True)
class SimilarityCalibration:
    """How similar in-distribution images' nearest training cases are (validation split, current bank)."""

    threshold: float  # nearest-case similarity below this: far from every training case
    median: float
    n: int


def similarity_calibration(run: MunkeyRun, *, quantile: float = OOD_QUANTILE, cap: int = 1000) -> SimilarityCalibration:
    """Nearest-case similarity of validation images (never in the bank): its `quantile` is the
    threshold, so about 1 % of in-distribution images get the "far" warning."""
    try:
        keys = run.split_keys("val")
    except MunkeyError:
        keys = run.split_keys("test")
    if len(keys) > cap:
        keys = keys[np.random.default_rng(0).permutation(len(keys))[:cap]]
    if len(keys) == 0 or len(run.bank) == 0:
        return SimilarityCalibration(threshold=0.0, median=float("nan"), n=0)
    top = run.search(keys, 1).similarities.cpu().numpy()[:, 0]
    return SimilarityCalibration(float(np.quantile(top, quantile)), float(np.median(top)), int(len(top)))


def _plural(name: str, n: int) -> str:
    return name if n == 1 else f"{name}s" if not name.endswith("s") else name


def assess_evidence(preds: Predictions, i: int, class_names: Sequence[str], calib: SimilarityCalibration,
                    *, min_agreement: float = 0.5) -> dict:
    """Plain-language reading of prediction i's retrieved cases, with warnings and an abstention.

    Agreement = the share of retrieved cases whose label is the predicted class (the same in every
    aggregation mode: it depends on the retrieval only). Far: the nearest case's similarity is below
    the run's calibrated threshold. Disagree: agreement below `min_agreement`. Either one makes the
    page abstain (`abstain`): the model's answer is shown only on request.
    """
    labels = [int(x) for x in preds.neighbour_labels[i]]
    sims = np.asarray(preds.similarities[i], float)
    k = len(labels)
    predicted = int(preds.labels[i])
    counts = Counter(labels)
    top_label, top_n = counts.most_common(1)[0]
    agree = counts.get(predicted, 0)
    nearest = float(sims.max()) if k else float("nan")
    far = bool(k == 0 or nearest < calib.threshold)
    disagree = bool(k == 0 or agree / k < min_agreement)
    summary = (f"{top_n} of {k} similar training cases are {_plural(class_names[top_label], top_n)}"
               + ("" if top_label == predicted else f"; {agree} are {_plural(class_names[predicted], agree)}, "
                  "the model's answer"))
    warnings = []
    if far:
        warnings.append(f"This image is far from every training case: its nearest one has similarity {nearest:.2f}, "
                        f"below {calib.threshold:.2f}, which 99 % of validation images exceed. It may not be the kind "
                        "of image the model was trained on; do not rely on the answer.")
    if disagree:
        warnings.append(f"The similar training cases disagree: only {agree} of {k} are "
                        f"{_plural(class_names[predicted], agree)}. The answer is uncertain.")
    return {"summary": summary, "agreement": agree / k if k else 0.0, "agree": agree, "k": k,
            "nearest_similarity": nearest, "threshold": calib.threshold, "far": far, "disagree": disagree,
            "abstain": far or disagree, "warnings": warnings,
            "confidence_note": (f"Confidence {100 * float(preds.confidence[i]):.1f} % is the model's probability in "
                                f"the '{preds.mode}' aggregation mode; each mode weighs the same retrieved cases "
                                "differently, so it changes with the mode. The share of similar cases that agree "
                                f"({agree} of {k}) does not.")}
