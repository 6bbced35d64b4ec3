"""Predictions of dataset rows with the current bank, kept until a bank change can alter them.

A MUNKEY prediction of one query depends only on the model and on its K nearest bank rows (their
similarities and exemplars; model/predict.py). Deleting ids leaves the K nearest rows of every
query that did not retrieve one of them as they were (removing entries outside a top-K set keeps
it the top-K set), with the same exemplars, so its prediction is unchanged; only the queries whose
K neighbours included a deleted id change. `PredictionCache` keeps, per table (split, pathway, K),
each predicted row's class probabilities and neighbour ids: `deleted(ids)` drops the rows that
retrieved a deleted id (their probabilities and neighbour ids are zeroed, so nothing derived from a
deleted row stays in memory), `clear()` drops everything (a reload from disk: the bank may have
changed in any way), and so does a deletion that moves the bank across the exact/IVF search size
(run/loaded.py). Each access names the state it expects (`state`: the bank, model and search
objects, the bank's size and search mode); a state the cache was not told about (a bank replaced
or edited behind the run's back) clears it first, so a stale prediction is never served.
The IVF search keeps the argument: its centroids do not change with the bank, and a query's probed
lists still hold its K nearest rows when none of them was deleted.
Users: run/loaded.py `LoadedMunkeyRun.predict_rows` (under the run's lock), eval/evaluate.py.
Tests: tests/eval/test_incremental.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable

import numpy as np


@dataclass
class CachedTable:
    """Predictions of the rows of one dataset split for one (pathway, K): filled where `valid`."""

    probs: np.ndarray       # (N, C) float32, zero where not valid
    neighbours: np.ndarray  # (N, K) int64 sample ids, -1 where not valid
    valid: np.ndarray       # (N,) bool

    def missing(self, index: np.ndarray) -> np.ndarray:
        """The distinct rows of `index` with no valid prediction, sorted."""
        index = np.asarray(index, dtype=np.int64)
        return np.unique(index[~self.valid[index]])

    def put(self, rows: np.ndarray, probs: np.ndarray, neighbours: np.ndarray) -> None:
        """Store the predictions (len(rows), C) and neighbour ids (len(rows), K) of `rows`."""
        self.probs[rows] = probs
        self.neighbours[rows] = neighbours
        self.valid[rows] = True

    def drop(self, ids: np.ndarray) -> int:
        """Invalidate (and zero) the rows whose neighbours include one of `ids`; how many were dropped."""
        hit = self.valid & np.isin(self.neighbours, ids).any(axis=1)
        self.probs[hit] = 0.0
        self.neighbours[hit] = -1
        self.valid[hit] = False
        return int(hit.sum())


class PredictionCache:
    """Tables of cached predictions, valid for one bank state (see the module docstring)."""

    def __init__(self) -> None:
        self._tables: dict[Hashable, CachedTable] = {}
        self._state: tuple | None = None

    def table(self, key: Hashable, n_rows: int, n_classes: int, k: int, state: tuple) -> CachedTable:
        """The table `key` for a split of `n_rows` rows (created empty on first use); everything is
        dropped first when `state` is not the state the cache was last told about."""
        self._check(state)
        t = self._tables.get(key)
        if t is None or t.probs.shape != (n_rows, n_classes) or t.neighbours.shape[1] != k:
            t = CachedTable(np.zeros((n_rows, n_classes), np.float32), np.full((n_rows, k), -1, np.int64),
                            np.zeros(n_rows, bool))
            self._tables[key] = t
        return t

    def deleted(self, ids: Iterable[int], state: tuple) -> int:
        """`ids` left the bank, which is now in `state`: drop the predictions that retrieved them
        (returns how many rows were dropped over all tables)."""
        ids = np.asarray(sorted(int(i) for i in ids), dtype=np.int64)
        dropped = sum(t.drop(ids) for t in self._tables.values())
        self._state = state
        return dropped

    def clear(self, state: tuple | None = None) -> None:
        """Drop every prediction (a reload: the bank may differ in any way); `state` is the new one."""
        for t in self._tables.values():  # zero them too: they may hold what deleted rows gave
            t.probs[:] = 0.0
            t.neighbours[:] = -1
        self._tables.clear()
        self._state = state

    def _check(self, state: tuple) -> None:
        if state != self._state:
            self.clear(state)

    def valid_rows(self, key: Hashable) -> int:
        """How many rows of table `key` hold a valid prediction (0 when there is no such table)."""
        t = self._tables.get(key)
        return 0 if t is None else int(t.valid.sum())
