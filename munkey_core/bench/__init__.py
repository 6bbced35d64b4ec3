"""Benchmarks behind `munkey bench NAME`: each module here is one benchmark.

A benchmark module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`, and keeps
its heavy imports inside `run` so that `munkey --help` stays fast. Benchmarks print tables of absolute
figures *and* ratios against a baseline measured in the same run (these machines are shared and noisy),
and write them under docs/ when asked to.
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
}


def load(name: str) -> ModuleType:
    """The module of benchmark `name`."""
    return importlib.import_module(BENCHMARKS[name], __name__)
