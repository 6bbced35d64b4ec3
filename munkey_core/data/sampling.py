"""Seeded subsets: a stratified sample of rows, a random fraction of ids, and the apportioning both rest on.

The same seed always gives the same subset (datasets' `max_train` cut, the class-unlearning test
subset, random forget sets, selection's validation forget split).
Tests: tests/data/test_data.py (stratified cut), tests/forget/test_forget.py (random_ids).
"""

from __future__ import annotations

import numpy as np

from munkey_core.errors import MunkeyError


def apportion(counts: np.ndarray, total: int, low: np.ndarray | int,
               high: np.ndarray | int) -> np.ndarray:
    """Share `total` among classes in proportion to `counts` (largest remainder), each in
    [low, high].

    Returns fewer than `total` only when every class is at `high`.
    """
    ideal = counts * (total / max(int(counts.sum()), 1))
    alloc = np.clip(np.floor(ideal).astype(np.int64), low, high)
    while alloc.sum() != total:
        gap = ideal - alloc  # positive: class is below its fair share
        if alloc.sum() < total:
            room = alloc < high
            if not room.any():
                break
            alloc[np.argmax(np.where(room, gap, -np.inf))] += 1
        else:
            room = alloc > low
            if not room.any():
                break
            alloc[np.argmin(np.where(room, gap, np.inf))] -= 1
    return alloc


def stratified_sample(labels: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Sorted indices of a seeded, stratified sample of k rows (every class kept while k allows);
    every index when k is 0 or at least the number of rows."""
    if k <= 0 or k >= len(labels):
        return np.arange(len(labels))
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    take = apportion(counts, k, 1 if k >= len(counts) else 0, counts)
    rng = np.random.default_rng(seed)
    chosen = [rng.permutation(np.flatnonzero(inverse == c))[:take[c]] for c in range(len(counts))]
    return np.sort(np.concatenate(chosen))


def random_ids(ids: np.ndarray, fraction: float, seed: int) -> list[int]:
    """A seeded uniform random `fraction` of `ids` (at least one id), sorted."""
    if not 0.0 < fraction < 1.0:
        raise MunkeyError(f"--random-fraction must be between 0 and 1 (exclusive), got {fraction}.")
    if len(ids) == 0:
        raise MunkeyError("The memory bank is empty; there is nothing left to delete.")
    count = max(1, int(round(fraction * len(ids))))
    chosen = np.random.default_rng(seed).choice(np.sort(ids), size=count, replace=False)
    return sorted(int(i) for i in chosen)
