"""The Class unlearning page under AppTest, on a real tiny MUNKEY run and a tiny ResNet-18 beside it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from munkey_core.dashboard.classforget_job import CURVE_EVERY
from munkey_core.run.rows import load_bank
from tests.app.test_app import _settle

APP = Path(__file__).resolve().parents[2] / "app.py"
TOKEN = "class token"


def _open(monkeypatch: pytest.MonkeyPatch, run: Path, token: str | None = None) -> AppTest:
    monkeypatch.setenv("MUNKEY_RUN", str(run))
    if token:
        monkeypatch.setenv("MUNKEY_OPERATOR_TOKEN", token)
    else:
        monkeypatch.delenv("MUNKEY_OPERATOR_TOKEN", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=90)
    at.run()
    at.switch_page("pages/class_unlearning.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_munkey_run_keys_and_unact_with_keep(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(monkeypatch, tiny_run, TOKEN)
    assert at.title[0].value == "Class unlearning"
    assert at.button(key="train_resnet")  # no classifier run beside it: offered
    at.selectbox(key="class_pick").set_value(3)
    at.number_input(key="class_n").set_value(10)
    at.number_input(key="class_k").set_value(3)
    at.button(key="class_run").click().run()
    _settle(at, "class_job")
    job = at.session_state["class_job"]
    assert job.state == "done" and job.request.cls == 3 and job.request.method == "keys+unact"
    rounds = job.request.details["rounds"]  # at most k = 3: the MUNKEY default stops once the class is gone
    # the curve: before the first round, every CURVE_EVERY-th round, and the request's last round
    want = sorted({0, rounds} | set(range(CURVE_EVERY, rounds + 1, CURVE_EVERY)))
    assert 1 <= rounds <= 3 and [p["round"] for p in job.curve] == want
    assert {r["method"] for r in job.rows} == {"keys+unact", "keys", "unact", "mask"}
    metrics = {m.label: m.value for m in at.metric}
    assert "Af (forgotten class)" in metrics and metrics["Delta vs the class oracle"] == "no oracle"
    assert len(at.get("plotly_chart")) >= 1
    shown = at.dataframe[0].value  # the comparison table: no None/nan cell; unmeasured oracle columns left out, said
    assert not shown.isna().any().any() and "Af* %" not in shown.columns and "Delta" not in shown.columns
    assert any("need a class oracle" in c.value for c in at.caption)
    before = load_bank(tiny_run).fingerprint()
    keep = at.button(key="class_keep")
    assert keep.disabled  # no credential yet
    at.text_input(key="class_credential").set_value(TOKEN)
    at.text_input(key="class_operator").set_value("carol")
    out = tiny_run.parent / "kept"
    at.text_input(key="class_out").set_value(str(out))
    at.run()
    at.button(key="class_keep").click().run()
    assert not at.exception
    assert any("Saved as a new run" in s.value for s in at.success)
    assert not np.any(load_bank(out).labels == 3)
    assert load_bank(tiny_run).fingerprint() == before  # the open run is untouched


def test_resnet_beside_the_run_compares_with_ssd(tiny_run: Path, tiny_classifier_runs, monkeypatch) -> None:
    shutil.copytree(tiny_classifier_runs["resnet18"], tiny_run.parent / "resnet")
    at = _open(monkeypatch, tiny_run)
    at.selectbox(key="class_model").set_value("classifier run · resnet").run()
    at.selectbox(key="class_pick").set_value(6)
    at.number_input(key="class_n").set_value(0)
    at.number_input(key="class_p").set_value(90.0)
    at.run()
    at.button(key="class_run").click().run()
    _settle(at, "class_job")
    job = at.session_state["class_job"]
    assert job.state == "done" and [r["method"] for r in job.rows] == ["unact", "ssd", "lfssd", "mask"]
    assert job.rows[0]["Af"] < job.rows[0]["Af_before"]
    assert at.text_input(key="class_credential").disabled  # no credential configured: keeping is off
    at.button(key="class_discard").click().run()
    assert "class_job" not in at.session_state


def test_corrupt_upload_shows_an_error(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(monkeypatch, tiny_run)
    at.radio(key="class_source").set_value("Upload images").run()
    at.file_uploader(key="class_upload").set_value([("bad.png", b"not an image", "image/png")])
    at.run()
    assert not at.exception
    assert "bad.png is not a readable image" in at.error[0].value
    assert at.button(key="class_run").disabled


def test_the_retain_guard_message(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every image of class 0 on the tiny run: the retain guard stops the request (the next round would
    cost the kept classes more than 2 points on their probe), and the page says what the request's own
    images still show against the stop rule, leaving whether the class is gone to Af's verdict."""
    at = _open(monkeypatch, tiny_run)
    at.selectbox(key="class_pick").set_value(0)
    at.number_input(key="class_n").set_value(0)
    at.checkbox(key="class_compare").uncheck()
    at.button(key="class_run").click().run()
    _settle(at, "class_job")
    job = at.session_state["class_job"]
    assert job.state == "done" and job.request.details["stop_reason"] == "retain guard"
    assert job.request.details["probe_after"] >= job.request.details["probe_before"] - 2.0
    shown = [w.value for w in at.warning]
    d, n = job.request.details, job.request.n_images
    said = next(w for w in shown if "retain guard stopped this request" in w)
    assert f"{round(d['left_predicted'] * n)} of {n} image(s) still predicted as " in said, said
    assert f"largest {100 * d['left_max_prob']:.1f} % (below {100 * 2 / 10:.1f} %)" in said, said  # tail 2 x chance
    assert "partly removed" not in said and "verdict above" in said
