"""The copy search on the pages follows deletions (streamlit.testing's AppTest, real tiny digits run): the
thresholds the page holds in memory are re-derived without a deleted image, whichever process deleted it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from munkey_core.run import copycache
from munkey_core.service import MunkeyRun

APP = Path(__file__).resolve().parents[2] / "app.py"


def _png(img: np.ndarray, side: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img[..., 0]).resize((side, side), Image.Resampling.BICUBIC).save(buf, format="PNG")
    return buf.getvalue()


def test_after_a_deletion_elsewhere_the_page_uses_thresholds_without_the_deleted_image(
        tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sorted((tiny_run / copycache.CACHE_DIR).glob("thresholds-*.json"))[0]
    key = path.stem[len("thresholds-"):]
    saved = json.loads(path.read_text())["calibration"]
    victim = int(saved["set_by"][0])  # a training image that set a threshold
    train = MunkeyRun(tiny_run, device="cpu").dataset.train
    upload = _png(train.images[int(np.flatnonzero(train.ids == victim)[0])], 64)

    monkeypatch.setenv("MUNKEY_RUN", str(tiny_run))
    monkeypatch.delenv("MUNKEY_OPERATOR_TOKEN", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page("pages/deletions.py").run()
    at.radio(key="method").set_value("Similar to an image").run()
    at.file_uploader(key="query_images").set_value(("me.png", upload, "image/png")).run()
    assert not at.exception, [e.value for e in at.exception]
    assert f"Exact match found: training id {victim}" in at.success[0].value
    assert at.multiselect(key="similar_pick").value == [victim]

    MunkeyRun(tiny_run, device="cpu").forget([victim], operator="another process")  # e.g. `munkey forget`
    assert copycache.read_thresholds(tiny_run, key) is None  # purged: its thresholds may rest on the victim
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    # the page re-derived its thresholds without the deleted image (and wrote them back to the run) ...
    cal = copycache.read_thresholds(tiny_run, key)
    assert cal is not None and victim not in cal["set_by"] and victim not in {r[3] for r in cal["records"]}
    message = at.success[0].value
    assert f"training id {victim}" in message and "already deleted" in message
    assert f"threshold {cal['threshold']:.3f}" in message
    # ... and the deleted image is not proposed for deletion again
    assert victim not in at.multiselect(key="similar_pick").options
