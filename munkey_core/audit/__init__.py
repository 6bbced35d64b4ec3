"""The audit trail of deletion requests (layer: above run; docs/modules.md has the map).

- log.py: the append-only, hash-chained log, its head anchor and verification.
- backends.py: where its rows live: SQLite (default) or PostgreSQL.
- canonical.py: canonical JSON (RFC 8785) and the hashes built on it.
- receipts.py: a JSON and an HTML receipt per request, checkable against the log.
- signing.py: the operator's keys outside every run (Ed25519 signatures, subject pseudonyms).
Tests: tests/audit/test_audit.py, tests/audit/test_postgres.py, tests/run/test_atomicity.py.
"""
