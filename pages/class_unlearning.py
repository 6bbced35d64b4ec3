"""Class unlearning (UnAct editor): remove a whole class from a trained model with forward passes only.

Pick the model (the open MUNKEY run, or a ResNet-18 / ViT classifier run next to it), the images of
the class (a class and n from the training data, or uploaded images: no label needed), and p, gamma
and k; the request runs off the script thread (munkey_core.dashboard.classforget_job) with a per-round chart of
Af and Ar, then is compared with SSD, LFSSD and the masked logit (classifier runs) or with key
deletion alone, UnAct alone and the masked logit (MUNKEY runs). Keeping the edited model saves it as a new run and needs the operator credential;
the original run is never modified.
"""

from dataclasses import replace
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from munkey_core.unlearn.classforget import ClassEditor, guard_limits, read_as_note, request_left
from munkey_core.dashboard.classforget_job import ClassUnlearnJob, warm_up
from munkey_core.run.loaded import classifier_runs_in
from munkey_core.training.classifier import RESNET_PROFILES, train_classifier_run
from munkey_core.errors import MunkeyError
from munkey_core.dashboard.views import TrainingJob, credential_gate
from pages._common import (IMAGE_TYPES, ROOT, configured_token, decoded_uploads, fmt, require_run, run_dir,
                           user_errors)

JOB_KEY = "class_job"
run = require_run()


@st.cache_resource(max_entries=3, show_spinner="Opening the model for editing...")
def _editor(path: str, stamp: float) -> ClassEditor:
    return ClassEditor(path)


@st.cache_resource(show_spinner=False)
def _resnet_job(dataset: str, out: str) -> TrainingJob:
    epochs = RESNET_PROFILES["cpu"][1]["epochs"]
    return TrainingJob(out, dataset=dataset, profile="cpu", overrides={"epochs": epochs}, trainer=train_classifier_run)


def _stamp(path: Path) -> float:
    return max((path / n).stat().st_mtime for n in ("config.json", "model.pt") if (path / n).exists())


@st.fragment(run_every=1.0)
def _resnet_progress(job: TrainingJob) -> None:
    st.progress(job.fraction, text=f"Training the ResNet-18: {job.stage}")
    if job.state != "running":
        st.rerun(scope="app")


def _curve_figure(curve: list[dict], k: int) -> go.Figure:
    fig = go.Figure()
    rounds = [p["round"] for p in curve]
    fig.add_trace(go.Scatter(x=rounds, y=[p["Af"] for p in curve], mode="lines+markers", name="Af (forgotten class)"))
    fig.add_trace(go.Scatter(x=rounds, y=[p["Ar"] for p in curve], mode="lines+markers", name="Ar (other classes)"))
    fig.update_layout(height=320, margin=dict(l=10, r=10, t=30, b=10), xaxis=dict(title="round", range=[-0.3, k + 0.3]),
                      yaxis=dict(title="test accuracy (%)", range=[-2, 102]), legend=dict(orientation="h", y=1.12))
    return fig


@st.fragment(run_every=1.0)
def _job_progress(job: ClassUnlearnJob) -> None:
    st.progress(job.fraction, text=f"{job.stage} ({job.elapsed:.0f} s)")
    if job.curve:
        st.plotly_chart(_curve_figure(job.curve, job.cfg.k), key="curve_live")
    if job.state != "running":
        st.rerun(scope="app")


st.title("Class unlearning")
st.write("Remove a whole class from a trained model, given only some images of it: no labels, no retained data, "
         "no gradients. **UnAct** damps the late units that carry the class, round after round. On a MUNKEY run, "
         "removing a class deletes every key of the class and then runs UnAct on the backbone along the path "
         "inference takes (each image with the neighbours it retrieves once the keys are gone), until the images "
         "no longer give the class. The comparison rows include masking the class's output: it hides the class "
         "without removing anything inside the model. The original run is never changed: keep the edited model "
         "as a new run.")

# ----- which model ------------------------------------------------------------------------------
here = run_dir()
classifiers = classifier_runs_in(here.parent, ROOT / "runs")
choices = {f"MUNKEY run · {here.name}": here} | {f"classifier run · {p.name}": p for p in classifiers}
label = st.selectbox("Model to edit", list(choices), key="class_model",
                     help="The open MUNKEY run, or a ResNet-18 / ViT trained with 'munkey train --arch' in the same "
                          "folder. SSD and LFSSD comparisons need a classifier run.")
if not classifiers:
    out = here.parent / f"{here.name}_resnet18"
    job = _resnet_job(run.config["dataset"], str(out))
    if job.state == "running":
        _resnet_progress(job)
    else:
        if job.state == "failed":
            st.error(job.error or "Training failed.", icon=":material/error:")
        st.caption(f"No ResNet-18 next to this run yet. Train one on `{run.config['dataset']}` to compare UnAct with "
                   "SSD and LFSSD (seconds on digits, minutes on larger data).")
        cred = st.text_input("Operator credential (training writes a new run folder)", type="password",
                             key="resnet_credential", disabled=configured_token() is None)
        if st.button("Train a ResNet-18 on the same data", key="train_resnet", icon=":material/model_training:",
                     disabled=not credential_gate.check(cred, configured_token(), who="class page: training")):
            job.start()
            st.rerun()
path = choices[label]
try:
    editor = _editor(str(path), _stamp(path))
except MunkeyError as exc:
    st.error(str(exc), icon=":material/error:")
    st.stop()
warm_up(editor)  # the unedited model's test forwards, off the script thread: every request reuses them
names = editor.class_names

# ----- which images ------------------------------------------------------------------------------
source = st.radio("Images of the class", ["A class of the training data", "Upload images"], horizontal=True,
                  key="class_source")
images, cls = None, None
if source == "A class of the training data":
    c = st.columns([2, 1])
    cls = c[0].selectbox("Class", list(range(len(names))), format_func=lambda i: f"{i} · {names[i]}", key="class_pick")
    n = c[1].number_input("Images (0 = every training image of the class)", 0, 100000, 5, key="class_n")
    with user_errors():
        images = editor.class_images(int(cls), int(n))
else:
    files = st.file_uploader("Images of the class to forget (PNG, JPEG, BMP, TIFF or NPY)", accept_multiple_files=True,
                             type=IMAGE_TYPES, key="class_upload",
                             help="Processed in memory, never written to disk. The class is the model's own vote.")
    decoded = [img for _, img in decoded_uploads(files)]
    if decoded:
        with user_errors():
            images = editor.prepare(decoded)

# ----- settings ------------------------------------------------------------------------------------
base = editor.default_config()
c = st.columns(4)
if editor.kind == "munkey":
    method = c[0].selectbox("Method", ["keys+unact", "unact", "keys"], key="class_method",
                            format_func={"keys+unact": "delete the class's keys + UnAct", "unact": "UnAct on the backbone",
                                         "keys": "delete the class's keys only"}.get)
    score = "attribution"
else:
    method = "unact"
    score = c[0].selectbox("ResNet unit score", ["attribution", "activation"], key="class_score",
                           disabled=editor.arch != "resnet18",
                           help="activation: the paper's mean post-ReLU activation; attribution: activation x the "
                                "channel's weight towards the class logit (spares channels every class uses)")
p = c[1].number_input("p (percentile)", 0.0, 100.0, float(base.p), 1.0, key="class_p")
gamma = c[2].number_input("gamma (damping)", 0.001, 0.999, float(base.gamma), 0.01, format="%.3f", key="class_gamma")
k = c[3].number_input("k (rounds)", 1, 100, int(base.k), key="class_k")
compare = st.checkbox("Compare with " + ("SSD and LFSSD" if editor.kind == "classifier" else "the other two methods"),
                      value=True, key="class_compare",
                      help="SSD needs labels and a backward pass over the whole training set (cached after the first "
                           "request): slower.")

job: ClassUnlearnJob | None = st.session_state.get(JOB_KEY)
running = job is not None and job.state == "running"
if st.button("Run the request", type="primary", key="class_run", disabled=images is None or running,
             icon=":material/play_arrow:"):
    with user_errors():
        cfg = replace(base, p=float(p), gamma=float(gamma), k=int(k), score=score)  # the stopping rule stays
        cfg.check()
        job = ClassUnlearnJob(editor, method, images, cls=cls, cfg=cfg, compare=compare)
        st.session_state[JOB_KEY] = job
        job.start()
        st.rerun()

if job is None:
    st.stop()
if job.state == "running":
    _job_progress(job)
    st.stop()
if job.state == "failed":
    st.error(job.error or "The request failed.", icon=":material/error:")
    st.stop()

# ----- results ------------------------------------------------------------------------------------
req = job.request
st.subheader(f"Result: class {req.cls} · {job.editor.class_names[req.cls]}")
m = st.columns(4)
m[0].metric("Af (forgotten class)", fmt(req.after.Af, suffix=" %"), delta=fmt(req.after.Af - req.before.Af),
            delta_color="inverse")
m[1].metric("Ar (other classes)", fmt(req.after.Ar, suffix=" %"), delta=fmt(req.after.Ar - req.before.Ar))
m[2].metric("Delta vs the class oracle", fmt(req.delta) if req.delta is not None else "no oracle",
            help="|Ar - Ar*| + |Af - Af*| against the same recipe trained without the class "
                 "('munkey unact RUN --class C --train-oracle' trains it)")
m[3].metric("Edit time", f"{req.seconds:.2f} s",
            help="The unlearning edit itself. The whole request, with the accuracy measurements before and after and "
                 "any comparisons, took the time shown below.")
v = job.editor.af_verdict(req)
{"forgotten": st.success, "not yet": st.error}.get(v["verdict"], st.warning)(
    f"Verdict on class {req.cls} · {job.editor.class_names[req.cls]}: **{v['verdict']}**. {v['reason']}",
    icon=":material/balance:")
if req.details.get("stop_reason") == "retain guard":
    st.warning(f"The retain guard stopped this request after {req.details.get('rounds', 0)} rounds: the next round "
               "would have lowered the kept classes' accuracy on their probe (10 bank exemplars per kept class) by more "
               f"than {guard_limits(req.details)}, so it was undone. The request's images on the result: "
               f"{request_left(req)}. Whether the class is gone from the test split is the "
               "verdict above; removing more from this model would cost the classes you keep.", icon=":material/shield:")
if note := read_as_note(req, job.editor.class_names):
    st.info(note, icon=":material/info:")
st.caption(f"The whole request took {job.elapsed:.1f} s (edit {req.seconds:.2f} s; the rest is measuring accuracy before "
           "and after" + (" and the comparisons)." if job.rows and len(job.rows) > 1 else ")."))
st.plotly_chart(_curve_figure(job.curve, job.cfg.k), key="curve_final")
st.caption(f"Per-round accuracies on {len(job.probe)} test images; the figures above use {req.after.n_test}. "
           f"Pseudo-label of the images: {req.pseudo_label} ({job.editor.class_names[req.pseudo_label]}).")
table = pd.DataFrame([{"method": r["method"], "Af %": r["Af"], "Ar %": r["Ar"], "Delta": r["Delta"],
                       "seconds": r["seconds"], "Af* %": r["Af_oracle"], "Ar* %": r["Ar_oracle"]} for r in job.rows])
unmeasured = [c for c in table.columns if c != "method" and table[c].isna().all()]
table = table.drop(columns=unmeasured)
for c in table.columns:  # a value missing in some rows reads "—", never None or nan
    if c != "method" and table[c].isna().any():
        table[c] = [("—" if pd.isna(v) else f"{v:.2f}") for v in table[c]]
st.dataframe(table, hide_index=True, column_config={c: st.column_config.NumberColumn(format="%.2f")
                                                    for c in table.columns if c != "method" and table[c].dtype != object})
if unmeasured:
    st.caption(f"Not shown, because nothing measured them: {', '.join(unmeasured)} (they need a class oracle, "
               "a model of the same recipe trained without the class).")
per_class = pd.DataFrame({"class": job.editor.class_names, "before": req.before.per_class, "after": req.after.per_class})
st.bar_chart(per_class.set_index("class"), stack=False, height=260)

st.subheader("Keep or discard")
if job.saved is not None:
    st.success(f"Saved as a new run: `{job.saved.relative_to(Path.cwd()) if job.saved.is_relative_to(Path.cwd()) else job.saved}`. "
               "Open it with MUNKEY_RUN to serve it.", icon=":material/check_circle:")
    st.stop()
token = configured_token()
given = st.text_input("Operator credential", type="password", key="class_credential", disabled=token is None)
operator = st.text_input("Operator name", key="class_operator")
default_out = job.editor.root.parent / f"{job.editor.root.name}_{job.method.replace('+', '_')}_c{req.cls}"
if default_out.is_relative_to(Path.cwd()):  # show what the user would type
    default_out = default_out.relative_to(Path.cwd())
out = st.text_input("New run directory", str(default_out), key="class_out")
c = st.columns(2)
allowed = credential_gate.check(given, token, who="class page: keep") and bool(operator.strip())
if token is None:
    st.caption("Keeping needs an operator credential (MUNKEY_OPERATOR_TOKEN); you can still run and compare.")
if c[0].button("Keep: save as a new run", key="class_keep", disabled=not allowed, icon=":material/save:"):
    with user_errors():
        job.keep(out, operator=operator.strip())
        st.rerun()
if c[1].button("Discard", key="class_discard", icon=":material/delete:"):
    del st.session_state[JOB_KEY]
    st.rerun()
