"""Wall time of the whole `munkey forget --no-evaluate` command, before and after, in one script.

    .venv/bin/python scripts/bench_forget_command.py RUN --before OLD_TREE --ids-file IDS [--repeats 5]

RUN is a MUNKEY run (the demo's: digits, cpu profile), copied afresh for every command, never
changed; IDS a file of training ids (e.g. 1,000 random ids of the run). OLD_TREE is a checkout of
the code to compare with (`git worktree add /tmp/old <commit>`). Each command is a fresh
`python -m munkey_core.cli forget COPY --ids-file IDS --operator bench --no-evaluate` with
PYTHONPATH set to OLD_TREE or to this tree, one torch thread, alternating old and new; what is timed
is the process from start to exit (interpreter start, imports, the request, exit), and the
request's own figure ("deleted N sample(s) in X ms") is read from its output.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(tree: Path, run: Path, ids: Path, scratch: Path) -> tuple[float, float]:
    work = scratch / "run"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run, work)
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "munkey_core.cli", "forget", str(work), "--ids-file", str(ids),
                          "--operator", "bench", "--no-evaluate"], env=env, capture_output=True, text=True,
                         cwd=scratch)  # not a tree: `-m` puts the working folder first on sys.path
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{tree}: {res.stderr[-2000:]}")
    ms = float(re.search(r"in ([0-9.]+) ms", res.stdout).group(1))
    return wall, ms / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--ids-file", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    out: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.repeats):
            for label, tree in (("before", a.before.resolve()), ("after", ROOT)):
                out[label].append(one(tree, a.run, a.ids_file, Path(tmp)))
    med = {k: (sorted(w for w, _ in v)[len(v) // 2], sorted(d for _, d in v)[len(v) // 2]) for k, v in out.items()}
    n = sum(1 for _ in open(a.ids_file) if _.strip())
    print(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}, {os.cpu_count()} CPUs, {a.repeats} repeats "
          f"alternating, {n} ids; load average (1 min) {load0:.2f} before, {os.getloadavg()[0]:.2f} after.\n")
    print("| `munkey forget --no-evaluate` | before (s) | after (s) | ratio |\n|---|---:|---:|---:|")
    print(f"| whole command (median) | {med['before'][0]:.2f} | {med['after'][0]:.2f} | "
          f"{med['before'][0] / med['after'][0]:.1f}x |")
    print(f"| the deletion inside it (its own figure, median) | {med['before'][1]:.3f} | {med['after'][1]:.3f} | "
          f"{med['before'][1] / med['after'][1]:.1f}x |")
    for label in out:
        print(f"{label}: whole " + ", ".join(f"{w:.2f}" for w, _ in out[label]))


if __name__ == "__main__":
    main()
