"""Screenshots of every dashboard page from a real `streamlit run app.py` in Chromium (Playwright).

Same skip rules as tests/e2e/test_e2e.py. Visits Overview, Case evidence (an uploaded digit with its
neighbours), Deletion requests (a preview), Audit log, Samples (the low-confidence ones) and Embeddings (both
maps, a lasso selection with its thumbnails, then a hover image) and saves a full-page PNG of each.

- PNGs go to a temporary folder, or to docs/screenshots/<page>.png when MUNKEY_SCREENSHOTS=1
  (so CI never rewrites the repository).
- The run is a copy of the session's tiny run, or of MUNKEY_SCREENSHOT_RUN when set (the docs'
  screenshots: MUNKEY_SCREENSHOTS=1 MUNKEY_SCREENSHOT_RUN=runs/digits_cpu); the source is never changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from munkey_core.run.rows import load_bank

from _browser import ARGS, CHROMIUM, NO_CHROMIUM, ROOT, digit_png, hover_image_tooltip, idle, streamlit_server
WIDTH, HEIGHT = 1400, 1000

_pw = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
sync_playwright, PlaywrightTimeout = _pw.sync_playwright, _pw.TimeoutError
pytestmark = NO_CHROMIUM


@pytest.fixture
def screens_run(request: pytest.FixtureRequest, tmp_path: Path):
    """A private copy of MUNKEY_SCREENSHOT_RUN, else the tiny run (copied by its fixture)."""
    src = os.environ.get("MUNKEY_SCREENSHOT_RUN")
    if not src:
        yield request.getfixturevalue("tiny_run")
        return
    # inside the repository (runs/ is git-ignored) so the pages show a relative run path
    dest = ROOT / "runs" / f"screenshots-{tmp_path.name}"
    shutil.copytree(Path(src).expanduser().resolve(), dest)
    yield dest
    shutil.rmtree(dest, ignore_errors=True)


@pytest.fixture
def shots_dir(tmp_path: Path) -> Path:
    out = ROOT / "docs" / "screenshots" if os.environ.get("MUNKEY_SCREENSHOTS") == "1" else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def server(screens_run: Path, tmp_path: Path):
    with streamlit_server(screens_run, tmp_path) as url:
        yield url


def _shoot(page, path: Path) -> None:
    """A full-page PNG: Streamlit scrolls inside its main container, not the document, so the viewport
    is grown to the content's height for the shot and restored afterwards."""
    idle(page)
    page.mouse.move(1, 1)  # no hover label or chart toolbar in the shot
    page.wait_for_timeout(800)  # charts finish their transitions
    height = page.evaluate("""() => {
        const main = document.querySelector('[data-testid=stMain]') || document.scrollingElement;
        return Math.max(main.scrollHeight, document.scrollingElement.scrollHeight);
    }""")
    page.set_viewport_size({"width": WIDTH, "height": max(HEIGHT, int(height) + 40)})
    page.wait_for_timeout(600)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    assert page.locator("[data-testid=stException]").count() == 0, f"exception on {path.stem}"


def _goto(page, link: str, heading: str) -> None:
    page.get_by_role("link", name=link).click()
    page.get_by_role("heading", name=heading).wait_for(timeout=60_000)
    idle(page)


def _lasso(page, plot, whole: bool = False) -> None:
    """Drag a lasso over part of a plotly chart (its drag mode is lasso), or around all of it."""
    box = plot.locator(".nsewdrag").first.bounding_box()
    cx, cy, w, h = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, box["width"], box["height"]
    pts = ([(cx - 0.3 * w, cy - 0.3 * h), (cx + 0.05 * w, cy - 0.35 * h), (cx + 0.1 * w, cy + 0.1 * h),
            (cx - 0.25 * w, cy + 0.15 * h)] if not whole else
           [(cx - 0.49 * w, cy - 0.49 * h), (cx + 0.49 * w, cy - 0.49 * h), (cx + 0.49 * w, cy + 0.49 * h),
            (cx - 0.49 * w, cy + 0.49 * h)])
    pts.append(pts[0])
    page.mouse.move(*pts[0])
    page.mouse.down()
    for a, b in zip(pts, pts[1:]):
        for t in np.linspace(0, 1, 8)[1:]:
            page.mouse.move(a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]))
    page.mouse.up()


def test_screenshots_of_every_page(server: str, screens_run: Path, shots_dir: Path, tmp_path: Path) -> None:
    png = digit_png(tmp_path / "digit.png")
    bank_ids = load_bank(screens_run).ids
    forgotten_file = screens_run / "forgotten.json"
    forgotten = json.loads(forgotten_file.read_text())["ids"] if forgotten_file.exists() else []
    request = [int(i) for i in bank_ids[:7]] + [int(i) for i in forgotten[:1]]  # one deleted earlier, if any
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        page.goto(server)
        page.get_by_role("heading", name="MUNKEY model").wait_for(timeout=120_000)
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        _shoot(page, shots_dir / "overview.png")

        _goto(page, "Case evidence", "Case evidence")
        page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files([str(png)])
        page.get_by_text(re.compile("^Similar training cases")).wait_for(timeout=90_000)
        page.get_by_text("Expert view: ids, weights and votes").first.click()  # the chart is in the expert view
        page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
        _shoot(page, shots_dir / "evidence.png")

        _goto(page, "Deletion requests", "Deletion requests")
        area = page.get_by_label("Sample ids (commas, spaces or new lines)")
        area.fill(", ".join(map(str, request)))
        area.press("Control+Enter")
        page.get_by_text("Preview").first.wait_for(timeout=60_000)
        _shoot(page, shots_dir / "deletions.png")

        _goto(page, "Class unlearning", "Class unlearning")
        page.get_by_role("button", name="Run the request").click()
        page.get_by_text("Result: class").wait_for(timeout=180_000)
        page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
        _shoot(page, shots_dir / "class_unlearning.png")

        _goto(page, "Audit log", "Audit log")
        _shoot(page, shots_dir / "audit.png")

        _goto(page, "Samples", "Samples")
        page.get_by_text("Low confidence only").click()  # (a trained run gets almost no training sample wrong)
        idle(page)
        _shoot(page, shots_dir / "samples.png")

        _goto(page, "Embeddings", "Embeddings")
        page.get_by_text("Draw a lasso or a box").wait_for(timeout=240_000)  # cold UMAP: tens of seconds
        plots = page.locator(".js-plotly-plot")
        plots.nth(1).wait_for(timeout=30_000)
        _shoot(page, shots_dir / "embeddings.png")
        _lasso(page, plots.first)
        try:
            page.get_by_text("Selected:").wait_for(timeout=30_000)
        except PlaywrightTimeout:  # the partial lasso caught no point on this run's map: take them all
            _lasso(page, plots.first, whole=True)
            page.get_by_text("Selected:").wait_for(timeout=60_000)
        _shoot(page, shots_dir / "embeddings_selection.png")
        page.get_by_text("Images on hover").click()
        chart = page.locator("[data-testid=stVegaLiteChart]").first
        chart.wait_for(timeout=60_000)
        idle(page)
        assert hover_image_tooltip(page, chart)
        page.screenshot(path=str(shots_dir / "embeddings_hover.png"))  # the viewport: the tooltip stays
        browser.close()
    for name in ("overview", "evidence", "deletions", "class_unlearning", "audit", "samples", "embeddings",
                 "embeddings_selection", "embeddings_hover"):
        assert (shots_dir / f"{name}.png").stat().st_size > 10_000, name
