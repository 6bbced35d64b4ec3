"""Case evidence (for clinicians): a prediction and the training cases it leaned on.

Uploads are decoded in memory (munkey_core.data.images.decode_image) and never written to disk.
"""

import pandas as pd
import plotly.express as px
import streamlit as st

from munkey_core.model.predict import MODES
from munkey_core.dashboard.views import display_image, evidence_rows, predict_test_sample, training_images
from munkey_core.dashboard.trust import assess_evidence, find_copies
from pages._common import (IMAGE_TYPES, copy_index_for, decoded_uploads, example_index_for, require_run,
                           similarity_calibration_for, user_errors)
from pages._grids import sample_filter

MODE_LABELS = {"ensemble": "Ensemble (default: K forwards, weighted)",
               "softmax_fusion": "Softmax fusion (one forward, weighted mean exemplar)",
               "rank_fusion": "Rank fusion (one forward, reciprocal-rank weights)"}
PER_ROW = 8

run = require_run()
names = run.class_names

st.title("Case evidence")
st.write("For an image, the model retrieves the K most similar training cases from its memory bank and "
         "combines them into its answer. Every answer below shows those cases; an uploaded image is also checked "
         "against every training image, at any size, to say whether it is a copy of one.")

if len(run.bank) == 0:
    st.error("The memory bank is empty: every training sample has been deleted, so there are no training cases "
             "to show and nothing to predict with.", icon=":material/error:")
    st.stop()

with st.sidebar:
    mode = st.selectbox("Aggregation", MODES, format_func=MODE_LABELS.get, key="mode")
    k_max = min(32, len(run.bank))
    if k_max > 1:
        k = st.slider("K (training cases retrieved)", 1, k_max, min(run.train_cfg.k, k_max), key="k")
    else:  # one training case left: nothing to choose
        k = 1
        st.caption("K = 1: the memory bank holds one training case.")

source = st.radio("Query", ["Upload images", "Test sample"], horizontal=True, key="source")


def show_copy(image, found: dict) -> None:
    """Whether the upload is a copy of a training image: the verdict in words, the query beside the match."""
    best = found["matches"][0] if found["matches"] else None
    if found["found"]:
        st.success(found["message"], icon=":material/content_copy:")
    else:
        st.info(found["message"], icon=":material/search_off:")
    if best is None:
        return
    cols = st.columns([1, 1, 3])
    cols[0].image(display_image(image, 128), caption="your image", width="stretch")
    cols[1].image(display_image(training_images(run, [best["id"]])[0], 128), width="stretch",
                  caption=f"training id {best['id']} · {best['label_name']} · similarity {best['score']:.3f}")


def show_prediction(title: str, image, preds, i: int, true_label: int | None = None, found: dict | None = None) -> None:
    """One query: its image, the prediction (or an abstention), the retrieved cases in plain words."""
    rows = evidence_rows(run, preds, i)
    predicted = int(preds.labels[i])
    info = assess_evidence(preds, i, names, similarity_calibration_for(run))
    st.subheader(title)
    if found is not None:
        show_copy(image, found)
        if found["found"] and found["in_bank"]:
            st.caption(f"The prediction and its evidence below are those of training image {found['id']}, of which this "
                       "upload is a copy.")
    left, right = st.columns([1, 3])
    left.image(display_image(image, 256), caption="query", width="stretch")
    with right:
        for w in info["warnings"]:
            st.warning(w, icon=":material/warning:")
        show = not info["abstain"] or st.checkbox("Show the model's answer anyway", key=f"show_anyway_{title}")
        c = st.columns(3)
        if show:
            c[0].metric("Prediction", names[predicted])
            c[1].metric("Confidence", f"{100 * float(preds.confidence[i]):.1f} %", help=info["confidence_note"])
        else:
            c[0].metric("Prediction", "no confident answer")
            c[1].metric("Similar cases that agree", f"{info['agree']} of {info['k']}")
        if true_label is not None:
            c[2].metric("True label", names[true_label])
            c[2].caption("The prediction is correct." if true_label == predicted else
                         f"The prediction ({names[predicted]}) is wrong.")
        st.markdown(f"**{info['summary']}.**")
        st.caption(info["confidence_note"])
    st.markdown("**Similar training cases**, most similar first")
    view = sample_filter(run, f"cases_filter_{title}", [r["id"] for r in rows], [r["label"] for r in rows])
    shown = [rows[int(j)] for j in view.rows]  # the expert view below keeps every retrieved case
    imgs = training_images(run, [r["id"] for r in shown])
    for start in range(0, len(shown), PER_ROW):
        cols = st.columns(PER_ROW)
        for col, r, img in zip(cols, shown[start:start + PER_ROW], imgs[start:start + PER_ROW]):
            col.image(display_image(img, 128), width="stretch")
            col.caption(f"**{r['label_name']}** · {100 * r['weight']:.0f}% of the answer  \nsimilarity {r['similarity']:.2f}")
    with st.expander("Expert view: ids, weights and votes"):
        df = pd.DataFrame(rows)
        df["case"] = [f"#{r['rank']} id {r['id']}" for r in rows]
        df["vote"] = ["for " + names[predicted] if s else "for another class" for s in df["supports_prediction"]]
        df["votes_for_name"] = df["votes_for_name"].fillna("—")
        fig = px.bar(df, x="case", y="weight", color="vote", title="Share of the answer from each similar case (weight)",
                     color_discrete_map={"for " + names[predicted]: "#2f6f8f", "for another class": "#d08c60"},
                     hover_data=["label_name", "similarity", "votes_for_name"])
        fig.update_xaxes(categoryorder="array", categoryarray=list(df["case"]), title=None)
        st.plotly_chart(fig, key=f"contrib_{title}")
        st.caption("weight: the share of the answer that comes from the case (softmax of similarity / tau; rank-based in "
                   "rank fusion). vote: the class the model gives when it looks at the image with that case alone.")
        st.dataframe(df[["rank", "id", "label_name", "similarity", "weight", "votes_for_name",
                         "supports_prediction"]], hide_index=True)


if source == "Upload images":
    files = st.file_uploader("Images (PNG, JPEG, BMP, TIFF or NPY; gray or RGB; any size)",
                             type=IMAGE_TYPES,
                             accept_multiple_files=True, key="uploads")
    decoded = decoded_uploads(files)
    titles, images = [n for n, _ in decoded], [img for _, img in decoded]
    if not files:
        st.info("Upload one or more images to see the prediction and its evidence.")
    if images:
        with user_errors():
            copies = find_copies(run, copy_index_for(run), images)
            # an upload that is a copy of a training image still in the bank gets that image's own evidence
            # (resampling blurs small images enough to move their keys; the copy search is pixel-exact)
            exact = [c["found"] and c["in_bank"] for c in copies]
            originals = training_images(run, [c["id"] for c, e in zip(copies, exact) if e])
            it = iter(originals)
            preds = run.predict_images([next(it) if e else img for img, e in zip(images, exact)], k=k, mode=mode)
            for i, (title, img) in enumerate(zip(titles, images)):
                show_prediction(title, img, preds, i, found=copies[i])
else:
    n_test = len(run.dataset.test)
    index = st.number_input(f"Test sample index (0 to {n_test - 1})", 0, n_test - 1, example_index_for(run), step=1,
                            key="test_index", help="Opens on the first test sample the model predicts correctly.")
    with user_errors():
        sp = predict_test_sample(run, int(index), k=k, mode=mode)
        show_prediction(f"Test sample {int(index)} (id {sp.id})", sp.image, sp.predictions, 0, true_label=sp.label)
