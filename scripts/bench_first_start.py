"""Dashboard first start from a fresh clone, in Chromium: seconds to a usable Overview, and to the model.

    .venv/bin/python scripts/bench_first_start.py [--installer] [--token] [--warm-keys] [--out DIR]

Clones this repository's HEAD (committed work only) into a temporary folder, reuses this checkout's
`.venv` (the pip steps of scripts/install.sh need the network and are not timed), and runs the
clone's own code. By default nothing is cached: no runs/demo and an empty key cache (a new machine);
`--warm-keys` keeps the user's key cache. `--installer` first times scripts/demo_run.sh, the step
of scripts/install.sh that trains the demo run once, so the dashboard opens on a trained model.
`--token` starts the server with an operator credential (the README's command), so training waits
for an operator: the bench then types the credential and clicks *Train the demo run* as soon as
the page offers it.

Then `streamlit run app.py` starts and Chromium opens it at once (and, once the model is ready, a
second time on the trained run: the first start after the installer's step). Timed from the
server's start:
- usable Overview: the first screen a user can work with. With a run: the model card. Without
  one: the training progress line and the training images (the dataset browser) both drawn.
- model ready: the Overview's model card ("MUNKEY model"), after the background training.
The progress line is sampled every 2 s to check the time-left estimate against the real end.
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
TOKEN = "bench-operator-token"


def _server(clone: Path, env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    from _browser import free_port

    port = free_port()
    proc = subprocess.Popen([str(clone / ".venv" / "bin" / "python"), "-m", "streamlit", "run", "app.py",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                            cwd=clone, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def _wait_health(url: str, proc: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("streamlit exited")
        time.sleep(0.2)
    raise RuntimeError("streamlit did not answer")


def measure(clone: Path, env: dict, log: Path, token: bool, limit_s: float, usable_only: bool = False) -> dict:
    from playwright.sync_api import sync_playwright

    from _browser import ARGS, CHROMIUM

    out: dict = {"eta_samples": []}
    t0 = time.perf_counter()
    proc, url = _server(clone, env, log)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _wait_health(url, proc)
            out["server_answers_s"] = time.perf_counter() - t0
            _say(f"server answers: {out['server_answers_s']:.1f} s")
            page.goto(url)
            model = page.get_by_role("heading", name="MUNKEY model")
            data = page.get_by_role("heading", name="The data the model trains on")
            while True:  # the first usable screen: the model card, or the progress and the dataset browser
                if model.count() and page.get_by_role("heading", name="Model card").count():
                    out["usable_s"], out["usable_what"] = time.perf_counter() - t0, "model card (trained run)"
                    _say(f"usable Overview: {out['usable_s']:.1f} s ({out['usable_what']})")
                    break
                grid = page.locator("[data-testid=stImage] img")
                if data.count() and grid.count() and page.locator("[data-testid=stProgress]").count() + \
                        page.get_by_role("button", name="Train the demo run").count():
                    grid.first.wait_for(state="visible")
                    out["usable_s"] = time.perf_counter() - t0
                    out["usable_what"] = "training progress + dataset browser (no run yet)"
                    _say(f"usable Overview: {out['usable_s']:.1f} s ({out['usable_what']})")
                    break
                if time.perf_counter() - t0 > limit_s:
                    raise RuntimeError("no usable Overview within the limit")
                page.wait_for_timeout(200)
            page.screenshot(path=str(log.parent / f"{log.stem}_first_screen.png"))
            if usable_only:
                browser.close()
                return out
            if token and model.count() == 0:
                cred = page.get_by_label("Operator credential (training writes the run folder)")
                cred.fill(TOKEN)
                cred.press("Enter")
                button = page.get_by_role("button", name="Train the demo run")
                while button.is_disabled():
                    page.wait_for_timeout(200)
                button.click()
                out["clicked_train_s"] = time.perf_counter() - t0
                _say(f"operator clicked 'Train the demo run' at {out['clicked_train_s']:.1f} s")
            while model.count() == 0:
                if time.perf_counter() - t0 > limit_s:
                    raise RuntimeError("the model was not ready within the limit")
                bar = page.locator("[data-testid=stProgress]")
                if bar.count():
                    text = bar.first.inner_text()
                    m = re.search(r"(\d+)% .*?about (\d+) min (\d+) s left", text)
                    if m:
                        out["eta_samples"].append((time.perf_counter() - t0, int(m.group(1)),
                                                   60 * int(m.group(2)) + int(m.group(3))))
                        if len(out["eta_samples"]) % 30 == 1:
                            _say(f"  at {out['eta_samples'][-1][0]:.0f} s: {text.strip()}")
                    elif "first epoch" in text:
                        out.setdefault("first_progress_s", time.perf_counter() - t0)
                page.wait_for_timeout(2000)
            page.get_by_role("heading", name="Model card").wait_for(timeout=120_000)
            out["model_ready_s"] = time.perf_counter() - t0
            _say(f"model ready (Overview's model card): {out['model_ready_s']:.1f} s")
            page.screenshot(path=str(log.parent / f"{log.stem}_model_ready.png"))
            assert page.locator("[data-testid=stException]").count() == 0, "a page raised"
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def _say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--installer", action="store_true", help="time scripts/demo_run.sh (the installer's demo-run "
                    "step) in the clone first")
    ap.add_argument("--run", type=Path, help="copy this trained demo run into the clone's runs/demo first (what the "
                    "installer's step leaves), instead of training it")
    ap.add_argument("--usable-only", action="store_true", help="stop at the usable Overview (no waiting for training)")
    ap.add_argument("--repeats", type=int, default=1, help="fresh clones measured one after the other")
    ap.add_argument("--token", action="store_true", help="start with an operator credential (README's command)")
    ap.add_argument("--warm-keys", action="store_true", help="keep the user's key cache (default: an empty one)")
    ap.add_argument("--profile", default="cpu", help="the demo run's profile (default cpu, the dashboard's; tiny: a "
                    "quick check of this script)")
    ap.add_argument("--limit", type=float, default=3600, help="seconds before giving up")
    ap.add_argument("--out", type=Path, help="keep the clone, server log and screenshots here")
    args = ap.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="munkey-first-start-"))
    work.mkdir(parents=True, exist_ok=True)
    head = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], text=True).strip()
    flags = " ".join(a for a, on in (("--installer", args.installer), ("--token", args.token),
                                     ("--warm-keys", args.warm_keys), (f"--profile {args.profile}",
                                                                       args.profile != "cpu"),
                                     (f"--run {args.run}", args.run is not None), ("--usable-only", args.usable_only),
                                     (f"--repeats {args.repeats}", args.repeats != 1)) if on)
    _say(f"$ .venv/bin/python scripts/bench_first_start.py {flags}".rstrip())
    usable = []
    for rep in range(args.repeats):
        load0 = os.getloadavg()[0]
        result = _one(args, work / f"rep{rep}")
        usable.append(result["usable_s"])
        _say(f"repeat {rep + 1}: clone of {head}, {os.cpu_count()} CPUs, load average (1 min) {load0:.2f} before, "
             f"{os.getloadavg()[0]:.2f} after; key cache {'warm' if args.warm_keys else 'empty'}; files in {work}")
    if args.repeats > 1:
        _say(f"usable Overview over {args.repeats} fresh clones: median {sorted(usable)[len(usable) // 2]:.1f} s, "
             f"min {min(usable):.1f} s, max {max(usable):.1f} s")
    return 0


def _one(args: argparse.Namespace, work: Path) -> dict:
    """One fresh clone, started and measured; prints each milestone."""
    work.mkdir(parents=True, exist_ok=True)
    clone = work / "clone"
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.check_call(["git", "clone", "--quiet", str(ROOT), str(clone)])
    (clone / ".venv").symlink_to((ROOT / ".venv").resolve())
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUNKEY_")}
    env.update(PYTHONPATH=str(clone), HF_HUB_OFFLINE="1")  # the clone's code, not the venv's editable install
    if not args.warm_keys:
        env["MUNKEY_CACHE"] = str(work / "empty-key-cache")
    if args.token:
        env["MUNKEY_OPERATOR_TOKEN"] = TOKEN
    if args.profile != "cpu":
        env["MUNKEY_PROFILE"] = args.profile
    result: dict = {}
    if args.run is not None:
        shutil.copytree(args.run, clone / "runs" / "demo")
    if args.installer:
        t0 = time.perf_counter()
        subprocess.check_call(["bash", "scripts/demo_run.sh"], cwd=clone, env=env)
        result["installer_demo_run_s"] = time.perf_counter() - t0
        _say(f"installer's demo-run step (scripts/demo_run.sh): {result['installer_demo_run_s']:.1f} s")
    result.update(measure(clone, env, work / "server.log", args.token, args.limit, args.usable_only))
    if args.usable_only or "model_ready_s" not in result:
        return result
    end = result["model_ready_s"]
    for t, pct, left in result["eta_samples"][:: max(1, len(result["eta_samples"]) // 8)]:
        _say(f"  at {t:6.1f} s: {pct:3d}% shown, {left:4d} s left shown, {end - t:6.1f} s left in fact")
    if result.get("usable_what", "").startswith("training"):
        _say("second start, the run now present (what the dashboard's first start is after the installer's step):")
        measure(clone, env, work / "server2.log", False, args.limit, usable_only=True)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
