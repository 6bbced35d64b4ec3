"""Deletion receipts: a JSON document and a readable HTML page per request, checkable against the log.

A receipt holds the whole log entry (its body, seq, prev_hash and entry_hash), the log's head
(seq, hash) at the moment it was issued, and `receipt_sha256` over the rest of it (canonical
JSON). `verify_receipt` checks, in order: the receipt is unaltered; its entry hashes to the hash
it claims; the run's log is intact (audit.verify_run); the log still holds this very entry; and
the log still holds the head the receipt saw (so nothing up to it was rewritten since).
Files: `<run>/receipts/<request_id>.json` and `.html` (self-contained, no external resources).
Tests: tests/test_audit.py.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from munkey_core import __version__
from munkey_core.audit.log import AuditLog, Entry, entry_hash, now_utc, open_log, verify_run
from munkey_core.audit.canonical import canonical_bytes, sha256_hex
from munkey_core.errors import MunkeyError
from munkey_core.atomic import atomic_write_bytes, atomic_write_json

RECEIPT_FORMAT = "munkey-receipt/1"
RECEIPTS_DIR = "receipts"


def build_receipt(log: AuditLog, entry: Entry) -> dict:
    """The receipt for `entry`, carrying the log's current head."""
    head = log.head()
    receipt = {
        "receipt_format": RECEIPT_FORMAT, "issued": now_utc(), "software": f"munkey-core {__version__}",
        "request_id": entry.request_id, "run_id": log.run_id,
        "log": f"{log.binding['backend']}:{log.binding['location']}",  # never a password or an absolute path
        "entry": {"seq": entry.seq, "prev_hash": entry.prev_hash, "entry_hash": entry.entry_hash, "body": entry.body},
        "log_head": {"seq": head.seq, "hash": head.entry_hash} if head else None,
        "how_to_verify": "munkey audit verify-receipt RECEIPT.json RUN_DIR",
    }
    receipt["receipt_sha256"] = sha256_hex(canonical_bytes(receipt))
    return receipt


def receipt_paths(root: str | Path, request_id: str) -> tuple[Path, Path]:
    base = Path(root) / RECEIPTS_DIR / request_id
    return base.with_suffix(".json"), base.with_suffix(".html")


def write_receipt(root: str | Path, receipt: dict) -> tuple[Path, Path]:
    """Write the JSON and HTML files of a receipt (atomically); returns their paths."""
    js, page = receipt_paths(root, receipt["request_id"])
    atomic_write_json(js, receipt)
    atomic_write_bytes(page, render_html(receipt).encode("utf-8"))
    return js, page


def issue(root: str | Path, log: AuditLog, entry: Entry) -> tuple[Path, Path]:
    return write_receipt(root, build_receipt(log, entry))


def load_receipt(path: str | Path) -> dict:
    """A receipt JSON file; a missing, binary or malformed file raises MunkeyError."""
    path = Path(path)
    if not path.is_file():
        raise MunkeyError(f"The receipt {path} does not exist.")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise MunkeyError(f"{path} is not a receipt (it is not JSON text); give the .json file of a receipt.") from None
    if not isinstance(data, dict) or data.get("receipt_format") != RECEIPT_FORMAT:
        raise MunkeyError(f"{path} is not a MUNKEY deletion receipt ({RECEIPT_FORMAT}).")
    return data


def verify_receipt(receipt: dict, root: str | Path, url: str | None = None) -> dict:
    """Check a receipt against the run's log; returns {ok, request_id, seq, message, checks}."""
    checks: list[dict] = []

    def result(ok: bool, message: str) -> dict:
        e = receipt.get("entry") if isinstance(receipt.get("entry"), dict) else {}
        return {"ok": ok, "request_id": receipt.get("request_id"), "seq": e.get("seq"), "message": message,
                "checks": checks}

    claimed = receipt.get("receipt_sha256")
    rest = {k: v for k, v in receipt.items() if k != "receipt_sha256"}
    try:
        intact = claimed == sha256_hex(canonical_bytes(rest))
        e = receipt["entry"]
        entry_ok = entry_hash(receipt["run_id"], int(e["seq"]), e["prev_hash"], e["body"]) == e["entry_hash"]
    except (KeyError, TypeError, ValueError):
        return result(False, "the receipt is malformed: fields are missing")
    checks.append({"check": "receipt unaltered (receipt_sha256)", "ok": intact})
    if not intact:
        return result(False, "the receipt was altered after it was issued (receipt_sha256 does not match)")
    checks.append({"check": "entry hash re-computed from its content", "ok": entry_ok})
    if not entry_ok:
        return result(False, "the receipt's entry does not hash to the entry_hash it claims")
    v = verify_run(root, url)
    checks.append({"check": "the run's audit log is intact", "ok": v.ok})
    if not v.ok:
        return result(False, f"the run's audit log is not intact: {v.message}")
    log = open_log(root, url)
    if log is None:
        return result(False, "the run has no audit log")
    with log:
        if log.run_id != receipt["run_id"]:
            checks.append({"check": "receipt belongs to this run", "ok": False})
            return result(False, f"the receipt is for run {receipt['run_id']}, this run is {log.run_id}")
        by_seq = {x.seq: x for x in log.entries()}
    found = by_seq.get(int(e["seq"]))
    held = found is not None and found.entry_hash == e["entry_hash"]
    checks.append({"check": f"the log holds entry #{e['seq']} with this hash", "ok": held})
    if not held:
        return result(False, f"the log no longer holds this receipt's entry #{e['seq']}: it was removed or replaced")
    head = receipt.get("log_head") or {}
    head_entry = by_seq.get(int(head.get("seq", -1)))
    head_ok = head_entry is not None and head_entry.entry_hash == head.get("hash")
    checks.append({"check": f"the log still holds the head #{head.get('seq')} seen when the receipt was issued",
                   "ok": head_ok})
    if not head_ok:
        return result(False, f"the log was rewritten after this receipt was issued: entry #{head.get('seq')} differs")
    return result(True, f"valid: entry #{e['seq']} of an intact log ({v.entries} entries, head #{v.head_seq})")


# --------------------------------------------------------------------------- HTML


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _table(rows: list[tuple], head: tuple | None = None) -> str:
    e = html.escape
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{e(str(h))}</th>" for h in head) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c if isinstance(c, _Raw) else e(_fmt(c))}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


class _Raw(str):
    """Already-escaped HTML for a table cell."""


def _ok(flag: bool | None) -> _Raw:
    if flag is None:
        return _Raw('<span class="na">not checked</span>')
    return _Raw('<span class="ok">passed</span>' if flag else '<span class="bad">FAILED</span>')


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
color:#1b1f24}h1{font-size:1.6rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ccd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;width:100%}td,th{border:1px solid #ccd;padding:.3rem .5rem;
text-align:left;vertical-align:top}th{background:#f2f4f8}code,.mono{font-family:ui-monospace,monospace;
font-size:.85rem;word-break:break-all}.ok{color:#116329;font-weight:600}.bad{color:#a40e26;font-weight:600}
.na{color:#666}.note{color:#444;font-size:.9rem}.badge{display:inline-block;padding:.2rem .6rem;border-radius:.3rem;
background:#e6f4ea;color:#116329;font-weight:600}.badge.bad{background:#fde7ea}"""


def render_html(receipt: dict) -> str:
    """A self-contained, readable page for a receipt (all values escaped)."""
    e = html.escape
    entry = receipt["entry"]
    b = entry["body"]
    refused = b.get("kind") == "refused"
    ev = b.get("evidence") or {}
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>MUNKEY receipt {e(receipt['request_id'])}"
             f"</title><style>{_CSS}</style></head><body>"]
    title = "Refused deletion request" if refused else "Deletion receipt"
    badge = ('<span class="badge bad">refused: nothing was deleted</span>' if refused else
             '<span class="badge">deleted and verified</span>' if ev.get("passed") else
             '<span class="badge bad">deleted; a post-deletion check FAILED</span>')
    parts.append(f"<h1>{title}</h1><p>{badge}</p>")
    parts.append("<h2>Request</h2>" + _table([
        ("Request id", _Raw(f"<code>{e(str(b.get('request_id')))}</code>")), ("Operator", b.get("operator")),
        ("Data subject (pseudonymous reference)", b.get("subject_ref")), ("Received (UTC)", b.get("received")),
        ("Executed (UTC)", b.get("executed")), ("Method", b.get("method")), ("Dataset", b.get("dataset")),
        ("Run id", _Raw(f"<code>{e(str(b.get('run_id')))}</code>")), ("Audit log", receipt.get("log")),
    ]))
    if refused:
        ids = b.get("requested_ids")
        parts.append("<h2>Why it was refused</h2>" + f"<p>{e(str(b.get('reason')))}</p>"
                     + (f"<p class=note>Ids named: {e(', '.join(map(str, ids)))}</p>" if ids else ""))
    else:
        samples = b.get("samples", [])
        already = b.get("already_deleted", [])
        parts.append(f"<h2>Samples</h2><p>{len(samples)} training sample(s) deleted by this request"
                     + (f"; {len(already)} named id(s) had been deleted by earlier requests: "
                        f"{e(', '.join(map(str, already)))}" if already else "") + ".</p>")
        if samples:
            parts.append(_table([(s["id"], _Raw(f"<code>{e(str(s.get('memory_sha256')))}</code>"),
                                  _Raw(f"<code>{e(str(s.get('image_sha256')))}</code>")) for s in samples],
                                ("id", "memory row sha256 (key + exemplar)", "image sha256")))
        m, bank = b.get("model", {}), b.get("bank", {})
        parts.append("<h2>Model and memory bank</h2>" + _table([
            ("Model weights fingerprint", _Raw(f"<code>{e(str(m.get('before')))}</code>"),
             _Raw(f"<code>{e(str(m.get('after')))}</code>")),
            ("Memory bank fingerprint", _Raw(f"<code>{e(str(bank.get('before', {}).get('fingerprint')))}</code>"),
             _Raw(f"<code>{e(str(bank.get('after', {}).get('fingerprint')))}</code>")),
            ("Memory bank entries", bank.get("before", {}).get("size"), bank.get("after", {}).get("size")),
        ], ("", "before", "after")) + "<p class=note>Key deletion changes no weight: the model fingerprint stays the "
            "same, the memory bank loses exactly the deleted rows.</p>")
        met = b.get("metrics", {})
        mb, ma = met.get("before") or {}, met.get("after") or {}
        parts.append("<h2>Model quality (percent; Ps is a ratio)</h2>" + _table(
            [(k, mb.get(k), ma.get(k)) for k in ("TA", "RA", "FA", "MIA", "Ps")], ("metric", "before", "after"))
            + f"<p class=note>Before: {e(str(met.get('before_source')))}. After: {e(str(met.get('after_source')))}. "
              "TA test accuracy, RA retained training samples, FA all samples deleted so far, MIA membership "
              "attack AUC (50 = indistinguishable from unseen data).</p>")
        own, probe = ev.get("own_key_search", {}), ev.get("probe_search", {})
        parts.append("<h2>Evidence after the deletion</h2>" + _table([
            (f"Search with the deleted samples' own keys ({own.get('queries')} queries, top {ev.get('k')})",
             _ok(not own.get("retrieved") if own.get("queries") else None)),
            (f"Search with a probe set ({probe.get('set')}, {probe.get('queries')} queries, top {ev.get('k')})",
             _ok(not probe.get("retrieved") if probe.get("queries") else None)),
            ("None left in the memory bank (memory and bank file)",
             _ok(not ev.get("in_memory_bank") and not ev.get("in_bank_file")) if ev else _ok(None)),
            (f"None left in the {ev.get('checkpoints_checked')} checkpoint(s)", _ok(not ev.get("in_checkpoints"))
             if ev else _ok(None)),
        ], ("check", "result")) + _table([
            ("FA on this request's samples, before", ev.get("request_FA_before")),
            ("FA on this request's samples, after", ev.get("request_FA_after")),
            ("MIA AUC on this request's samples (vs test)", ev.get("request_MIA")),
            ("MIA attack", ev.get("MIA_attack")),
            ("Gaps to a retrained oracle", ev.get("oracle_gaps")),
        ], ("measure", "value")) + f"<p class=note>{e(str(ev.get('oracle_note') or ''))}</p>")
        if b.get("recovered"):
            parts.append("<p class=note>This deletion was interrupted and finished automatically when the run was "
                         "next opened.</p>")
    head = receipt.get("log_head") or {}
    parts.append("<h2>Integrity</h2>" + _table([
        ("Log entry", f"#{entry['seq']}"), ("Entry hash", _Raw(f"<code>{e(entry['entry_hash'])}</code>")),
        ("Previous entry's hash", _Raw(f"<code>{e(entry['prev_hash'])}</code>")),
        ("Log head when issued", _Raw(f"#{e(str(head.get('seq')))} <code>{e(str(head.get('hash')))}</code>")),
        ("Receipt issued (UTC)", receipt.get("issued")),
        ("Receipt sha256", _Raw(f"<code>{e(str(receipt.get('receipt_sha256')))}</code>")),
    ]) + "<p>To check this receipt against the run's audit log: <code>munkey audit verify-receipt "
        f"{e(receipt['request_id'])}.json RUN_DIR</code>. The JSON file is the authoritative receipt; this page "
        "shows it.</p></body></html>")
    return "".join(parts)
