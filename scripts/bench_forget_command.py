"""Wall time of the whole `munkey forget --no-evaluate` command, before and after, in one script.

    .venv/bin/python scripts/bench_forget_command.py RUN --before OLD_TREE --ids-file IDS [--repeats 5]

RUN is a MUNKEY run (the demo's: digits, cpu profile), copied afresh for every command, never
changed; IDS a file of training ids (e.g. 1,000 random ids of the run). OLD_TREE is a checkout of
the code to compare with (`git worktree add /tmp/old <commit>`). Each command is a fresh
`python -m munkey_core.cli forget COPY --ids-file IDS --operator bench --no-evaluate` with
PYTHONPATH set to OLD_TREE or to this tree, one torch thread, alternating old and new; what is timed
is the process from start to exit (interpreter start, imports, the request, exit), and the
request's own figure ("deleted N sample(s) in X ms") is read from its output.

Two ways Python may find the package's code, each measured (`--bytecode`):
- `cached`: as after any earlier run or a regular install, the compiled modules are read from a
  bytecode cache (PYTHONPYCACHEPREFIX, one per tree, filled by one untimed run);
- `source`: the environment as it is (with PYTHONDONTWRITEBYTECODE=1 and no __pycache__ in the tree,
  as in a fresh checkout, every module of the package is compiled from source at every start;
  installed libraries keep their own caches).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(tree: Path, run: Path, ids: Path, scratch: Path, pycache: Path | None = None) -> tuple[float, float, float]:
    """(wall seconds, the request's own seconds, CPU seconds of the process: user + system)."""
    work = scratch / "run"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run, work)
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    if pycache is not None:  # read (and on the untimed first run, write) compiled modules there
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "munkey_core.cli", "forget", str(work), "--ids-file", str(ids),
                          "--operator", "bench", "--no-evaluate"], env=env, capture_output=True, text=True,
                         cwd=scratch)  # not a tree: `-m` puts the working folder first on sys.path
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"{tree}: {res.stderr[-2000:]}")
    ms = float(re.search(r"in ([0-9.]+) ms", res.stdout).group(1))
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return wall, ms / 1000, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--ids-file", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bytecode", choices=("cached", "source", "both"), default="both")
    a = ap.parse_args()
    trees = (("before", a.before.resolve()), ("after", ROOT))
    modes = ("cached", "source") if a.bytecode == "both" else (a.bytecode,)
    n = sum(1 for _ in open(a.ids_file) if _.strip())
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            caches = {label: Path(tmp) / f"pycache-{label}" if mode == "cached" else None for label, _ in trees}
            if mode == "source":
                stale = [str(t / "munkey_core" / "__pycache__") for _, t in trees
                         if (t / "munkey_core" / "__pycache__").exists()]
                if stale or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
                    print(f"note: source mode with {'cached modules in ' + ', '.join(stale) if stale else ''}"
                          f"{'' if os.environ.get('PYTHONDONTWRITEBYTECODE') else ' PYTHONDONTWRITEBYTECODE unset'}: "
                          "Python may read or write compiled modules, so this is not a from-source start")
            else:
                for label, tree in trees:  # untimed: fills each tree's cache
                    one(tree, a.run, a.ids_file, Path(tmp), caches[label])
            out: dict[str, list[tuple[float, float, float]]] = {"before": [], "after": []}
            load0 = os.getloadavg()[0]
            for _ in range(a.repeats):
                for label, tree in trees:
                    out[label].append(one(tree, a.run, a.ids_file, Path(tmp), caches[label]))
            med = {k: [sorted(x[i] for x in v)[len(v) // 2] for i in range(3)] for k, v in out.items()}
            print(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}, {os.cpu_count()} CPUs, bytecode "
                  f"{mode}, {a.repeats} repeats alternating, {n} ids; load average (1 min) {load0:.2f} before, "
                  f"{os.getloadavg()[0]:.2f} after.\n")
            print(f"| `munkey forget --no-evaluate` (bytecode {mode}) | before (s) | after (s) | ratio |\n"
                  "|---|---:|---:|---:|")
            print(f"| whole command (median) | {med['before'][0]:.2f} | {med['after'][0]:.2f} | "
                  f"{med['before'][0] / med['after'][0]:.1f}x |")
            print(f"| CPU time of the command, user + system (median) | {med['before'][2]:.2f} | "
                  f"{med['after'][2]:.2f} | {med['before'][2] / med['after'][2]:.1f}x |")
            print(f"| the deletion inside it (its own figure, median) | {med['before'][1]:.3f} | "
                  f"{med['after'][1]:.3f} | {med['before'][1] / med['after'][1]:.1f}x |")
            for label in out:
                print(f"{label}: whole " + ", ".join(f"{x[0]:.2f}" for x in out[label])
                      + "; CPU " + ", ".join(f"{x[2]:.2f}" for x in out[label]))
            print()


if __name__ == "__main__":
    main()
