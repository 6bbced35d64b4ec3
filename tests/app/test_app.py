"""The Streamlit dashboard through streamlit.testing's AppTest, against a real tiny digits run."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.errors import AppTestError

from munkey_core.dashboard.astlock import affected, is_serialised, restore_ast_parsing
from munkey_core.run.rows import load_bank
from munkey_core.service import MunkeyRun

APP = Path(__file__).resolve().parents[2] / "app.py"
TIMEOUT = 60
TOKEN = "correct horse battery staple"


def _app(monkeypatch: pytest.MonkeyPatch, run: Path, token: str | None = None) -> AppTest:
    monkeypatch.setenv("MUNKEY_RUN", str(run))
    if token is None:
        monkeypatch.delenv("MUNKEY_OPERATOR_TOKEN", raising=False)
    else:
        monkeypatch.setenv("MUNKEY_OPERATOR_TOKEN", token)
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, at.exception
    return at


def _page(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _settle(at: AppTest, key: str, timeout: float = 240) -> AppTest:
    """Let the background job the page keeps in session_state[key] end, then rerun the page.

    Pages collect a finished job on their own reruns, so a short job may be gone before the test looks:
    wait only if it is still there. Fails if the job failed or is still running after `timeout` s."""
    job = at.session_state[key] if key in at.session_state else None
    if job is not None:
        state = job.wait(timeout)
        assert state == "done", f"{key} ended {state}: {job.error}"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _digit_png() -> bytes:
    from sklearn.datasets import load_digits

    img = np.rint(load_digits().images[1700] * 255 / 16).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).resize((32, 32)).convert("RGB").save(buf, format="PNG")  # RGB, another size
    return buf.getvalue()


def _texts(at: AppTest) -> str:
    parts = [*(m.value for m in at.markdown), *(c.value for c in at.caption), *(t.value for t in at.title),
             *(s.value for s in at.success), *(w.value for w in at.warning), *(i.value for i in at.info)]
    return "\n".join(str(p) for p in parts)


def _wait_for_the_trained_overview(at: AppTest, run: Path, timeout: float = 120) -> None:
    """Rerun the page until background training has written `run` and the Overview shows its model card."""
    deadline = time.time() + timeout
    while time.time() < deadline and at.title[0].value != "MUNKEY model":
        time.sleep(1.0)
        at.run()
        assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.title[0].value == "MUNKEY model" and (run / "config.json").exists()


def test_every_page_renders(tiny_run_template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    restore_ast_parsing()  # another test may have locked it: the app must do it on its own
    at = _app(monkeypatch, tiny_run_template)
    assert is_serialised() == affected()  # tests/dashboard/test_astlock.py
    assert at.title[0].value == "MUNKEY model"
    labels = {m.label: m.value for m in at.metric}
    assert labels["Deleted samples"] == "0" and "**Dataset** `digits`" in _texts(at)
    assert len(at.get("plotly_chart")) >= 2  # loss and accuracy per epoch
    _page(at, "evidence")
    assert at.title[0].value == "Case evidence"
    _page(at, "deletions")
    assert at.title[0].value == "Deletion requests"
    assert "Deletion is disabled" in at.warning[0].value and at.text_input(key="credential").disabled
    _page(at, "audit")
    assert at.title[0].value == "Audit log"
    assert "hash-chained" in at.caption[0].value


def test_evidence_upload_shows_neighbours_and_survives_a_corrupt_file(tiny_run_template: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, tiny_run_template), "evidence")
    assert at.radio(key="source").value == "Upload images"
    at.file_uploader(key="uploads").set_value([("broken.png", b"definitely not a png", "image/png"),
                                              ("digit.png", _digit_png(), "image/png")])
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and "broken.png is not a readable image" in at.error[0].value
    metrics = {m.label: m.value for m in at.metric}
    if metrics["Prediction"] == "no confident answer":  # far or disagreeing cases: the page abstains
        assert at.warning and "Similar cases that agree" in metrics
    else:
        assert metrics["Prediction"] in [str(d) for d in range(10)] and metrics["Confidence"].endswith("%")
    assert "similar training cases are" in _texts(at)  # the evidence in plain words
    gallery = [c.value for c in at.caption if c.value.startswith("**") and "of the answer" in c.value]
    assert len(gallery) == 4  # the tiny profile's K
    assert at.subheader[0].value == "digit.png"
    # K and the aggregation mode are honoured
    at.slider(key="k").set_value(2)
    at.selectbox(key="mode").set_value("softmax_fusion")
    at.run()
    assert not at.exception and len([c for c in at.caption if c.value.startswith("**") and "of the answer" in c.value]) == 2
    # the test-sample path opens on the first test sample predicted right (each predicted on its own here)
    at.radio(key="source").set_value("Test sample").run()
    run = MunkeyRun(tiny_run_template, device="cpu")
    singles = [int(run.predict_images([img]).labels[0]) for img in run.dataset.test.images[:20]]
    first_right = next((j for j, p in enumerate(singles) if p == int(run.dataset.test.labels[j])), 0)
    assert at.number_input(key="test_index").value == first_right
    assert f"Test sample {first_right} " in at.subheader[0].value
    at.number_input(key="test_index").set_value(5).run()
    assert not at.exception and "Test sample 5" in at.subheader[0].value
    assert "True label" in {m.label for m in at.metric}


def test_operator_deletes_and_sees_metrics(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bank0 = load_bank(tiny_run)
    ids = [int(i) for i in bank0.ids[:6]]
    at = _page(_app(monkeypatch, tiny_run, token=TOKEN), "deletions")
    at.text_area(key="ids_text").input(", ".join(map(str, ids))).run()
    assert {m.label: m.value for m in at.metric}["In the memory bank"] == "6"
    assert at.button(key="delete").disabled  # no credential yet
    at.text_input(key="credential").input(TOKEN)
    at.text_input(key="operator").input("Dana (DPO)").run()
    at.checkbox(key="confirm").check().run()
    assert not at.button(key="delete").disabled
    # the confirmation belongs to the selection: changing it unticks the box and disarms Delete
    at.text_area(key="ids_text").input(", ".join(map(str, ids[:5]))).run()
    assert not at.checkbox(key="confirm").value and at.button(key="delete").disabled
    at.text_area(key="ids_text").input(", ".join(map(str, ids))).run()
    at.checkbox(key="confirm").check().run()
    at.button(key="delete").click().run()
    assert not at.exception, [e.value for e in at.exception]
    _settle(at, "deletion_job")  # the deletion and its evaluation run off the script thread
    assert not at.error, [e.value for e in at.error]
    assert "deletion_job" not in at.session_state and "deletion_summary" in at.session_state
    bank1 = load_bank(tiny_run)
    assert len(bank1) == len(bank0) - 6 and not set(ids) & set(bank1.ids.tolist())
    table = next(d.value for d in at.dataframe if "metric" in d.value.columns)  # before/after metrics
    verdicts = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert list(verdicts["measure"]) == ["FA", "MIA"]
    assert set(verdicts["verdict"]) <= {"forgotten", "not yet", "cannot tell"}
    assert all(v.endswith(" %") for v in verdicts["samples still held read"])  # the positive control, shown
    assert "Forgetting by key deletion has not been measured for the tiny profile on digits" in _texts(at)
    assert "`munkey evaluate RUN --oracle --noise-floor 2`" in _texts(at)  # the test profile: never measured
    summary = at.session_state["deletion_summary"]
    held = [v["remembered"] for v in summary["assessment"]["verdicts"]]
    assert list(verdicts["samples still held read"]) == [f"{h:.1f} %" for h in held]
    same = summary["same_class"]  # this request against unseen samples of its classes, and the note saying what
    shown = _texts(at)  # that does not show
    assert f"({same['TA_same_classes']:.2f} %)" in shown and same["same_class_note"][:60] in shown
    assert table.loc[table["metric"] == "MIA", "before"].item() == "not defined before a deletion"
    assert not at.checkbox(key="confirm").value  # unticked after the request
    assert list(table["metric"]) == ["TA", "RA", "FA", "MIA", "Ps"]
    assert table.loc[table["metric"] == "MIA", "after"].item() != "—"
    assert any("Retrieval check passed" in s.value for s in at.success)
    assert at.get("download_button")
    # after the rerun the preview reflects the bank as it is now
    assert {m.label: m.value for m in at.metric}["Deleted earlier"] == "6"
    _page(at, "audit")
    requests = at.dataframe[0].value
    assert requests["ids deleted"].tolist() == [6] and requests["ids"][0] == " ".join(map(str, ids))
    assert requests["operator"][0] == "Dana (DPO)" and any("Log verified" in s.value for s in at.success)


def test_viewer_cannot_delete(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp = load_bank(tiny_run).fingerprint()
    ids = load_bank(tiny_run).ids[:3].tolist()
    at = _page(_app(monkeypatch, tiny_run, token=TOKEN), "deletions")
    at.radio(key="method").set_value("Upload an ids file").run()
    at.file_uploader(key="ids_file").set_value(("req.csv", ("id\n" + "\n".join(map(str, ids))).encode(),
                                                "text/csv")).run()
    assert {m.label: m.value for m in at.metric}["In the memory bank"] == "3"
    assert len([c for c in at.caption if c.value.startswith("id ")]) == 3  # the preview thumbnails
    at.text_input(key="credential").input("wrong").run()
    assert any("not accepted" in w.value for w in at.warning)
    assert at.checkbox(key="confirm").disabled and at.button(key="delete").disabled
    with pytest.raises(AppTestError):
        at.button(key="delete").click()
    at.run()
    assert load_bank(tiny_run).fingerprint() == fp
    # select by similarity to an uploaded image: preview works for a viewer too
    at.radio(key="method").set_value("Similar to an image").run()
    at.file_uploader(key="query_images").set_value(("me.png", _digit_png(), "image/png"))
    at.number_input(key="top_n").set_value(5).run()
    pick = at.multiselect(key="similar_pick")
    assert not at.exception and len(pick.options) == 5
    assert len(pick.value) <= 1  # only an exact copy of the upload is preselected, never the look-alikes
    assert at.button(key="delete").disabled
    assert load_bank(tiny_run).fingerprint() == fp


def test_overview_evaluate_now_shows_metrics_without_changing_the_run(tiny_run: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, tiny_run)
    assert "No evaluation recorded yet" in at.info[0].value
    at.button(key="evaluate").click().run()
    _settle(at, "overview_eval_job")  # evaluation runs off the script thread
    assert not at.error and "overview_eval" in at.session_state
    assert not (tiny_run / "metrics.json").exists()  # a viewer's click writes nothing to the run
    assert any("not recorded in the run" in c.value for c in at.caption)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["TA (test accuracy)"].endswith("%") and metrics["FA (deleted samples)"] == "—"
    assert at.get("plotly_chart")


def test_missing_run_trains_the_demo_run(tmp_path: Path, tiny_run_template: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from munkey_core.data.datasets import load_dataset

    monkeypatch.setenv("MUNKEY_PROFILE", "tiny")
    # a fresh clone's state: no run and no cached keys, so the background job computes the keys first
    # (seconds), while the checks below use the Overview and a page that needs the model
    monkeypatch.setenv("MUNKEY_CACHE", str(tmp_path / "empty-cache"))
    run = tmp_path / "fresh"
    at = _app(monkeypatch, run)
    # the first script run starts training in the background and the Overview is usable at once
    assert at.title[0].value == "Training the demo model (first start)"
    assert not at.error and at.get("progress"), "the training progress is shown"
    assert "The demo model is training:" in at.get("progress")[0].proto.text
    digits = load_dataset("digits", seed=0)  # the tiny profile's split: an independent load
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Training samples"] == str(len(digits.train)) and metrics["Classes"] == "10"
    assert at.get("plotly_chart"), "samples per class and split"
    sevens = digits.train.ids[digits.train.labels == 7][:24]
    at.selectbox(key="browse_class").set_value(7).run()  # browsing works while the model trains
    assert not at.exception, [e.value for e in at.exception]
    shown = [c.value for c in at.caption if c.value.startswith("id ")]
    assert shown == [f"id {int(i)}" for i in sevens]
    # a page that needs the model says so, with the progress, instead of failing
    _page(at, "evidence")
    assert at.title[0].value == "Training the demo model (first start)"
    assert "This page needs the trained model" in _texts(at) and at.get("progress")
    _page(at, "overview")
    _wait_for_the_trained_overview(at, run)
    assert "**profile** `tiny`" in _texts(at)
    bank = load_bank(run)
    assert sorted(bank.ids.tolist()) == sorted(digits.train.ids.tolist())  # the ids browsed are the run's ids
    assert {m.label: m.value for m in at.metric}["Memory bank entries"] == str(len(digits.train))
    _page(at, "evidence")  # the trained run is usable: a page that needs the model opens
    assert at.title[0].value == "Case evidence"


def test_first_start_with_a_credential_shows_the_data_and_waits_for_the_operator(
        tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from munkey_core.data.datasets import load_dataset

    monkeypatch.setenv("MUNKEY_PROFILE", "tiny")
    monkeypatch.delenv("MUNKEY_AUTOTRAIN", raising=False)
    run = tmp_path / "fresh"
    at = _app(monkeypatch, run, token=TOKEN)
    assert at.title[0].value == "No MUNKEY run yet" and at.button(key="train_start").disabled
    assert {m.label: m.value for m in at.metric}["Classes"] == "10"  # the data is browsable before training
    at.selectbox(key="browse_class").set_value(3).run()
    threes = load_dataset("digits", seed=0).train.ids
    threes = threes[load_dataset("digits", seed=0).train.labels == 3][:24]
    assert [c.value for c in at.caption if c.value.startswith("id ")] == [f"id {int(i)}" for i in threes]
    assert not run.exists()  # nothing was trained by browsing
    at.text_input(key="train_credential").input(TOKEN).run()
    at.button(key="train_start").click().run()
    assert at.title[0].value == "Training the demo model (first start)"
    _wait_for_the_trained_overview(at, run)


def test_damaged_run_shows_an_error_not_a_traceback(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tiny_run / "model.pt").write_bytes(b"garbage")
    at = _app(monkeypatch, tiny_run)
    assert at.error and "damaged" in at.error[0].value


def test_selection_from_embeddings_prefills_the_deletion_form(tiny_run_template: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ids = load_bank(tiny_run_template).ids[:3].tolist()
    at = _app(monkeypatch, tiny_run_template)
    at.session_state["deletion_ids_prefill"] = ids
    _page(at, "deletions")
    assert at.text_area(key="ids_text").value == ", ".join(map(str, ids))
    assert "deletion_ids_prefill" not in at.session_state


def test_deletions_page_compares_with_a_retrained_model_only_where_one_exists(tiny_run: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing deleted: nothing to compare. Deleted but no M-oracle: the page says it cannot tell and names
    the command. With the M-oracle and one twin of another seed: the gaps, the floor and the verdict."""
    from munkey_core.eval.oracles import evaluate_against_oracle
    from munkey_core.service import MunkeyRun

    at = _page(_app(monkeypatch, tiny_run, token=TOKEN), "deletions")
    assert "Nothing is deleted yet." in _texts(at)
    run = MunkeyRun(tiny_run, device="cpu")
    run.forget([int(i) for i in run.bank.ids[:20]], operator="t", evaluate=False)
    at = _page(_app(monkeypatch, tiny_run, token=TOKEN), "deletions")
    at.button(key="oracle_compare").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "cannot tell whether the model matches one that never saw them" in _texts(at)
    assert "munkey evaluate RUN --oracle --noise-floor 2" in _texts(at)
    want = evaluate_against_oracle(MunkeyRun(tiny_run, device="cpu"), noise_floor=1, progress=False)
    at = _page(_app(monkeypatch, tiny_run, token=TOKEN), "deletions")
    at.button(key="oracle_compare").click().run()
    assert not at.exception, [e.value for e in at.exception]
    shown = next(d.value for d in at.dataframe if "Avg Gap to the M-oracle" in d.value.columns)
    assert len(shown) == 4 and shown["Avg Gap to the M-oracle"][0] == f"{want['AvgGap']:.2f}"
    assert shown["Avg Gap to the M-oracle"][2] == f"{want['noise_floor']['AvgGap']:.2f}"
    assert shown["Avg Gap to the M-oracle"][3] == f"{want['control']['AvgGap']:.2f}"  # the positive control's row
    bar = want["noise_floor"]["AvgGap"] + 0.3
    word = ("not yet" if want["AvgGap"] > bar else "cannot tell" if want["control"]["AvgGap"] <= bar else "forgotten")
    verdicts = [m.value for m in (*at.success, *at.error, *at.warning) if "Verdict against retraining" in m.value]
    assert verdicts and f"**{word}**" in verdicts[0]
    assert "nan" not in _texts(at) and "None" not in _texts(at)


def test_evidence_page_with_one_training_case_left_and_with_none(tiny_run: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A bank emptied by deletions (down to one case, then none) is a state a user can reach: the page says
    so instead of failing on a K slider from 1 to 1 or on an empty search."""
    run = MunkeyRun(tiny_run, device="cpu")
    ids = run.bank.ids.tolist()
    run.forget(ids[1:], operator="tester")
    at = _page(_app(monkeypatch, tiny_run), "evidence")
    assert not at.error and any("holds one training case" in c.value for c in at.caption)
    MunkeyRun(tiny_run, device="cpu").forget(ids[:1], operator="tester")
    at = _page(_app(monkeypatch, tiny_run), "evidence")
    assert "memory bank is empty" in at.error[0].value
