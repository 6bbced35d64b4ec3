"""Is a deletion distinguishable from retraining? Run-vs-oracle gaps against the oracle-vs-oracle floor.

A fidelity cell is one data split with models of two kinds that differ only in their training seed:
runs measured after the deletion and M-oracles retrained without the deleted samples. Its noise floor
is the Avg Gap between oracles; the run is "as if never trained on" (for these metrics) when its Avg
Gap to the oracles is no larger than that.

`gap_verdict` reads one run's Avg Gap to its M-oracle against the floor in words (the dashboard's and
`munkey evaluate --oracle`'s reading): within floor + 0.3 (issue 17's bar) or not, or "cannot tell"
without a floor or where its positive control (the run had the deleted samples read like the samples it
still holds, oracles.remembered_control) is within the bar too. `floor_excess` is the pooled figure the docs report: the mean run-vs-oracle gap minus the mean
oracle-pair gap, over every cell. `signed_offsets` says which way the runs sit. `relabelling_test` asks whether that excess is more than chance:
under the null hypothesis that a run after deletion is one more draw of the retraining (the runs and
the oracles of a cell are exchangeable), relabelling which models of each cell are the runs leaves
the excess's distribution unchanged; the p-value is the share of relabellings whose excess is at
least the observed one (the observed labelling included, so p >= 1 / number of relabellings; with as
many runs as oracles, swapping the two groups of a split keeps its run-vs-oracle gaps, so p can reach
that bound only when the runs vary less among themselves than the oracles do). Every
relabelling is enumerated when there are few (three runs and three oracles on three splits: 20^3 =
8,000), else `max_draws` random ones are drawn. Models keep their split: a relabelling never mixes
splits, whose test sets and forget sets differ.

Tests: tests/eval/test_floors.py (against a direct enumeration over subsets; a shifted run as the
positive control; exchangeable draws as the null).
"""

from __future__ import annotations

import itertools
from math import comb
from typing import Mapping, Sequence

import numpy as np

from munkey_core.eval.metrics import GAP_KEYS, avg_gap
from munkey_core.eval.verdicts import CANNOT_TELL, FORGOTTEN, NOT_YET, finite_number

GAP_MARGIN = 0.3  # Avg Gap points over the noise floor still read as retraining chance (issue 17's bar)

Metrics = Mapping[str, float]
Cell = tuple[Sequence[Metrics], Sequence[Metrics]]  # (runs after deletion, M-oracles) of one data split


def gap_verdict(avg_gap_to_oracle: float | None, floor: float | None, n_floor: int = 0,
                margin: float = GAP_MARGIN, *, control_gap: float | None = None, needs_control: bool = False) -> dict:
    """A run's Avg Gap to its M-oracle against the noise floor (mean Avg Gap of `n_floor` oracles of other
    training seeds to the same M-oracle), in words: {"verdict", "reason", "bar"}. "forgotten" when the gap
    is within floor + margin and the positive control is not (`control_gap`: the gap had the deleted
    samples read like the samples the run still holds, oracles.remembered_control), "not yet" above it,
    "cannot tell" without a measured gap or floor, or where the control is within the bar too (the gaps
    could not have shown a remembered sample), or missing when `needs_control`."""
    if not finite_number(avg_gap_to_oracle):
        return {"verdict": CANNOT_TELL, "bar": None,
                "reason": "The gap to the retrained model was not measured."}
    if not finite_number(floor) or n_floor <= 0:
        return {"verdict": CANNOT_TELL, "bar": None,
                "reason": f"Avg Gap {avg_gap_to_oracle:.2f} to the retrained model, but no noise floor (models retrained "
                          "with other seeds) to say how much of it retraining chance alone gives."}
    bar = float(floor) + margin
    what = (f"Avg Gap {avg_gap_to_oracle:.2f} to the retrained model; retrained models differ by {floor:.2f} among "
            f"themselves ({n_floor} retrained with {'another seed' if n_floor == 1 else 'other seeds'})")
    if avg_gap_to_oracle <= bar:
        if finite_number(control_gap) and control_gap <= bar:
            return {"verdict": CANNOT_TELL, "bar": bar,
                    "reason": f"{what}: within that noise + {margin:.1f}, but so would be a model still remembering "
                              f"them (read like the samples it holds: Avg Gap {control_gap:.2f}), so these measures "
                              "cannot tell here."}
        if not finite_number(control_gap) and needs_control:
            return {"verdict": CANNOT_TELL, "bar": bar,
                    "reason": f"{what}: within that noise + {margin:.1f}, but the model holds no training sample of "
                              "the deleted samples' classes to show what remembering reads, so nothing shows these "
                              "measures could tell."}
        control = (f"; a model still remembering them would read {control_gap:.2f}" if finite_number(control_gap)
                   else "")
        return {"verdict": FORGOTTEN, "bar": bar,
                "reason": f"{what}: within that noise + {margin:.1f}{control}: as if never trained on, for these "
                          "measures." + (" One other seed is a thin floor." if n_floor == 1 else "")}
    return {"verdict": NOT_YET, "bar": bar,
            "reason": f"{what}: {avg_gap_to_oracle - bar:.2f} over that noise + {margin:.1f}, so the model still "
                      "differs from one that never saw the deleted samples by more than retraining chance."}


def floor_excess(cells: Sequence[Cell], keys: tuple[str, ...] = GAP_KEYS) -> tuple[float, float]:
    """(mean run-vs-oracle Avg Gap, mean oracle-pair Avg Gap) over every pair of every cell."""
    cross = [avg_gap(r, o, keys) for runs, oracles in cells for r in runs for o in oracles]
    within = [avg_gap(a, b, keys) for _, oracles in cells for a, b in itertools.combinations(oracles, 2)]
    if not cross or not within:
        raise ValueError("every cell needs a run and two oracles, and at least one cell: nothing to compare")
    return float(np.mean(cross)), float(np.mean(within))


def signed_offsets(cells: Sequence[Cell], keys: tuple[str, ...] = GAP_KEYS) -> dict[str, list[float]]:
    """Per metric, per cell with a run and an oracle: the runs' mean minus the oracles' mean (= the mean
    signed run - oracle over the cell's pairs). Which way the runs sit, which Avg Gap's absolute values
    hide: FA and MIA above zero on every cell = the deleted samples still recognised better than by
    retrained models."""
    return {k: [float(np.mean([r[k] for r in runs]) - np.mean([o[k] for o in oracles])) for runs, oracles in cells
                if runs and oracles] for k in keys}


def _cell_sums(runs: Sequence[Metrics], oracles: Sequence[Metrics],
               keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For every choice of which len(runs) of the cell's models are the runs: (sum of run-vs-oracle gaps,
    sum of oracle-pair gaps). Index 0 is the observed labelling."""
    models = list(runs) + list(oracles)
    m, r = len(models), len(runs)
    gap = np.array([[avg_gap(a, b, keys) for b in models] for a in models])  # (m, m), symmetric
    cross, within = [], []
    for chosen in itertools.combinations(range(m), r):  # the first is range(r): the observed labelling
        rest = [i for i in range(m) if i not in chosen]
        cross.append(gap[np.ix_(chosen, rest)].sum())
        within.append(sum(gap[a, b] for a, b in itertools.combinations(rest, 2)))
    return np.array(cross), np.array(within)


def relabelling_test(cells: Sequence[Cell], keys: tuple[str, ...] = GAP_KEYS, max_draws: int = 100_000,
                     seed: int = 0) -> dict:
    """Permutation test of "the runs after deletion are exchangeable with their oracles" (module docstring).

    Returns {"gap": mean run-vs-oracle gap, "floor": mean oracle-pair gap, "excess": gap - floor,
    "p": the one-sided p-value, "relabellings": how many were compared, "exact": all of them or a sample}."""
    gap, floor = floor_excess(cells, keys)
    n_cross = sum(len(r) * len(o) for r, o in cells)
    n_within = sum(comb(len(o), 2) for _, o in cells)
    per_cell = []  # per cell: the excess each relabelling contributes, index 0 observed
    for runs, oracles in cells:
        cross, within = _cell_sums(runs, oracles, keys)
        per_cell.append(cross / n_cross - within / n_within)
    observed = sum(c[0] for c in per_cell)
    total = int(np.prod([len(c) for c in per_cell], dtype=np.float64))
    tol = 1e-9  # equal excesses count as "at least as large" despite float summation order
    if total <= max_draws:
        grid = np.zeros(1)
        for c in per_cell:  # every combination of one relabelling per cell: (total,)
            grid = (grid[:, None] + c[None, :]).ravel()
        p, exact, count = float(np.mean(grid >= observed - tol)), True, total
    else:
        rng = np.random.default_rng(seed)
        draws = sum(c[rng.integers(0, len(c), size=max_draws)] for c in per_cell)
        p = float((1 + np.sum(draws >= observed - tol)) / (1 + max_draws))
        exact, count = False, max_draws
    return {"gap": gap, "floor": floor, "excess": gap - floor, "p": p, "relabellings": count, "exact": exact}
