"""Where the audit log's rows live: an embedded SQLite file (default) or a PostgreSQL table.

Both hold one table of rows (run_id, seq, request_id, kind, prev_hash, entry_hash, body), body
being the entry's canonical JSON text; the chain logic is in audit.py and is the same for both.
Rows are append-only: triggers refuse UPDATE and DELETE (a guard against accidents; tampering
by someone who drops the triggers is what the hash chain and `munkey audit verify` detect).
One table may hold many runs' chains (PostgreSQL, shared deployments): each run has a run_id.

- SQLite: `<run>/audit.sqlite`, rollback journal (no WAL file), synchronous=FULL, secure_delete
  on. Appends run in BEGIN IMMEDIATE transactions. Only fingerprints are ever stored, never
  vectors, so no free page or journal can keep a deleted exemplar.
- PostgreSQL: `munkey_audit` table in the database of a connection URL (psycopg 3, the
  `postgres` extra). Appends take a transaction-scoped advisory lock per run, so processes on
  different hosts serialise too; the primary key (run_id, seq) forbids a fork of the chain.
Cost: reading the chain is one query; an append is one short transaction.
Tests: tests/audit/test_audit.py (SQLite), tests/audit/test_postgres.py (a real PostgreSQL server).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from munkey_core.errors import MunkeyError

SQLITE_NAME = "audit.sqlite"
PG_TABLE = "munkey_audit"
_COLUMNS = "seq, request_id, kind, prev_hash, entry_hash, body"


@dataclass(frozen=True)
class Row:
    """One stored log row; `body` is the canonical JSON text of the entry."""

    seq: int
    request_id: str
    kind: str
    prev_hash: str
    entry_hash: str
    body: str


BuildRow = Callable[["Row | None"], Row]  # head row (or None) -> the row to append
BeforeCommit = Callable[[Row], None]


class Store(Protocol):
    description: str

    def rows(self, run_id: str) -> list[Row]: ...
    def append(self, run_id: str, build: BuildRow, before_commit: BeforeCommit) -> Row: ...
    def close(self) -> None: ...


# --------------------------------------------------------------------------- SQLite

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_log (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL, kind TEXT NOT NULL,
    prev_hash TEXT NOT NULL, entry_hash TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (run_id, seq));
CREATE UNIQUE INDEX IF NOT EXISTS audit_log_request ON audit_log (run_id, request_id);
CREATE TRIGGER IF NOT EXISTS audit_log_no_update BEFORE UPDATE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_log_no_delete BEFORE DELETE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"""


class SqliteStore:
    """The log in `<run>/audit.sqlite`."""

    def __init__(self, path: Path, create: bool) -> None:
        self.path = Path(path)
        self.description = f"sqlite:{self.path}"
        if not create and not self.path.exists():
            raise MunkeyError(f"The audit log {self.path} is missing; restore it from a backup.")
        if create and not self.path.exists():  # owner-only from the start (SQLite's journal takes its mode)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=DELETE")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA secure_delete=ON")
            if create:  # one transaction: all or nothing, and 4 flushes instead of 4 per statement (16)
                self.conn.executescript("BEGIN IMMEDIATE;" + _SQLITE_SCHEMA + "COMMIT;")
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    @staticmethod
    def prepare(path: Path) -> Path:
        """A new, empty log with the schema in a temporary file beside `path` (owner-only), not yet
        flushed: the caller flushes it and renames it over `path` with the run's binding in one group
        write (audit/log.py `open_log`: two rounds of flushes, where creating the schema in place took
        four flushes and the binding two more). A crash before the rename leaves a stray temporary
        file, which the next open of the run removes; the log is never seen half made."""
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=OFF")  # no rollback journal for a file nobody else sees yet
                conn.execute("PRAGMA synchronous=OFF")  # flushed by the caller, once, before the rename
                conn.executescript("BEGIN;" + _SQLITE_SCHEMA + "COMMIT;")
            finally:
                conn.close()
        except BaseException:
            os.unlink(tmp)
            raise
        return Path(tmp)

    def _damaged(self, exc: Exception) -> MunkeyError:
        return MunkeyError(f"The audit log {self.path} is damaged or unreadable ({exc}); restore it from a "
                           "backup. Nothing was changed.")

    def rows(self, run_id: str) -> list[Row]:
        try:
            cur = self.conn.execute(f"SELECT {_COLUMNS} FROM audit_log WHERE run_id = ? ORDER BY seq", (run_id,))
            return [Row(int(r[0]), *[str(x) for x in r[1:]]) for r in cur.fetchall()]
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def append(self, run_id: str, build: BuildRow, before_commit: BeforeCommit) -> Row:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                head = self.conn.execute(f"SELECT {_COLUMNS} FROM audit_log WHERE run_id = ? ORDER BY seq DESC "
                                         "LIMIT 1", (run_id,)).fetchone()
                row = build(None if head is None else Row(int(head[0]), *[str(x) for x in head[1:]]))
                self.conn.execute("INSERT INTO audit_log (run_id, seq, request_id, kind, prev_hash, entry_hash, body) "
                                  "VALUES (?, ?, ?, ?, ?, ?, ?)", (run_id, row.seq, row.request_id, row.kind,
                                                                   row.prev_hash, row.entry_hash, row.body))
                before_commit(row)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            return row
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- PostgreSQL

_PG_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {PG_TABLE} (
    run_id TEXT NOT NULL, seq BIGINT NOT NULL, request_id TEXT NOT NULL, kind TEXT NOT NULL,
    prev_hash TEXT NOT NULL, entry_hash TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (run_id, seq));
CREATE UNIQUE INDEX IF NOT EXISTS {PG_TABLE}_request ON {PG_TABLE} (run_id, request_id);
CREATE OR REPLACE FUNCTION {PG_TABLE}_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;
CREATE OR REPLACE TRIGGER {PG_TABLE}_no_change BEFORE UPDATE OR DELETE ON {PG_TABLE}
    FOR EACH ROW EXECUTE FUNCTION {PG_TABLE}_append_only();
"""
_SCHEMA_LOCK = 0x6D756E6B  # advisory lock id while creating the schema ("munk")


def describe_postgres(url: str) -> str:
    """postgresql://user@host:port/dbname for a connection URL or conninfo string, password left out."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise _no_psycopg() from None
    try:
        info = conninfo_to_dict(url)
    except Exception as exc:
        raise MunkeyError(f"The audit log URL is malformed ({exc}); use postgresql://user:password@host:port/db."
                          ) from None
    user = info.get("user") or ""
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    return f"postgresql://{user + '@' if user else ''}{host}:{port}/{info.get('dbname') or user or 'postgres'}"


def _no_psycopg() -> MunkeyError:
    return MunkeyError("A PostgreSQL audit log needs psycopg: pip install 'munkey-core[postgres]' "
                       "(or pip install 'psycopg[binary]').")


class PostgresStore:
    """The log in the `munkey_audit` table of a PostgreSQL database."""

    def __init__(self, url: str, create: bool) -> None:
        try:
            import psycopg
        except ImportError:
            raise _no_psycopg() from None
        self._psycopg = psycopg
        self.description = describe_postgres(url)
        try:
            self.conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
            with self.conn.transaction():
                self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                exists = self.conn.execute("SELECT to_regclass(%s)", (PG_TABLE,)).fetchone()[0]
                if exists is None:
                    if not create:
                        raise MunkeyError(f"The audit log table {PG_TABLE} is missing from {self.description}; "
                                          "restore it from a backup.")
                    self.conn.execute(_PG_SCHEMA)
        except psycopg.Error as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: Exception) -> MunkeyError:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return MunkeyError(f"The audit log database {self.description} is unreachable or refused the request "
                           f"({msg}). Check the URL (--audit-url or MUNKEY_AUDIT_URL) and the server; nothing was "
                           "changed.")

    def rows(self, run_id: str) -> list[Row]:
        try:
            cur = self.conn.execute(f"SELECT {_COLUMNS} FROM {PG_TABLE} WHERE run_id = %s ORDER BY seq", (run_id,))
            return [Row(int(r[0]), *[str(x) for x in r[1:]]) for r in cur.fetchall()]
        except self._psycopg.Error as exc:
            raise self._failed(exc) from None

    def append(self, run_id: str, build: BuildRow, before_commit: BeforeCommit) -> Row:
        try:
            with self.conn.transaction():
                self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (run_id,))
                head = self.conn.execute(f"SELECT {_COLUMNS} FROM {PG_TABLE} WHERE run_id = %s ORDER BY seq DESC "
                                         "LIMIT 1", (run_id,)).fetchone()
                row = build(None if head is None else Row(int(head[0]), *[str(x) for x in head[1:]]))
                self.conn.execute(f"INSERT INTO {PG_TABLE} (run_id, seq, request_id, kind, prev_hash, entry_hash, "
                                  "body) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                                  (run_id, row.seq, row.request_id, row.kind, row.prev_hash, row.entry_hash, row.body))
                before_commit(row)
            return row
        except self._psycopg.Error as exc:
            raise self._failed(exc) from None

    def close(self) -> None:
        self.conn.close()
