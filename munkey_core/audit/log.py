"""The audit log: append-only, hash-chained, one entry per deletion request (refused ones too).

Entry n stores `prev_hash` = entry n-1's hash (64 zeros for the first) and its own
`entry_hash = sha256(JCS({"format", "run_id", "seq", "prev_hash", "body"}))`, JCS being the
canonical JSON of canonical.py (RFC 8785). Editing, removing, inserting or reordering an entry
breaks a hash or a link; `verify` walks the chain and names the first entry that was touched,
and says how. A chain alone cannot show that its *last* entries were cut off or rewritten, so
the run keeps an anchor: `audit_head.json` = the (seq, hash) of the newest entry, rewritten after
each append (with `audit_pending.json` naming an append in flight, so a crash between the
database commit and the anchor write is recognised, not mistaken for tampering). Receipts carry
the head too, so a rewrite of the whole log is caught by any receipt issued before it.

The run is bound to its log in `audit.json` (run id, backend, where; never a password): SQLite
`<run>/audit.sqlite` by default, PostgreSQL when a URL is given (`--audit-url` or
$MUNKEY_AUDIT_URL) at the first request. Storage is in auditstore.py.
Signatures: the anchor is signed (Ed25519) with the operator's key, kept outside the run
(signing.py), and every entry names the public key that signs (`signer`): whoever can write the
run but not read that key can no longer rewrite the end of the log unnoticed. An unsigned anchor
is accepted only for a log no signing version wrote to ("older format"). Threat model and limits
(a whole-folder rollback to an earlier signed state is caught by receipts, not by the log alone):
docs/compliance_threat_model.md.
Tests: tests/audit/test_audit.py, tests/audit/test_postgres.py.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from munkey_core.audit.backends import SQLITE_NAME, PostgresStore, Row, SqliteStore, Store, describe_postgres
from munkey_core.audit.canonical import Encoded, canonical_bytes, canonical_json, sha256_hex
from munkey_core.audit import signing
from munkey_core.errors import MunkeyError
from munkey_core.run.lock import crash_point
from munkey_core.run.rows import bank_ids
from munkey_core.atomic import atomic_write_json, atomic_write_many, fsync_dir, json_bytes, read_json

LOG_FORMAT = "munkey-audit/1"
HEAD_FORMAT = "munkey-audit-head/1"  # what a log head's signature covers
GENESIS = "0" * 64
BINDING_NAME = "audit.json"
HEAD_NAME = "audit_head.json"
PENDING_NAME = "audit_pending.json"
URL_ENV = "MUNKEY_AUDIT_URL"


def now_utc() -> str:
    """Current UTC time, ISO 8601 with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def entry_hash(run_id: str, seq: int, prev_hash: str, body: dict | Encoded) -> str:
    """The hash an entry must carry (see the module docstring); `body` may be given encoded already."""
    return sha256_hex(canonical_bytes({"format": LOG_FORMAT, "run_id": run_id, "seq": seq,
                                       "prev_hash": prev_hash, "body": body}))


@dataclass(frozen=True)
class Entry:
    """A parsed log entry."""

    seq: int
    prev_hash: str
    entry_hash: str
    body: dict
    text: str | None = field(default=None, compare=False, repr=False)  # body's canonical JSON, when known

    @property
    def request_id(self) -> str:
        return str(self.body.get("request_id"))

    @property
    def kind(self) -> str:
        return str(self.body.get("kind"))


@dataclass
class Verification:
    """Outcome of re-computing the chain: `ok`, else the first bad entry and what happened to it."""

    ok: bool
    location: str
    entries: int = 0
    head_seq: int | None = None
    head_hash: str | None = None
    first_bad_seq: int | None = None
    problem: str | None = None  # edited | removed | inserted | reordered | truncated | unanchored | inconsistent
    #                             | unsigned | forged
    message: str = ""
    notes: list[str] = field(default_factory=list)
    signed_by: str | None = None  # the public key (hex) whose signature on the head was checked

    def as_dict(self) -> dict:
        return {"ok": self.ok, "log": self.location, "entries": self.entries, "head_seq": self.head_seq,
                "head_hash": self.head_hash, "first_bad_seq": self.first_bad_seq, "problem": self.problem,
                "message": self.message, "notes": list(self.notes), "signed_by": self.signed_by}


def _parse(row: Row) -> dict | None:
    try:
        body = json.loads(row.body)
    except (ValueError, TypeError):
        return None
    return body if isinstance(body, dict) else None


def _content_ok(row: Row, run_id: str, seq: int | None = None) -> bool:
    body = _parse(row)
    if body is None or canonical_json(body) != row.body:
        return False
    if body.get("kind") != row.kind or body.get("request_id") != row.request_id or body.get("run_id") != run_id:
        return False
    # row.body is the body's canonical text (just checked): hash it without encoding the body again
    return entry_hash(run_id, row.seq if seq is None else seq, row.prev_hash, Encoded(row.body)) == row.entry_hash


def _plural(n: int) -> str:
    return "entry" if n == 1 else "entries"


def check_chain(rows: list[Row], run_id: str) -> tuple[int, str, str] | None:
    """(seq, problem, message) of the first entry that breaks the chain, or None when intact."""
    by_hash = {r.entry_hash: i for i, r in enumerate(rows)}
    referenced = {r.prev_hash for r in rows}
    for p, r in enumerate(rows):
        prev = rows[p - 1] if p else None
        expected = prev.entry_hash if prev else GENESIS
        expected_seq = prev.seq + 1 if prev else 1
        if r.prev_hash != expected:
            nxt = rows[p + 1] if p + 1 < len(rows) else None
            q = by_hash.get(r.prev_hash)
            if q is not None and q > p:
                return r.seq, "reordered", (f"entry #{r.seq} is out of order: it was written after entry "
                                            f"#{rows[q].seq}, which now comes later in the log")
            if nxt is not None and nxt.prev_hash == expected and r.entry_hash not in referenced:
                return r.seq, "inserted", (f"entry #{r.seq} was inserted: the entry after it links to the entry "
                                           "before it")
            if q is None:
                if r.prev_hash == GENESIS:
                    return rows[0].seq, "inserted", (f"entry #{rows[0].seq} was inserted before the first entry "
                                                     "of the log")
                content = _content_ok(r, run_id)
                if content and prev is not None and r.seq == expected_seq:
                    return prev.seq, "edited", (f"entry #{prev.seq} was edited and its hash re-computed: entry "
                                                f"#{r.seq} still links to its original hash")
                if content and r.seq > expected_seq:
                    gone = r.seq - expected_seq
                    first = expected_seq
                    return first, "removed", (f"{gone} {_plural(gone)} (#{first}"
                                              + (f" to #{r.seq - 1}" if gone > 1 else "")
                                              + f") removed before entry #{r.seq}")
                for d in range(1, len(rows) + 2):  # renumbered after a removal?
                    if _content_ok(r, run_id, seq=r.seq + d):
                        return r.seq, "removed", (f"{d} {_plural(d)} removed before the entry now numbered "
                                                  f"#{r.seq} (originally #{r.seq + d}; later entries renumbered)")
                return r.seq, "edited", f"entry #{r.seq} was edited: it links to no entry of the log"
            between = rows[q + 1:p]
            if between and not any(b.entry_hash in referenced for b in between):
                n = len(between)
                return between[0].seq, "inserted", (f"{n} {_plural(n)} inserted: #{between[0].seq}"
                                                    + (f" to #{between[-1].seq}" if n > 1 else "")
                                                    + f" (entry #{r.seq} links to entry #{rows[q].seq})")
            return (between[0].seq if between else r.seq), "reordered", (
                f"entry #{r.seq} is out of order: it was written right after entry #{rows[q].seq}")
        if not _content_ok(r, run_id):
            return r.seq, "edited", f"entry #{r.seq} was edited: its content no longer matches its hash"
        if r.seq != expected_seq:
            return r.seq, "edited", f"entry #{r.seq} was renumbered (expected #{expected_seq})"
    return None


class AuditLog:
    """One run's chain in a store, with the run directory's anchor files."""

    def __init__(self, store: Store, binding: dict, root: Path) -> None:
        self.store = store
        self.binding = binding
        self.root = Path(root)
        self.run_id = str(binding["run_id"])

    @property
    def location(self) -> str:
        return self.store.description

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- reading ----------------------------------------------------------------------
    def rows(self) -> list[Row]:
        return self.store.rows(self.run_id)

    def entries(self) -> list[Entry]:
        """Every entry, oldest first (bodies that do not parse come back empty; verify flags them)."""
        return [Entry(r.seq, r.prev_hash, r.entry_hash, _parse(r) or {}) for r in self.rows()]

    def head(self) -> Entry | None:
        rows = self.rows()
        if not rows:
            return None
        r = rows[-1]
        return Entry(r.seq, r.prev_hash, r.entry_hash, _parse(r) or {})

    def find(self, request_id: str) -> Entry | None:
        return next((e for e in self.entries() if e.request_id == request_id), None)

    def subject_ref(self, subject: str | None) -> str | None:
        """A pseudonymous reference for a data subject: a keyed hash under the operator's subject key,
        kept outside the run (signing.py), so the log never holds the name or case number and whoever
        reads the run cannot test guesses; the same subject maps to the same ref under one key."""
        return signing.subject_ref(subject, self.root)

    def signer_key(self) -> str:
        """The public key (hex) that signs this log's heads and receipts from this machine; recorded in
        the run's binding when the log is created here (`open_log`) or the first time it signs here."""
        key = signing.signer(self.root).public_key
        known = list(self.binding.get("signing_keys", []))
        if key not in known:
            self.binding = {**self.binding, "signing_keys": known + [key]}
            atomic_write_json(self.root / BINDING_NAME, self.binding)
        return key

    # ----- writing ----------------------------------------------------------------------
    def append(self, body: dict, *, also: Callable[[Entry], list[tuple[Path, bytes]]] | None = None,
               flush_pending_removal: bool = True) -> Entry:
        """Append an entry (body must carry kind, request_id and run_id); returns it with its hash.
        The caller holds the run lock. `also(entry)`: files written with the anchor in one group (the
        entry's receipt, audit/receipts.py `append_with_receipt`): each atomic, all durable on return.
        `flush_pending_removal=False`: the caller flushes the run folder afterwards (a deletion removes
        its journal there), which makes the removal of audit_pending.json durable too."""
        if body.get("run_id") != self.run_id:
            raise ValueError("entry body must carry this log's run_id")
        text = canonical_json(body)  # encoded once: the row, its hash and the receipt reuse it

        def build(head: Row | None) -> Row:
            seq = head.seq + 1 if head else 1
            prev = head.entry_hash if head else GENESIS
            return Row(seq, str(body["request_id"]), str(body["kind"]), prev,
                       entry_hash(self.run_id, seq, prev, Encoded(text)), text)

        def before_commit(row: Row) -> None:
            atomic_write_json(self.root / PENDING_NAME, {"seq": row.seq, "hash": row.entry_hash})
            crash_point("audit-pending")

        row = self.store.append(self.run_id, build, before_commit)
        crash_point("audit-committed")
        entry = Entry(row.seq, row.prev_hash, row.entry_hash, body, text)
        self._anchor(row.seq, row.entry_hash, also(entry) if also is not None else (), flush_pending_removal)
        crash_point("audit-head")
        return entry

    def _anchor(self, seq: int, hash_: str, files: Sequence[tuple[Path, bytes]] = (),
                flush_pending_removal: bool = True) -> None:
        """Write the signed head (with `files`, one group write), then drop the pending marker: the
        head is durable before the marker's removal can be."""
        key = self.signer_key()
        head = {"seq": seq, "hash": hash_, "run_id": self.run_id}
        head["signature"] = signing.signer(self.root).sign(head_message(self.run_id, seq, hash_))
        assert head["signature"]["public_key"] == key
        atomic_write_many([(self.root / HEAD_NAME, json_bytes(head)), *files])
        pending = self.root / PENDING_NAME
        if pending.exists():
            pending.unlink()
            if flush_pending_removal:
                fsync_dir(self.root)

    def settle(self) -> None:
        """Finish the anchor of an append interrupted after its commit (caller holds the run lock)."""
        pending = _read_optional(self.root / PENDING_NAME)
        if pending is None:
            return
        row = next((r for r in self.rows() if r.seq == pending.get("seq")), None)
        if row is not None and row.entry_hash == pending.get("hash"):
            self._anchor(row.seq, row.entry_hash)
        else:  # the append never committed
            (self.root / PENDING_NAME).unlink()
            fsync_dir(self.root)

    # ----- verification -----------------------------------------------------------------
    def _check_head_signature(self, anchor: dict, rows: list[Row], head_row: Row, trusted_key: str | None,
                              v: Verification) -> str | None:
        """None when the anchor's signature holds (or the log is of the older, unsigned format);
        else what is wrong."""
        sig = anchor.get("signature")
        signers = _named_signers([r for r in rows if r.seq <= head_row.seq])
        if sig is None:
            if trusted_key is None and not signers:
                v.notes.append("the log head is unsigned (older format); it is signed from the next request on")
                return None
            return ("the log head (audit_head.json) is unsigned, but this log is signed: it was replaced or "
                    "edited")
        ok, why = signing.verify_signature(sig, head_message(self.run_id, head_row.seq, head_row.entry_hash),
                                           trusted_key)
        if not ok:
            return f"the log head's signature is not valid ({why}): audit_head.json was edited or forged"
        head_body = _parse(head_row) or {}
        named = head_body.get("signer")
        if isinstance(named, str) and trusted_key is None and named != sig.get("public_key"):
            return "the log head is signed by another key than the one its newest entry names"
        v.signed_by = str(sig.get("public_key"))
        return None


    def verify(self, trusted_key: str | None = None) -> Verification:
        """Re-compute every hash and link, then compare the end of the chain with the run's anchor and
        check the anchor's signature: by `trusted_key` (hex) when given, else by the key the head entry
        names. An unsigned anchor is accepted only for a log that no signing version wrote to (older
        format), and then said so in a note."""
        rows = self.rows()
        v = Verification(ok=True, location=self.location, entries=len(rows))
        if rows:
            v.head_seq, v.head_hash = rows[-1].seq, rows[-1].entry_hash
        bad = check_chain(rows, self.run_id)
        if bad is not None:
            return _fail(v, *bad)
        anchor = _read_optional(self.root / HEAD_NAME)
        pending = _read_optional(self.root / PENDING_NAME)
        anchored_seq = 0
        if anchor is not None:
            anchored_seq = int(anchor.get("seq", 0))
            row = next((r for r in rows if r.seq == anchored_seq), None)
            if row is None:
                last = rows[-1].seq if rows else 0
                gone = anchored_seq - last
                return _fail(v, last + 1, "truncated", f"{gone} {_plural(gone)} (#{last + 1}"
                             + (f" to #{anchored_seq}" if gone > 1 else "") + ") removed from the end of the log: "
                             f"the run recorded entry #{anchored_seq} as its newest")
            if row.entry_hash != anchor.get("hash"):
                return _fail(v, row.seq, "edited", f"entry #{row.seq} was rewritten: its hash differs from the one "
                             "the run recorded for it (audit_head.json)")
            bad_sig = self._check_head_signature(anchor, rows, row, trusted_key, v)
            if bad_sig is not None:
                return _fail(v, row.seq, "unsigned" if "unsigned" in bad_sig else "forged", bad_sig)
        elif trusted_key is not None and rows:
            return _fail(v, rows[-1].seq, "unsigned", "the log has no signed head (audit_head.json is missing)")
        extra = [r for r in rows if r.seq > anchored_seq]
        if extra:
            in_flight = (len(extra) == 1 and pending is not None and pending.get("seq") == extra[0].seq
                         and pending.get("hash") == extra[0].entry_hash)
            if not in_flight:
                what = "inserted after the newest entry the run recorded" if anchor is not None else \
                    "not anchored: the run's record of its newest entry (audit_head.json) is missing"
                return _fail(v, extra[0].seq, "inserted" if anchor is not None else "unanchored",
                             f"entry #{extra[0].seq} was {what}")
            v.notes.append(f"entry #{extra[0].seq} was committed just before an interruption; its anchor is "
                           "written when the run is next opened")
        v.message = (f"intact: {len(rows)} {_plural(len(rows))}, head #{v.head_seq} {v.head_hash}" if rows
                     else "intact: the log is empty")
        return v


def head_message(run_id: str, seq: int, hash_: str) -> bytes:
    """The bytes a log head's signature covers."""
    return canonical_bytes({"format": HEAD_FORMAT, "run_id": run_id, "seq": seq, "hash": hash_})


def _named_signers(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        body = _parse(r) or {}
        if isinstance(body.get("signer"), str):
            out.append(body["signer"])
    return out


def _fail(v: Verification, seq: int, problem: str, message: str) -> Verification:
    v.ok, v.first_bad_seq, v.problem, v.message = False, seq, problem, message
    return v


def _read_optional(path: Path) -> dict | None:
    if not path.exists():
        return None
    data = read_json(path)
    if not isinstance(data, dict):
        raise MunkeyError(f"{path} is damaged; restore the run directory from a backup.")
    return data


# --------------------------------------------------------------------------- opening a run's log


def _is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://")) or "dbname=" in url or "host=" in url


def open_log(root: str | Path, url: str | None = None, *, create: bool = False) -> AuditLog | None:
    """The run's audit log; None when the run has none yet and `create` is False.

    `url` (else $MUNKEY_AUDIT_URL) selects PostgreSQL for a run that has no log yet, and supplies
    the credentials for a run bound to PostgreSQL. A run's log never changes backend.
    """
    root = Path(root)
    explicit = url
    url = url or os.environ.get(URL_ENV) or None
    binding_path, sqlite_path = root / BINDING_NAME, root / SQLITE_NAME
    new = not binding_path.exists()
    if not new:
        binding = read_json(binding_path)
        if not isinstance(binding, dict) or not {"run_id", "backend", "location"} <= set(binding):
            raise MunkeyError(f"{binding_path} is damaged; restore the run directory from a backup.")
        if create and "subject_salt" in binding:  # older format: the pseudonym key lay beside the log
            binding = {k: v for k, v in binding.items() if k != "subject_salt"}
            binding["subject_key"] = "kept outside the run since " + now_utc()
            atomic_write_json(binding_path, binding)
    else:
        if sqlite_path.exists() or (root / HEAD_NAME).exists():
            raise MunkeyError(f"{binding_path} is missing, but this run has an audit log; restore the run "
                              "directory from a backup. Nothing was changed.")
        if not create:
            return None
        binding = {"format": 1, "run_id": str(uuid.uuid4()), "created": now_utc(),
                   "subject_key": "kept outside the run",
                   "backend": "postgresql" if url and _is_postgres(url) else "sqlite",
                   "location": describe_postgres(url) if url and _is_postgres(url) else SQLITE_NAME}
        if url and not _is_postgres(url):
            raise MunkeyError(f"Unsupported audit log URL {url!r}: give a postgresql://user:password@host:port/db "
                              "URL, or none for the run's own SQLite log.")
    if new:
        binding = _with_signer(binding, root)
    if binding["backend"] == "sqlite":
        if explicit and _is_postgres(explicit):
            raise MunkeyError(f"This run's audit log is its SQLite file {sqlite_path}; a run's log cannot move to "
                              "PostgreSQL. Leave out --audit-url.")
        if new:  # the empty log built beside its place, then it and the binding in one group write
            atomic_write_many([(binding_path, json_bytes(binding))], prepared=[(SqliteStore.prepare(sqlite_path),
                                                                               sqlite_path)])
        store: Store = SqliteStore(sqlite_path, create=False)
    elif binding["backend"] == "postgresql":
        if not url:
            raise MunkeyError(f"This run's audit log is in PostgreSQL ({binding['location']}); give its URL with "
                              f"--audit-url or ${URL_ENV}.")
        if describe_postgres(url).split("@")[-1] != str(binding["location"]).split("@")[-1]:
            raise MunkeyError(f"The audit log URL points to {describe_postgres(url)}, but this run's log is at "
                              f"{binding['location']}. Give that database's URL.")
        store = PostgresStore(url, create=new)
    else:
        raise MunkeyError(f"{binding_path} names an unknown backend {binding['backend']!r}; restore it from a backup.")
    if new and binding["backend"] != "sqlite":
        atomic_write_json(binding_path, binding)
    return AuditLog(store, binding, root)


def _with_signer(binding: dict, root: Path) -> dict:
    """A new log's binding with the key that will sign it from this machine (`signing_keys`, which
    `AuditLog.signer_key` would otherwise add at the first signature: a second write of the binding);
    unchanged when the key cannot be had now (the first signature then says why)."""
    try:
        key = signing.signer(root).public_key
    except MunkeyError:
        return binding
    return {**binding, "signing_keys": [key]}


LINEAGE_KIND = "lineage"  # the first entry of a run derived from another: anchors the parent's log


def operator_label(operator: str | None) -> str:
    """How a listing names an entry's operator: a request refused for naming nobody reads as such, not None."""
    return operator.strip() if isinstance(operator, str) and operator.strip() else "(no operator named)"


def logged_deletions(entries: list[Entry]) -> set[int]:
    """Every id the log records as deleted: by this run's deletions, or inherited from the run it was
    derived from (a lineage entry)."""
    deleted: set[int] = set()
    for e in entries:
        if e.kind == "deletion":
            deleted.update(int(s["id"]) for s in e.body.get("samples", []))
        elif e.kind == LINEAGE_KIND:
            deleted.update(int(i) for i in e.body.get("inherited_deleted_ids", []))
    return deleted


def verify_run(root: str | Path, url: str | None = None, trusted_key: str | None = None) -> Verification:
    """Verify the run's chain, its signed anchor, then that the run agrees with it: every id the log
    says was deleted is gone from the bank file and from every checkpoint row file, and listed in
    forgotten.json; every id in forgotten.json has its log entry (ids of a deletion still in progress
    excepted). A directory that is not a run is an error, not an empty log."""
    from munkey_core.run.paths import open_run, read_config, read_forgotten
    from munkey_core.run.rows import checkpoint_ids_present

    root = Path(root)
    paths = open_run(root)  # raises MunkeyError for a folder that is not a run
    read_config(paths)
    log = open_log(root, url)
    forgotten = set(int(i) for i in read_forgotten(paths)["ids"])
    if log is None:
        v = Verification(ok=True, location="none", message="no audit log yet: no request has been filed")
        if forgotten:
            return _fail(v, 0, "inconsistent", f"{len(forgotten)} sample(s) are deleted (forgotten.json) but the run "
                         "has no audit log recording them")
        if trusted_key is not None:
            return _fail(v, 0, "unsigned", "the run has no audit log, so nothing is signed")
        return v
    with log:
        v = log.verify(trusted_key)
        if not v.ok:
            return v
        deleted = logged_deletions(log.entries())
    journal = root / "journal.json"
    pending = set(int(i) for i in read_json(journal).get("ids", [])) if journal.exists() else set()
    if pending:
        v.notes.append(f"a deletion of {len(pending)} sample(s) is in progress or was interrupted; it is finished "
                       "when the run is next opened")
    unlogged = sorted(forgotten - deleted - pending)
    if unlogged:
        return _fail(v, 0, "inconsistent", f"{len(unlogged)} deleted sample(s) (forgotten.json) have no log entry: "
                     + ", ".join(map(str, unlogged[:10])) + "; forgotten.json was edited, or a deletion was not "
                     "recorded. Nothing was deleted for them")
    unlisted = sorted(deleted - forgotten)
    if unlisted:
        return _fail(v, 0, "inconsistent", f"the log records {len(unlisted)} deletion(s) that forgotten.json lacks: "
                     + ", ".join(map(str, unlisted[:10])))
    settled = deleted - pending
    back = sorted(set(bank_ids(paths.root).tolist()) & settled)
    if back:
        return _fail(v, 0, "inconsistent", f"{len(back)} sample(s) the log records as deleted are in the memory bank "
                     "again (bank.store restored from an older copy?): " + ", ".join(map(str, back[:10]))
                     + "; file the deletion again to remove them")
    in_ckpts, n_ckpts = checkpoint_ids_present(paths.checkpoints, sorted(settled))
    if in_ckpts:
        name, ids = next(iter(in_ckpts.items()))
        return _fail(v, 0, "inconsistent", f"checkpoint rows of {sum(map(len, in_ckpts.values()))} sample(s) the log "
                     f"records as deleted are back ({name}: " + ", ".join(map(str, ids[:10]))
                     + "); a row file was restored from an older copy: file the deletion again to remove them")
    v.message += (f"; the run agrees with it ({len(deleted)} deleted sample(s), none in the bank or in "
                  f"{n_ckpts} checkpoint(s))")
    return v
