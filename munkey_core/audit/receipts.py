"""Deletion receipts: a JSON document and a readable HTML page per request, checkable against the log.

A receipt holds the whole log entry (its body, seq, prev_hash and entry_hash), the log's head
(seq, hash) at the moment it was issued, `receipt_sha256` over the rest of it (canonical JSON), the
operator's public key, and an Ed25519 signature over every other field (format 2; refusals get one
too). `verify_receipt` checks, in order: the receipt is unaltered and its signature holds (offline:
only the public key is needed); its entry hashes to the hash it claims; and, given the run, the
run's log is intact (log.verify_run); the log still holds this very entry; and the log still holds
the head the receipt saw (so nothing up to it was rewritten since). Receipts of format 1 (older,
unsigned) verify as "unsigned (older format)".
Files: `<run>/receipts/<request_id>.json` and `.html` (self-contained, no external resources).
Tests: tests/audit/test_audit.py, tests/audit/test_receipt_html.py (the page: escaping, content, the same
bytes as the Jinja2 template it replaced), tests/audit/test_canonical_oracle.py (hash and signature
against an independent RFC 8785 encoder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import markupsafe

from munkey_core import __version__
from munkey_core.audit import signing
from munkey_core.audit.log import AuditLog, Entry, entry_hash, now_utc, open_log, verify_run
from munkey_core.audit.canonical import Encoded, canonical_bytes, sha256_hex
from munkey_core.errors import MunkeyError
from munkey_core.atomic import atomic_write_many, json_bytes

RECEIPT_FORMAT = "munkey-receipt/2"  # signed (Ed25519)
LEGACY_FORMAT = "munkey-receipt/1"  # unsigned, older versions: verified as "unsigned (older format)"
FORMATS = (RECEIPT_FORMAT, LEGACY_FORMAT)
RECEIPTS_DIR = "receipts"
MAX_RECEIPT_BYTES = 8 * 1024 * 1024  # a receipt file larger than this is refused before it is read


def signed_content(receipt: dict) -> bytes:
    """What a receipt's signature covers: every field but the signature itself (canonical JSON)."""
    return canonical_bytes({k: v for k, v in receipt.items() if k != "signature"})


def build_receipt(log: AuditLog, entry: Entry) -> dict:
    """The receipt for `entry`, carrying the log's current head, signed with the operator's key (every
    field is covered: change any one, even `issued`, and the signature fails)."""
    head = log.head()
    key = signing.signer(log.root).public_key
    receipt = {
        "receipt_format": RECEIPT_FORMAT, "issued": now_utc(), "software": f"munkey-core {__version__}",
        "request_id": entry.request_id, "run_id": log.run_id,
        "log": f"{log.binding['backend']}:{log.binding['location']}",  # never a password or an absolute path
        "entry": {"seq": entry.seq, "prev_hash": entry.prev_hash, "entry_hash": entry.entry_hash, "body": entry.body},
        "log_head": {"seq": head.seq, "hash": head.entry_hash} if head else None,
        "public_key": key,
        "how_to_verify": "munkey audit verify-receipt RECEIPT.json [RUN_DIR] --public-key KEY",
    }
    # hashed and signed with the body's canonical text when the entry carries it (the same bytes)
    fast = receipt if entry.text is None else {**receipt, "entry": {**receipt["entry"], "body": Encoded(entry.text)}}
    receipt["receipt_sha256"] = fast["receipt_sha256"] = sha256_hex(canonical_bytes(fast))
    receipt["signature"] = signing.signer(log.root).sign(signed_content(fast))
    return receipt


def receipt_paths(root: str | Path, request_id: str) -> tuple[Path, Path]:
    base = Path(root) / RECEIPTS_DIR / request_id
    return base.with_suffix(".json"), base.with_suffix(".html")


def receipt_files(root: str | Path, receipt: dict) -> list[tuple[Path, bytes]]:
    """The (path, bytes) of a receipt's JSON and HTML files."""
    js, page = receipt_paths(root, receipt["request_id"])
    return [(js, json_bytes(receipt)), (page, render_html(receipt).encode("utf-8"))]


def write_receipt(root: str | Path, receipt: dict) -> tuple[Path, Path]:
    """Write the JSON and HTML files of a receipt (atomically); returns their paths."""
    # one group write (atomic.py atomic_write_many): each file atomic, both durable on return
    atomic_write_many(receipt_files(root, receipt))
    return receipt_paths(root, receipt["request_id"])


def issue(root: str | Path, log: AuditLog, entry: Entry) -> tuple[Path, Path]:
    return write_receipt(root, build_receipt(log, entry))


def append_with_receipt(root: str | Path, log: AuditLog, body: dict, *,
                        flush_pending_removal: bool = True) -> tuple[Entry, Path, Path]:
    """`log.append(body)` then `issue` of its receipt, with the receipt's files written in the same
    group as the log's new head (AuditLog.append `also`): one round of file flushes and one of folder
    flushes for the three, instead of two each. The receipt is built after the entry is committed, as
    by `issue`; a crash before the group's renames leaves the entry committed and pending, which the
    next open anchors (and a deletion's journal then issues the receipt again)."""
    entry = log.append(body, also=lambda e: receipt_files(root, build_receipt(log, e)),
                       flush_pending_removal=flush_pending_removal)
    js, page = receipt_paths(root, entry.request_id)
    return entry, js, page


def load_receipt(path: str | Path) -> dict:
    """A receipt JSON file; a missing, huge, binary, deeply nested or malformed file raises MunkeyError."""
    path = Path(path)
    if path.is_dir():
        raise MunkeyError(f"{path} is a folder; give one receipt's .json file in it.")
    if not path.is_file():
        raise MunkeyError(f"The receipt {path} does not exist.")
    if path.stat().st_size > MAX_RECEIPT_BYTES:
        raise MunkeyError(f"{path} is too large to be a receipt (over {MAX_RECEIPT_BYTES // (1024 * 1024)} MB).")
    return parse_receipt(path.read_bytes(), str(path))


def parse_receipt(data: bytes, name: str = "receipt") -> dict:
    """A receipt from bytes (a file or an upload), checked for its shape; MunkeyError if it is not one."""
    try:
        data_ = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MunkeyError(f"{name} is not a receipt (it is not JSON text of a sane depth); give the .json file of "
                          "a receipt.") from None
    if not isinstance(data_, dict) or data_.get("receipt_format") not in FORMATS:
        raise MunkeyError(f"{name} is not a MUNKEY deletion receipt ({RECEIPT_FORMAT}).")
    problem = _shape_problem(data_)
    if problem:
        raise MunkeyError(f"{name} is a malformed receipt: {problem}.")
    return data_


def _shape_problem(r: dict) -> str | None:
    """What is wrong with a receipt's structure (types of the fields verification reads), or None."""
    def is_hash(x) -> bool:
        return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)

    def is_seq(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 < x < 2 ** 53

    e = r.get("entry")
    if not isinstance(r.get("run_id"), str) or not isinstance(r.get("request_id"), str):
        return "run_id and request_id must be strings"
    if not isinstance(e, dict) or not isinstance(e.get("body"), dict):
        return "its entry is missing"
    if not is_seq(e.get("seq")) or not is_hash(e.get("prev_hash")) or not is_hash(e.get("entry_hash")):
        return "its entry's seq, prev_hash or entry_hash is malformed"
    head = r.get("log_head")
    if head is not None and (not isinstance(head, dict) or not is_seq(head.get("seq")) or not is_hash(head.get("hash"))):
        return "its log_head is malformed (expected {seq, hash})"
    if not is_hash(r.get("receipt_sha256")):
        return "its receipt_sha256 is malformed"
    if r.get("receipt_format") == RECEIPT_FORMAT and (not isinstance(r.get("signature"), dict)
                                                     or not isinstance(r.get("public_key"), str)):
        return "it has no signature (a signed receipt format)"
    try:
        canonical_bytes(r)
    except (TypeError, ValueError, RecursionError):
        return "it holds values canonical JSON cannot encode"
    return None


def verify_receipt(receipt: dict, root: str | Path | None = None, url: str | None = None,
                   trusted_key: str | None = None) -> dict:
    """Check a receipt: its hash and signature (offline, with the public key only), its entry's hash,
    then, when a run is given, that the run's log is intact and still holds this entry and the head the
    receipt saw. Returns {ok, signed, request_id, seq, message, checks}; never raises on a bad receipt."""
    checks: list[dict] = []
    problem = _shape_problem(receipt) if isinstance(receipt, dict) else "not a JSON object"
    signed = isinstance(receipt, dict) and receipt.get("receipt_format") == RECEIPT_FORMAT

    def result(ok: bool, message: str) -> dict:
        e = receipt.get("entry") if isinstance(receipt, dict) and isinstance(receipt.get("entry"), dict) else {}
        rid = receipt.get("request_id") if isinstance(receipt, dict) else None
        return {"ok": ok, "signed": signed, "request_id": rid, "seq": e.get("seq"), "message": message,
                "checks": checks}

    if problem:
        return result(False, f"the receipt is malformed: {problem}")
    e = receipt["entry"]
    rest = {k: v for k, v in receipt.items() if k not in ("receipt_sha256", "signature")}
    intact = receipt["receipt_sha256"] == sha256_hex(canonical_bytes(rest))
    checks.append({"check": "receipt unaltered (receipt_sha256)", "ok": intact})
    if not intact:
        return result(False, "the receipt was altered after it was issued (receipt_sha256 does not match)")
    if signed:
        ok, why = signing.verify_signature(receipt["signature"], signed_content(receipt), trusted_key)
        ok = ok and receipt["signature"].get("public_key") == receipt["public_key"]
        checks.append({"check": "signature over every field (Ed25519)", "ok": ok, "detail": why})
        if not ok:
            return result(False, f"the receipt's signature is not valid: {why}")
        named = e["body"].get("signer")
        if isinstance(named, str) and named != receipt["public_key"]:
            checks.append({"check": "signed by the key its log entry names", "ok": False})
            return result(False, "the receipt is signed by another key than the one its log entry names")
    elif trusted_key is not None or e["body"].get("signer") is not None:
        checks.append({"check": "signature over every field (Ed25519)", "ok": False})
        return result(False, "the receipt is unsigned, but its entry was written by a signing version (or a "
                      "trusted key was given): it was stripped of its signature")
    try:
        entry_ok = entry_hash(receipt["run_id"], e["seq"], e["prev_hash"], e["body"]) == e["entry_hash"]
    except (TypeError, ValueError, RecursionError):
        entry_ok = False
    checks.append({"check": "entry hash re-computed from its content", "ok": entry_ok})
    if not entry_ok:
        return result(False, "the receipt's entry does not hash to the entry_hash it claims")
    how = (f"signed by key {receipt['public_key']}" + (" (the trusted key)" if trusted_key else "")
           if signed else "unsigned (older format): its hashes hold, but nothing proves who issued it")
    if root is None:
        return result(True, f"valid offline: entry #{e['seq']}, {how}; give the run to check it against the log")
    v = verify_run(root, url, trusted_key)
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
    found = by_seq.get(e["seq"])
    held = found is not None and found.entry_hash == e["entry_hash"]
    checks.append({"check": f"the log holds entry #{e['seq']} with this hash", "ok": held})
    if not held:
        return result(False, f"the log no longer holds this receipt's entry #{e['seq']}: it was removed or replaced")
    head = receipt.get("log_head") or {}
    head_entry = by_seq.get(head.get("seq", -1))
    head_ok = head_entry is not None and head_entry.entry_hash == head.get("hash")
    checks.append({"check": f"the log still holds the head #{head.get('seq')} seen when the receipt was issued",
                   "ok": head_ok})
    if not head_ok:
        return result(False, f"the log was rewritten after this receipt was issued: entry #{head.get('seq')} differs")
    return result(True, f"valid: entry #{e['seq']} of an intact log ({v.entries} entries, head #{v.head_seq}); {how}")


# --------------------------------------------------------------------------- HTML
# The page is written directly, every value from the receipt escaped by markupsafe (what Jinja2's
# autoescaping calls): markup comes only from the fixed strings below. (It was a Jinja2 template;
# importing Jinja2 and compiling the template took about a tenth of a `munkey forget`. The page is
# the same bytes: tests/audit/test_receipt_html.py renders the old template as its oracle.)


@dataclass(frozen=True)
class _Code:
    """A cell shown in monospace (hashes, ids), optionally after a plain prefix."""

    text: object
    before: str = ""


@dataclass(frozen=True)
class _Status:
    """A check's outcome: passed, FAILED, or not checked (None)."""

    ok: bool | None


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
color:#1b1f24}h1{font-size:1.6rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ccd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;width:100%}td,th{border:1px solid #ccd;padding:.3rem .5rem;
text-align:left;vertical-align:top}th{background:#f2f4f8}code,.mono{font-family:ui-monospace,monospace;
font-size:.85rem;word-break:break-all}.ok{color:#116329;font-weight:600}.bad{color:#a40e26;font-weight:600}
.na{color:#666}.note{color:#444;font-size:.9rem}.badge{display:inline-block;padding:.2rem .6rem;border-radius:.3rem;
background:#e6f4ea;color:#116329;font-weight:600}.badge.bad{background:#fde7ea}"""

_STATUS = {None: '<span class="na">not checked</span>', True: '<span class="ok">passed</span>',
           False: '<span class="bad">FAILED</span>'}


def _esc(v: object) -> str:
    """`v` as HTML text, escaped once. Letters and digits only (ids, hashes: most cells of a large
    request) need no escaping and skip the call."""
    text = v if type(v) is str else str(v)
    return text if text.isalnum() else str(markupsafe.escape(text))


def _cell(c: object) -> str:
    """One table cell's content: a `_Code`, a `_Status` or a plain value (escaped once)."""
    if isinstance(c, _Code):
        return f"{_esc(c.before)}<code>{_esc(c.text)}</code>"
    if isinstance(c, _Status):
        return _STATUS[None if c.ok is None else bool(c.ok)]
    return _esc(_fmt(c))


def _table(rows: list[tuple], head: tuple | None = None) -> str:
    """A table: an optional header row of plain labels, then one row per tuple of cells."""
    parts = ["<table>"]
    if head:
        parts += ["<tr>", *(f"<th>{_esc(h)}</th>" for h in head), "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in r) + "</tr>" for r in rows]
    parts.append("</table>")
    return "".join(parts)


def _difference_row(ev: dict) -> tuple[str, str | None]:
    """FA minus the same-class accuracy with its 95 % interval. Receipts issued before the interval was
    recorded render as they always did (their standard error, 0 on the forget side at FA 0 or 100 %)."""
    diff, interval = ev.get("FA_minus_TA_same_classes"), ev.get("difference_interval")
    if diff is not None and interval:
        return "FA after minus that (95% interval)", f"{diff:+.2f} ({interval[0]:+.2f} to {interval[1]:+.2f})"
    return ("FA after minus that (± its standard error)",
            None if diff is None else f"{diff:+.2f} ± {ev.get('difference_se') or 0:.2f}")


def _section(title: str, *tables: str, before: tuple = (), notes: tuple = ()) -> dict:
    return {"title": title, "tables": list(tables), "before": [p for p in before if p], "notes": list(notes)}


def _page(*, request_id: object, title: str, badge: str, badge_bad: bool, sections: list[dict]) -> str:
    """The whole page around the sections (`tables` already written by `_table`)."""
    out = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>MUNKEY receipt {_esc(request_id)}</title>\n"
           f"<style>{_CSS}</style></head><body>\n"
           f'<h1>{_esc(title)}</h1><p><span class="badge{" bad" if badge_bad else ""}">{_esc(badge)}</span></p>\n']
    for s in sections:
        out.append(f"\n<h2>{_esc(s['title'])}</h2>")
        out += [f"<p>{_esc(p)}</p>" for p in s["before"]]
        out += s["tables"]
        out += [f"<p class=note>{_esc(p)}</p>" for p in s["notes"]]
        out.append("\n")
    out.append(f"\n<p>To check this receipt with only the operator's public key: <code>munkey audit verify-receipt "
               f"{_esc(request_id)}.json\n--public-key KEY</code>; against the run's audit log too: add the run "
               "folder. The JSON file is the authoritative receipt;\nthis page shows it.</p></body></html>")
    return "".join(out)


def render_html(receipt: dict) -> str:
    """A self-contained, readable page for a receipt (every value escaped once)."""
    entry = receipt["entry"]
    b = entry["body"]
    refused = b.get("kind") == "refused"
    ev = b.get("evidence") or {}
    sections = [_section("Request", _table([
        ("Request id", _Code(b.get("request_id"))), ("Operator", b.get("operator")),
        ("Data subject (pseudonymous reference)", b.get("subject_ref")), ("Received (UTC)", b.get("received")),
        ("Executed (UTC)", b.get("executed")), ("Method", b.get("method")), ("Dataset", b.get("dataset")),
        ("Run id", _Code(b.get("run_id"))), ("Audit log", receipt.get("log")),
    ]))]
    if refused:
        ids = b.get("requested_ids")
        sections.append(_section("Why it was refused", before=(str(b.get("reason")),),
                                 notes=(f"Ids named: {', '.join(map(str, ids))}",) if ids else ()))
    else:
        samples = b.get("samples", [])
        already = b.get("already_deleted", [])
        intro = (f"{len(samples)} training sample(s) deleted by this request"
                 + (f"; {len(already)} named id(s) had been deleted by earlier requests: "
                    f"{', '.join(map(str, already))}" if already else "") + ".")
        sample_tables = [_table([(s["id"], _Code(s.get("memory_sha256")), _Code(s.get("image_sha256")))
                                 for s in samples],
                                ("id", "memory row sha256 (key + exemplar)", "image sha256"))] if samples else []
        sections.append(_section("Samples", *sample_tables, before=(intro,)))
        m, bank = b.get("model", {}), b.get("bank", {})
        sections.append(_section("Model and memory bank", _table([
            ("Model weights fingerprint", _Code(m.get("before")), _Code(m.get("after"))),
            ("Memory bank fingerprint", _Code(bank.get("before", {}).get("fingerprint")),
             _Code(bank.get("after", {}).get("fingerprint"))),
            ("Memory bank entries", bank.get("before", {}).get("size"), bank.get("after", {}).get("size")),
        ], ("", "before", "after")), notes=("Key deletion changes no weight: the model fingerprint stays the same, the "
                                           "memory bank loses exactly the deleted rows.",)))
        met = b.get("metrics", {})
        mb, ma = met.get("before") or {}, met.get("after") or {}
        sections.append(_section("Model quality (percent; Ps is a ratio)", _table(
            [(k, mb.get(k), ma.get(k)) for k in ("TA", "RA", "FA", "MIA", "Ps")], ("metric", "before", "after")),
            notes=(f"Before: {met.get('before_source')}. After: {met.get('after_source')}. TA test accuracy, RA "
                   "retained training samples, FA all samples deleted so far, MIA membership attack AUC (50 = "
                   "indistinguishable from unseen data).",)))
        own, probe = ev.get("own_key_search", {}), ev.get("probe_search", {})
        checks = _table([
            (f"Search with the deleted samples' own keys ({own.get('queries')} queries, top {ev.get('k')})",
             _Status(not own.get("retrieved") if own.get("queries") else None)),
            (f"Search with a probe set ({probe.get('set')}, {probe.get('queries')} queries, top {ev.get('k')})",
             _Status(not probe.get("retrieved") if probe.get("queries") else None)),
            ("None left in the memory bank (memory and bank file)",
             _Status(not ev.get("in_memory_bank") and not ev.get("in_bank_file") if ev else None)),
            (f"None left in the {ev.get('checkpoints_checked')} checkpoint(s)",
             _Status(not ev.get("in_checkpoints") if ev else None)),
        ], ("check", "result"))
        measures = _table([
            ("FA on this request's samples, before", ev.get("request_FA_before")),
            ("FA on this request's samples, after", ev.get("request_FA_after")),
            ("Accuracy on unseen test samples of the same classes", ev.get("TA_same_classes")),
            _difference_row(ev),
            ("MIA AUC on this request's samples (vs test)", ev.get("request_MIA")),
            ("MIA TPR at 1% / 0.1% FPR", None if ev.get("TPR@1%") is None else
             f"{ev['TPR@1%']:.2f} / {ev.get('TPR@0.1%'):.2f}"),
            ("MIA attack", ev.get("MIA_attack")),
            *([("Training samples still held, same classes: accuracy / MIA AUC (what remembered samples read)",
                f"{ev['FA_remembered']:.2f} / {ev['MIA_remembered']:.2f}")]
              if ev.get("FA_remembered") is not None and ev.get("MIA_remembered") is not None else []),
            ("Gaps to a retrained oracle", ev.get("oracle_gaps")),
        ], ("measure", "value"))
        notes = [ev.get("same_class_note") or "", ev.get("oracle_note") or ""]
        if b.get("recovered"):
            notes.append("This deletion was interrupted and finished automatically when the run was next opened.")
        sections.append(_section("Evidence after the deletion", checks, measures, notes=tuple(notes)))
    head = receipt.get("log_head") or {}
    sections.append(_section("Integrity", _table([
        ("Log entry", f"#{entry['seq']}"), ("Entry hash", _Code(entry["entry_hash"])),
        ("Previous entry's hash", _Code(entry["prev_hash"])),
        ("Log head when issued", _Code(head.get("hash"), before=f"#{head.get('seq')} ")),
        ("Receipt issued (UTC)", receipt.get("issued")),
        ("Receipt sha256", _Code(receipt.get("receipt_sha256"))),
        ("Signed by (Ed25519 public key)", _Code(receipt.get("public_key")) if receipt.get("signature")
         else "unsigned (older format)"),
    ])))
    badge = ("refused: nothing was deleted" if refused else "deleted and verified" if ev.get("passed") else
             "deleted; a post-deletion check FAILED")
    return _page(request_id=receipt["request_id"], sections=sections, badge=badge,
                 badge_bad=bool(refused or not ev.get("passed")),
                 title="Refused deletion request" if refused else "Deletion receipt")
