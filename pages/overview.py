"""Overview: the model card, the training history, and the metrics across deletions. On first start
(no run yet) it shows the training progress and the data being trained on, usable at once."""

from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from munkey_core.dashboard.firststart import class_counts, training_data
from pages._common import (collect_finished_job, demo_profile, fmt, get_run, grid_filter, image_grid, run_dir,
                           training_panel)


@st.cache_resource(max_entries=2, show_spinner=False)
def _training_data(dataset: str, profile: str):
    return training_data(dataset, profile)


def _first_start() -> None:
    """No run yet: the training status (it runs in the background), and the data it trains on,
    browsable at once; the page turns into the model's Overview by itself when training ends.
    The data is drawn first: the training panel below may load the model code (seconds)."""
    panel = st.container()
    dataset, profile = "digits", demo_profile()
    ds = _training_data(dataset, profile)
    st.subheader("The data the model trains on")
    h, w = ds.image_shape
    st.markdown(f"**Dataset** `{ds.name}` ({ds.num_classes} classes, {h}x{w} px, "
                f"{'gray' if ds.channels == 1 else 'colour'}) · **profile** `{profile}`. These are the training "
                "samples and ids the run will hold: note the ids of a sample to delete once the model is ready.")
    c = st.columns(4)
    c[0].metric("Training samples", len(ds.train))
    c[1].metric("Validation samples", len(ds.val))
    c[2].metric("Test samples", len(ds.test))
    c[3].metric("Classes", ds.num_classes)
    st.plotly_chart(px.bar(pd.DataFrame(class_counts(ds)), x="class", y="samples", color="split", barmode="group",
                           title="Samples per class and split"), key="class_counts_chart")
    st.subheader("Browse the training images")
    pick = st.selectbox("Class", range(ds.num_classes), format_func=lambda c: ds.class_names[c], key="browse_class")
    rows = ds.train.subset(ds.train.labels == pick)
    view = grid_filter("browse_filter", rows.ids, rows.labels, ds.class_names, limit=24, classes=False)
    image_grid(rows.images[view.rows], [f"id {int(i)}" for i in rows.ids[view.rows]],
               size=48, per_row=8)
    with panel:
        training_panel(run_dir(), page_needs_model=False)


run = get_run()
if run is None:
    _first_start()
    st.stop()

from munkey_core.dashboard.views import EvaluationJob, forgetting_assessment, latest_metrics  # noqa: E402

s = run.summary()

st.title("MUNKEY model")
root = run.paths.root.resolve()
shown = root.relative_to(Path.cwd()) if root.is_relative_to(Path.cwd()) else root
st.caption(f"Run directory `{shown}`")

st.subheader("Model card")
st.markdown(f"**Dataset** `{s['dataset']}` ({s['classes']} classes) · **key encoder** `{s['encoder']}` · "
            f"**profile** `{s['profile']}` · **design** {s['design']} · **K** {run.train_cfg.k}, **tau** {run.train_cfg.tau} · "
            f"trained {s['created'] or '—'} on {run.config.get('device', '—')}")
c = st.columns(4)
c[0].metric("Training samples", s["train_size"])
c[1].metric("Memory bank entries", s["bank_size"])
c[2].metric("Deleted samples", s["deleted"])
c[3].metric("Training time", fmt(s["train_seconds"], 0, " s"))

# "Evaluate now" is open to viewers, so its result stays in this browser session and is not written
# to the run: the run directory changes only through an operator's deletion (which records metrics).
EVAL_JOB = "overview_eval_job"
collect_finished_job(EVAL_JOB, "overview_eval", "result")


@st.fragment(run_every=1.0)
def _eval_progress(job: EvaluationJob) -> None:
    st.progress(job.fraction, text=f"Evaluating: {job.stage} ({job.elapsed:.0f} s; the page stays usable)")
    if job.state != "running":
        st.rerun(scope="app")


@st.cache_data(max_entries=8, show_spinner="Measuring the targets of FA and MIA...")
def _assessment(path: str, bank_size: int, deleted: int, after: tuple) -> dict:
    # FA's target (unseen samples of the deleted samples' classes) needs one pass over the test set
    return forgetting_assessment(run, dict(after), run.forgotten_ids)


session_eval = st.session_state.get("overview_eval")
if session_eval is not None and session_eval.get("bank_size") != len(run.bank):
    session_eval = None
last = session_eval or latest_metrics(run)
st.subheader("Latest evaluation")
if last is None:
    st.info("No evaluation recorded yet. Evaluate the model to fill in TA, RA and Ps.")
else:
    c = st.columns(5)
    c[0].metric("TA (test accuracy)", fmt(last.get("TA"), 2, " %"))
    c[1].metric("RA (retained samples)", fmt(last.get("RA"), 2, " %"))
    c[2].metric("FA (deleted samples)", fmt(last.get("FA"), 2, " %"))
    c[3].metric("MIA (AUC)", fmt(last.get("MIA"), 2, " %"), help="50 = deleted samples are indistinguishable "
                "from unseen test data (what a retrained model gives).")
    c[4].metric("Ps (pathway balance)", fmt(last.get("Ps"), 3), help="|A_img - A_tok| / A_both; lower is "
                "more balanced, the paper selects models with Ps <= 0.3.")
    current = latest_metrics(run, current_only=True) is not None
    when = f"Measured {last['time']}" if last.get("time") else "Measured in this session"
    st.caption(f"{when} on {fmt(last.get('n_test'), 0)} test, {fmt(last.get('n_retain'), 0)} retained and "
               f"{fmt(last.get('n_forget'), 0)} deleted samples; MIA attack: {last.get('MIA_attack') or 'not measured'}."
               + (" Evaluated in this session, not recorded in the run." if session_eval is not None else
                  "" if current else " The bank has changed since: evaluate again for current numbers."))

    if last.get("FA") is not None or last.get("MIA") is not None:
        a = _assessment(str(run.paths.root), len(run.bank), len(run.forgotten_ids),
                        tuple(sorted((k, v) for k, v in last.items() if k in ("FA", "MIA", "n_forget", "n_test"))))
        show = {"forgotten": st.success, "not yet": st.error}.get(a["overall"], st.warning)
        show(f"Forgetting verdict: **{a['overall']}**. " + " ".join(v["reason"] for v in a["verdicts"]),
             icon=":material/balance:")

_job = st.session_state.get(EVAL_JOB)
if _job is not None and _job.state == "running":
    _eval_progress(_job)
elif st.button("Evaluate now", key="evaluate", icon=":material/speed:"):
    st.session_state[EVAL_JOB] = EvaluationJob(run)
    st.session_state[EVAL_JOB].start()
    st.rerun()

st.subheader("Training history")
hist = run.history
if not hist:
    st.info("This run has no training history.")
else:
    h = pd.DataFrame(hist)
    c = st.columns(2)
    c[0].plotly_chart(px.line(h, x="epoch", y="loss", markers=True, title="Training loss"), key="loss_chart")
    acc_cols = [k for k in ("train_acc", "val_acc") if k in h]
    acc = h.melt(id_vars="epoch", value_vars=acc_cols, var_name="set", value_name="accuracy (%)")
    c[1].plotly_chart(px.line(acc, x="epoch", y="accuracy (%)", color="set", markers=True, title="Accuracy"),
                      key="acc_chart")

st.subheader("Metrics across deletions")
mh = run.metrics_history
if not mh:
    st.info("No evaluations recorded yet.")
else:
    m = pd.DataFrame(mh)
    cols = [k for k in ("TA", "RA", "FA", "MIA") if k in m]
    long = m.melt(id_vars=["deleted"], value_vars=cols, var_name="metric", value_name="percent").dropna()
    fig = px.line(long, x="deleted", y="percent", color="metric", markers=True,
                  title="TA, RA, FA, MIA vs number of deleted samples")
    fig.update_xaxes(title="samples deleted")
    st.plotly_chart(fig, key="metrics_chart")
    st.caption("Each point is one recorded evaluation (metrics.json). MIA uses the cheap attack named above.")
