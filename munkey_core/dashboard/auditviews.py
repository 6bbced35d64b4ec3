"""What the dashboard's audit page shows (no Streamlit here, by rule): read-only views of the log.

Nothing here writes to the run: receipts are rebuilt in memory for download, and an uploaded
receipt is checked in memory. The log's location comes from the run ($MUNKEY_AUDIT_URL for a
PostgreSQL log). Cost: one read of the log and one chain verification per call.
Tests: tests/audit/test_audit.py (views), tests/app/test_app.py (the page).
"""

from __future__ import annotations

import json
from pathlib import Path

from munkey_core.audit import log as audit
from munkey_core.audit import receipts
from munkey_core.forget.request import record_refusal
from munkey_core.errors import MunkeyError
from munkey_core.service import MunkeyRun


def audit_status(run: MunkeyRun) -> dict:
    """verify_run as a dict; a log that cannot be read comes back as not ok with the reason."""
    try:
        return audit.verify_run(run.paths.root, run.audit_url).as_dict()
    except MunkeyError as exc:
        return {"ok": False, "log": None, "entries": 0, "head_seq": None, "head_hash": None, "first_bad_seq": None,
                "problem": "unreadable", "message": str(exc), "notes": []}


def audit_rows(run: MunkeyRun) -> list[dict]:
    """One row per log entry, oldest first (empty when the run has no log yet)."""
    log = audit.open_log(run.paths.root, run.audit_url)
    if log is None:
        return []
    with log:
        entries = log.entries()
    rows = []
    for e in entries:
        b = e.body
        ids = [int(s["id"]) for s in b.get("samples", [])]
        rows.append({"seq": e.seq, "kind": e.kind, "request_id": e.request_id, "operator": b.get("operator"),
                     "subject_ref": b.get("subject_ref"), "received": b.get("received"),
                     "executed": b.get("executed"), "n_deleted": len(ids), "ids": ids,
                     "already_deleted": b.get("already_deleted", []),
                     "bank_size_after": (b.get("bank") or {}).get("after", {}).get("size"),
                     "checks_passed": (b.get("evidence") or {}).get("passed"), "reason": b.get("reason"),
                     "recovered": b.get("recovered", False), "entry_hash": e.entry_hash})
    return rows


def audit_table(rows: list[dict]) -> list[dict]:
    """`audit_rows` as the page's table: a cell that does not apply to an entry (a refused request's
    execution time, bank size and checks; a deletion's refusal reason) or an operator nobody named reads
    as words, never None."""
    def cell(v, empty: str = "—") -> str:
        return empty if v is None or v == "" else str(v)

    return [{"entry": r["seq"], "kind": r["kind"], "request id": r["request_id"],
             "operator": audit.operator_label(r["operator"]), "received (UTC)": cell(r["received"]),
             "executed (UTC)": cell(r["executed"]), "ids deleted": r["n_deleted"], "ids": " ".join(map(str, r["ids"])),
             "bank size after": cell(r["bank_size_after"]),
             "checks passed": {True: "yes", False: "no"}.get(r["checks_passed"], "—"),
             "reason refused": cell(r["reason"], "")} for r in rows]


def receipt_documents(run: MunkeyRun, request_id: str) -> tuple[bytes, bytes]:
    """(JSON, HTML) of the receipt for a logged request, rebuilt in memory with the log's current head."""
    log = audit.open_log(run.paths.root, run.audit_url)
    if log is None:
        raise MunkeyError("This run has no audit log yet: no deletion request has been filed.")
    with log:
        entry = log.find(request_id)
        if entry is None:
            raise MunkeyError(f"The log holds no request {request_id!r}.")
        receipt = receipts.build_receipt(log, entry)
    return (json.dumps(receipt, indent=2, sort_keys=True) + "\n").encode(), receipts.render_html(receipt).encode()


def check_receipt_bytes(run: MunkeyRun, data: bytes, name: str = "receipt") -> dict:
    """verify_receipt for an uploaded receipt file (processed in memory, never stored)."""
    if len(data) > receipts.MAX_RECEIPT_BYTES:
        raise MunkeyError(f"{name} is too large to be a receipt.")
    return receipts.verify_receipt(receipts.parse_receipt(data, name), run.paths.root, run.audit_url)


def refuse_unauthorised(run: MunkeyRun, ids: list[int], operator: str) -> str | None:
    """Log a deletion attempted without a valid operator credential; returns the request id."""
    return record_refusal(Path(run.paths.root), reason="The operator credential is missing or wrong.",
                          operator=operator or None, requested_ids=ids, source="dashboard", url=run.audit_url,
                          lock=run.runlock)
