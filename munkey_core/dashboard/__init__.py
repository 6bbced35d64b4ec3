"""What the dashboard pages show, and their background jobs; no Streamlit import here (layer: top).

- views.py: evidence rows, similar samples, `delete_and_measure`, deletion/evaluation jobs.
- firststart.py: the first start: the demo run's training job, the data it trains on (no torch import).
- auditviews.py: read-only views of the audit log.
- trust.py: what makes an answer on the dashboard trustworthy.
- embeddings.py: the two UMAP maps of what a run remembers.
- classforget_job.py: class unlearning as a background job.
- jobs.py: a background job a UI polls.
- astlock.py: one lock around `ast.parse` on CPython releases where parsing in two threads at once fails.
- gridfilter.py: filters on the image grids (class, id, tag, wrong, low confidence), with the counts shown.
Tests: tests/dashboard/test_views.py, tests/dashboard/test_embeddings.py, tests/dashboard/test_gridfilter.py, tests/dashboard/test_astlock.py, tests/test_app*.py.
"""
