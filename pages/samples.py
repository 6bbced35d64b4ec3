"""Samples: browse the training samples still in the memory bank, FiftyOne-style. Filter them by class, id,
tag, "wrong" (the run's current prediction differs from the label) and "low confidence"; tag them
("review", "consent-withdrawn"); save the filters as a named view; send the matching ones to Deletion
requests (ids in st.session_state["deletion_ids_prefill"]). Filtering, predictions and tags are
munkey_core's (dashboard/gridfilter.py, run/tags.py); this page lays them out."""

import streamlit as st

from pages._common import require_run, thumbnail_grid, user_errors
from pages._grids import sample_filter

PREFILL_KEY = "deletion_ids_prefill"  # read by the Deletion requests page: list[int], ascending
PER_ROW = 8  # thumbnails a row: captions stay on one line down to 800 px

run = require_run()

st.title("Samples")
st.write("The training samples the model still remembers (deleted ones are gone from here). Narrow them down with "
         "the filters: the ones the model now gets wrong, the ones it is unsure about, a class, ids or a tag. Tag "
         "what you find (e.g. `review`, `consent-withdrawn`), save the filters as a view to come back to, or send "
         "the matching samples to a deletion request.")

with user_errors():
    ids = sorted(int(i) for i in run.bank.ids)
    labels = run.dataset.lookup(ids).labels if ids else []
    view = sample_filter(run, "browse", ids, labels)
    matching = [ids[int(j)] for j in view.rows]
    n_show = int(st.columns([1, 2])[0].number_input("Thumbnails to show", 8, 600, 48, step=8, key="browse_show"))
    if matching:
        thumbnail_grid(run, matching[:n_show], size=48, per_row=PER_ROW, caption=lambda i, name: f"id {i} · {name}")
        if len(matching) > n_show:
            st.caption(f"The first {n_show} of {len(matching)} matching samples are drawn; the filters and tags apply "
                       "to all of them.")
    if st.button(f"Request deletion of the {len(matching)} matching sample(s)", key="browse_to_deletions",
                 disabled=not matching, icon=":material/delete:",
                 help="Opens Deletion requests with these ids filled in; nothing is deleted until an operator confirms "
                      "there."):
        st.session_state[PREFILL_KEY] = matching
        st.switch_page("pages/deletions.py")
