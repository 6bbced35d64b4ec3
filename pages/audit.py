"""Audit log: every deletion request (refused ones too) from the run's hash-chained log, the chain's
verification, each request's receipt, and a receipt checker. Read-only: viewers change nothing
(receipts are rebuilt in memory; an uploaded receipt is checked in memory, never stored)."""

from pathlib import Path

import pandas as pd

import streamlit as st

from munkey_core.dashboard.auditviews import audit_rows, audit_status, audit_table, check_receipt_bytes, receipt_documents
from pages._common import require_run, user_errors

run = require_run()

st.title("Audit log")
st.caption("Every deletion request, refused ones too, is an entry of an append-only, hash-chained log: each entry "
           "carries the previous entry's hash and its own hash over a canonical encoding (RFC 8785), so an edited, "
           "removed, inserted or reordered entry is detected. Each request has a receipt carrying the log's head.")
status = audit_status(run)
rows = audit_rows(run) if status.get("problem") != "unreadable" else []
c = st.columns(4)
c[0].metric("Log entries", status.get("entries", 0))
c[1].metric("Deletion requests", sum(r["kind"] == "deletion" for r in rows))
c[2].metric("Samples deleted", len(run.forgotten_ids))
c[3].metric("Memory bank entries", len(run.bank))
if status["ok"]:
    where = str(status.get("log") or "")
    where = f"SQLite file {Path(where[len('sqlite:'):]).name} in the run directory" if where.startswith("sqlite:") else where
    st.success(f"Log verified ({where}): {status['message']}.", icon=":material/verified:")
else:
    st.error(f"Log NOT intact: {status['message']}. Restore the log from a backup and investigate; deletions are "
             "refused until then.", icon=":material/gpp_bad:")
for note in status.get("notes", []):
    st.info(note)
if not rows:
    st.info("No deletion request has been recorded for this run.")
else:
    df = pd.DataFrame(audit_table(rows))
    st.dataframe(df, hide_index=True)
    st.download_button("Download as CSV", df.to_csv(index=False), file_name="audit_log.csv", mime="text/csv",
                       key="download_csv")
    st.subheader("Receipt of a request")
    pick = st.selectbox("Request", [r["request_id"] for r in reversed(rows)], key="receipt_pick")
    if pick:
        with user_errors():
            js, page = receipt_documents(run, pick)
            cols = st.columns(2)
            cols[0].download_button("Receipt (JSON)", js, file_name=f"{pick}.json", mime="application/json",
                                    key="receipt_json")
            cols[1].download_button("Receipt (readable HTML)", page, file_name=f"{pick}.html", mime="text/html",
                                    key="receipt_html")

st.subheader("Check a receipt")
up = st.file_uploader("A receipt's .json file (checked in memory, never stored)", type=["json"], key="receipt_upload")
if up is not None:
    with user_errors():
        res = check_receipt_bytes(run, up.getvalue(), up.name)
        if res["ok"]:
            detail = res["message"].removeprefix("valid:").strip()  # the checker's message may repeat the word
            st.success(f"Receipt valid: {detail}." if detail else "Receipt valid.", icon=":material/verified:")
        else:
            st.error(f"Receipt INVALID: {res['message']}.", icon=":material/gpp_bad:")
        st.dataframe(pd.DataFrame(res["checks"]), hide_index=True)
