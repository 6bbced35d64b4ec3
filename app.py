"""MUNKEY dashboard: `streamlit run app.py`. Builds the navigation from pages/ and opens the run once.

The run directory is $MUNKEY_RUN (default runs/demo). When it holds no run yet, every page offers
(and, when no operator credential is configured, starts) training the demo run on digits
($MUNKEY_PROFILE, default cpu; MUNKEY_AUTOTRAIN=0/1 overrides; with a credential configured, the
training button needs it). The server listens on localhost only (.streamlit/config.toml).
"""

import streamlit as st

from munkey_core.dashboard.astlock import serialise_ast_parsing

# Streamlit parses each page on every rerun while background jobs load .npy files (numpy parses their
# headers): on CPython 3.11.0-3.11.7 / 3.12.0-3.12.1 two parses at once can fail, so they take turns
serialise_ast_parsing()

st.set_page_config(page_title="MUNKEY: unlearning by design", page_icon=":material/key:", layout="wide")

PAGES = [
    st.Page("pages/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("pages/evidence.py", title="Case evidence", icon=":material/image_search:"),
    st.Page("pages/samples.py", title="Samples", icon=":material/photo_library:"),
    st.Page("pages/deletions.py", title="Deletion requests", icon=":material/delete:"),
    st.Page("pages/class_unlearning.py", title="Class unlearning", icon=":material/layers_clear:"),
    st.Page("pages/audit.py", title="Audit log", icon=":material/fact_check:"),
    st.Page("pages/embeddings.py", title="Embeddings", icon=":material/scatter_plot:"),
]

nav = st.navigation(PAGES)  # before the heavy imports below, so the sidebar is right from the start

from pages._common import get_run  # noqa: E402  (torch loads only where a run is opened)

with st.sidebar:
    st.caption("MUNKEY: machine unlearning by key deletion. Deleting a training sample deletes its "
               "memory-bank entry; every prediction names the training cases behind it.")
get_run()  # open (or reuse) the cached run once per script run; pages share it
nav.run()
