"""The relabelling test of "a deletion is one more draw of the retraining" (munkey_core/eval/floors.py).

Checked against a direct enumeration written here (every choice of runs per split, gaps recomputed
from the metrics), with a shifted run as the positive control and exchangeable draws as the null.
The metrics are the digits measurements of docs/results/forgetting_at_defaults.md ("three runs and
three oracles per split", 10%): TA, RA, FA, MIA after deletion for the runs, as trained for the oracles.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from munkey_core.eval.floors import floor_excess, relabelling_test, signed_offsets

KEYS = ("TA", "RA", "FA", "MIA")


def m(*values: float) -> dict:
    return dict(zip(KEYS, values))


DIGITS_10 = [  # (runs after deletion, M-oracles) per data split 0, 1, 2
    ([m(94.99, 100.00, 91.27, 52.06), m(94.71, 100.00, 93.65, 53.66), m(94.99, 100.00, 94.44, 54.44)],
     [m(94.43, 99.91, 91.27, 51.84), m(93.87, 100.00, 91.27, 52.40), m(95.54, 99.91, 90.48, 52.99)]),
    ([m(95.26, 100.00, 95.24, 47.72), m(95.26, 100.00, 96.83, 49.10), m(95.54, 100.00, 96.83, 49.53)],
     [m(95.26, 100.00, 96.03, 49.32), m(95.82, 100.00, 95.24, 46.99), m(96.10, 99.91, 95.24, 48.31)]),
    ([m(95.54, 99.91, 96.03, 54.15), m(92.20, 100.00, 94.44, 55.28), m(93.59, 100.00, 95.24, 54.73)],
     [m(91.36, 100.00, 92.86, 55.10), m(91.64, 100.00, 92.06, 56.30), m(91.92, 100.00, 92.86, 55.02)]),
]


def direct_gap(a: dict, b: dict) -> float:
    return sum(abs(a[k] - b[k]) for k in KEYS) / len(KEYS)


def direct_excess(cells) -> float:
    """Pooled mean run-vs-oracle gap minus pooled mean oracle-pair gap, written out."""
    cross = [direct_gap(r, o) for runs, oracles in cells for r in runs for o in oracles]
    within = [direct_gap(a, b) for _, oracles in cells for i, a in enumerate(oracles) for b in oracles[i + 1:]]
    return sum(cross) / len(cross) - sum(within) / len(within)


def direct_p(cells) -> tuple[float, int]:
    """Every relabelling of every split, each one's excess recomputed from scratch."""
    choices = []
    for runs, oracles in cells:
        models, r = runs + oracles, len(runs)
        choices.append([([models[i] for i in c], [models[i] for i in range(len(models)) if i not in c])
                        for c in itertools.combinations(range(len(models)), r)])
    observed = direct_excess(cells)
    excesses = [direct_excess(list(pick)) for pick in itertools.product(*choices)]
    return sum(e >= observed - 1e-9 for e in excesses) / len(excesses), len(excesses)


def test_floor_excess_matches_a_direct_computation() -> None:
    gap, floor = floor_excess(DIGITS_10)
    assert gap - floor == pytest.approx(direct_excess(DIGITS_10), abs=1e-12)
    assert gap == pytest.approx(1.03, abs=0.005) and floor == pytest.approx(0.58, abs=0.005)  # the docs' table


@pytest.mark.parametrize("splits", [[0], [2], [0, 1], [0, 1, 2]])
def test_p_value_matches_a_direct_enumeration(splits: list[int]) -> None:
    cells = [DIGITS_10[s] for s in splits]
    out = relabelling_test(cells)
    p, n = direct_p(cells)
    assert out["exact"] and out["relabellings"] == n == 20 ** len(splits)
    assert out["p"] == pytest.approx(p, abs=1e-12)
    assert out["excess"] == pytest.approx(direct_excess(cells), abs=1e-12)


def test_uneven_cells_match_a_direct_enumeration() -> None:
    """One run and two oracles on one split, two and three on another (as the Fashion-MNIST tables)."""
    cells = [(DIGITS_10[0][0][:1], DIGITS_10[0][1][:2]), (DIGITS_10[2][0][:2], DIGITS_10[2][1])]
    p, n = direct_p(cells)
    out = relabelling_test(cells)
    assert out["relabellings"] == n == 3 * 10 and out["p"] == pytest.approx(p, abs=1e-12)


def test_signed_offsets_match_a_direct_computation() -> None:
    """Per split: mean of the runs' metric minus mean of the oracles'; a cell without a run is skipped."""
    offsets = signed_offsets(DIGITS_10 + [([], DIGITS_10[0][1])])
    for k in KEYS:
        expected = [np.mean([r[k] for r in runs]) - np.mean([o[k] for o in orcs]) for runs, orcs in DIGITS_10]
        assert offsets[k] == pytest.approx(expected)
    assert offsets["FA"][0] == pytest.approx((91.27 + 93.65 + 94.44) / 3 - (91.27 + 91.27 + 90.48) / 3)


def test_a_run_that_remembers_is_found_and_the_oracles_alone_are_not() -> None:
    """Positive control: runs whose FA and MIA sit well above their oracles get the smallest p there is.
    Null: the oracles of each split relabelled against each other (nothing to find) are not flagged."""
    leaky = [([{**r, "FA": r["FA"] + 6.0, "MIA": r["MIA"] + 5.0} for r in runs], oracles) for runs, oracles in DIGITS_10]
    out = relabelling_test(leaky)
    # with as many runs as oracles, swapping the two groups of a split keeps the run-vs-oracle sum, so the
    # 2^3 swaps are the only relabellings that can tie or beat the observed one
    assert out["p"] <= 2 ** 3 / 20 ** 3 and out["excess"] > 2.0
    oracle_only = [(oracles[:1], oracles[1:]) for _, oracles in DIGITS_10]
    assert relabelling_test(oracle_only)["p"] > 0.1


def test_exchangeable_draws_give_spread_p_values() -> None:
    """Runs and oracles drawn from one distribution: p is not systematically small (about uniform)."""
    rng = np.random.default_rng(0)
    ps = []
    for _ in range(40):
        cells = []
        for _split in range(3):
            draws = [m(*(np.array([94.5, 99.9, 93.0, 52.0]) + rng.normal(0, [0.8, 0.05, 1.5, 1.2]))) for _ in range(6)]
            cells.append((draws[:3], draws[3:]))
        ps.append(relabelling_test(cells)["p"])
    assert 0.3 < float(np.mean(ps)) < 0.7
    assert np.mean(np.array(ps) < 0.05) < 0.2


def test_sampled_relabellings_agree_with_the_exact_p() -> None:
    exact = relabelling_test(DIGITS_10)
    sampled = relabelling_test(DIGITS_10, max_draws=4000, seed=1)
    assert not sampled["exact"] and sampled["relabellings"] == 4000
    assert sampled["p"] == pytest.approx(exact["p"], abs=0.02)


def test_a_cell_without_an_oracle_pair_has_no_floor() -> None:
    with pytest.raises(ValueError, match="two oracles"):
        floor_excess([(DIGITS_10[0][0], DIGITS_10[0][1][:1])])


def test_gap_verdict_reads_the_gap_against_floor_plus_margin() -> None:
    """Within floor + 0.3: forgotten; above: not yet, by how much; no floor or no gap: cannot tell."""
    from munkey_core.eval.floors import gap_verdict

    assert gap_verdict(0.64, 0.79, 1)["verdict"] == "forgotten"  # the demo run: below its floor
    assert gap_verdict(1.09, 0.79, 2)["verdict"] == "forgotten"  # 0.79 + 0.3 = 1.09: the edge is within
    over = gap_verdict(1.42, 0.44, 3)
    assert over["verdict"] == "not yet" and "0.68 over" in over["reason"] and over["bar"] == pytest.approx(0.74)
    assert "thin floor" in gap_verdict(0.5, 0.6, 1)["reason"] and "thin floor" not in gap_verdict(0.5, 0.6, 2)["reason"]
    for gap, floor, n in ((0.5, None, 0), (0.5, 0.4, 0), (None, 0.4, 2), (float("nan"), 0.4, 2), (0.5, float("nan"), 2)):
        v = gap_verdict(gap, floor, n)
        assert v["verdict"] == "cannot tell" and "nan" not in v["reason"] and "None" not in v["reason"]



def test_gap_verdict_needs_a_positive_control_outside_the_bar() -> None:
    """A run within floor + 0.3 reads "forgotten" only where a model still remembering the deleted samples
    (read like the samples it holds) would not be: a control within the bar too, or none where one is
    needed, gives "cannot tell"; a gap over the bar stays "not yet" whatever the control."""
    from munkey_core.eval.floors import gap_verdict

    strong = gap_verdict(0.41, 1.18, 1, control_gap=6.6, needs_control=True)
    assert strong["verdict"] == "forgotten" and "still remembering them would read 6.60" in strong["reason"]
    weak = gap_verdict(0.41, 1.18, 1, control_gap=1.2, needs_control=True)  # nothing left to forget, measurably
    assert weak["verdict"] == "cannot tell" and "Avg Gap 1.20" in weak["reason"]
    assert gap_verdict(0.41, 1.18, 1, control_gap=None, needs_control=True)["verdict"] == "cannot tell"
    assert gap_verdict(0.41, 1.18, 1, control_gap=None)["verdict"] == "forgotten"  # callers without a control
    assert gap_verdict(2.0, 0.5, 2, control_gap=0.1, needs_control=True)["verdict"] == "not yet"


def test_the_oracle_comparison_carries_its_positive_control(tiny_run) -> None:
    """`evaluate_against_oracle` measures the run on the samples it still holds and reports the Avg Gap it
    would have to the M-oracle had the deleted samples read like those: recomputed here by hand from the
    run's and the oracle's rows and the control's FA / MIA."""
    from munkey_core.eval.oracles import evaluate_against_oracle
    from munkey_core.service import MunkeyRun

    run = MunkeyRun(tiny_run, device="cpu")
    run.forget([int(i) for i in run.bank.ids[:30]], operator="t", evaluate=False)
    r = evaluate_against_oracle(run, progress=False)
    c, mine, orc = r["control"], r["run"], r["oracle"]
    assert c["FA"] == mine["FA_remembered"] and c["MIA"] == mine["MIA_remembered"]
    by_hand = np.mean([abs(mine["TA"] - orc["TA"]), abs(mine["RA"] - orc["RA"]), abs(c["FA"] - orc["FA"]),
                       abs(c["MIA"] - orc["MIA"])])
    assert c["AvgGap"] == pytest.approx(by_hand)
