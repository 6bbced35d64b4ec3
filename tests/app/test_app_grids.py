"""Filters on the image grids (class, id), through streamlit's AppTest on a real tiny digits run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from munkey_core.run.rows import load_bank
from tests.app.test_app import _app, _page, _settle


def _thumbs(at) -> list[str]:
    """Captions of the preview thumbnails ("id N · name"), in page order."""
    return [c.value for c in at.caption if c.value.startswith("id ")]


def test_deletion_preview_filters_by_class_and_id_and_counts(tiny_run_template: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    bank = load_bank(tiny_run_template)
    ids, labels = bank.ids[:20].tolist(), bank.labels[:20].tolist()
    at = _page(_app(monkeypatch, tiny_run_template), "deletions")
    at.text_area(key="ids_text").input(", ".join(map(str, ids))).run()
    assert len(_thumbs(at)) == 20
    assert any(c.value == "Showing 20 of 20." for c in at.caption)

    cls = labels[0]
    expect = [i for i, lab in zip(ids, labels) if lab == cls]  # independent of the filter code
    at.multiselect(key="preview_filter_classes").set_value([cls]).run()
    assert not at.exception
    assert _thumbs(at) == [f"id {i} · {cls}" for i in expect]
    assert any(c.value == f"Showing {len(expect)} of {len(expect)} matching the filter (20 in all)." for c in at.caption)

    at.multiselect(key="preview_filter_classes").set_value([]).run()
    lo, hi = sorted(ids)[5], sorted(ids)[9]
    at.text_input(key="preview_filter_ids").input(f"{lo}-{hi}").run()
    assert sorted(int(t.split()[1]) for t in _thumbs(at)) == sorted(ids)[5:10]
    # the request itself is unchanged: all 20 ids stay in it
    assert {m.label: m.value for m in at.metric}["In the memory bank"] == "20"

    at.text_input(key="preview_filter_ids").input("not an id").run()
    assert at.error and "Id filter" in at.error[0].value and len(_thumbs(at)) == 20
    page = "\n".join(str(c.value) for c in at.caption)
    assert "None" not in page and "nan" not in page


def test_evidence_similar_cases_filter_by_class(tiny_run_template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, tiny_run_template), "evidence")
    at.radio(key="source").set_value("Test sample").run()
    at.slider(key="k").set_value(8).run()
    assert not at.exception, [e.value for e in at.exception]

    def gallery() -> list[str]:  # the label of each similar case drawn ("**3** · 40% of the answer ...")
        return [c.value.split("**")[1] for c in at.caption if c.value.startswith("**") and "of the answer" in c.value]

    before = gallery()
    assert len(before) == 8 and any(c.value == "Showing 8 of 8." for c in at.caption)
    key = next(m.key for m in at.multiselect if m.key.startswith("cases_filter_"))
    first = before[0]
    at.multiselect(key=key).set_value([int(first)]).run()
    assert not at.exception
    after = gallery()
    assert after == [lab for lab in before if lab == first]
    if len(after) < 8:
        assert any(c.value == f"Showing {len(after)} of {len(after)} matching the filter (8 in all)." for c in at.caption)


def _reference_predictions(run_dir: Path, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, confidence) of training samples, from the model's own predict (no cache, no page code)."""
    from munkey_core.model.predict import predict
    from munkey_core.service import MunkeyRun

    run = MunkeyRun(run_dir, device="cpu")
    train = run.dataset.train
    rows = np.array([int(np.flatnonzero(train.ids == i)[0]) for i in ids])
    p = predict(run.model, run.bank, run.to_input(train.images[rows]), run.split_keys("train")[rows],
                k=run.train_cfg.k, tau=run.train_cfg.tau, neighbour_predictions=False)
    return p.labels, p.confidence


def _shown_ids(at) -> list[int]:
    return [int(t.split()[1]) for t in _thumbs(at)]


def test_samples_page_filters_wrong_and_low_confidence_tags_and_saved_views(tiny_run: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from munkey_core.run.tags import read_tags

    bank = load_bank(tiny_run)
    order = np.argsort(bank.ids)
    ids, labels = bank.ids[order].tolist(), bank.labels[order].tolist()
    predicted, confidence = _reference_predictions(tiny_run, ids)
    at = _page(_app(monkeypatch, tiny_run), "samples")
    at.number_input(key="browse_show").set_value(600).run()
    assert any(c.value == f"Showing {len(ids)} of {len(ids)}." for c in at.caption)
    wrong = [i for i, p, lab in zip(ids, predicted, labels) if p != lab]
    assert any(c.value.startswith(f"Of all {len(ids)}: {len(wrong)} predicted wrongly") for c in at.caption)

    at.checkbox(key="browse_wrong").check().run()
    assert not at.exception
    assert _shown_ids(at) == wrong
    at.checkbox(key="browse_wrong").uncheck().run()

    at.checkbox(key="browse_low").check().run()
    threshold = round(float(np.quantile(confidence, 0.2)), 2)  # the tiny run is unsure of everything: its own scale
    at.number_input(key="browse_thr").set_value(threshold).run()
    low = [i for i, c in zip(ids, confidence) if c < threshold]
    assert 0 < len(low) < len(ids)
    assert _shown_ids(at) == low
    assert any(c.value == f"Showing {len(low)} of {len(low)} matching the filter ({len(ids)} in all)." for c in at.caption)

    # tag every matching sample "review", then save these filters as a view
    at.text_input(key="browse_tagname").input("review").run()
    at.button(key="browse_addtag").click().run()
    assert not at.exception and any(f"Tagged {len(low)} sample(s) 'review'" in s.value for s in at.success)
    assert read_tags(tiny_run).tags == {"review": low}
    at.text_input(key="browse_viewname").input("unsure").run()
    at.button(key="browse_saveview").click().run()
    assert read_tags(tiny_run).views["unsure"]["low_confidence"] == pytest.approx(threshold)

    # clear the filters, filter by the tag: the same samples
    at.checkbox(key="browse_low").uncheck().run()
    assert any(c.value == f"Showing {len(ids)} of {len(ids)}." for c in at.caption)
    at.multiselect(key="browse_tags").set_value(["review"]).run()
    assert _shown_ids(at) == low
    assert any(f"{len(low)} tagged 'review'" in c.value for c in at.caption)
    at.multiselect(key="browse_tags").set_value([]).run()

    # the saved view brings the filters back
    at.selectbox(key="browse_view").set_value("unsure").run()
    at.button(key="browse_apply").click().run()
    assert at.checkbox(key="browse_low").value and _shown_ids(at) == low
    page = "\n".join(str(c.value) for c in at.caption)
    assert "None" not in page and "nan" not in page


def test_a_damaged_tags_file_is_explained_not_a_traceback(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tiny_run / "tags.json").write_bytes(b'{"format": 1, "tags": {"review": [1, 2')
    at = _page(_app(monkeypatch, tiny_run), "samples")
    assert not at.exception
    assert any("tags file" in e.value and "is damaged" in e.value and "Move it away" in e.value for e in at.error)
    assert _thumbs(at)  # the grid still works, without tags
    at.text_input(key="browse_tagname").input("review").run()
    at.button(key="browse_addtag").click().run()
    assert not at.exception and any("is damaged" in e.value for e in at.error)
    assert (tiny_run / "tags.json").read_bytes() == b'{"format": 1, "tags": {"review": [1, 2'  # not overwritten


def test_deletion_preview_filters_wrong_and_low_confidence(tiny_run_template: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    bank = load_bank(tiny_run_template)
    ids = bank.ids[:20].tolist()
    _, confidence = _reference_predictions(tiny_run_template, ids)
    at = _page(_app(monkeypatch, tiny_run_template), "deletions")
    at.text_area(key="ids_text").input(", ".join(map(str, ids))).run()
    at.checkbox(key="preview_filter_low").check().run()
    # a threshold inside the widest gap between the middle confidences (a threshold on a sample's own
    # confidence, or within 0.01 of one, makes the expected set depend on the widget's rounding)
    s = np.sort(confidence)
    at_gap = 5 + int(np.argmax(np.diff(s[5:16])))
    assert s[at_gap + 1] - s[at_gap] > 0.02, s
    threshold = round(float(s[at_gap] + s[at_gap + 1]) / 2, 2)
    at.number_input(key="preview_filter_thr").set_value(threshold).run()
    expect = sorted(i for i, c in zip(ids, confidence) if c < threshold)
    assert 0 < len(expect) < len(ids)
    assert sorted(_shown_ids(at)) == expect
    assert {m.label: m.value for m in at.metric}["In the memory bank"] == "20"  # the request is unchanged


def test_tags_given_on_the_deletion_page_leave_with_the_deleted_sample(tiny_run: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from munkey_core.run.tags import add_tag, read_tags
    from tests.app.test_app import TOKEN

    ids = [int(i) for i in load_bank(tiny_run).ids if int(i) >= 100]
    a, b = ids[5], ids[60]
    add_tag(tiny_run, "review", [a, b])
    at = _page(_app(monkeypatch, tiny_run, token=TOKEN), "deletions")
    at.text_area(key="ids_text").input(str(a)).run()
    at.text_input(key="preview_filter_tagname").input("consent-withdrawn").run()
    at.button(key="preview_filter_addtag").click().run()  # tags the one sample of the request
    assert read_tags(tiny_run).tags == {"consent-withdrawn": [a], "review": sorted([a, b])}
    at.text_input(key="credential").input(TOKEN)
    at.text_input(key="operator").input("Dana (DPO)").run()
    at.checkbox(key="confirm").check().run()
    at.button(key="delete").click().run()
    _settle(at, "deletion_job")
    assert "deletion_summary" in at.session_state, "the deletion neither ran nor left a summary"
    raw = (tiny_run / "tags.json").read_bytes()
    assert re.search(rb"(?<![0-9])" + str(a).encode() + rb"(?![0-9])", raw) is None, raw
    assert b"consent-withdrawn" not in raw and read_tags(tiny_run).tags == {"review": [b]}
