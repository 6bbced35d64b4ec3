"""`munkey bench fidelity --merge-csv`: per-seed rows of earlier invocations' CSVs joined to this one's.

Why: a seed is an hour of training on this machine and its models are cached only in --work, which does
not outlive the machine; the CSV does. A table over seeds 0, 1, 2 can then come from a committed CSV of
seeds 0, 1 and a new invocation with `--seed-list 2`, without retraining seeds 0 and 1. The rows read
back are the very numbers written (a CSV float is its repr), so the mean ± sample sd over seeds is the
one a single invocation over all seeds prints. What a CSV cannot tell (dataset, profile, options) the
user vouches for; what it can is checked: the columns, no (rate, seed) cell twice, the same rows per
cell and the same attack everywhere.
"""

from __future__ import annotations

import csv
from pathlib import Path

from munkey_core.errors import MunkeyError

# the audited `munkey forget` request of a cell, carried on its MUNKEY (key deletion) row in the CSV
AUDITED = {"audited_request_s": "request_seconds", "audited_deletion_s": "deletion_seconds",
           "audited_deleted": "deleted"}
_FLOATS = ("TA", "RA", "FA", "MIA", "TPR@1%", "TPR@0.1%", "AvgGap", "seconds", "val_AvgGap",
           "audited_request_s", "audited_deletion_s")
_INTS = ("seed", "epoch", "train_seed", "audited_deleted")
_REQUIRED = ("rate", "seed", "method", "oracle", "TA", "RA", "FA", "MIA", "TPR@1%", "TPR@0.1%", "AvgGap",
             "seconds", "MIA_attack")


def _parsed(raw: dict) -> dict:
    """A CSV row with the types the bench wrote: floats, ints, None for an empty cell."""
    row: dict = {}
    for k, v in raw.items():
        if v is None or v == "":
            row[k] = None
        elif k == "rate" or k in _FLOATS:
            row[k] = float(v)
        elif k in _INTS:
            row[k] = int(float(v))
        else:
            row[k] = v
    return row


def read_rows(paths: list[str | Path], rates: list[float]) -> tuple[list[dict], dict[tuple[float, int], dict]]:
    """The rows of `rates` in the fidelity CSVs `paths`, and the audited requests they carry
    ((rate, seed) -> {request_seconds, deletion_seconds, deleted}; absent from CSVs written before them)."""
    rows: list[dict] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise MunkeyError(f"--merge-csv: {p} is not a file.")
        with open(p, newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in _REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise MunkeyError(f"--merge-csv: {p} lacks the column(s) {missing}; is it a `bench fidelity` CSV "
                                  "of this version?")
            here = [r for r in map(_parsed, reader) if r["rate"] in rates]
        if not here:
            raise MunkeyError(f"--merge-csv: {p} has no row of the rates {rates}.")
        seen = {(r["rate"], r["seed"]) for r in rows}
        twice = sorted({(r["rate"], r["seed"]) for r in here} & seen)
        if twice:
            raise MunkeyError(f"--merge-csv: (rate, seed) cell(s) {twice} of {p} are in another CSV already.")
        rows += here
    audited = {(r["rate"], r["seed"]): {v: r[k] for k, v in AUDITED.items()} for r in rows
               if r["method"].startswith("MUNKEY (key deletion") and r.get("audited_request_s") is not None}
    return rows, audited


def merged(read: list[dict], measured: list[dict], rates: list[float], optional: tuple[str, ...] = ()) -> list[dict]:
    """`read` and `measured` rows in the order one invocation writes them (rate as in `rates`, then seed;
    within a cell, as measured), after checking they can share a table: no cell twice, the same methods
    in the same order in every cell of a rate (rows of `optional` methods aside), one attack."""
    cells_read = {(r["rate"], r["seed"]) for r in read}
    twice = sorted(cells_read & {(r["rate"], r["seed"]) for r in measured})
    if twice:
        raise MunkeyError(f"--merge-csv: (rate, seed) cell(s) {twice} are both in the CSV and measured here; "
                          "leave those seeds out of --seed-list.")
    rows = sorted(read + measured, key=lambda r: (rates.index(r["rate"]), r["seed"]))  # stable within a cell
    for rate in rates:
        shapes: dict[tuple[str, ...], list[int]] = {}
        for seed in dict.fromkeys(r["seed"] for r in rows if r["rate"] == rate):
            shape = tuple(r["method"] for r in rows if r["rate"] == rate and r["seed"] == seed
                          and r["method"] not in optional)
            shapes.setdefault(shape, []).append(seed)
        if len(shapes) > 1:
            raise MunkeyError(f"--merge-csv: the cells of rate {rate:g} hold different rows (seeds "
                              f"{list(shapes.values())}): other --methods, --tune, --floor-oracles or --select.")
    attacks = {r["MIA_attack"] for r in rows}
    if len(attacks) > 1:
        raise MunkeyError(f"--merge-csv: the rows were measured with different attacks: {sorted(attacks)}.")
    return rows


def with_audited(rows: list[dict], audited: dict[tuple[float, int], dict]) -> list[dict]:
    """`rows` for the CSV: each cell's MUNKEY (key deletion) row carries its audited request (so that a
    later --merge-csv keeps it)."""
    out = []
    for r in rows:
        a = audited.get((r["rate"], r["seed"])) if r["method"].startswith("MUNKEY (key deletion") else None
        out.append({**r, **{k: a[v] for k, v in AUDITED.items()}} if a else r)
    return out
