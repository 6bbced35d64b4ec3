"""Filters on the image grids (class, id), through streamlit's AppTest on a real tiny digits run."""

from __future__ import annotations

from pathlib import Path

import pytest

from munkey_core.run.rows import load_bank
from tests.app.test_app import _app, _page


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
