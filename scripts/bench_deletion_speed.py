"""What a user waits for when deleting: a dashboard deletion request with its evaluation (10 ids) and a
`munkey forget` of 1,000 ids without evaluation, this tree against an older one, in one run.

    python scripts/bench_deletion_speed.py RUN --before OLD_TREE [--repeats 3] [--write FILE]

RUN is a trained run (the demo run: `munkey demo`, digits, cpu profile); it is never changed: every
measurement works on a fresh copy. OLD_TREE is a folder holding an older `munkey_core` package (e.g.
`git archive COMMIT munkey_core | tar -x -C OLD_TREE`). Each measurement runs in its own process with
PYTHONPATH set to one tree; the two trees alternate, `--repeats` times; medians are reported.

Measured (seconds, wall clock):
- dashboard deletion, warm: the run open and evaluated once (what the Overview's "Evaluate now" or an
  earlier deletion leaves), then `dashboard.views.delete_and_measure` of 10 ids (what the Deletion
  requests page runs: the request with its before/after evaluation, evidence, audit entry, receipt,
  and the verdicts' same-class accuracy);
- dashboard deletion, cold: the same request as the first action of a freshly opened run (RUN as
  `munkey train` leaves it: evaluated once, so its predictions are stored in it, run/predstore.py;
  a tree without the store ignores them);
- forget 1,000 ids, in process: `MunkeyRun.forget(ids, evaluate=False)` on an open run that has
  filed one request before (so its audit log exists and the dataset is loaded, as in the dashboard):
  validation, evidence, the journal, every row file, the audit entry and the signed receipt;
- `munkey forget` 1,000 ids, whole command: the CLI process, imports included.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r"""
import json, sys, time
import numpy as np
from munkey_core.service import MunkeyRun
scenario, path, ids_file = sys.argv[1], sys.argv[2], sys.argv[3]
ids = [int(x) for x in open(ids_file).read().split()]
run = MunkeyRun(path, device="cpu")
out = {}
if scenario == "warm":
    run.evaluate(max_samples=2000, record=False)
if scenario in ("warm", "cold"):
    from munkey_core.dashboard.views import delete_and_measure
    t = time.perf_counter()
    s = delete_and_measure(run, ids, operator="bench", max_samples=2000)
    out["seconds"] = time.perf_counter() - t
    out["TA_after"] = s["metrics_after"].get("TA")
    out["FA_after"] = s["metrics_after"].get("FA")
else:
    named = set(ids)
    warm = [i for i in run.bank.ids.tolist() if i not in named][-1:]
    run.forget(warm, operator="bench", evaluate=False)  # the log, signing key and dataset in use: not timed
    t = time.perf_counter()
    res = run.forget(ids, operator="bench", evaluate=False)
    out["seconds"] = time.perf_counter() - t
    out["storage_seconds"] = res.seconds
import munkey_core
out["module"] = munkey_core.__file__
print("RESULT " + json.dumps(out))
"""


def _worker(tree: Path, scenario: str, run: Path, ids_file: Path, env: dict) -> dict:
    # cwd: the run's folder, never a source tree (python -c and -m put the working directory first on sys.path)
    p = subprocess.run([sys.executable, "-c", WORKER, scenario, str(run), str(ids_file)], env={**env, "PYTHONPATH": str(tree)},
                       capture_output=True, text=True, check=False, cwd=run)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not line:
        raise SystemExit(f"{scenario} with {tree} failed:\n{p.stderr[-3000:]}")
    out = json.loads(line[-1][len("RESULT "):])
    if not Path(out["module"]).resolve().is_relative_to(tree):
        raise SystemExit(f"{scenario} ran {out['module']}, not the tree {tree}")
    return out


def _cli(tree: Path, run: Path, ids_file: Path, env: dict) -> float:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "munkey_core.cli", "forget", str(run), "--ids-file", str(ids_file),
                        "--operator", "bench", "--no-evaluate"], env={**env, "PYTHONPATH": str(tree)},
                       capture_output=True, text=True, check=False, cwd=run)
    if p.returncode:
        raise SystemExit(f"munkey forget with {tree} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t


def flush_rounds(work: Path, files: int = 11, rounds: int = 12) -> tuple[float, float]:
    """Median ms to make one fresh 4 KiB write durable in each of `files` files (a forget request's
    bank and 10 checkpoint row files): fdatasync one after another, and all issued together (what
    bank/store.py `delete_many` does)."""
    from concurrent.futures import ThreadPoolExecutor

    fds = [os.open(work / f"flush{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(files)]
    seq, together = [], []
    try:
        with ThreadPoolExecutor(files) as pool:
            for r in range(rounds):
                for out, run_all in ((seq, lambda: [os.fdatasync(fd) for fd in fds]),
                                     (together, lambda: list(pool.map(os.fdatasync, fds)))):
                    for fd in fds:
                        os.pwrite(fd, os.urandom(4096), 4096 * (2 * r + len(out) % 2))
                    t = time.perf_counter()
                    run_all()
                    out.append(time.perf_counter() - t)
                time.sleep(0.2)
    finally:
        for fd in fds:
            os.close(fd)
    return 1e3 * statistics.median(seq), 1e3 * statistics.median(together)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--before", type=Path, required=True, help="folder holding the older munkey_core package")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", type=Path, default=None, help="also write the markdown table here")
    args = ap.parse_args()
    after_tree = Path(__file__).resolve().parents[1]
    trees = {"before": args.before.resolve(), "after": after_tree}
    work = Path(tempfile.mkdtemp(prefix="munkey-delbench-"))
    env = {**os.environ, "MUNKEY_CONFIG_DIR": str(work / "config"), "OMP_NUM_THREADS": os.environ.get(
        "OMP_NUM_THREADS", "1"), "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS", "1")}
    sys.path.insert(0, str(after_tree))
    from munkey_core.run.rows import bank_ids

    bank = bank_ids(args.run)
    order = __import__("numpy").random.default_rng(0).permutation(bank)
    ids10, ids1000 = work / "ids10.txt", work / "ids1000.txt"
    ids10.write_text("\n".join(map(str, order[:10])))
    ids1000.write_text("\n".join(map(str, order[:min(1000, len(order) - 1)])))
    results: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    t0 = time.perf_counter()
    try:
        for rep in range(args.repeats):
            for name, tree in (trees.items() if rep % 2 == 0 else reversed(list(trees.items()))):
                for scenario, ids_file in (("warm", ids10), ("cold", ids10), ("forget", ids1000), ("cli", ids1000)):
                    copy = work / f"{name}-{scenario}-{rep}"
                    shutil.copytree(args.run, copy)
                    if scenario == "cli":
                        secs = _cli(tree, copy, ids_file, env)
                    else:
                        secs = _worker(tree, scenario, copy, ids_file, env)["seconds"]
                    results[name].setdefault(scenario, []).append(secs)
                    shutil.rmtree(copy)
                    print(f"repeat {rep + 1}: {name:<6} {scenario:<6} {secs:7.3f} s", flush=True)
        seq_ms, together_ms = flush_rounds(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [("dashboard deletion of 10 ids with evaluation, warm (run evaluated once)", "warm"),
            ("dashboard deletion of 10 ids with evaluation, cold (first action of a fresh process)", "cold"),
            (f"forget {min(1000, len(order) - 1):,} ids without evaluation, in process (`MunkeyRun.forget`)", "forget"),
            (f"`munkey forget` {min(1000, len(order) - 1):,} ids --no-evaluate, whole command (imports included)", "cli")]
    lines = ["| action | before s (median) | after s (median) | before / after | after, every repeat s |",
             "|---|---:|---:|---:|---|"]
    for label, key in rows:
        b, a = statistics.median(results["before"][key]), statistics.median(results["after"][key])
        lines.append(f"| {label} | {b:.2f} | {a:.2f} | {b / a:.1f}x | "
                     f"{', '.join(f'{x:.2f}' for x in results['after'][key])} |")
    load = os.getloadavg()[0]
    footer = (f"\nRun: {args.run.name}, bank {len(bank):,} rows, {args.repeats} repeats alternating the trees, "
              f"{os.cpu_count()} CPUs, 1 thread per process, total {time.perf_counter() - t0:.0f} s, "
              f"load average (1 min) at the end {load:.2f}.")
    flushes = (f"\n\nFlushing 11 files (one fresh 4 KiB write each, median of 12 rounds): fdatasync one after another "
               f"{seq_ms:.1f} ms, all issued together {together_ms:.1f} ms ({seq_ms / together_ms:.1f}x).")
    text = "\n".join(lines) + footer + flushes
    print(text)
    if args.write:
        args.write.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
