"""The Embeddings page through streamlit.testing's AppTest, against a tiny digits run with deletions.

A browser's lasso cannot be drawn here, so the selection is injected the way Streamlit stores it
(the chart's widget state: {"selection": {"points": [...]}}), with points taken from the figure the
page actually drew.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from munkey_core.service import MunkeyRun

APP = Path(__file__).resolve().parents[2] / "app.py"
TIMEOUT = 90


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One torch thread: when other processes share the 2 cores, torch's 2 OpenMP threads stall at
    every barrier (see munkey_core/keys.py; measured here: 447 s instead of 16 s for the
    tests' fixtures). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _open_embeddings(monkeypatch: pytest.MonkeyPatch, run: Path) -> AppTest:
    """Open the page with a small cap (100 points) and rerun until the background job has drawn both maps."""
    monkeypatch.setenv("MUNKEY_RUN", str(run))
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.session_state["emb_max_points"] = 100
    at.run()
    at.switch_page("pages/embeddings.py").run()
    assert not at.exception, [e.value for e in at.exception]
    deadline = time.time() + TIMEOUT
    while len(at.get("plotly_chart")) < 2:
        assert not at.error, [e.value for e in at.error]
        assert time.time() < deadline, "the maps were not computed in time"
        time.sleep(0.5)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def test_embeddings_page_draws_both_maps_and_hands_a_selection_to_deletions(
        tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    gone = [int(i) for i in run.bank.ids[::50][:8]]
    run.forget(gone)
    del run

    at = _open_embeddings(monkeypatch, tiny_run)
    assert at.title[0].value == "Embeddings"
    assert any("108 of" in c.value and "8 of them deleted" in c.value for c in at.caption)  # 100 fitted + 8 deleted
    assert any("Draw a lasso" in i.value for i in at.info)
    cls_fig, ex_fig = _figures(at)
    # the [CLS] map ends with the deleted samples as crosses; the exemplar map has none of them
    crosses = cls_fig["data"][-1]
    assert crosses["marker"]["symbol"].startswith("x")
    assert sorted(int(c[0]) for c in crosses["customdata"]) == sorted(gone)
    ex_ids = {int(c[0]) for t in ex_fig["data"] for c in t.get("customdata", [])}
    cls_ids = {int(c[0]) for t in cls_fig["data"] for c in t["customdata"]}
    assert len(cls_ids) == 108 and ex_ids == cls_ids - set(gone)

    # lasso: two points of the first class trace and one cross (what the browser sends back)
    t0 = cls_fig["data"][0]
    points = [{"curve_number": 0, "point_index": j, "point_number": j, "customdata": t0["customdata"][j]}
              for j in (0, 1)]
    points.append({"curve_number": len(cls_fig["data"]) - 1, "point_index": 0, "point_number": 0,
                   "customdata": crosses["customdata"][0]})
    at.session_state["map_cls"] = {"selection": {"points": points, "point_indices": [0, 1, 0], "box": [],
                                                 "lasso": []}}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    kept = sorted(int(p["customdata"][0]) for p in points[:2])
    assert at.subheader[0].value == "Selected: 3 sample(s)"
    assert any("2 still in the memory bank, 1 deleted earlier" in c.value for c in at.caption)
    assert len([c for c in at.caption if "id " in c.value and " · " in c.value]) == 3  # thumbnails
    assert at.get("download_button")
    # the selection's grid has the sample filters: tagging skips the deleted sample
    at.text_input(key="sel_filter_tagname").input("review").run()
    at.button(key="sel_filter_addtag").click().run()
    assert any("Tagged 2 sample(s) 'review'. 1 not in the memory bank were skipped." in s.value for s in at.success)
    at.multiselect(key="sel_filter_tags").set_value(["review"]).run()
    assert sorted(int(c.value.split()[1]) for c in at.caption if c.value.startswith("id ")) == kept
    at.multiselect(key="sel_filter_tags").set_value([]).run()

    at.button(key="emb_to_deletions").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Deletion requests"
    # the deletion page consumed the hand-over: only samples still in the bank are filled in
    assert "deletion_ids_prefill" not in at.session_state
    assert at.text_area(key="ids_text").value == ", ".join(map(str, kept))


def test_embeddings_page_without_deletions(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open_embeddings(monkeypatch, tiny_run)  # a copy: the page caches its maps inside the run
    assert any("0 of them deleted" in c.value for c in at.caption)
    cls_fig, ex_fig = _figures(at)
    assert not any(t["marker"].get("symbol", "").startswith("x") for f in (cls_fig, ex_fig) for t in f["data"])
    assert not at.subheader  # nothing selected yet
    # a selection can be cleared: the button drops it and the page asks for a new one
    t0 = cls_fig["data"][0]
    points = [{"curve_number": 0, "point_index": j, "point_number": j, "customdata": t0["customdata"][j]}
              for j in (0, 1)]
    at.session_state["map_cls"] = {"selection": {"points": points, "point_indices": [0, 1], "box": [], "lasso": []}}
    at.run()
    assert at.subheader[0].value == "Selected: 2 sample(s)"
    at.button(key="emb_clear").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.subheader and any("Draw a lasso" in i.value for i in at.info)
    assert len(at.get("plotly_chart")) == 2  # both maps are still drawn


def test_images_on_hover_put_a_thumbnail_of_each_point_in_the_chart(tiny_run: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The hover mode's chart carries one small PNG per point, as the `image` field vega-tooltip shows
    (tests/e2e/test_e2e.py checks in Chromium that hovering shows it)."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    run = MunkeyRun(tiny_run, device="cpu")
    gone = [int(i) for i in run.bank.ids[::50][:3]]
    run.forget(gone)
    images = {int(i): img for i, img in zip(run.dataset.train.ids, run.dataset.train.images)}
    del run
    at = _open_embeddings(monkeypatch, tiny_run)
    at.get("button_group")[0].set_value("Images on hover").run()
    assert not at.exception, [e.value for e in at.exception]
    charts = at.get("vega_lite_chart")
    assert len(charts) == 1 and not at.get("plotly_chart")  # one chart for both maps: the thumbnails travel once
    import pyarrow as pa

    spec = json.loads(charts[0].proto.spec)
    records = pa.ipc.open_stream(charts[0].proto.data.data).read_all().to_pylist()  # the chart's one dataset
    assert len(records) == 103 and {r["id"] for r in records if r["status"] == "deleted"} == set(gone)
    assert all(r["image"].startswith("data:image/png;base64,") for r in records)
    assert {t["field"] for t in spec["hconcat"][0]["encoding"]["tooltip"]} >= {"image", "id", "label"}
    payload = len(charts[0].proto.spec) + len(charts[0].proto.data.data)
    assert payload < 103 * 600 + 20_000, payload  # light: well under 1 KB a point for 8x8 digits
    # each thumbnail is the sample's own image, enlarged 4x (nearest neighbour)
    for r in records[:5]:
        png = Image.open(io.BytesIO(base64.b64decode(r["image"].split(",", 1)[1])))
        want = images[r["id"]][..., 0]
        assert png.size == (32, 32)
        assert np.array_equal(np.asarray(png), np.repeat(np.repeat(want, 4, axis=0), 4, axis=1))
