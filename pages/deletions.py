"""Deletion requests (for compliance officers): select training samples, preview them, delete them
as an authorised operator, and see what changed.

Anyone can select and preview; deleting needs the operator credential ($MUNKEY_OPERATOR_TOKEN or
`operator_token` in .streamlit/secrets.toml), compared in constant time, and the operator's name.
Every deletion is an audit-log entry with a receipt; an attempt with a wrong credential is logged
as refused. Uploaded images and ids files are processed in memory and never written to disk.
"""

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from munkey_core.dashboard.auditviews import refuse_unauthorised
from munkey_core.forget.ids import parse_ids
import hashlib

from munkey_core.dashboard.trust import find_copies
from munkey_core.dashboard.views import (DeletionJob, classify_ids, credential_gate, display_image, ids_from_bytes,
                                         metrics_table, oracle_check, similar_training_samples, training_images,
                                         unknown_ids_message)
from munkey_core.config import forgetting_note, recipe_changes
from munkey_core.eval.oracles import forget_tag
from munkey_core.eval.verdicts import FORGOTTEN, NOT_YET
from pages._common import (IMAGE_TYPES, collect_finished_job, configured_token, copy_index_for, decoded_uploads, fmt,
                           require_run, thumbnail_grid, user_errors)
from pages._grids import sample_filter

PREVIEW_MAX = 24
PER_ROW = 8

run = require_run()
names = run.class_names


VERDICT_STYLE = {FORGOTTEN: (st.success, ":material/check_circle:"), NOT_YET: (st.error, ":material/warning:")}


def show_verdicts(assessment: dict | None) -> None:
    """Each forgetting number against its target, with its verdict in words (eval/verdicts.py)."""
    if not assessment:
        st.warning("Forgetting was not measured for this request: cannot tell whether it is forgotten.",
                   icon=":material/help:")
        return
    word = assessment["overall"]
    show, icon = VERDICT_STYLE.get(word, (st.warning, ":material/help:"))
    show(f"Verdict: **{word}**. " + " ".join(v["reason"] for v in assessment["verdicts"]), icon=icon)
    st.dataframe(pd.DataFrame([{
        "measure": v["metric"], "value": fmt(v["value"], 1, " %"), "target": fmt(v["target"], 1, " %") + " " + v["target_label"],
        "95 % interval": "—" if not v["interval"] else f"{v['interval'][0]:.1f}-{v['interval'][1]:.1f} %",
        "samples still held read": fmt(v.get("remembered"), 1, " %"),
        "samples": fmt(v["n"], 0), "verdict": v["verdict"]} for v in assessment["verdicts"]]), hide_index=True)
    st.caption("\"Samples still held read\": the same measure on training samples the model still holds, of the "
               "same classes: what a sample it still remembered would read. \"Forgotten\" needs the value at the "
               "target and clearly below that (beyond both uncertainties); otherwise the page says it cannot tell.")


def show_same_class(same: dict | None) -> None:
    """This request's samples against unseen test samples of their classes, and what that does not show."""
    if not same or same.get("TA_same_classes") is None:
        return
    interval = same.get("difference_interval")
    st.write(f"This request's samples after the deletion, against unseen test samples of the same classes "
             f"({fmt(same['TA_same_classes'])} %): FA minus that {fmt(same.get('FA_minus_TA_same_classes'))} points"
             + (f" (95 % interval {interval[0]:+.2f} to {interval[1]:+.2f})" if interval else "")
             + (f"; membership attack TPR at 1 % / 0.1 % FPR {fmt(same['TPR@1%'])} / {fmt(same.get('TPR@0.1%'))} %"
                if same.get("TPR@1%") is not None else "") + ".")
    st.caption(same.get("same_class_note") or "")


def show_summary(summary: dict) -> None:
    """Before/after metrics, the retrieval check and the JSON download of a finished deletion."""
    st.subheader("Result of the last deletion")
    n_del = len(summary["deleted"])
    st.info(f"Deleted {n_del} training sample(s) in {1000 * summary['delete_seconds']:.1f} ms; the memory "
               f"bank went from {summary['bank_size_before']} to {summary['bank_size_after']} entries."
               + (f" {len(summary['already_deleted'])} id(s) had been deleted by an earlier request."
                  if summary["already_deleted"] else ""), icon=":material/delete:")
    table = pd.DataFrame(metrics_table(summary["metrics_before"], summary["metrics_after"]))
    for col in ("before", "after", "change"):
        table[col] = [fmt(v, 3 if m == "Ps" else 2) for v, m in zip(table[col], table["metric"])]
    table.loc[table["metric"] == "MIA", "before"] = "not defined before a deletion"
    show_verdicts(summary.get("assessment"))
    show_same_class(summary.get("same_class"))
    st.dataframe(table, hide_index=True)
    fa_req = summary.get("FA_this_request_after")
    st.caption(
        f"TA, RA, Ps before: {summary['before_source']}. FA before = accuracy on this request's samples while "
        f"still in the bank. FA and MIA after cover all {fmt(summary.get('n_forget_after'), 0)} samples deleted so far"
        + (f" (on this request's samples alone, FA after = {fmt(fa_req)} %)" if fa_req is not None else "")
        + f". MIA: {summary.get('MIA_attack') or 'not measured'}; 50 = indistinguishable from unseen test data.")
    check = summary["retrieval_check"]
    if check["ok"]:
        st.success(f"Retrieval check passed: searching the bank with the {check['ids_checked']} deleted samples' "
                   f"own keys (top {check['k']}) returns none of them, and none is left in the bank in memory or "
                   "in the bank file on disk.", icon=":material/verified:")
    else:
        st.error(f"Retrieval check FAILED: retrieved {check['retrieved']}, still in memory "
                 f"{check['in_memory_bank']}, still in the bank file {check['in_bank_file']}.",
                 icon=":material/error:")
    st.info(f"Request `{summary['request_id']}` is entry #{summary['log_entry']} of the audit log. Its receipt "
            "(JSON, and a readable page) carries the log's head hash; check it any time on the Audit log page or "
            "with `munkey audit verify-receipt`.", icon=":material/receipt_long:")
    c = st.columns(3)
    for col, key, label, mime, ext in ((c[0], "receipt_json", "Download receipt (JSON)", "application/json", "json"),
                                       (c[1], "receipt_html", "Download receipt (HTML)", "text/html", "html")):
        path = Path(summary[key])
        if path.is_file():
            col.download_button(label, path.read_bytes(), file_name=f"{summary['request_id']}.{ext}", mime=mime,
                                key=f"download_{ext}")
    c[2].download_button("Download deletion summary (JSON)", json.dumps(summary, indent=2, default=float),
                         file_name="deletion_summary.json", mime="application/json", key="download_summary")
    st.caption(summary.get("oracle_note") or "")


JOB_KEY = "deletion_job"


@st.fragment(run_every=1.0)
def _deletion_progress(job: DeletionJob) -> None:
    with st.status(f"Deleting and measuring: {job.stage}", state="running", expanded=True):
        st.progress(job.fraction, text=f"{job.elapsed:.0f} s")
        st.caption("The samples are deleted in milliseconds; the evaluation before and after (TA, RA, FA, MIA, Ps "
                   "and the retrieval check) takes longer. The page stays usable.")
    if job.state != "running":
        st.rerun(scope="app")


def show_oracle_check() -> None:
    """The deletions so far against a model retrained without them, where one was trained (nothing is
    trained here): the gaps, the noise floor of models retrained with other seeds, and the verdict."""
    st.subheader("Compared with a model retrained without the deleted samples")
    n_del = len(run.forgotten_ids)
    if n_del == 0:
        st.caption("Nothing is deleted yet.")
        return
    deleted_sig = forget_tag(run.forgotten_ids)
    check = st.session_state.get("oracle_check")
    if check is not None and check.get("deleted") != deleted_sig:
        check = None  # the deletions changed since it was measured
    if check is None:
        st.write(f"The verdicts above compare the {n_del} deleted sample(s) with unseen samples: that the model "
                 "treats them on average like data it never saw. Whether it matches a model that never saw them "
                 "needs that model (an M-oracle: the same recipe retrained without them) and its noise floor.")
        if st.button("Compare with the retrained model", key="oracle_compare", icon=":material/compare:"):
            with st.spinner("Measuring this model and the retrained ones on the same samples..."), user_errors():
                found = oracle_check(run)
                st.session_state["oracle_check"] = {"deleted": deleted_sig, "result": found}
                st.rerun()
        return
    found = check["result"]
    if found is None:
        st.info(f"No model retrained without exactly these {n_del} deletion(s) exists yet, so this page cannot "
                "tell whether the model matches one that never saw them. `munkey evaluate RUN --oracle "
                "--noise-floor 2` trains it and two more with other training seeds (minutes on the CPU profile); "
                "this section then shows the gaps and the noise floor.", icon=":material/help:")
        return
    show, icon = VERDICT_STYLE.get(found["verdict"], (st.warning, ":material/help:"))
    show(f"Verdict against retraining: **{found['verdict']}**. {found['reason']}", icon=icon)
    table = pd.DataFrame(found["rows"])
    for col in ("TA", "RA", "FA", "MIA", "Avg Gap to the M-oracle"):
        table[col] = [fmt(v) for v in table[col]]
    st.dataframe(table, hide_index=True)
    st.caption(f"{found['n_forget']} deleted samples (forget set {found['forget_set']}). Avg Gap: the mean of the "
               f"four absolute differences to the M-oracle. MIA: {found['MIA_attack']}. The bar: noise floor + 0.3.")


# A deletion finished in the background: keep its summary, drop the job (before anything is drawn, so the
# preview below already reflects the bank as it is now).
collect_finished_job(JOB_KEY, "deletion_summary", "summary")
job_running = st.session_state.get(JOB_KEY) is not None and st.session_state[JOB_KEY].state == "running"

st.title("Deletion requests")
st.write("Select the training samples a request names, check them, and delete them from the model's memory. "
         "Deletion removes each sample's key and exemplar from the bank and from every checkpoint: no "
         "retraining, and the deleted samples can no longer be retrieved as evidence.")
if _unmeasured := forgetting_note(run.config.get("profile", ""), run.config.get("dataset", ""),
                                  recipe_changes(run.config)):
    st.caption(_unmeasured)
if job_running:  # at the top, where the operator is looking
    _deletion_progress(st.session_state[JOB_KEY])

# A selection made on the Embeddings page arrives as a pre-filled list of ids.
prefill = st.session_state.pop("deletion_ids_prefill", None)
if prefill:
    st.session_state["method"] = "Type ids"
    st.session_state["ids_text"] = ", ".join(str(i) for i in prefill)
    st.info(f"{len(prefill)} sample(s) selected on the Embeddings page are filled in below.")

method = st.radio("Select samples", ["Type ids", "Upload an ids file", "Similar to an image"], horizontal=True,
                  key="method")
ids: list[int] = []
similar_rows: list[dict] = []
if method == "Type ids":
    text = st.text_area("Sample ids (commas, spaces or new lines)", key="ids_text", placeholder="12, 40, 41")
    if text.strip():
        with user_errors():
            ids = parse_ids(text, source="typed ids")
elif method == "Upload an ids file":
    f = st.file_uploader("CSV or text file of ids (a CSV may name an `id` column)", type=["csv", "txt"],
                         key="ids_file")
    if f is not None:
        with user_errors():
            ids = ids_from_bytes(f.getvalue(), f.name)
else:
    imgs = st.file_uploader("Image(s) of the person or object (PNG, JPEG, BMP, TIFF or NPY; any size)",
                            type=IMAGE_TYPES, accept_multiple_files=True,
                            key="query_images", help="Processed in memory and never written to disk.")
    top_n = st.number_input("How many of the most similar training samples", 1, max(1, len(run.bank)),
                            min(10, max(1, len(run.bank))), key="top_n")
    decoded = decoded_uploads(imgs)
    if decoded:
        with user_errors():
            index = copy_index_for(run)
            images = [img for _, img in decoded]
            copies = find_copies(run, index, images, top=1)
            similar_rows = similar_training_samples(run, images, int(top_n), copies=index)
            for (name, img), found in zip(decoded, copies):
                cols = st.columns([1, 5])
                cols[0].image(display_image(img, 128), caption=f"your image: {name}", width="stretch")
                if found["found"]:
                    cols[1].success(found["message"], icon=":material/content_copy:")
                else:
                    cols[1].info(found["message"], icon=":material/search_off:")
        if similar_rows:
            st.caption("Candidates: an exact or near-duplicate copy of an uploaded image first, then the most similar "
                       "training samples by key (cosine). Untick the ones the request does not name.")
            view = sample_filter(run, "cand_filter", [r["id"] for r in similar_rows], [r["label"] for r in similar_rows])
            shown_rows = [similar_rows[int(j)] for j in view.rows]
            pics = training_images(run, [r["id"] for r in shown_rows])
            for start in range(0, len(shown_rows), PER_ROW):
                cols = st.columns(PER_ROW)
                for col, r, pic in zip(cols, shown_rows[start:start + PER_ROW], pics[start:start + PER_ROW]):
                    col.image(display_image(pic, 128), width="stretch")
                    col.caption(f"**id {r['id']}** · {r['label_name']}  \n"
                                + (f"copy ({r['copy_score']:.3f})" if r["copy"] else f"similar ({r['similarity']:.2f})"))
            found_ids = [r["id"] for r in similar_rows]
            copy_ids = [r["id"] for r in similar_rows if r["copy"]]
            labels = {r["id"]: (f"{r['id']} (copy of your image, {r['copy_score']:.3f})" if r["copy"]
                                else f"{r['id']} (similar, {r['similarity']:.2f})") for r in similar_rows}
            if st.session_state.get("similar_pick_for") != found_ids:  # new candidates: preselect the copies only
                st.session_state["similar_pick"] = copy_ids
                st.session_state["similar_pick_for"] = found_ids
            ids = st.multiselect("Samples to delete (the exact copies are preselected)", found_ids,
                                 key="similar_pick", format_func=labels.get)

# Unknown ids can be dropped here instead of editing the file; what was dropped is remembered per selection.
raw_sig = hashlib.sha256(repr(ids).encode()).hexdigest()[:16]
if ids and st.session_state.get("drop_unknown_for") == raw_sig:
    dropped = classify_ids(run, ids)["unknown"]
    ids = [i for i in ids if i not in set(dropped)]
    st.caption(f"{len(dropped)} id(s) that cannot be deleted were dropped from this request: "
               + ", ".join(map(str, dropped[:20])) + (" ..." if len(dropped) > 20 else ""))

groups = classify_ids(run, ids) if ids else {"in_bank": [], "already_deleted": [], "unknown": [], "other_split": {}}
if ids:
    st.subheader("Preview")
    c = st.columns(3)
    c[0].metric("In the memory bank", len(groups["in_bank"]))
    c[1].metric("Deleted earlier", len(groups["already_deleted"]))
    c[2].metric("Cannot be deleted", len(groups["unknown"]))
    if groups["unknown"]:
        st.error(unknown_ids_message(groups), icon=":material/error:")
        if st.button(f"Drop the {len(groups['unknown'])} id(s) that cannot be deleted", key="drop_unknown",
                     icon=":material/remove_circle:"):
            st.session_state["drop_unknown_for"] = raw_sig
            st.rerun()
    in_bank = groups["in_bank"]
    if in_bank:
        with user_errors():
            st.caption(f"The filters below change only what is shown: all {len(in_bank)} sample(s) in the memory "
                       "bank stay in the request.")
            view = sample_filter(run, "preview_filter", in_bank, run.dataset.lookup(in_bank).labels, limit=PREVIEW_MAX)
            preview = [in_bank[int(j)] for j in view.rows]
            if preview:
                thumbnail_grid(run, preview, size=64, per_row=PER_ROW, caption=lambda i, name: f"id {i} · {name}")

st.subheader("Delete")
token = configured_token()
if token is None:
    st.warning("Deletion is disabled: no operator credential is configured. Set the environment variable "
               "`MUNKEY_OPERATOR_TOKEN` before starting the app, or add `operator_token = \"...\"` to "
               "`.streamlit/secrets.toml`. You can still select and preview samples.", icon=":material/lock:")
given = st.text_input("Operator credential", type="password", key="credential", disabled=token is None)
operator = st.text_input("Operator name (recorded in the audit log)", key="operator")
subject = st.text_input("Data subject reference (optional, e.g. a case number; the log keeps only a keyed hash)",
                        key="subject")
authorised = credential_gate.check(given, token, who="deletion page")
if token is not None and given and not authorised:
    st.warning("That credential is not accepted. You can preview, but not delete.", icon=":material/lock:")
n = len(groups["in_bank"])
ready = authorised and n > 0 and not groups["unknown"] and bool(operator.strip()) and not job_running
if job_running:
    st.info("A deletion is running (progress at the top of the page). Delete is locked until it ends.",
            icon=":material/hourglass_top:")
elif authorised and n > 0 and not operator.strip():
    st.info("Enter the operator's name to enable deletion.", icon=":material/badge:")
# The confirmation belongs to one selection and one request: unticked whenever the selected ids change
# (or the operator) and after every request.
confirm_sig = repr((sorted(groups["in_bank"]), operator.strip()))
if st.session_state.get("confirm_for") != confirm_sig:
    st.session_state["confirm"] = False
st.session_state["confirm_for"] = confirm_sig
confirm = st.checkbox(f"I confirm the deletion of {n} training sample(s). This cannot be undone.",
                      key="confirm", disabled=not ready)
if st.button(f"Delete {n} sample(s)", type="primary", key="delete", disabled=not (ready and confirm),
             icon=":material/delete_forever:"):
    st.session_state["confirm_for"] = None  # the next run unticks the confirmation
    if not credential_gate.check(given, configured_token(), who="deletion page"):  # re-checked at deletion
        rid = refuse_unauthorised(run, ids, operator.strip())
        st.error("Not authorised: the operator credential is missing or wrong. Nothing was deleted"
                 + (f"; the attempt is recorded as refused request {rid}." if rid else "."))
    else:
        with user_errors():
            job = DeletionJob(run, ids, operator=operator.strip(), subject=subject.strip() or None)
            st.session_state[JOB_KEY] = job
            st.session_state.pop("deletion_summary", None)
            job.start()
            st.rerun()

if not job_running and "deletion_summary" in st.session_state:
    show_summary(st.session_state["deletion_summary"])

if not job_running:
    show_oracle_check()
