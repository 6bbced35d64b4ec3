"""Benchmarks behind `munkey bench NAME`: each module here is one benchmark.

A benchmark module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`, and keeps
its heavy imports inside `run` so that `munkey --help` stays fast. Benchmarks print tables of absolute
figures *and* ratios against a baseline measured in the same run (these machines are shared and noisy),
and write them under docs/ when asked to.

- perf.py (with forget_storage.py): deletion, forget requests, search, inference, training, memory.
- fidelity.py (with fidelity_run.py, and fidelity_merge.py for --merge-csv): random forgetting against
  retrained oracles.
- unact.py (with unact_run.py): UnAct against SSD, LFSSD and class oracles.
- ulira.py (with ulira_run.py): a per-example unlearning attack (U-LiRA style).
- duplicates.py: near-duplicate recall@1 of copies of training images.
- search.py: exact vs IVF top-K search: recall on a run's own keys, speed at 1M rows.
- _common.py: markdown tables and synthetic keys.
Tests: tests/bench/test_bench_search.py, tests/bench/test_bench_fidelity.py, tests/bench/test_bench_unact.py, tests/eval/test_ulira.py, tests/run/test_runstore.py.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# name -> module (relative to this package); add a benchmark by adding a line here.
BENCHMARKS: dict[str, str] = {
    "perf": ".perf",
    "unact": ".unact",
    "fidelity": ".fidelity",
    "ulira": ".ulira",
    "duplicates": ".duplicates",
    "search": ".search",
}


def load(name: str) -> ModuleType:
    """The module of benchmark `name`."""
    return importlib.import_module(BENCHMARKS[name], __name__)
