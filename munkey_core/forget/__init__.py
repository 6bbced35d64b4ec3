"""Deletion requests (layer: above run; docs/modules.md has the map).

- request.py: the deletion protocol: journal (commit point), files, evidence, audit entry,
  receipt; roll-forward when a run is opened.
- evidence.py: what a receipt proves: fingerprints, retrieval and stored-copies checks.
- ids.py: a request's ids from text, CSV, a file or an upload.
Tests: tests/forget/test_forget.py, tests/run/test_atomicity.py, tests/audit/test_audit.py, tests/run/test_purge.py.
"""
