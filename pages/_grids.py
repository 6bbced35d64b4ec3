"""The controls above a grid of training samples: filters (class, id, tag, wrong, low confidence) with
their counts, tagging the shown samples, and saved views. Layout only: filtering, predictions and the
tags file are munkey_core's (dashboard/gridfilter.py, run/tags.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import streamlit as st

from munkey_core.dashboard.gridfilter import GridFilter, GridView, confidence_calibration, filter_counts, filter_grid, grid_predictions
from munkey_core.errors import MunkeyError
from munkey_core.run import tags as run_tags
from pages._common import get_run

if TYPE_CHECKING:
    from munkey_core.service import MunkeyRun


@st.cache_resource(max_entries=4, show_spinner="Calibrating the low-confidence threshold on validation images...")
def _calibration(path: str, bank_size: int):
    return confidence_calibration(get_run())


def calibration_for(run: MunkeyRun):
    """The run's default low-confidence threshold (gridfilter.confidence_calibration), per bank state."""
    return _calibration(str(run.paths.root), len(run.bank))


def read_store(run: MunkeyRun) -> run_tags.TagStore:
    """The run's tags and saved views; a damaged file shows its message and counts as empty."""
    try:
        return run_tags.read_tags(run.paths.root)
    except MunkeyError as exc:
        st.error(str(exc), icon=":material/error:")
        return run_tags.TagStore()


def _apply_view(key: str, view: dict, default_threshold: float, known_tags: Sequence[str]) -> None:
    """Set the filter widgets of grid `key` to a saved view (a callback: runs before they are drawn)."""
    flt = GridFilter.from_view(view)
    st.session_state[f"{key}_classes"] = list(flt.classes)
    st.session_state[f"{key}_ids"] = flt.id_query
    st.session_state[f"{key}_tags"] = [t for t in flt.tags if t in known_tags]
    st.session_state[f"{key}_wrong"] = flt.wrong
    st.session_state[f"{key}_low"] = flt.low_confidence is not None
    st.session_state[f"{key}_thr"] = float(flt.low_confidence if flt.low_confidence is not None else default_threshold)


def _act(key: str, fn, *args) -> None:
    """Run a tags-file change from a button callback; its outcome is shown on the rerun."""
    try:
        st.session_state[f"{key}_msg"] = ("ok", fn(*args))
    except MunkeyError as exc:
        st.session_state[f"{key}_msg"] = ("error", str(exc))


def _tag(run: MunkeyRun, key: str, ids: list[int]) -> str:
    out = run_tags.add_tag(run.paths.root, st.session_state.get(f"{key}_tagname", ""), ids, lock=run.runlock)
    name = run_tags.check_name(st.session_state.get(f"{key}_tagname", ""))
    return (f"Tagged {len(out['tagged'])} sample(s) '{name}'."
            + (f" {len(out['skipped'])} not in the memory bank were skipped." if out["skipped"] else ""))


def _untag(run: MunkeyRun, key: str, ids: list[int]) -> str:
    name = run_tags.check_name(st.session_state.get(f"{key}_tagname", ""))
    n = run_tags.remove_tag(run.paths.root, name, ids, lock=run.runlock)
    return f"Removed the tag '{name}' from {n} sample(s)."


def _save(run: MunkeyRun, key: str, flt: GridFilter) -> str:
    name = run_tags.save_view(run.paths.root, st.session_state.get(f"{key}_viewname", ""), flt.to_view(), lock=run.runlock)
    return f"Saved the view '{name}'."


def _delete_view(run: MunkeyRun, key: str) -> str:
    name = st.session_state.get(f"{key}_view")
    run_tags.delete_view(run.paths.root, name, lock=run.runlock)
    return f"Deleted the view '{name}'."


def sample_filter(run: MunkeyRun, key: str, ids: Sequence[int], labels: Sequence[int], *,
                  limit: int | None = None, tagging: bool = True) -> GridView:
    """Filters above a grid of training samples, with the count of each; with `tagging`, a folded box to
    tag the shown samples and to save or apply named views. Returns the gridfilter.GridView (positions
    into ids); filtering changes only what is drawn, never a selection."""
    names = run.class_names
    ids = [int(i) for i in ids]
    store = read_store(run)
    calib = calibration_for(run)
    with st.spinner(f"The run's current predictions of {len(ids)} samples (kept until the memory bank changes)..."):
        preds = grid_predictions(run, ids) if ids else None
    if f"{key}_thr" not in st.session_state:
        st.session_state[f"{key}_thr"] = round(float(calib.threshold), 2)
    if tagging and store.views:
        row = st.columns([3, 1, 1], vertical_alignment="bottom")
        row[0].selectbox("Saved view", sorted(store.views), key=f"{key}_view")
        view_name = st.session_state.get(f"{key}_view")
        row[1].button("Apply view", key=f"{key}_apply", on_click=_apply_view,
                      args=(key, store.views.get(view_name, {}), float(calib.threshold), sorted(store.tags)))
        row[2].button("Delete view", key=f"{key}_delview", on_click=_act, args=(key, _delete_view, run, key))
    c = st.columns(3)
    picked = c[0].multiselect("Filter by class", range(len(names)), format_func=lambda k: names[k],
                              key=f"{key}_classes", placeholder="all classes")
    query = c[1].text_input("Filter by id", key=f"{key}_ids", placeholder="all ids, or e.g. 12, 40-60")
    if f"{key}_tags" in st.session_state:  # a tag deleted since (purged by a deletion, removed) is dropped
        st.session_state[f"{key}_tags"] = [t for t in st.session_state[f"{key}_tags"] if t in store.tags]
    chosen_tags = c[2].multiselect("Filter by tag", sorted(store.tags), key=f"{key}_tags",
                                   placeholder="any tag or none" if store.tags else "no tags yet")
    c = st.columns([1, 1.3, 1], vertical_alignment="bottom")
    wrong = c[0].checkbox("Wrong only", key=f"{key}_wrong",
                          help="Samples whose current prediction (the run's K, the current memory bank) differs "
                               "from their label.")
    low = c[1].checkbox("Low confidence only", key=f"{key}_low",
                        help="Samples predicted with a confidence below the threshold. " + calib.note)
    threshold = c[2].number_input("Confidence below", 0.0, 1.0, step=0.05, format="%.2f", key=f"{key}_thr",
                                  disabled=not low, help=calib.note)
    flt = GridFilter(tuple(picked), query, tuple(chosen_tags), bool(wrong), float(threshold) if low else None)
    try:
        view = filter_grid(ids, labels, flt, predictions=preds, tagged=store.tags)
    except MunkeyError as exc:  # an unreadable id filter: say so, filter without it
        st.error(str(exc), icon=":material/error:")
        flt = GridFilter(flt.classes, "", flt.tags, flt.wrong, flt.low_confidence)
        view = filter_grid(ids, labels, flt, predictions=preds, tagged=store.tags)
    drawn = view if limit is None else GridView(view.rows[:max(0, int(limit))], view.matched, view.total)
    counts = filter_counts(ids, labels, predictions=preds, threshold=float(threshold), tagged=store.tags)
    st.caption(drawn.caption)
    st.caption(f"Of all {len(ids)}: {counts['wrong']} predicted wrongly, {counts['low_confidence']} "
               f"with confidence below {float(threshold):.2f}"
               + "".join(f", {n} tagged '{t}'" for t, n in counts["tags"].items() if n) + ".")
    if tagging:
        _tag_box(run, key, [ids[int(j)] for j in view.rows], flt)
    return drawn


def _tag_box(run: MunkeyRun, key: str, shown: list[int], flt: GridFilter) -> None:
    """Tag or untag the shown samples; save the current filters as a named view."""
    msg = st.session_state.pop(f"{key}_msg", None)
    if msg is not None:
        (st.success if msg[0] == "ok" else st.error)(msg[1], icon=":material/sell:" if msg[0] == "ok" else ":material/error:")
    with st.expander(f"Tags and saved views ({len(shown)} matching)"):
        pick = list(shown)
        if st.checkbox("Pick the samples one by one", key=f"{key}_one_by_one",
                       help="Otherwise the tag goes to every sample matching the filters."):
            if st.session_state.get(f"{key}_pick_for") != shown:  # new grid content: start from none
                st.session_state[f"{key}_pick"] = []
                st.session_state[f"{key}_pick_for"] = list(shown)
            pick = st.multiselect("Samples to tag", shown, key=f"{key}_pick", format_func=lambda i: f"id {i}")
        row = st.columns([2, 1, 1], vertical_alignment="bottom")
        row[0].text_input("Tag", key=f"{key}_tagname", placeholder="e.g. review, consent-withdrawn")
        row[1].button(f"Tag {len(pick)}", key=f"{key}_addtag", disabled=not pick, on_click=_act,
                      args=(key, _tag, run, key, list(pick)), icon=":material/sell:")
        row[2].button(f"Untag {len(pick)}", key=f"{key}_untag", disabled=not pick, on_click=_act,
                      args=(key, _untag, run, key, list(pick)))
        row = st.columns([2.5, 1.2], vertical_alignment="bottom")
        row[0].text_input("Save the current filters as a view", key=f"{key}_viewname", placeholder="e.g. to review")
        row[1].button("Save view", key=f"{key}_saveview", on_click=_act, args=(key, _save, run, key, flt),
                      icon=":material/bookmark_add:")
        st.caption("Tags and views are kept in the run folder (tags.json). Tags are data about the samples: deleting a "
                   "sample deletes its tags in the same request.")
