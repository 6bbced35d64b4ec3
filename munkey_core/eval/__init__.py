"""Measurements (layer: above run; docs/modules.md has the map).

- metrics.py: accuracy, the cheap MIA AUC, Ps, Avg Gap.
- floors.py: run-vs-oracle gaps against the oracle-pair noise floor, and the relabelling test of them.
- evaluate.py: a loaded run's TA, RA, FA, MIA, Ps; a request's FA and MIA.
- mia.py: the cheap and the RMIA-style strong membership attacks.
- oracles.py: retrained oracles and the measurements compared against them.
- selection.py: checkpoint selection (`munkey select`).
- ulira.py: the statistics of the per-example unlearning attack (U-LiRA style).
- verdicts.py: each forgetting number against its target, with an interval and a plain word.
Tests: tests/eval/test_metrics.py, tests/test_service.py, tests/eval/test_mia.py, tests/eval/test_oracles.py,
tests/eval/test_selection.py, tests/eval/test_ulira.py, tests/eval/test_floors.py.
"""
