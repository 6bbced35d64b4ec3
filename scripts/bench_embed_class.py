"""Before/after timings of the Embeddings maps and of a class request, on one run, in one script.

    .venv/bin/python scripts/bench_embed_class.py RUN --before OLD_TREE [--repeats 1]

RUN is a MUNKEY run (the demo's: digits, cpu profile); it is copied to a temporary folder for each
measurement, never changed. OLD_TREE is a checkout of the code to compare with (for example
`git worktree add /tmp/old <commit>`); each measurement runs in a fresh Python process with
PYTHONPATH set to OLD_TREE or to this tree, one torch thread, alternating old and new. What is timed
(wall seconds, the library calls the dashboard pages make, without Streamlit):
- Embeddings, first map: `compute_maps` in a fresh process (UMAP's numba compilation included);
- Embeddings after a deletion: the same process deletes 10 ids (`MunkeyRun.forget`, no evaluation),
  then asks for the maps again (what the page does when the bank changed);
- Embeddings after a restart: a new process asks for the maps of the run as it was left;
- class request: `ClassEditor` opened as the Class unlearning page opens it, then one request as the
  page runs it (`ClassUnlearnJob.task`: keys + UnAct on 5 images of class 0, per-round curve, and the
  three comparison rows), then a second request (class 1) on the same editor. The new code starts
  the editor's warm-up when the page opens it (`warm_up`); it is timed separately ("open") and
  finished before the request is clicked, as on a page a user reads first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAP_POINTS = 3000  # the page's default cap


def child_embeddings(run_dir: str, phase: str) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from munkey_core.dashboard import embeddings as emb
    from munkey_core.service import MunkeyRun

    out: dict = {}
    t0 = time.perf_counter()
    run = MunkeyRun(run_dir, device="cpu")
    params = emb.MapParams(max_points=MAP_POINTS)
    out["open_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    maps = emb.compute_maps(run, params)
    out["maps_s"] = time.perf_counter() - t0
    out["points"] = int(len(maps.ids))
    if phase == "first":
        victims = [int(i) for i in maps.ids[~maps.deleted][::97][:10]]
        before = {int(i): maps.cls_xy[r].tolist() for r, i in enumerate(maps.ids)}
        t0 = time.perf_counter()
        run.forget(victims, operator="bench", evaluate=False)
        out["forget_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = emb.compute_maps(run, params)
        out["after_deletion_s"] = time.perf_counter() - t0
        kept = [r for r, i in enumerate(again.ids) if not again.deleted[r] and int(i) in before]
        moved = [float(np.abs(np.asarray(before[int(again.ids[r])]) - again.cls_xy[r]).max()) for r in kept]
        out["kept_points_max_move"] = max(moved) if moved else None
        out["deleted_shown"] = int(again.deleted.sum())
        cache = Path(run_dir) / "embeddings"
        out["deleted_ids_in_cache_files"] = None
        if cache.is_dir():
            from munkey_core.run.mapcache import read_maps

            found = [int(i) for p in cache.glob("maps-*.npz") for i in read_maps(p).ids if int(i) in victims]
            out["deleted_ids_in_cache_files"] = len(found)
    return out


def child_class(run_dir: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from munkey_core.dashboard import classforget_job as cj
    from munkey_core.unlearn.classforget import ClassEditor

    out: dict = {}
    t0 = time.perf_counter()
    editor = ClassEditor(run_dir)
    if hasattr(cj, "warm_up"):
        cj.warm_up(editor)
        editor._warm.join()
    out["open_s"] = time.perf_counter() - t0
    for name, cls in (("request_s", 0), ("second_request_s", 1)):
        job = cj.ClassUnlearnJob(editor, "keys+unact", editor.class_images(cls, 5), cls=cls,
                                 cfg=editor.default_config(), compare=True)
        t0 = time.perf_counter()
        job.task()
        out[name] = time.perf_counter() - t0
        out[name.replace("_s", "_rows")] = [{k: r[k] for k in ("method", "Af", "Ar", "seconds")} for r in job.rows]
        out[name.replace("_s", "_rounds")] = len(job.curve) - 1
    return out


def _child(tree: Path, args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", *args], env=env,
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"child {args} on {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(run: Path, tree: Path, scratch: Path) -> dict:
    work = scratch / "run"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run, work)
    out = {"embeddings_first": _child(tree, ["embeddings", str(work), "first"])}
    out["embeddings_restart"] = _child(tree, ["embeddings", str(work), "restart"])
    shutil.rmtree(work)
    shutil.copytree(run, work)
    out["class"] = _child(tree, ["class", str(work)])
    shutil.rmtree(work)
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, run_dir = sys.argv[2], sys.argv[3]
        res = child_embeddings(run_dir, sys.argv[4]) if kind == "embeddings" else child_class(run_dir)
        print(json.dumps(res))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write every figure here")
    a = ap.parse_args()
    t_start = time.time()
    results: dict[str, list] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.repeats):
            for label, tree in (("before", a.before), ("after", ROOT)):
                results[label].append(measure(a.run, tree.resolve(), Path(tmp)))
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpus": os.cpu_count(), "seconds": round(time.time() - t_start), "load_after": os.getloadavg()[0]}
    report = {"meta": meta, **results}
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))

    def med(label: str, *path: str) -> float:
        vals = []
        for r in results[label]:
            v = r
            for p in path:
                v = v[p]
            vals.append(v)
        return sorted(vals)[len(vals) // 2]

    rows = [("Embeddings: first map in a fresh process (UMAP compiled and fitted)", ("embeddings_first", "maps_s")),
            ("Embeddings: after a deletion of 10 ids, same process", ("embeddings_first", "after_deletion_s")),
            ("Embeddings: after a restart (new process)", ("embeddings_restart", "maps_s")),
            ("Class unlearning: open the editor (new: + warm-up of the test forwards)", ("class", "open_s")),
            ("Class unlearning: keys + UnAct request with its 3 comparisons", ("class", "request_s")),
            ("Class unlearning: a second request (another class)", ("class", "second_request_s"))]
    print(f"{meta['date']}, {meta['cpus']} CPUs, 1 torch thread, {a.repeats} repeat(s) in {meta['seconds']} s; "
          f"load average (1 min) {meta['load_after']:.2f} after.\n")
    print("| what | before (s) | after (s) | ratio |\n|---|---:|---:|---:|")
    for name, path in rows:
        b, n = med("before", *path), med("after", *path)
        print(f"| {name} | {b:.2f} | {n:.2f} | {b / n:.1f}x |")
    last = results["after"][-1]
    print(f"\nafter: kept points moved by at most {last['embeddings_first']['kept_points_max_move']} after the "
          f"deletion; deleted ids left in the cache files: {last['embeddings_first']['deleted_ids_in_cache_files']}")
    for label in ("before", "after"):
        rows_ = results[label][-1]["class"]["request_rows"]
        print(f"{label}: " + "; ".join(f"{r['method']} Af {r['Af']:.1f} Ar {r['Ar']:.1f}" for r in rows_))


if __name__ == "__main__":
    main()
