"""Shared by the browser tests: Chromium discovery, a real `streamlit run app.py` server, page helpers."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MUNKEY_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "e2e-operator-token"
NO_CHROMIUM = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (apt-get install chromium, "
                                 "or set MUNKEY_CHROMIUM to one)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(run: Path, log_dir: Path) -> Iterator[str]:
    """`streamlit run app.py` on a free loopback port for `run` (operator token TOKEN); yields its URL."""
    port = free_port()
    env = {**os.environ, "MUNKEY_RUN": str(run), "MUNKEY_OPERATOR_TOKEN": TOKEN}
    log_path = log_dir / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail("streamlit did not start: " + log_path.read_text()[-2000:])
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def digit_png(path: Path) -> Path:
    """A real digits test image, enlarged to 40x40 (another size than the training data), as PNG."""
    from sklearn.datasets import load_digits

    img = np.rint(load_digits().images[1700] * 255 / 16).astype(np.uint8)
    Image.fromarray(img).resize((40, 40)).save(path)
    return path


def idle(page, timeout_ms: int = 180_000) -> None:
    """Wait until the script run finished (Streamlit shows its status widget while running)."""
    page.wait_for_timeout(400)
    page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=timeout_ms)


def click_until_shown(page, button, text: str, tries: int = 2, timeout_ms: int = 30_000) -> None:
    """Click `button` until `text` shows, at most `tries` times: only for idempotent actions (tagging the
    same ids twice changes nothing). A click that lands while Streamlit swaps the element out can be
    lost on a loaded machine; the assertions after it still check what the click did. Each miss reports the
    page's text (a warning when it tries again, the failure's message after the last try), so a flake
    in CI says what the page showed instead."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        step = "the click"
        try:
            button.click(timeout=timeout_ms)
            step = "the confirmation"
            page.get_by_text(text).wait_for(timeout=timeout_ms)
            return
        except PlaywrightTimeout:  # the button or the confirmation did not show; the page's text says why
            shown = " ".join(page.inner_text("body").split())[-1500:]
            what = f"{text!r}: {step} timed out ({timeout_ms // 1000} s) on try {attempt + 1} of {tries}"
            if attempt == tries - 1:
                pytest.fail(f"{what}; the page ended with: {shown}")
            warnings.warn(f"{what} (trying again); the page ended with: {shown}")
            idle(page)


def sign_in_as_operator(page, name: str = "E2E operator") -> None:
    """On the Deletion requests page: type the operator credential and the operator's name."""
    cred = page.get_by_label("Operator credential")
    cred.fill(TOKEN)
    cred.press("Enter")
    idle(page)
    who = page.get_by_label("Operator name (recorded in the audit log)")
    who.fill(name)
    who.press("Enter")
    idle(page)


def hover_image_tooltip(page, chart) -> str:
    """Move the mouse over the left half of a Vega-Lite chart until Vega's tooltip shows an image; returns
    the tooltip's HTML ('' when no point showed one)."""
    box = chart.bounding_box()
    tip = page.locator("#vg-tooltip-element")
    for y in range(30, int(box["height"]) - 30, 10):
        for x in range(10, int(box["width"] / 2), 10):
            page.mouse.move(box["x"] + x, box["y"] + y)
            page.wait_for_timeout(10)
            if tip.count() and tip.is_visible() and "<img" in tip.inner_html():
                return tip.inner_html()
    return ""
