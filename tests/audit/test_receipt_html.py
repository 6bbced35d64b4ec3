"""The receipt's readable page (audit.receipts.render_html, written directly with markupsafe's escaping):
every value taken from the receipt is escaped exactly once, whatever it holds, the page shows the
receipt's facts, and it is byte for byte the page the Jinja2 template wrote before (recorded hashes).
Built on the real sample receipt in docs/."""

from __future__ import annotations

import copy
import hashlib
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from munkey_core.audit.receipts import render_html

# a real receipt of the demo run (docs/sample_receipt.json as of 2026-12-01), frozen here: the page hashes
# below were written by the former template for exactly these bytes, while docs/ keeps the newest receipt
SAMPLE = json.loads((Path(__file__).resolve().parent / "data" / "receipt_2026-12-01.json").read_text())
DOCS_SAMPLE = json.loads((Path(__file__).resolve().parents[2] / "docs" / "sample_receipt.json").read_text())
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)> & "quoted" \'single\''


class _Page(HTMLParser):
    """The page's tags and its visible text, as a browser's parser sees them."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)

    @property
    def visible(self) -> str:
        return " ".join(" ".join(self.text).split())


def _hostile(receipt: dict) -> dict:
    r = copy.deepcopy(receipt)
    b = r["entry"]["body"]
    for key in ("operator", "subject_ref", "dataset", "run_id", "request_id", "received", "method"):
        b[key] = HOSTILE
    b["evidence"]["oracle_note"] = HOSTILE
    b["evidence"]["MIA_attack"] = HOSTILE
    b["metrics"]["before_source"] = HOSTILE
    b["samples"][0]["memory_sha256"] = HOSTILE
    r["log"] = HOSTILE
    r["issued"] = HOSTILE
    r["request_id"] = HOSTILE
    return r


@pytest.mark.parametrize("sample", [SAMPLE, DOCS_SAMPLE], ids=["frozen", "docs"])
def test_the_sample_receipt_shows_its_facts(sample: dict) -> None:
    page = _Page(render_html(sample))
    body = sample["entry"]["body"]
    text = page.visible
    assert "Deletion receipt" in text and "deleted and verified" in text
    assert sample["request_id"] in text and body["operator"] in text and sample["entry"]["entry_hash"] in text
    assert f"{len(body['samples'])} training sample(s) deleted by this request" in text
    assert all(str(s["id"]) in text and s["image_sha256"] in text for s in body["samples"])
    assert f"{body['metrics']['after']['FA']:.2f}" in text
    assert page.tags.count("table") == 7 and "script" not in page.tags and "img" not in page.tags


def test_every_value_is_escaped_once() -> None:
    raw = render_html(_hostile(SAMPLE))
    page = _Page(raw)
    assert "script" not in page.tags and "img" not in page.tags      # no markup came from the values
    assert "<script>" not in raw and "<img" not in raw
    assert "&lt;script&gt;" in raw and "&amp; &#34;quoted&#34;" in raw  # escaped, not double-escaped
    assert page.visible.count(HOSTILE) >= 10                          # and shown to the reader as typed


def test_a_refused_request_escapes_its_reason_and_ids() -> None:
    r = copy.deepcopy(SAMPLE)
    r["entry"]["body"] = {"kind": "refused", "request_id": "req-1", "operator": HOSTILE, "reason": HOSTILE,
                          "requested_ids": [1, 2, HOSTILE]}
    page = _Page(render_html(r))
    assert "Refused deletion request" in page.visible and "refused: nothing was deleted" in page.visible
    assert page.visible.count(HOSTILE) == 3 and "script" not in page.tags and "img" not in page.tags


# sha256 of the pages the Jinja2 template (autoescape on, StrictUndefined; receipts.py up to d99bf48)
# wrote for these receipts. The direct writer must write the same bytes; a deliberate change of the
# page changes these.
_TEMPLATE_PAGES = {
    "sample": "e98005ca601853d0576ad91be12c4f02502595240b9e87085046989dd4a5b34e",
    "hostile": "1289b3714b4d1fca28fdae7ff61a8624d4e99dc9dab63faecf3825c340dbc6f6",
    "refused": "caa095e15538605288e814ea0b5dfe174af18807c233fa1e5b189975d44619ec",
    "failed": "df91db42678a598510237f057f04ca65233e434277adc85cf8a9d0ec0b9c4f4c",
    "empty": "7a329e475667f24355d1db487a41c172b079206d6624a940ebf1863b80f22c70",
}


def _cases() -> dict[str, dict]:
    refused = copy.deepcopy(SAMPLE)
    refused["entry"]["body"] = {"kind": "refused", "request_id": "req-1", "operator": HOSTILE, "reason": HOSTILE,
                                "requested_ids": [1, 2, HOSTILE]}
    failed = copy.deepcopy(SAMPLE)  # every status kind, the optional rows filled, unsigned
    b = failed["entry"]["body"]
    b["evidence"].update({"passed": False, "in_checkpoints": {"e.rows": [1]}, "TPR@1%": 0.5, "TPR@0.1%": 0.25,
                          "FA_minus_TA_same_classes": -1.5})
    b["evidence"]["own_key_search"]["queries"] = 0
    b.update({"recovered": True, "already_deleted": [5, 6]})
    del failed["signature"]
    empty = copy.deepcopy(SAMPLE)  # fields missing or None
    empty["entry"]["body"] = {"kind": "deletion", "request_id": None}
    empty["log_head"] = None
    return {"sample": SAMPLE, "hostile": _hostile(SAMPLE), "refused": refused, "failed": failed, "empty": empty}


def test_the_page_is_the_one_the_template_wrote() -> None:
    pages = {name: hashlib.sha256(render_html(r).encode("utf-8")).hexdigest() for name, r in _cases().items()}
    assert pages == _TEMPLATE_PAGES


def test_a_receipt_with_the_difference_interval_shows_it() -> None:
    r = copy.deepcopy(DOCS_SAMPLE)
    ev = r["entry"]["body"]["evidence"]
    ev.update({"FA_minus_TA_same_classes": 77.78, "difference_se": 13.86, "difference_interval": [-7.9, 93.1]})
    text = _Page(render_html(r)).visible
    assert "FA after minus that (95% interval) +77.78 (-7.90 to +93.10)" in text and "±" not in text
    del ev["difference_interval"]  # a receipt issued before the interval was recorded: as it always read
    assert "FA after minus that (± its standard error) +77.78 ± 13.86" in _Page(render_html(r)).visible
