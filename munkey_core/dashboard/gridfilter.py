"""Filters on the dashboard's image grids, with the count of what is shown: by class, by id (single ids
and ranges), by tag (run/tags.py), "wrong" (the run's current prediction differs from the label) and
"low confidence" (the prediction's confidence below a threshold). Plain functions (no Streamlit): the
pages draw the controls and the images.

- `GridFilter` / `filter_grid`: what to show and the rows that pass; `GridView.caption` says how many.
- `grid_predictions(run, ids)`: the run's current prediction and confidence of training samples, from
  `run.predict_rows` (the evaluation's cached predictions, run/predcache.py: a page never predicts).
- `confidence_calibration(run)`: the default "low confidence" threshold, from validation images.
- `filter_counts`: how many rows each filter would match (shown beside the controls).
- `GridFilter.to_view` / `from_view`: a filter as a saved view's JSON (run/tags.py stores it).
Why: a grid of 24-1,000 thumbnails is only useful if a user can narrow it to "the 8s", "ids 300-400",
"the ones it gets wrong" or "the ones tagged review" and see how many are hidden; filtering never
changes a selection, only what is drawn.
Tests: tests/dashboard/test_gridfilter.py, tests/app/test_app_grids.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np

from munkey_core.errors import MunkeyError

if TYPE_CHECKING:  # the model code loads only where a run is opened (the first start draws grids without it)
    from munkey_core.service import MunkeyRun

_TERM = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class GridFilter:
    """What to show: `classes` (class indices; empty = all), an id query ("12, 40-60"; empty = all),
    `tags` (samples carrying any of them; empty = all), `wrong` (only samples the run predicts wrongly)
    and `low_confidence` (only samples predicted with a confidence below it, in [0, 1]; None = all).
    All the filters set must hold."""

    classes: tuple[int, ...] = ()
    id_query: str = ""
    tags: tuple[str, ...] = ()
    wrong: bool = False
    low_confidence: float | None = None

    @property
    def needs_predictions(self) -> bool:
        return self.wrong or self.low_confidence is not None

    def to_view(self) -> dict:
        """The filter as a saved view (JSON; run/tags.py): the id query as inclusive [lo, hi] ranges."""
        return {"classes": [int(c) for c in self.classes], "id_ranges": [[lo, hi] for lo, hi in parse_id_query(self.id_query)],
                "tags": list(self.tags), "wrong": bool(self.wrong),
                "low_confidence": None if self.low_confidence is None else float(self.low_confidence)}

    @classmethod
    def from_view(cls, view: Mapping) -> "GridFilter":
        """The filter a saved view stores (unknown fields ignored, missing ones: no filter)."""
        ranges = view.get("id_ranges") or []
        query = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
        low = view.get("low_confidence")
        return cls(tuple(int(c) for c in view.get("classes") or []), query, tuple(str(t) for t in view.get("tags") or []),
                   bool(view.get("wrong", False)), None if low is None else float(low))


@dataclass(frozen=True)
class GridPredictions:
    """The run's current prediction of each grid row: `predicted` -1 and `confidence` 0 where it has none
    (an id outside the training split); rows align with the ids asked for."""

    predicted: np.ndarray   # (N,) int64
    confidence: np.ndarray  # (N,) float32 in [0, 1]

    def wrong(self, labels: Sequence[int]) -> np.ndarray:
        """(N,) bool: predicted, and not the label."""
        return (self.predicted >= 0) & (self.predicted != np.asarray(labels, np.int64).reshape(-1))

    def below(self, threshold: float) -> np.ndarray:
        """(N,) bool: predicted with a confidence below `threshold`."""
        return (self.predicted >= 0) & (self.confidence < float(threshold))


@dataclass(frozen=True)
class GridView:
    """The rows of a grid to draw: `rows` (positions in the input, in input order), and the counts."""

    rows: np.ndarray  # (shown,) int64 positions into the ids given to filter_grid
    matched: int      # rows that pass the filter (shown <= matched <= total)
    total: int        # rows before filtering

    @property
    def shown(self) -> int:
        return len(self.rows)

    @property
    def caption(self) -> str:
        """'Showing 12 of 126.' or 'Showing 12 of 40 matching the filter (126 in all).'; never None or nan."""
        if self.total == 0:
            return "Nothing to show."
        if self.matched == self.total:
            return f"Showing {self.shown} of {self.total}."
        if self.matched == 0:
            return f"Showing 0 of {self.total}: nothing matches the filter; clear the filters to see them."
        return f"Showing {self.shown} of {self.matched} matching the filter ({self.total} in all)."


def parse_id_query(text: str) -> list[tuple[int, int]]:
    """'12, 40-60 100..120' -> [(12, 12), (40, 60), (100, 120)] (inclusive ranges); '' -> [] (all ids).

    Raises MunkeyError on anything else, saying what is accepted."""
    text = (text or "").strip()
    if not text:
        return []
    ranges: list[tuple[int, int]] = []
    text = re.sub(r"\s*(?:-|\.\.|\bto\b)\s*", "-", text)  # "40 - 60", "40..60", "40 to 60" -> "40-60"
    for term in re.split(r"[,;\s]+", text):
        if not term:
            continue
        m = _TERM.match(term)
        if m is None:
            raise MunkeyError(f"Id filter: cannot read {term!r}. Type ids and ranges, e.g. `12, 40-60`; "
                              "clear the box to show all.")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        ranges.append((min(lo, hi), max(lo, hi)))
    return ranges


def filter_grid(ids: Sequence[int], labels: Sequence[int], flt: GridFilter, *, limit: int | None = None,
                predictions: GridPredictions | None = None,
                tagged: Mapping[str, Iterable[int]] | None = None) -> GridView:
    """The rows of (ids, labels) that pass `flt`, in input order, at most `limit` of them. `predictions`
    (rows aligned with ids) are needed by the wrong / low-confidence filters, `tagged` (tag -> ids) by
    the tag filter."""
    ids_a = np.asarray(ids, dtype=np.int64).reshape(-1)        # (N,)
    labels_a = np.asarray(labels, dtype=np.int64).reshape(-1)  # (N,)
    if len(ids_a) != len(labels_a):
        raise ValueError(f"{len(ids_a)} ids but {len(labels_a)} labels")
    keep = np.ones(len(ids_a), dtype=bool)
    if flt.classes:
        keep &= np.isin(labels_a, np.asarray(flt.classes, dtype=np.int64))
    ranges = parse_id_query(flt.id_query)
    if ranges:
        in_any = np.zeros(len(ids_a), dtype=bool)
        for lo, hi in ranges:
            in_any |= (ids_a >= lo) & (ids_a <= hi)
        keep &= in_any
    if flt.tags:
        tagged = tagged or {}
        with_tag = sorted({int(i) for t in flt.tags for i in tagged.get(t, [])})
        keep &= np.isin(ids_a, np.asarray(with_tag, dtype=np.int64))
    if flt.needs_predictions:
        if predictions is None or len(predictions.predicted) != len(ids_a):
            raise ValueError("the wrong / low-confidence filters need the predictions of every row")
        if flt.wrong:
            keep &= predictions.wrong(labels_a)
        if flt.low_confidence is not None:
            keep &= predictions.below(flt.low_confidence)
    rows = np.flatnonzero(keep)
    matched = len(rows)
    if limit is not None:
        rows = rows[:max(0, int(limit))]
    return GridView(rows=rows.astype(np.int64), matched=matched, total=len(ids_a))


def filter_counts(ids: Sequence[int], labels: Sequence[int], *, predictions: GridPredictions | None = None,
                  threshold: float | None = None, tagged: Mapping[str, Iterable[int]] | None = None) -> dict:
    """How many of the rows each filter matches on its own: {"wrong": n, "low_confidence": n (below
    `threshold`), "tags": {tag: n}}; the prediction counts are 0 without predictions."""
    ids_a = np.asarray(ids, dtype=np.int64).reshape(-1)
    out: dict = {"wrong": 0, "low_confidence": 0, "tags": {}}
    if predictions is not None:
        out["wrong"] = int(predictions.wrong(labels).sum())
        if threshold is not None:
            out["low_confidence"] = int(predictions.below(threshold).sum())
    for tag, tag_ids in sorted((tagged or {}).items()):
        out["tags"][tag] = int(np.isin(ids_a, np.asarray(sorted(int(i) for i in tag_ids), np.int64)).sum())
    return out


def grid_predictions(run: "MunkeyRun", ids: Sequence[int]) -> GridPredictions:
    """The run's current prediction (ensemble, the run's K, the current bank) and its confidence (the
    predicted class's probability) for training samples `ids`, from `run.predict_rows`: cached per bank
    state, so a grid asks the model only for rows it never predicted (or whose neighbours were deleted).
    Ids outside the training split get no prediction (predicted -1)."""
    ids_a = np.asarray(ids, dtype=np.int64).reshape(-1)
    predicted = np.full(len(ids_a), -1, np.int64)
    confidence = np.zeros(len(ids_a), np.float32)
    train_ids = np.asarray(run.dataset.train.ids, np.int64)
    order = np.argsort(train_ids, kind="stable")
    pos = np.searchsorted(train_ids, ids_a, sorter=order).clip(max=max(len(train_ids) - 1, 0))
    found = (train_ids[order[pos]] == ids_a) if len(train_ids) else np.zeros(len(ids_a), bool)
    if found.any():
        probs = run.predict_rows("train", order[pos[found]])  # (n, C)
        predicted[found] = probs.argmax(axis=1)
        confidence[found] = probs.max(axis=1)
    return GridPredictions(predicted, confidence)


DEFAULT_LOW_CONFIDENCE = 0.5  # when the run has no validation or test images to calibrate on
CALIBRATION_QUANTILE = 0.10


@dataclass(frozen=True)
class ConfidenceCalibration:
    """The default "low confidence" threshold: the confidence that the least confident 10 % of unseen
    (validation) images fall below, with how often the run is right below and above it."""

    threshold: float
    n: int                      # images it was measured on (0: no data, DEFAULT_LOW_CONFIDENCE)
    split: str                  # "val" or "test"
    accuracy_below: float | None  # % of those images predicted right, below / at or above the threshold
    accuracy_above: float | None

    @property
    def note(self) -> str:
        """One sentence for the page; never None or nan."""
        if self.n == 0:
            return f"No unseen images to calibrate on: the default threshold is {self.threshold:.2f}."
        parts = [f"Default {self.threshold:.2f}: the least confident {int(100 * CALIBRATION_QUANTILE)} % of "
                 f"{self.n} {'validation' if self.split == 'val' else 'test'} images (never in the memory) fall below it"]
        if self.accuracy_below is not None and self.accuracy_above is not None:
            parts.append(f"the model is right on {self.accuracy_below:.0f} % of those and on {self.accuracy_above:.0f} % "
                         "of the others")
        return "; ".join(parts) + "."


def confidence_calibration(run: "MunkeyRun", *, quantile: float = CALIBRATION_QUANTILE,
                           cap: int = 1000) -> ConfidenceCalibration:
    """Measure the default low-confidence threshold on at most `cap` validation images (test images when
    the dataset has no validation split), predicted as the grids predict (`run.predict_rows`, cached)."""
    for split in ("val", "test"):
        try:
            s = run.dataset.split(split)
        except MunkeyError:
            continue
        if len(s):
            break
    else:
        return ConfidenceCalibration(DEFAULT_LOW_CONFIDENCE, 0, "", None, None)
    idx = np.arange(len(s))
    if len(idx) > cap:
        idx = np.sort(np.random.default_rng(0).permutation(len(idx))[:cap])
    probs = run.predict_rows(split, idx)  # (n, C)
    conf, right = probs.max(axis=1), probs.argmax(axis=1) == np.asarray(s.labels)[idx]
    t = float(np.quantile(conf, quantile))
    below = conf < t

    def pct(mask: np.ndarray) -> float | None:
        return float(100.0 * right[mask].mean()) if mask.any() else None

    return ConfidenceCalibration(t, int(len(idx)), split, pct(below), pct(~below))
