"""End to end: a real `streamlit run app.py` server driven by Chromium through Playwright.

Skipped when Playwright (`pip install playwright`) or a Chromium binary (Debian: `apt-get install
chromium`, or set MUNKEY_CHROMIUM) is missing. Covers what AppTest cannot: the real server, the
browser upload path, and the page layout actually rendering.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from munkey_core.run.rows import load_bank

from _browser import (ARGS, CHROMIUM, NO_CHROMIUM, click_until_shown, digit_png, hover_image_tooltip, idle,
                      sign_in_as_operator, streamlit_server)

sync_playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed "
                                      "(pip install playwright)").sync_playwright
pytestmark = NO_CHROMIUM


@pytest.fixture
def server(tiny_run: Path, tmp_path: Path):
    with streamlit_server(tiny_run, tmp_path) as url:
        yield url


def test_browser_evidence_and_deletion(server: str, tiny_run: Path, tmp_path: Path) -> None:
    png = digit_png(tmp_path / "digit.png")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server)
        page.get_by_role("heading", name="MUNKEY model").wait_for(timeout=90_000)
        assert page.locator("[data-testid=stException]").count() == 0

        # evidence: a good and a corrupt upload
        page.get_by_role("link", name="Case evidence").click()
        page.get_by_role("heading", name="Case evidence").wait_for(timeout=60_000)
        page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files([str(png),
                                                                                  str(tmp_path / "broken.png")])
        page.get_by_text(re.compile("^Similar training cases")).wait_for(timeout=60_000)
        idle(page)
        assert page.locator("[data-testid=stAlertContentError]").filter(has_text="broken.png").count() == 1
        assert page.locator("[data-testid=stMetricLabel]").filter(has_text="Prediction").count() == 1
        page.get_by_text("Expert view: ids, weights and votes").first.click()  # the chart is in the expert view
        page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)  # the contributions chart (slow under load)
        page.screenshot(path=str(tmp_path / "evidence.png"))

        # deletion as the operator
        bank0 = load_bank(tiny_run)
        ids = [int(i) for i in bank0.ids[:4]]
        page.get_by_role("link", name="Deletion requests").click()
        page.get_by_role("heading", name="Deletion requests").wait_for(timeout=60_000)
        area = page.get_by_label("Sample ids (commas, spaces or new lines)")
        area.fill(", ".join(map(str, ids)))
        area.press("Control+Enter")
        idle(page)
        page.get_by_text("Preview").wait_for(timeout=30_000)
        sign_in_as_operator(page)
        page.get_by_text("I confirm the deletion of 4 training sample(s)").click()
        idle(page)
        page.get_by_role("button", name="Delete 4 sample(s)").click()
        page.get_by_text("Retrieval check passed").wait_for(timeout=120_000)
        idle(page)
        assert page.locator("[data-testid=stException]").count() == 0
        # FA on the deleted samples is reported after the deletion, and the receipt is offered
        assert page.get_by_text("FA after =").count() >= 1
        page.get_by_role("button", name="Download receipt (JSON)").wait_for(timeout=60_000)  # drawn last
        assert page.get_by_role("button", name="Download receipt (JSON)").count() == 1
        assert page.get_by_role("button", name="Download receipt (HTML)").count() == 1
        page.screenshot(path=str(tmp_path / "deleted.png"))

        # a viewer (no credential) can preview but not delete
        viewer = browser.new_page(viewport={"width": 1400, "height": 1000})
        viewer.goto(server)
        viewer.get_by_role("heading", name="MUNKEY model").wait_for(timeout=90_000)
        viewer.get_by_role("link", name="Deletion requests").click()
        viewer.get_by_role("heading", name="Deletion requests").wait_for(timeout=60_000)
        others = [int(i) for i in load_bank(tiny_run).ids[:2]]
        area = viewer.get_by_label("Sample ids (commas, spaces or new lines)")
        area.fill(", ".join(map(str, others)))
        area.press("Control+Enter")
        idle(viewer)
        viewer.get_by_text("Preview").wait_for(timeout=30_000)
        assert viewer.get_by_role("button", name="Delete 2 sample(s)").is_disabled()
        browser.close()
    bank1 = load_bank(tiny_run)
    assert len(bank1) == len(bank0) - 4 and not set(ids) & set(bank1.ids.tolist())


def test_browser_samples_tags_and_embeddings_hover_image(server: str, tiny_run: Path) -> None:
    """Samples: the wrong ones tagged 'review' in the browser land in tags.json and filter the grid back.
    Embeddings, images on hover: pointing at a point of the map shows its thumbnail in Vega's tooltip."""
    import time

    from munkey_core.run.tags import read_tags

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server)
        page.get_by_role("heading", name="MUNKEY model").wait_for(timeout=90_000)

        page.get_by_role("link", name="Samples").click()
        page.get_by_role("heading", name="Samples").wait_for(timeout=60_000)
        idle(page)
        page.get_by_text("Wrong only").click()
        idle(page)
        shown = page.get_by_text(re.compile(r"^Showing \d+ of \d+ matching the filter"))
        n_wrong = int(re.match(r"Showing (\d+)", shown.inner_text()).group(1))
        page.get_by_text("Tags and saved views").click()
        tag = page.get_by_label("Tag", exact=True)
        tag.fill("review")
        tag.press("Enter")
        idle(page)
        click_until_shown(page, page.get_by_role("button", name=f"Tag {n_wrong}", exact=True),
                          f"Tagged {n_wrong} sample(s) 'review'.")
        assert len(read_tags(tiny_run).tags["review"]) == n_wrong
        page.get_by_text("Wrong only").click()  # off again: all samples, then only those tagged review
        idle(page)
        assert page.get_by_text(re.compile(rf"tagged 'review'")).count() >= 1
        assert page.locator("[data-testid=stException]").count() == 0
        page.get_by_role("link", name="Embeddings").click()
        page.locator(".js-plotly-plot").first.wait_for(timeout=300_000)  # the first UMAP fit (numba compiles)
        idle(page)
        t0 = time.perf_counter()
        page.get_by_text("Images on hover").click()
        chart = page.locator("[data-testid=stVegaLiteChart]").first
        chart.wait_for(timeout=60_000)
        idle(page)
        print(f"hover maps drawn {time.perf_counter() - t0:.1f} s after the click")  # a figure, not a check
        assert page.locator("[data-testid=stException]").count() == 0
        html = hover_image_tooltip(page, chart)
        tip = page.locator("#vg-tooltip-element")
        assert 'src="data:image/png;base64,' in html and ">id<" in html and ">label<" in html, html[:300]
        assert tip.locator("img").evaluate("img => img.naturalWidth") == 32  # the image decoded and shows
        browser.close()
