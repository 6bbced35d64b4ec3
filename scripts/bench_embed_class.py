"""Before/after timings of the Embeddings maps and of a class request, on one run, in one script.

    .venv/bin/python scripts/bench_embed_class.py RUN --before OLD_TREE [--repeats 1]
    .venv/bin/python scripts/bench_embed_class.py RUN --before OLD_TREE --browser /usr/bin/chromium

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
        out[name.replace("_s", "_rounds")] = job.request.details.get("rounds")
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


def _server(tree: Path, run: Path, log: Path):
    """`streamlit run app.py` of `tree` on a free loopback port, for `run`; returns (process, url)."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(tree), MUNKEY_RUN=str(run), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    env.pop("MUNKEY_OPERATOR_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(tree / "app.py"), "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"], cwd=tree, env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("streamlit did not start: " + log.read_text()[-2000:])


def browser_measure(run: Path, tree: Path, scratch: Path, chromium: str) -> dict:
    """The same steps as `measure`, clicked in Chromium against a real server of `tree` (wall time from
    the click to the page showing the result)."""
    from playwright.sync_api import sync_playwright

    from munkey_core.run.rows import bank_ids

    work = scratch / "run"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run, work)
    victims = [int(i) for i in bank_ids(work)[::97][:10]]
    log = scratch / "server.log"
    out: dict = {}
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

    def idle(page) -> None:
        page.wait_for_timeout(300)
        page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=600_000)

    def open_page(page, link: str, wait_text: str) -> float:
        t0 = time.perf_counter()
        page.get_by_role("link", name=link).click()
        page.get_by_text(wait_text).first.wait_for(timeout=600_000)
        return time.perf_counter() - t0

    def start(p):
        proc, url = _server(tree, work, log)
        browser = p.chromium.launch(executable_path=chromium, args=args)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.get_by_role("heading", name="MUNKEY model").wait_for(timeout=300_000)
        idle(page)
        return proc, browser, page

    with sync_playwright() as p:
        proc, browser, page = start(p)
        try:
            out["embeddings_first_s"] = open_page(page, "Embeddings", "Draw a lasso")
            env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
            subprocess.run([sys.executable, "-m", "munkey_core.cli", "forget", str(work), "--ids",
                            ",".join(map(str, victims)), "--operator", "bench", "--no-evaluate"], env=env,
                           check=True, capture_output=True)
            open_page(page, "Audit log", "Audit log")
            idle(page)
            out["embeddings_after_deletion_s"] = open_page(page, "Embeddings", f"{len(victims)} of them deleted")
        finally:
            browser.close()
            proc.terminate()
            proc.wait(20)
        proc, browser, page = start(p)
        try:
            out["embeddings_after_restart_s"] = open_page(page, "Embeddings", f"{len(victims)} of them deleted")
            open_page(page, "Class unlearning", "Run the request")
            idle(page)
            page.wait_for_timeout(10_000)  # a user reads the page before clicking (the new code warms up meanwhile)
            t0 = time.perf_counter()
            page.get_by_role("button", name="Run the request").click()
            page.get_by_text("Result: class").wait_for(timeout=600_000)
            idle(page)
            out["class_request_s"] = time.perf_counter() - t0
        finally:
            browser.close()
            proc.terminate()
            proc.wait(20)
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
    ap.add_argument("--before", type=Path, help="a checkout of the code to compare with (required unless "
                    "--after-only)")
    ap.add_argument("--after-only", action="store_true", help="measure this tree only (a re-check)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--browser", metavar="CHROMIUM", help="instead: click the same steps in this Chromium binary "
                    "against a real `streamlit run` of each tree (needs Playwright)")
    a = ap.parse_args()
    if a.before is None and not a.after_only:
        ap.error("--before is required (or --after-only)")
    trees = [("after", ROOT)] if a.after_only else [("before", a.before), ("after", ROOT)]
    if a.browser:
        t_start = time.time()
        res = {}
        with tempfile.TemporaryDirectory() as tmp:
            for label, tree in trees:
                res[label] = browser_measure(a.run, tree.resolve(), Path(tmp), a.browser)
        if a.json:
            a.json.write_text(json.dumps(res, indent=1))
        print(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}, Chromium, {os.cpu_count()} CPUs, "
              f"in {time.time() - t_start:.0f} s; load average (1 min) {os.getloadavg()[0]:.2f} after.\n")
        print("| in Chromium (click to result) | before (s) | after (s) | ratio |\n|---|---:|---:|---:|")
        for key, name in (("embeddings_first_s", "Embeddings: first map"),
                          ("embeddings_after_deletion_s", "Embeddings: after a deletion of 10 ids (CLI)"),
                          ("embeddings_after_restart_s", "Embeddings: after a server restart"),
                          ("class_request_s", "Class unlearning: Run the request (keys + UnAct, 3 comparisons)")):
            b_, n_ = res.get("before", {}).get(key, float("nan")), res["after"][key]
            print(f"| {name} | {b_:.1f} | {n_:.1f} | {b_ / n_:.1f}x |")
        return
    t_start = time.time()
    results: dict[str, list] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.repeats):
            for label, tree in trees:
                results[label].append(measure(a.run, tree.resolve(), Path(tmp)))
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpus": os.cpu_count(), "seconds": round(time.time() - t_start), "load_after": os.getloadavg()[0]}
    report = {"meta": meta, **results}
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))

    def med(label: str, *path: str) -> float:
        if not results[label]:
            return float("nan")
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
    for label in [t for t, _ in trees]:
        rows_ = results[label][-1]["class"]["request_rows"]
        print(f"{label}: " + "; ".join(f"{r['method']} Af {r['Af']:.1f} Ar {r['Ar']:.1f}" for r in rows_))


if __name__ == "__main__":
    main()
