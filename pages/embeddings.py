"""Embeddings: UMAP maps of the model's [CLS] representations and of the bank's exemplar vectors.

Select points with the lasso or box to see their images, export their ids as CSV, or send them to
the Deletion page (ids in st.session_state["deletion_ids_prefill"]). The maps are computed off the
script thread by munkey_core.dashboard.embeddings.EmbeddingJob, one job per (run, bank file state, cap,
seed, refit count), kept in st.cache_resource so later visits and other sessions reuse the result. The
UMAP fit itself is cached inside the run (embeddings/, purged by every deletion): after a deletion or a
restart the job reads it instead of refitting.
"""

from pathlib import Path

import numpy as np
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from munkey_core.dashboard.embeddings import (MAX_POINTS, EmbeddingJob, EmbeddingMaps, MapParams, hover_table, ids_csv,
                                              ids_from_points, trace_groups)
from munkey_core.dashboard.views import training_images
from munkey_core.run.rows import bank_stamp
from pages._common import require_run, thumbnail_grid, user_errors
from pages._grids import sample_filter

PREFILL_KEY = "deletion_ids_prefill"  # read by the Deletion requests page: list[int], ascending
THUMBS_MAX = 48
PER_ROW = 12
MAP_KEYS = {"cls": "map_cls", "exemplar": "map_exemplar"}
SELECTION_GEN = "emb_selection_gen"  # bumped by "Clear selection": the maps get fresh widget keys


def _map_keys(gen: int) -> dict[str, str]:
    """The two maps' widget keys for selection generation `gen` (0: the plain MAP_KEYS)."""
    return MAP_KEYS if gen == 0 else {w: f"{k}_{gen}" for w, k in MAP_KEYS.items()}


run = require_run()
names = run.class_names


@st.cache_resource(max_entries=4, show_spinner=False)
def _job(path: str, bank_stamp: tuple[int, int, int], max_points: int, seed: int, refits: int, _run) -> EmbeddingJob:
    # bank_stamp (rows.bank_stamp) is in the key: a deletion writes the bank -> new maps (read from the
    # run's map cache, which the deletion purged: no refit); refits counts "Fit the maps again" clicks.
    return EmbeddingJob(_run, MapParams(max_points=max_points, seed=seed), refit=refits > 0)


def _palette(n: int) -> list[str]:
    if n <= 10:
        return px.colors.qualitative.D3
    if n <= 26:
        return px.colors.qualitative.Alphabet
    return px.colors.sample_colorscale("Turbo", [i / max(n - 1, 1) for i in range(n)])


def _figure(maps: EmbeddingMaps, which: str, title: str) -> go.Figure:
    """One map: a trace per class (circles), plus the deleted samples as crosses in their class colour."""
    xy = maps.cls_xy if which == "cls" else maps.exemplar_xy
    colors = _palette(len(names))
    fig = go.Figure()
    for g in trace_groups(maps, which, names):
        ids = maps.ids[g.rows]
        labels = maps.labels[g.rows]
        marker = (dict(symbol="x-thin", size=7, opacity=0.85, line=dict(width=1.3, color="#222"))
                  if g.deleted else dict(size=6, opacity=0.7, color=colors[int(labels[0]) % len(colors)]))
        fig.add_trace(go.Scatter(
            x=xy[g.rows, 0], y=xy[g.rows, 1], mode="markers", name=g.name, marker=marker,
            customdata=np.stack([ids, labels], axis=1).tolist(),  # plain JSON: the browser returns it per point
            hovertemplate="id %{customdata[0]} · label " + ("%{text}" if g.deleted else g.name)
            + ("<br>deleted: exemplar gone" if g.deleted else "") + "<extra></extra>",
            text=[names[c] for c in labels] if g.deleted else None))
    if which == "exemplar" and maps.deleted.any():  # legend entry only: the deleted have no point here
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="deleted: none",
                                 marker=dict(symbol="x-thin", size=7, line=dict(width=1.3, color="#bbb"))))
    fig.update_layout(title=title, height=560, margin=dict(l=10, r=10, t=50, b=10), dragmode="lasso",
                      legend=dict(orientation="h", yanchor="top", y=-0.02, x=0, itemsizing="constant", entrywidth=100),
                      uirevision=which, plot_bgcolor="#fafafa")
    fig.update_xaxes(showticklabels=False, title=None, zeroline=False, showgrid=False)
    fig.update_yaxes(showticklabels=False, title=None, zeroline=False, showgrid=False)
    return fig


POINTER_SELECT, POINTER_HOVER = "Select (lasso, box)", "Images on hover"
THUMB_SIDE = 32  # px: hover thumbnails are PNG data URLs in the chart's data (~0.1-0.6 KB each)


@st.cache_resource(max_entries=4, show_spinner="Making the hover thumbnails...")
def _hover_records(path: str, bank_stamp: tuple[int, int, int], max_points: int, seed: int, refits: int,
                   _maps: EmbeddingMaps) -> list[dict]:
    # the same key as _job: one table of thumbnails per computed pair of maps
    return hover_table(_maps, training_images(run, _maps.ids), names, side=THUMB_SIDE)


def _hover_chart(maps: EmbeddingMaps, records: list[dict]):
    """Both maps in one Vega-Lite chart (the thumbnails travel once): hovering a point shows its image."""
    import altair as alt

    colors = _palette(len(names))
    present = [n for n in names if n in {r["label"] for r in records}]
    base = alt.Chart(alt.Data(values=records)).mark_point(filled=True, size=28, opacity=0.75).encode(
        color=alt.Color("label:N", scale=alt.Scale(domain=list(names), range=[colors[c % len(colors)] for c in range(len(names))]),
                        legend=alt.Legend(orient="bottom", title=None, values=present)),
        shape=alt.Shape("status:N", scale=alt.Scale(domain=["in the bank", "deleted"], range=["circle", "cross"]),
                        legend=alt.Legend(orient="bottom", title=None)),
        tooltip=[alt.Tooltip("image:N"), alt.Tooltip("id:Q", title="id"), alt.Tooltip("label:N", title="label"),
                 alt.Tooltip("status:N", title="status")])
    size = dict(width=430, height=430)
    left = base.encode(x=alt.X("cls_x:Q", axis=None), y=alt.Y("cls_y:Q", axis=None)).properties(
        title="[CLS] representations (crosses: deleted)", **size)
    right = base.transform_filter("datum.ex_x != null").encode(x=alt.X("ex_x:Q", axis=None), y=alt.Y("ex_y:Q", axis=None)
                                                                ).properties(title=f"Exemplar vectors in the bank ({int((~maps.deleted).sum())})", **size)
    return alt.hconcat(left, right).resolve_scale(x="independent", y="independent").configure_view(stroke=None)


@st.fragment(run_every=1.0)
def _progress(job: EmbeddingJob) -> None:
    with st.status(f"Computing the maps: {job.stage}", state="running", expanded=True):
        st.progress(min(1.0, job.fraction), text=f"{job.elapsed:.0f} s")
        st.caption("This is the long part of the dashboard: K forwards per sample, then two UMAP fits. The first "
                   "map since the server started also pays UMAP's one-time compilation (numba, 10-30 s). "
                   "The result is kept: later visits open at once.")
    if job.state != "running":
        st.rerun(scope="app")


def _selection(maps: EmbeddingMaps, events: dict) -> list[int]:
    ids: set[int] = set()
    for which, event in events.items():
        points = (event or {}).get("selection", {}).get("points", [])
        if points:
            ids.update(ids_from_points(points, maps, trace_groups(maps, which, names)))
    return sorted(ids)


def _show_selection(maps: EmbeddingMaps, ids: list[int]) -> None:
    """Thumbnails of the selected samples, their ids as CSV, and the hand-over to the Deletion page."""
    deleted = set(maps.ids[maps.deleted].tolist())
    in_bank = [i for i in ids if i not in deleted]
    st.subheader(f"Selected: {len(ids)} sample(s)")
    st.caption(f"{len(in_bank)} still in the memory bank, {len(ids) - len(in_bank)} deleted earlier. Selections on "
               f"the two maps add up; Clear selection starts again. At most {THUMBS_MAX} images are drawn; the "
               "filters below change only what is drawn, and tags go to the samples still in the bank.")
    def struck_if_deleted(i: int, name: str) -> str:
        mark = "~~" if i in deleted else ""
        return f"{mark}id {i}{mark} · {name}"

    with user_errors():
        view = sample_filter(run, "sel_filter", ids, run.dataset.lookup(ids).labels, limit=THUMBS_MAX)
        thumbnail_grid(run, [ids[int(j)] for j in view.rows], size=48, per_row=PER_ROW, caption=struck_if_deleted)
    row = st.container(horizontal=True)
    row.download_button(f"Export {len(ids)} ids (CSV)", ids_csv(ids), file_name="selected_ids.csv",
                        mime="text/csv", key="emb_download", icon=":material/download:")
    if row.button("Clear selection", key="emb_clear", icon=":material/deselect:",
                  help="Forget the lasso and box selections on both maps."):
        gen = int(st.session_state.get(SELECTION_GEN, 0))
        for key in _map_keys(gen).values():
            st.session_state.pop(key, None)
        st.session_state[SELECTION_GEN] = gen + 1  # new chart keys: the browser drops its drawn selection too
        st.rerun()
    if row.button(f"Request deletion of the {len(in_bank)} still in the bank", key="emb_to_deletions",
                  disabled=not in_bank, icon=":material/delete:", help="Opens Deletion requests with these ids "
                  "filled in; nothing is deleted until an operator confirms there."):
        st.session_state[PREFILL_KEY] = in_bank
        st.switch_page("pages/deletions.py")


st.title("Embeddings")
st.write("Where the model places each training sample, and what its memory holds. Left: the model's [CLS] "
         "representation of every training image. Right: the exemplar vectors in the memory bank. Deleting a "
         "sample removes its exemplar, so it disappears from the right map, while its image still has a "
         "[CLS] point on the left (a cross).")

with st.sidebar:
    max_points = int(st.number_input("Points per map (seeded subsample)", 100, 20_000, MAX_POINTS, step=500,
                                     key="emb_max_points"))
    seed = int(st.number_input("UMAP seed", 0, 2**31 - 1, 0, key="emb_seed"))

stamp = bank_stamp(run.paths.root)
refits = int(st.session_state.get("emb_refits", 0))
job = _job(str(Path(run.paths.root).resolve()), stamp, max_points, seed, refits, run)
if job.state == "idle":
    job.start()
if job.state == "running":
    _progress(job)
    st.stop()
if job.state == "failed":
    st.error(job.error or "Computing the maps failed.", icon=":material/error:")
    if st.button("Try again", key="emb_retry"):
        job.start()
        st.rerun()
    st.stop()

maps = job.result
assert maps is not None
p = maps.params
st.caption(
    f"{len(maps.ids)} of {maps.n_train} training samples"
    + (f" (a seeded subsample: at most {p.max_points} samples still in the bank, and at most {p.max_points} "
       "deleted ones)" if maps.subsampled else "")
    + f"; {int(maps.deleted.sum())} of them deleted. [CLS] vectors are computed as prediction does: each image with "
    f"the exemplar tokens of its K={run.train_cfg.k} nearest entries in the bank (a sample still in the bank "
    f"retrieves its own), averaged with the ensemble weights: the bank of the fit for the circles, today's for the "
    f"crosses. UMAP 2-D, seed {p.seed}, {p.n_neighbors} neighbours, "
    f"min_dist {p.min_dist}; Euclidean for [CLS], cosine for exemplars. "
    + (f"Fitted {maps.fitted_at} in {maps.fit_seconds:.0f} s and read from the run's map cache in "
       f"{sum(maps.seconds.values()):.1f} s" if maps.from_cache else f"Fitted now in {maps.fit_seconds:.0f} s")
    + (f"; deletions since the fit removed {maps.removed_since_fit} of its points (the others keep their "
       "places; a fresh fit would move the neighbours of deleted samples a little)" if maps.removed_since_fit else "")
    + (". Crosses are not part of the fit: each sits at the mean place of its "
       f"{p.n_neighbors} nearest fitted [CLS] vectors, computed now and never stored." if maps.deleted.any() else ".")
    + " The fit is derived data kept in the run (embeddings/); a deletion removes the deleted samples' "
    "points from it.")
if st.sidebar.button("Fit the maps again", key="emb_refit", icon=":material/refresh:",
                     help="A fresh UMAP fit on the current bank (tens of seconds); replaces the cached one."):
    st.session_state["emb_refits"] = refits + 1
    st.rerun()
pointer = st.segmented_control("Pointer", [POINTER_SELECT, POINTER_HOVER], default=POINTER_SELECT, key="emb_pointer",
                               help="Select: draw a lasso or a box to pick samples. Images on hover: point at a sample "
                                    "to see its image (no selection in this mode).")
if pointer == POINTER_HOVER:
    records = _hover_records(str(Path(run.paths.root).resolve()), stamp, max_points, seed, refits, maps)
    st.altair_chart(_hover_chart(maps, records), key="emb_hover_chart")
    st.caption(f"Point at a sample to see its image ({THUMB_SIDE} px thumbnails). Switch the pointer back to "
               "Select to pick samples with a lasso or a box.")
    st.stop()
left, right = st.columns(2)
events = {}
map_keys = _map_keys(int(st.session_state.get(SELECTION_GEN, 0)))
with left:
    events["cls"] = st.plotly_chart(_figure(maps, "cls", "[CLS] representations (crosses: deleted)"),
                                    key=map_keys["cls"], on_select="rerun", selection_mode=("lasso", "box"))
with right:
    events["exemplar"] = st.plotly_chart(
        _figure(maps, "exemplar", f"Exemplar vectors in the bank ({int((~maps.deleted).sum())})"),
        key=map_keys["exemplar"], on_select="rerun", selection_mode=("lasso", "box"))

with user_errors():
    selected = _selection(maps, events)
    if selected:
        _show_selection(maps, selected)
    else:
        st.info("Draw a lasso or a box on either map to select samples: see their images, export their ids, or "
                "request their deletion.", icon=":material/gesture_select:")
