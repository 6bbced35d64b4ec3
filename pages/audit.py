"""Audit log: every deletion request recorded in the run's forgotten.json."""

import pandas as pd
import streamlit as st

from munkey_core.views import deletion_requests
from pages._common import require_run

run = require_run()

st.title("Audit log")
st.caption("Hash-chain verification of this log is not implemented yet (a later version); this table is read "
           "from the run's forgotten.json as it is.")
rows = deletion_requests(run)
c = st.columns(3)
c[0].metric("Deletion requests", len(rows))
c[1].metric("Samples deleted", len(run.forgotten_ids))
c[2].metric("Memory bank entries", len(run.bank))
if not rows:
    st.info("No deletion request has been recorded for this run.")
else:
    df = pd.DataFrame([{"request": r["request"], "time (UTC)": r["time"], "ids deleted": r["n_ids"],
                        "ids": " ".join(map(str, r["ids"]))} for r in rows])
    st.dataframe(df, hide_index=True)
    st.download_button("Download as CSV", df.to_csv(index=False), file_name="deletion_requests.csv",
                       mime="text/csv", key="download_csv")
