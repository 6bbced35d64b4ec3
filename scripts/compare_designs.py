"""Two MUNKEY designs side by side on one random-forgetting cell: fidelity, Ps and inference speed.

    .venv/bin/python scripts/compare_designs.py PAPER_RUN LATE_RUN --rate 0.1 --seed 0 [--write OUT.json]

PAPER_RUN and LATE_RUN are `seed_<s>/munkey` runs of `munkey bench fidelity` (the paper's design and
`--inject-at L`), each holding the M-oracle of the seeded forget set (`--rate`, `--seed`: the bench's
draw). Both runs are copied to a temporary folder first (the originals are only read), so a run that
another process is using is never locked or changed. For each design, on the same evaluation rows
(the bench's seeded subsamples) and with the cheap MIA: TA, RA, FA, MIA of key deletion and of the
M-oracle, Avg Gap, and Ps (test rows, bank after deletion). Then the ensemble's inference speed
(K neighbours, retrieval included, no per-neighbour evidence), both models timed alternately in this
one process, median of `--repeats`: compare the ratio, not the absolute img/s, on a shared machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from munkey_core.eval.metrics import accuracy, pathway_sensitivity  # noqa: E402
from munkey_core.model.munkey_vit import preprocess_images  # noqa: E402
from munkey_core.eval.oracles import eval_sets, gaps, measure, munkey_scorer, oracle_path  # noqa: E402
from munkey_core.model.predict import predict  # noqa: E402
from munkey_core.service import MunkeyRun, design_name  # noqa: E402
from munkey_core.data.sampling import random_ids  # noqa: E402

RUN_FILES = ("config.json", "model.pt", "bank.store", "bank.store.redo", "bank.npz", "history.json")  # format 2 or 1


def copy_run(src: Path, dest: Path) -> Path:
    """The files a run needs to be opened (no checkpoints, no audit state), copied to `dest`."""
    dest.mkdir(parents=True)
    for name in RUN_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dest / name)
    return dest


def design_row(run: MunkeyRun, oracle: MunkeyRun, ids: list[int], sets) -> dict:
    """Key deletion vs the M-oracle on `sets` (cheap MIA), and Ps on the test rows after deletion."""
    ds, k, tau = run.dataset, run.train_cfg.k, run.train_cfg.tau
    bank = copy.deepcopy(run.bank)
    bank.delete(ids)
    bank.compact()
    star = measure(munkey_scorer(oracle.model, oracle.bank, ds, run.split_keys, k, tau), ds, sets)
    mine = measure(munkey_scorer(run.model, bank, ds, run.split_keys, k, tau), ds, sets)
    x = preprocess_images(torch.from_numpy(np.array(ds.test.images[sets.test])), run.model_cfg.img_size)
    keys, y = run.split_keys("test")[sets.test], ds.test.labels[sets.test]
    acc = {p: accuracy(predict(run.model, bank, x, keys, k=k, tau=tau, pathway=p,
                               neighbour_predictions=False).labels, y) for p in ("both", "image", "token")}
    return {"design": design_name(run.model_cfg.inject_at), "inject_at": run.model_cfg.inject_at,
            "munkey": mine, "oracle": star, **gaps(mine, star),
            "Ps": pathway_sensitivity(acc["image"], acc["token"], acc["both"]),
            "A_img": acc["image"], "A_tok": acc["token"], "A_both": acc["both"]}


def speed(runs: dict[str, MunkeyRun], n: int, k: int, repeats: int) -> dict[str, float]:
    """Ensemble img/s of each run on the same n test images, timed alternately; median of `repeats`."""
    first = next(iter(runs.values()))
    ds = first.dataset
    x = preprocess_images(torch.from_numpy(np.array(ds.test.images[:n])), first.model_cfg.img_size)
    keys = first.split_keys("test")[:n]
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(repeats + 1):  # the first round warms up
        for name, run in runs.items():
            t0 = time.perf_counter()
            predict(run.model, run.bank, x, keys, k=k, tau=run.train_cfg.tau, neighbour_predictions=False)
            if rep:
                times[name].append(time.perf_counter() - t0)
    return {name: n / statistics.median(t) for name, t in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paper_run")
    p.add_argument("late_run")
    p.add_argument("--rate", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-samples", type=int, default=2000)
    p.add_argument("--k", type=int, default=8, help="neighbours for the speed measurement (default 8)")
    p.add_argument("--images", type=int, default=1024, help="test images per timed call (default 1024)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--write", default=None, help="write the results as JSON here")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs, oracles, rows = {}, {}, {}
        for name, src in (("paper", Path(args.paper_run)), ("late", Path(args.late_run))):
            run = MunkeyRun(copy_run(src, Path(tmp) / name), device="cpu")
            ids = random_ids(run.dataset.train.ids, args.rate, args.seed)
            o_src = oracle_path(src, ids, "munkey")
            if not (o_src / "config.json").exists():
                raise SystemExit(f"{src} has no M-oracle for this forget set ({o_src.name}); run the bench first.")
            runs[name] = run
            oracles[name] = MunkeyRun(copy_run(o_src, Path(tmp) / f"{name}_oracle"), device="cpu")
        ds = runs["paper"].dataset
        if not np.array_equal(ds.train.ids, runs["late"].dataset.train.ids):
            raise SystemExit("The two runs saw different training splits (another seed or size).")
        ids = random_ids(ds.train.ids, args.rate, args.seed)
        sets = eval_sets(ds, ids, max_samples=args.max_samples, seed=args.seed)
        for name in runs:
            rows[name] = design_row(runs[name], oracles[name], ids, sets)
        ips = speed(runs, args.images, args.k, args.repeats)
    result = {"rate": args.rate, "seed": args.seed, "n_forget": len(ids), "n_test": int(len(sets.test)),
              "n_retain": int(len(sets.retain)), "n_forget_evaluated": int(len(sets.forget)), "rows": rows,
              "speed_img_per_s": ips, "speed_k": args.k, "speed_ratio_late_over_paper": ips["late"] / ips["paper"],
              "threads": torch.get_num_threads(), "seconds": round(time.perf_counter() - t0, 1)}
    print("| design | method | TA | RA | FA | MIA (cheap) | Avg Gap | Ps | img/s (K=%d) |" % args.k)
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        o, m = r["oracle"], r["munkey"]
        print(f"| {r['design']} | Retrain (M-oracle) | {o['TA']:.2f} | {o['RA']:.2f} | {o['FA']:.2f} | "
              f"{o['MIA']:.2f} | 0.00 | | |")
        print(f"| {r['design']} | MUNKEY (key deletion) | {m['TA']:.2f} | {m['RA']:.2f} | {m['FA']:.2f} | "
              f"{m['MIA']:.2f} | {r['AvgGap']:.2f} | {r['Ps']:.3f} | {ips[name]:.0f} |")
    print(f"\nlate / paper inference speed: {result['speed_ratio_late_over_paper']:.2f}x "
          f"({args.images} test images per call, K={args.k}, {result['threads']} thread(s)); {result['seconds']} s")
    if args.write:
        Path(args.write).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
