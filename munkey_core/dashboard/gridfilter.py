"""Filters on the dashboard's image grids: by class and by id (single ids and ranges), with the count
of what is shown. Plain functions (no Streamlit): the pages draw the controls and the images.

Why: a grid of 24-126 thumbnails is only useful if a user can narrow it to "the 8s" or "ids 300-400"
and see how many are hidden; filtering never changes a selection, only what is drawn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from munkey_core.errors import MunkeyError

_TERM = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class GridFilter:
    """What to show: `classes` (class indices; empty = all) and an id query ("12, 40-60"; empty = all)."""

    classes: tuple[int, ...] = ()
    id_query: str = ""


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
            return f"Showing 0 of {self.total}: nothing matches the filter; clear the class or id filter to see them."
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


def filter_grid(ids: Sequence[int], labels: Sequence[int], flt: GridFilter, *, limit: int | None = None) -> GridView:
    """The rows of (ids, labels) that pass `flt`, in input order, at most `limit` of them."""
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
    rows = np.flatnonzero(keep)
    matched = len(rows)
    if limit is not None:
        rows = rows[:max(0, int(limit))]
    return GridView(rows=rows.astype(np.int64), matched=matched, total=len(ids_a))
