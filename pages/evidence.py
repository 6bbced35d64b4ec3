"""Case evidence (for clinicians): a prediction and the training cases it leaned on.

Uploads are decoded in memory (munkey_core.data.images.decode_image) and never written to disk.
"""

import pandas as pd
import plotly.express as px
import streamlit as st

from munkey_core.model.predict import MODES
from munkey_core.dashboard.views import display_image, evidence_rows, predict_test_sample, training_images
from pages._common import IMAGE_TYPES, decoded_uploads, require_run, user_errors

MODE_LABELS = {"ensemble": "Ensemble (default: K forwards, weighted)",
               "softmax_fusion": "Softmax fusion (one forward, weighted mean exemplar)",
               "rank_fusion": "Rank fusion (one forward, reciprocal-rank weights)"}
PER_ROW = 8

run = require_run()
names = run.class_names

st.title("Case evidence")
st.write("For an image, the model retrieves the K most similar training cases from its memory bank and "
         "combines their contributions. Every prediction below names those cases.")

with st.sidebar:
    mode = st.selectbox("Aggregation", MODES, format_func=MODE_LABELS.get, key="mode")
    k_max = max(1, min(32, len(run.bank)))
    k = st.slider("K (training cases retrieved)", 1, k_max, min(run.train_cfg.k, k_max), key="k")

source = st.radio("Query", ["Upload images", "Test sample"], horizontal=True, key="source")


def show_prediction(title: str, image, preds, i: int, true_label: int | None = None) -> None:
    """One query: its image, the prediction, the gallery of retrieved cases, their contributions."""
    rows = evidence_rows(run, preds, i)
    predicted = int(preds.labels[i])
    st.subheader(title)
    left, right = st.columns([1, 3])
    left.image(display_image(image, 128), caption="query", width=128)
    with right:
        c = st.columns(3)
        c[0].metric("Prediction", names[predicted])
        c[1].metric("Confidence", f"{100 * float(preds.confidence[i]):.1f} %")
        if true_label is not None:
            c[2].metric("True label", names[true_label],
                        delta="correct" if true_label == predicted else "wrong",
                        delta_color="normal" if true_label == predicted else "inverse")
        support = sum(r["weight"] for r in rows if r["supports_prediction"])
        st.caption(f"{sum(r['supports_prediction'] for r in rows)} of {len(rows)} retrieved cases vote for "
                   f"{names[predicted]}, carrying {100 * support:.0f}% of the weight ({preds.mode}).")
    imgs = training_images(run, [r["id"] for r in rows])
    st.markdown("**Retrieved training cases**, most similar first")
    for start in range(0, len(rows), PER_ROW):
        cols = st.columns(PER_ROW)
        for col, r, img in zip(cols, rows[start:start + PER_ROW], imgs[start:start + PER_ROW]):
            col.image(display_image(img, 64), width=64)
            col.caption(f"**id {r['id']}** · label {r['label_name']}  \nsim {r['similarity']:.3f}  \n"
                        f"weight {r['weight']:.3f}  \n"
                        f"votes {r['votes_for_name'] if r['votes_for_name'] is not None else '—'}")
    df = pd.DataFrame(rows)
    df["case"] = [f"#{r['rank']} id {r['id']}" for r in rows]
    df["vote"] = ["for " + names[predicted] if s else "for another class" for s in df["supports_prediction"]]
    fig = px.bar(df, x="case", y="weight", color="vote", title="Contribution of each retrieved case (weight)",
                 color_discrete_map={"for " + names[predicted]: "#2f6f8f", "for another class": "#d08c60"},
                 hover_data=["label_name", "similarity", "votes_for_name"])
    fig.update_xaxes(categoryorder="array", categoryarray=list(df["case"]), title=None)
    st.plotly_chart(fig, key=f"contrib_{title}")
    with st.expander("Evidence table"):
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
            preds = run.predict_images(images, k=k, mode=mode)
            for i, (title, img) in enumerate(zip(titles, images)):
                show_prediction(title, img, preds, i)
else:
    n_test = len(run.dataset.test)
    index = st.number_input(f"Test sample index (0 to {n_test - 1})", 0, n_test - 1, 0, step=1, key="test_index")
    with user_errors():
        sp = predict_test_sample(run, int(index), k=k, mode=mode)
        show_prediction(f"Test sample {int(index)} (id {sp.id})", sp.image, sp.predictions, 0, true_label=sp.label)
