"""Open every dashboard page on a run with Streamlit's AppTest and fail on any exception; on Embeddings,
wait for the maps and inject a lasso selection so the selection row (st.container(horizontal=True))
is drawn. Uses only AppTest features of the dashboard's lowest supported streamlit, so
scripts/check_floors.sh can run it at that floor (the test suite itself needs a newer AppTest).

Usage: python scripts/floor_pages.py RUN_DIR   (the run should have a few deletions)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[1] / "app.py"
PAGES = ["overview", "evidence", "deletions", "class_unlearning", "audit", "embeddings"]


def check(at: AppTest, where: str) -> None:
    errors = [e.value for e in at.exception]
    if errors:
        sys.exit(f"{where}: {errors}")


def main(run: str) -> None:
    os.environ["MUNKEY_RUN"] = str(Path(run).resolve())
    os.environ["MUNKEY_AUTOTRAIN"] = "0"
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["emb_max_points"] = 100
    at.run()
    check(at, "app")
    for page in PAGES:
        at.switch_page(f"pages/{page}.py").run()
        check(at, page)
        print(f"{page}: {at.title[0].value if at.title else '(no title)'}")
    deadline = time.time() + 300
    while len(at.get("plotly_chart")) < 2:  # the maps are computed in a background job
        if time.time() > deadline:
            sys.exit("embeddings: the maps were not drawn in 300 s")
        time.sleep(1)
        at.run()
        check(at, "embeddings")
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    trace = fig["data"][0]
    points = [{"curve_number": 0, "point_index": j, "point_number": j, "customdata": trace["customdata"][j]}
              for j in range(min(3, len(trace["customdata"])))]
    at.session_state["map_cls"] = {"selection": {"points": points, "point_indices": list(range(len(points))),
                                                 "box": [], "lasso": []}}
    at.run()
    check(at, "embeddings selection")
    if not at.get("download_button"):
        sys.exit("embeddings: the selection row (export, request deletion) was not drawn")
    print(f"embeddings: {len(points)} points selected, the selection row is drawn")


if __name__ == "__main__":
    main(sys.argv[1])
