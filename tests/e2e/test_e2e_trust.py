"""Issue 14 in a real browser: copies of training images found first at any size, out-of-distribution
warnings, the deletion confirmation that resets, Delete locked during a job, and no "None"/"nan".

A real `streamlit run app.py` on a copy of the tiny digits run, driven by Chromium through Playwright
(same skip rules as tests/e2e/test_e2e.py).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from munkey_core.data.datasets import load_dataset
from munkey_core.run.rows import load_bank

from _browser import ARGS, CHROMIUM, NO_CHROMIUM, idle, sign_in_as_operator, streamlit_server

sync_playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed "
                                      "(pip install playwright)").sync_playwright
pytestmark = NO_CHROMIUM
PAGES = [("Overview", "MUNKEY model"), ("Case evidence", "Case evidence"), ("Samples", "Samples"),
         ("Deletion requests", "Deletion requests"),
         ("Class unlearning", "Class unlearning"), ("Audit log", "Audit log"), ("Embeddings", "Embeddings")]
BAD_WORDS = re.compile(r"\b(None|nan|NaN)\b")


@pytest.fixture
def server(tiny_run: Path, tmp_path: Path):
    with streamlit_server(tiny_run, tmp_path) as url:
        yield url


def _copies(tiny_run: Path, tmp_path: Path) -> tuple[int, Path, Path]:
    """A training sample still in the bank, as a 64x64 bicubic enlargement (PNG) and a 3x JPEG (q 85)."""
    train = load_dataset("digits", seed=0).train
    sid = int(load_bank(tiny_run).ids[42])
    img = train.images[int(np.flatnonzero(train.ids == sid)[0]), ..., 0]
    png, jpg = tmp_path / "my_photo.png", tmp_path / "my_photo.jpg"
    Image.fromarray(img).resize((64, 64), Image.Resampling.BICUBIC).save(png)
    Image.fromarray(img).resize((24, 24), Image.Resampling.LANCZOS).save(jpg, quality=85)
    return sid, png, jpg


def _ood(tmp_path: Path) -> Path:
    """A colourful photo-like image nothing like a digit."""
    rng = np.random.default_rng(3)
    x = np.linspace(0, 1, 160)
    rgb = np.stack([np.outer(x, 1 - x), np.outer(1 - x, x), np.outer(x, x)], axis=-1) * 255
    rgb = np.clip(rgb + rng.normal(0, 40, rgb.shape), 0, 255).astype(np.uint8)
    path = tmp_path / "holiday.png"
    Image.fromarray(rgb).save(path)
    return path


def _goto(page, link: str, heading: str) -> None:
    page.get_by_role("link", name=link).click()
    page.get_by_role("heading", name=heading).wait_for(timeout=90_000)
    idle(page)


def _no_bad_words(page, where: str) -> None:
    text = page.locator("[data-testid=stMain]").inner_text()
    assert not BAD_WORDS.search(text), f"{where}: {BAD_WORDS.search(text).group(0)!r} in: ...{text[max(0, BAD_WORDS.search(text).start() - 80):BAD_WORDS.search(text).end() + 40]}..."
    assert page.locator("[data-testid=stException]").count() == 0, where


def _overlap(a, b) -> bool:
    return a[0] < b[0] + b[2] - 1 and b[0] < a[0] + a[2] - 1 and a[1] < b[1] + b[3] - 1 and b[1] < a[1] + a[3] - 1


def _no_overlap(page, where: str) -> None:
    """No two images, and no image and caption, overlap in the main area, and none runs off it."""
    def boxes(selector: str) -> list:
        return page.locator(f"[data-testid=stMain] {selector}").evaluate_all(
            "els => els.filter(e => e.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}) && "
            "(e.tagName === 'IMG' || e.innerText.trim() !== ''))"  # not the content of a closed expander
            ".map(e => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })"
            ".filter(b => b[2] > 0 && b[3] > 0)")
    imgs, caps = boxes("[data-testid=stImage] img"), boxes("[data-testid=stCaptionContainer]")
    assert imgs, where
    assert not any(_overlap(a, b) for i, a in enumerate(imgs) for b in imgs[i + 1:]), (where, imgs)
    assert not any(_overlap(a, c) for a in imgs for c in caps), (where, imgs, caps)
    main = page.locator("[data-testid=stMain]").bounding_box()
    assert all(b[0] + b[2] <= main["x"] + main["width"] + 1 for b in imgs + caps), where


def test_copies_ood_confirmation_lock_and_no_none(server: str, tiny_run: Path, tmp_path: Path) -> None:
    sid, png, jpg = _copies(tiny_run, tmp_path)
    ood = _ood(tmp_path)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server)
        page.get_by_role("heading", name="MUNKEY model").wait_for(timeout=120_000)
        idle(page)

        # Case evidence: both copies are found first, the out-of-distribution image is flagged
        _goto(page, "Case evidence", "Case evidence")
        page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files([str(png), str(jpg), str(ood)])
        page.get_by_text(re.compile("^Exact match found")).first.wait_for(timeout=300_000)
        idle(page, 300_000)
        page.get_by_text(re.compile("^Similar training cases")).nth(2).wait_for(timeout=120_000)  # all three drawn
        found = page.get_by_text(f"Exact match found: training id {sid} ")
        assert found.count() == 2, page.locator("[data-testid=stMain]").inner_text()[:3000]
        assert page.get_by_text("far from every training case").count() >= 1
        assert page.get_by_text("no confident answer").count() >= 1
        assert page.get_by_text(re.compile(r"\d+ of \d+ similar training cases are")).count() >= 2
        page.get_by_text("your image").nth(2).wait_for(timeout=60_000)  # each query beside its closest training image
        _no_bad_words(page, "Case evidence")

        # Deletion requests: both copies (resized PNG, JPEG) are found, the sample is proposed first and
        # preselected (and only it); 800 px wide, the uploads, candidates and their captions do not overlap
        page.set_viewport_size({"width": 800, "height": 1000})
        _goto(page, "Deletion requests", "Deletion requests")
        page.get_by_text("Similar to an image").click()
        idle(page)
        page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files([str(png), str(jpg)])
        page.get_by_text(f"Exact match found: training id {sid} ").first.wait_for(timeout=180_000)
        idle(page, 300_000)
        assert page.get_by_text(f"Exact match found: training id {sid} ").count() == 2
        select = page.locator("[data-testid=stMultiSelect]")
        select.get_by_text(f"{sid} (copy of your image").wait_for(timeout=60_000)  # preselected: shown as a tag
        assert select.get_by_text("(similar,").count() == 0  # the look-alikes are offered, not preselected
        page.get_by_text("your image: my_photo.png").wait_for(timeout=10_000)
        page.get_by_text("your image: my_photo.jpg").wait_for(timeout=10_000)
        cands = page.locator("[data-testid=stCaptionContainer]").filter(has_text=re.compile(r"^id \d+ ·"))
        first = cands.first.inner_text()
        assert first.startswith(f"id {sid} ·") and "copy (" in first, first
        _no_overlap(page, "Deletion requests at 800 px")
        page.set_viewport_size({"width": 1400, "height": 1000})
        _no_bad_words(page, "Deletion requests (similar)")

        # the confirmation resets when the selection changes
        page.get_by_text("Type ids").click()
        idle(page)
        ids = [int(i) for i in load_bank(tiny_run).ids[:3]]
        area = page.get_by_label("Sample ids (commas, spaces or new lines)")
        area.fill(", ".join(map(str, ids)))
        area.press("Control+Enter")
        idle(page)
        sign_in_as_operator(page)
        box = page.get_by_role("checkbox", name=re.compile("I confirm the deletion"))
        page.get_by_text("I confirm the deletion of 3 training sample(s)").click()
        idle(page)
        assert box.is_checked()
        area.fill(", ".join(map(str, ids[:2])))
        area.press("Control+Enter")
        page.get_by_text("I confirm the deletion of 2 training sample(s)").wait_for(timeout=60_000)
        idle(page)
        assert not page.get_by_role("checkbox", name=re.compile("I confirm the deletion")).is_checked()
        assert page.get_by_role("button", name="Delete 2 sample(s)").is_disabled()

        # Delete is locked while the job runs; the progress is at the top; the box is unticked after
        page.get_by_text("I confirm the deletion of 2 training sample(s)").click()
        idle(page)
        page.get_by_role("button", name="Delete 2 sample(s)").click()
        page.get_by_text("Delete is locked until it ends").wait_for(timeout=60_000)
        assert page.get_by_role("button", name=re.compile(r"Delete \d+ sample")).is_disabled()
        status = page.get_by_text(re.compile("Deleting and measuring")).first.bounding_box()
        delete_btn = page.get_by_role("button", name=re.compile(r"Delete \d+ sample")).bounding_box()
        assert status is not None and delete_btn is not None and status["y"] < delete_btn["y"]
        page.get_by_text("Retrieval check passed").wait_for(timeout=300_000)
        idle(page)
        assert not page.get_by_role("checkbox", name=re.compile("I confirm the deletion")).is_checked()
        assert page.get_by_text(re.compile(r"Verdict: (forgotten|not yet|cannot tell)")).count() == 1
        _no_bad_words(page, "Deletion requests (after a deletion)")

        # an uploaded ids file with an id from the test split: named with its split, and droppable
        test_id = int(load_dataset("digits", seed=0).test.ids[0])
        csv = tmp_path / "request.csv"
        csv.write_text(f"id\n{ids[2]}\n{test_id}\n")
        page.get_by_text("Upload an ids file").click()
        idle(page)
        page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files([str(csv)])
        page.get_by_text(f"{test_id} is in the test split").wait_for(timeout=60_000)
        page.get_by_role("button", name=re.compile("Drop the 1 id")).click()
        page.get_by_text("were dropped from this request").wait_for(timeout=60_000)
        idle(page)
        metric = page.locator("[data-testid=stMetric]").filter(has_text="Cannot be deleted")
        assert metric.locator("[data-testid=stMetricValue]").inner_text().strip() == "0"
        assert page.get_by_text(f"{test_id} is in the test split").count() == 0
        assert page.get_by_role("button", name="Delete 1 sample(s)").count() == 1

        # 800 px wide: the query image, the prediction and the thumbnails do not overlap (element boxes)
        page.set_viewport_size({"width": 800, "height": 1000})
        _goto(page, "Case evidence", "Case evidence")
        page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files([str(png)])
        page.get_by_text(re.compile("^Exact match found")).first.wait_for(timeout=300_000)
        idle(page, 300_000)
        page.get_by_text("query", exact=True).wait_for(timeout=60_000)
        boxes = page.locator("[data-testid=stImage] img").evaluate_all(
            "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })")
        metric = page.locator("[data-testid=stMetric]").first.bounding_box()
        assert len(boxes) >= 3 + 4  # your image, its match, the query, the K=4 cases

        m = [metric["x"], metric["y"], metric["width"], metric["height"]]
        assert not any(_overlap(b, m) for b in boxes), (boxes, m)
        _no_overlap(page, "Case evidence at 800 px")
        page.set_viewport_size({"width": 1400, "height": 1000})

        # no None / nan on any page
        for link, heading in PAGES:
            _goto(page, link, heading)
            if link == "Overview":
                page.get_by_text("Forgetting verdict").wait_for(timeout=120_000)
            _no_bad_words(page, link)
        browser.close()
