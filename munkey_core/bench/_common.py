"""Helpers shared by the benchmarks: markdown tables, their files, "mean ± sd" cells, synthetic keys and
the --munkey-set parser.

Keys are synthetic and clustered (CENTRES centres plus noise, unit norm), generated CHUNK rows at a
time so that a 1M-row bank is built in bounded memory.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Sequence

KEY_DIM, VALUE_DIM, CENTRES, CHUNK = 1280, 128, 1000, 50_000


def table(title: str, header: list[str], rows: list[list]) -> str:
    """A markdown table under a `###` title; floats with 3 decimals below 10, 1 above, thousands separated."""
    def fmt(v) -> str:
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def num_or_dash(v: float | None, digits: int = 2) -> str:
    """A table cell: the number with `digits` decimals, or "-" where it was not measured (None)."""
    return "-" if v is None else f"{v:.{digits}f}"


def chunks(n: int, seed: int, start_id: int = 0):
    """Yield (ids, keys) chunks of clustered unit keys; the same seed gives the same rows."""
    import numpy as np

    centres = np.random.default_rng(seed).standard_normal((CENTRES, KEY_DIM), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    for c, lo in enumerate(range(0, n, CHUNK)):
        m = min(CHUNK, n - lo)
        rng = np.random.default_rng([seed, c, start_id])
        keys = centres[rng.integers(0, CENTRES, m)]
        keys += rng.standard_normal((m, KEY_DIM), dtype=np.float32) * np.float32(0.6 / KEY_DIM ** 0.5)
        keys /= np.linalg.norm(keys, axis=1, keepdims=True)
        yield np.arange(start_id + lo, start_id + lo + m, dtype=np.int64), keys


def mean_sd(values: list[float]) -> str:
    """"mean ± sd" of the defined values, 2 decimals ("-" when none, the value alone when one)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.2f}"
    return f"{statistics.mean(vals):.2f} ± {statistics.stdev(vals):.2f}"


def write_tables(folder: str | Path, name: str, text: str, rows: Sequence[dict], columns: Sequence[str]) -> Path:
    """A benchmark's tables as `folder/name.md` (the text as printed) and `folder/name.csv` (one line per
    row, these columns); returns the Markdown file."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{name}.md"
    md.write_text(text)
    with open(out / f"{name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns))
        w.writeheader()
        w.writerows({c: r.get(c) for c in columns} for r in rows)
    print(f"wrote {md} and .csv")
    return md


def munkey_settings(profile: str, dataset: str, pairs: list[str]) -> dict[str, int | float]:
    """{'p_retrieval': 0.25, ...} from --munkey-set NAME=VALUE pairs (`bench ulira`'s shadows, `bench fidelity`'s
    runs): numeric TrainConfig fields of the MUNKEY models over the profile's recipe, typed as the recipe's own
    value and checked by the training config's own rules now (MunkeyError), not after the keys are encoded.
    Epochs and the seed have their own options."""
    from dataclasses import fields

    from munkey_core.config import resolve_profile, with_overrides
    from munkey_core.errors import MunkeyError

    base = resolve_profile(profile).train_for(dataset)
    numeric = {f.name for f in fields(base) if type(getattr(base, f.name)) in (int, float)} - {"epochs", "seed",
                                                                                                 "split_seed"}
    out: dict[str, int | float] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        name = name.strip()
        if not eq or name not in numeric:
            raise MunkeyError(f"--munkey-set takes NAME=VALUE with NAME a numeric training setting of the MUNKEY "
                              f"models ({', '.join(sorted(numeric))}); got {pair!r}.")
        try:
            out[name] = type(getattr(base, name))(value)
        except ValueError:
            kind = "a whole number" if isinstance(getattr(base, name), int) else "a number"
            raise MunkeyError(f"--munkey-set {name} must be {kind}; got {value!r}.") from None
    with_overrides(base, out)
    return out


def settings_phrases(over: dict[str, int | float]) -> list[str]:
    """['absent_skip_hardest 0.2', ...]: --munkey-set values as the tables and progress lines name them."""
    return [f"{k} {v:g}" for k, v in sorted(over.items())]


def settings_suffix(over: dict[str, int | float]) -> str:
    """'_absent_skip_hardest0.2...': --munkey-set values in a cache folder name, so models of another recipe
    are never reused ('' for the profile's own recipe)."""
    return "".join(f"_{k}{v:g}" for k, v in sorted(over.items()))
