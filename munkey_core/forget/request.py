"""The deletion protocol: one request -> bank, checkpoints, forgotten.json, audit entry and receipt,
all or nothing, one request at a time.

A request holds the run's deletion lock (`.deletion.lock`) from start to end, so requests queue;
the run lock (run/lock.py) is held exclusively only for three short sections, so readers (predict,
evidence, opening the run) never wait for an evaluation:
1. validate (exclusive): against the bank and the audit log (a tampered log refuses it; an unknown,
   missing or out-of-range id refuses it, and the refusal is logged with a signed receipt);
2. the evaluation before (no exclusive lock: the bank cannot change, only a deletion changes it);
3. commit and apply (exclusive): `journal.json` is written atomically (the commit point; the
   journal is the pending audit entry), then, each step idempotent: forgotten.json, every
   checkpoint's row file, the bank store (each purged in place: O(#ids) bytes, durable on return),
   then the run's derived files and the sample tags (run/mapcache.py, run/tags.py: the ids' rows and tags);
4. the evidence and evaluation after (no exclusive lock);
5. record (exclusive): the audit entry (skipped if the log already holds this request id), the
   receipt; the journal is removed last.
A crash before the commit point leaves the run as it was; after it, the next open of the run (or
the next request) finishes the journal ("roll forward"), so the run is always wholly before or
wholly after a request. A journal whose request still runs (its process holds the deletion lock)
is never finished by anyone else. Only a journal commits a deletion: ids that forgotten.json lists
but the bank holds (a stale file copied back, an id added by hand) are never deleted on open;
`munkey audit verify` reports them. The crash points named in CRASH_STEPS let
tests/run/test_atomicity.py SIGKILL a deletion at each step.
Nothing in the journal, the log or a receipt is a vector: only ids, hashes and metrics.
"""

from __future__ import annotations

import getpass
import hashlib
import secrets
import warnings
import time
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from munkey_core import __version__
from munkey_core.audit import receipts
from munkey_core.audit.log import LINEAGE_KIND, PENDING_NAME, AuditLog, now_utc, open_log, verify_run
from munkey_core.audit.canonical import plain
from munkey_core.errors import MunkeyError
from munkey_core.forget.evidence import ORACLE_NOTE, own_keys, retrieval_evidence, sample_fingerprints
from munkey_core.eval.metrics import MIA_CHEAP
from munkey_core.run.paths import RunPaths, is_run, read_forgotten
from munkey_core.run.copycache import purged_calibrations as purged_cached_thresholds
from munkey_core.run.mapcache import purge_ids as purge_cached_maps
from munkey_core.run.tags import purge_ids as purge_tags
from munkey_core.run.predstore import purged_tables as purged_stored_predictions
from munkey_core.run.lock import DELETION_LOCK_NAME, RunLock, crash_point, deletion_in_progress, pause_point
from munkey_core.run.rows import purge_checkpoint_rows
from munkey_core.atomic import atomic_write_json, fsync_dir, json_bytes, read_json

if TYPE_CHECKING:  # the model, the evaluation and the run interface load where a request needs them: one
    # without evaluation runs on a run opened without its model (run/bankonly.py) and loads no torch
    from munkey_core.run.loaded import DeletionTarget, LoadedMunkeyRun

Progress = Callable[[str, float], None]
JOURNAL_NAME = "journal.json"
METHOD = "key_deletion"  # the log's method field also admits "unact" and "retrain" (not implemented yet)
CRASH_STEPS = ("validated", "journal", "forgotten", "checkpoint", "checkpoints", "bank", "evaluated",
               "audit-pending", "audit-committed", "audit-head", "receipt")
MAX_ID = 2 ** 63 - 1  # ids are int64
REFUSAL_IDS_KEPT = 100  # ids a refusal's log entry lists (with the count and a hash of all)
_METRIC_KEYS = ("TA", "RA", "FA", "MIA", "Ps", "A_img", "A_tok", "n_test", "n_retain", "n_forget", "bank_size",
                "deleted", "time", "MIA_attack", "bank_fingerprint", "FA_remembered", "MIA_remembered",
                "n_remembered")


@dataclass(frozen=True)
class ForgetResult:
    """Outcome of a deletion request."""

    deleted: list[int]
    already_deleted: list[int]
    bank_size: int
    seconds: float
    request_id: str | None = None
    receipt: str | None = None
    receipt_html: str | None = None
    entry_seq: int | None = None
    entry_hash: str | None = None
    entry: dict = field(default_factory=dict)

    @property
    def evidence_passed(self) -> bool | None:
        return (self.entry.get("evidence") or {}).get("passed")


class RefusedRequest(MunkeyError):
    """A request refused and recorded in the audit log (`request_id` names its entry)."""

    def __init__(self, message: str, request_id: str | None) -> None:
        super().__init__(message)
        self.request_id = request_id


class UnfinishedRequest(MunkeyError):
    """A request committed (journal.json on disk) whose files or audit entry could not be finished now
    (a full disk, a damaged row file...): never a refusal; the next open of the run finishes it."""

    def __init__(self, message: str, request_id: str) -> None:
        super().__init__(message)
        self.request_id = request_id


def new_request_id() -> str:
    return "req-" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


def check_operator(operator: str | None) -> str:
    """The operator's name, checked; a library call without one is recorded as its OS user."""
    if operator is None:
        try:
            user = getpass.getuser()
        except Exception:
            user = "unknown"
        return f"unnamed library caller (OS user {user})"
    op = str(operator).strip()
    if not op:
        raise MunkeyError("Name the operator who files this deletion (--operator NAME). Nothing was deleted.")
    if len(op) > 200 or any(unicodedata.category(c).startswith("C") for c in op):
        raise MunkeyError("The operator name must be at most 200 printable characters. Nothing was deleted.")
    return op


EMPTY_BANK_NOTE = ("not evaluated: every training sample is deleted, so the model has no neighbours to retrieve "
                   "and cannot predict")


def _noop(stage: str, frac: float) -> None:
    pass


def _scaled(progress: Progress, lo: float, hi: float, prefix: str) -> Progress:
    return lambda stage, frac: progress(f"{prefix}: {stage}", lo + (hi - lo) * float(frac))


def _metrics(m: dict | None) -> dict | None:
    return None if m is None else plain({k: m.get(k) for k in _METRIC_KEYS if k in m})


def _matching_metrics(run: LoadedMunkeyRun, bank_fp: str) -> dict | None:
    hist = run.metrics_history
    return hist[-1] if hist and hist[-1].get("bank_fingerprint") == bank_fp else None


def _dataset_name(root: Path) -> str | None:
    try:
        return read_json(RunPaths(root).config).get("dataset")
    except Exception:
        return None


# --------------------------------------------------------------------------- refusals


def _refused_body(log: AuditLog, request_id: str, *, operator: str | None, subject: str | None, received: str,
                  reason: str, requested_ids: Sequence[int] | None, source: str) -> dict:
    return plain({
        "kind": "refused", "request_id": request_id, "run_id": log.run_id, "dataset": _dataset_name(log.root),
        "operator": operator, "subject_ref": log.subject_ref(subject), "received": received, "executed": None,
        "method": METHOD, "source": source, "reason": reason, **_requested_summary(requested_ids),
        "software": f"munkey-core {__version__}", "signer": log.signer_key(),
    })


def _requested_summary(ids: Sequence[int] | None) -> dict:
    """What a refusal records of the ids it names: the first REFUSAL_IDS_KEPT (ids beyond 2**53, which
    canonical JSON cannot hold as numbers, as decimal strings), their count, and a hash of them all,
    so a huge request cannot bloat the log."""
    if ids is None:
        return {"requested_ids": None}
    ids = [int(i) for i in ids]
    kept = [i if 0 <= i < 2 ** 53 else str(i) for i in ids[:REFUSAL_IDS_KEPT]]
    out: dict = {"requested_ids": kept}
    if len(ids) > REFUSAL_IDS_KEPT:
        out["requested_count"] = len(ids)
        out["requested_ids_sha256"] = hashlib.sha256(",".join(map(str, ids)).encode("ascii")).hexdigest()
    return out


def record_refusal(root: str | Path, *, reason: str, operator: str | None, subject: str | None = None,
                   requested_ids: Sequence[int] | None = None, source: str = "ids", url: str | None = None,
                   lock: RunLock | None = None) -> str | None:
    """Log a request refused before it reached `forget` (malformed ids, damaged run...). Only when the
    directory is a run and its log is intact; returns the request id, or None when not recorded."""
    root = Path(root)
    if not is_run(root):  # never write into a directory that is not a run
        return None
    op = None if operator is None else "".join(c for c in str(operator) if c.isprintable())[:200] or None
    try:
        with (lock or RunLock(root)).hold(exclusive=True):
            log = open_log(root, url, create=True)
            with log:
                log.settle()
                if not log.verify().ok:
                    return None
                body = _refused_body(log, new_request_id(), operator=op, subject=subject, received=now_utc(),
                                     reason=reason, requested_ids=requested_ids, source=source)
                return receipts.append_with_receipt(root, log, body)[0].request_id
    except MunkeyError:
        return None


# --------------------------------------------------------------------------- the request


def forget(run: LoadedMunkeyRun, ids: Sequence[int], *, operator: str | None = None, subject: str | None = None,
           evaluate: bool = False, max_samples: int = 2000, source: str = "ids",
           progress: Progress | None = None) -> ForgetResult:
    """File and execute one deletion request (see the module docstring).

    The whole request holds the run's deletion lock (requests queue on it); the run lock is held
    exclusively only for the short sections that validate, commit and apply, and append the entry.
    The evaluations before and after run outside them, on a bank that cannot change meanwhile (only
    a deletion changes it, and this one holds the deletion lock), so readers never wait for them."""
    report = progress or _noop
    received, request_id = now_utc(), new_request_id()
    operator = check_operator(operator)
    with RunLock(run.paths.root, DELETION_LOCK_NAME).hold(exclusive=True):
        log = open_log(run.paths.root, run.audit_url, create=True)
        with log:
            with run.lock, run.runlock.hold(exclusive=True):  # 1. validate (milliseconds)
                log.settle()
                run.reload_if_changed()
                if (run.paths.root / JOURNAL_NAME).exists():  # an interrupted deletion: nobody else runs one
                    finish(run, log, read_json(run.paths.root / JOURNAL_NAME), recovered=True)
                check = log.verify()
                if not check.ok:
                    raise MunkeyError(f"The audit log is not intact ({check.message}). Nothing was deleted and the "
                                      "request was not recorded. Run 'munkey audit verify "
                                      f"{run.paths.root}' and restore the log from a backup.")

                def refuse(reason: str, requested: Sequence[int] | None) -> None:
                    receipts.append_with_receipt(run.paths.root, log, _refused_body(
                        log, request_id, operator=operator, subject=subject, received=received, reason=reason,
                        requested_ids=requested, source=source))
                    raise RefusedRequest(f"{reason} Nothing was deleted; the refused request {request_id} is "
                                         "recorded in the audit log.", request_id)

                try:
                    ids = [int(i) for i in dict.fromkeys(int(i) for i in ids)]
                except (TypeError, ValueError, OverflowError):
                    refuse("The request holds malformed ids; ids are non-negative integers.", None)
                if not ids:
                    refuse("The deletion request names no sample id.", [])
                bad = [i for i in ids if not 0 <= i <= MAX_ID]
                if bad:
                    refuse(f"{len(bad)} id(s) are not non-negative integers within int64.", ids)
                done = set(run.forgotten_ids)
                unknown = [i for i in ids if i not in done and i not in run.bank]
                if unknown:
                    shown = ", ".join(map(str, unknown[:10])) + (" ..." if len(unknown) > 10 else "")
                    refuse(f"{len(unknown)} id(s) are not training samples of this run: {shown}.", ids)
                # an id deleted earlier whose row is in the bank again (a restored file) is deleted again
                todo = [i for i in ids if i not in done or i in run.bank]
                going = set(todo)
                already = [i for i in ids if i not in going]  # (a set: a list made this 1,000 x 1,000 steps)
            journal = _prepare(run, log, request_id, ids, todo, already, operator=operator, subject=subject,
                               received=received, source=source, evaluate=evaluate, max_samples=max_samples,
                               progress=report)  # 2. the evaluation before (readers go on)
            with run.lock, run.runlock.hold(exclusive=True):  # 3. commit and apply (milliseconds)
                keys = own_keys(run, ids)  # in memory only: the deleted keys are never written anywhere
                crash_point("validated")
                t0 = time.perf_counter()  # the deletion proper: from the commit point to the bank saved
                atomic_write_json(run.paths.root / JOURNAL_NAME, journal, compact=True)  # the commit point
                crash_point("journal")
                report("deleting", 0.45)
                try:
                    apply_journal(run, journal)
                except (MunkeyError, OSError) as exc:
                    raise _unfinished(request_id, exc) from None
                seconds = time.perf_counter() - t0
            try:
                measured = _measure_after(run, journal, keys, report)  # 4. the evaluation after (readers go on)
                with run.lock, run.runlock.hold(exclusive=True):  # 5. the audit entry and receipt
                    return _record(run, log, journal, measured, seconds=seconds, progress=report)
            except (MunkeyError, OSError) as exc:
                raise _unfinished(request_id, exc) from None


def forget_without_model(path: str | Path, ids: Sequence[int] | None, *, audit_url: str | None = None,
                         search: str | None = None, fraction: float | None = None, seed: int = 0,
                         **options) -> ForgetResult | None:
    """A request without evaluation (`forget` with evaluate=False) on the run opened without its model
    (run/bankonly.py: numpy and the run's files, no torch), for `ids` or, when None, a seeded random
    `fraction` of the bank. None where that path does not apply (an unfinished deletion to finish, a
    format-1 run, an IVF search, keys or weights it cannot read): the caller opens the run in full.
    The same files, audit entry and receipt as `forget` on the full run (tests/run/test_bankonly.py)."""
    from munkey_core.data.sampling import random_ids
    from munkey_core.run.bankonly import NeedsModel, open_bank_only

    try:
        run = open_bank_only(path, audit_url=audit_url, search=search)
        if run is None:
            return None
        with run.runlock.hold(exclusive=False):
            if needs_recovery(run):  # finishing it may need an evaluation: the full run does it
                return None
        if ids is None:
            ids = random_ids(run.bank.ids, fraction, seed)
        elif _names_ids_outside(run, ids):  # their keys come from the key cache (evidence.own_keys): read now
            try:
                run.split_keys("train")
            except MunkeyError:  # as open_bank_only: the full run reads them
                return None
        return forget(run, ids, evaluate=False, **options)
    except NeedsModel:  # raised before anything is committed (what it reads was read at open)
        return None


def _names_ids_outside(run: LoadedMunkeyRun, ids: Sequence[int]) -> bool:
    """True when some id is not in the bank (deleted earlier, or unknown); False for malformed ids too,
    which the request refuses before it reads any key."""
    try:
        return any(int(i) not in run.bank for i in ids)
    except (TypeError, ValueError, OverflowError):
        return False


def _unfinished(request_id: str, exc: BaseException) -> UnfinishedRequest:
    detail = str(exc) if isinstance(exc, MunkeyError) else f"{getattr(exc, 'strerror', None) or exc}."
    return UnfinishedRequest(
        f"The deletion request {request_id} is committed but could not be finished now: {detail} It is not "
        "refused and need not be filed again: once that is fixed, the next open of the run (or the next "
        "request) finishes it.", request_id)


def _prepare(run: LoadedMunkeyRun, log: AuditLog, request_id: str, ids: list[int], todo: list[int],
             already: list[int], *, operator: str, subject: str | None, received: str, source: str,
             evaluate: bool, max_samples: int, progress: Progress) -> dict:
    """The journal: the pending audit entry, with everything known before the change."""
    bank_fp = run.bank.fingerprint()
    samples, note = sample_fingerprints(run, todo)
    before, source_b, fa_before = None, "not evaluated (--no-evaluate)", None
    if evaluate and todo:
        from munkey_core.eval import evaluate as evaluation

        before = _matching_metrics(run, bank_fp)
        if before is not None:
            source_b = f"metrics.json entry of {before.get('time')}"
        else:
            before = evaluation.evaluate(run, max_samples=max_samples,
                                         progress=_scaled(progress, 0.0, 0.4, "before"))
            source_b = "evaluated before the deletion"
        fa_before = evaluation.accuracy_on_ids(run, todo)
    elif not todo:
        source_b = "not evaluated: this request deletes nothing new"
    journal = plain({
        "format": 1, "request_id": request_id, "already_deleted": already,
        "operator": operator, "subject_ref": log.subject_ref(subject), "received": received, "source": source,
        "evaluate": bool(evaluate), "max_samples": int(max_samples), "samples_note": note,
        "model_before": run.model_fingerprint, "bank_before": {"fingerprint": bank_fp, "size": len(run.bank)},
        "metrics_before": _metrics(before), "metrics_before_source": source_b, "request_FA_before": fa_before,
    })
    # plain already (Python ints, hex strings): not walked again, 1,000 samples are a few thousand values
    journal.update({"ids": todo, "requested": ids, "samples": samples})
    return journal


def apply_journal(run: DeletionTarget, journal: dict) -> None:
    """Make the run's files say what the journal says (each step idempotent).

    One group commit (run/rows.py `purge_checkpoint_rows`, bank/store.py `delete_many`) changes
    forgotten.json, the derived files that name a deleted id (the stored predictions, run/predstore.py,
    planned before the bank file changes: they are stamped with the bank after it; the copy-detection
    calibrations, run/copycache.py), every checkpoint's row file and the bank file: two rounds of
    concurrent flushes for all of them, each file old or new after a crash and every one durable on
    return; the journal, durable before this runs, finishes them after any crash."""
    todo = [int(i) for i in journal["ids"]]
    requested = [int(i) for i in journal.get("requested", todo)]  # a checkpoint row restored after an
    # earlier deletion goes too
    fg = read_forgotten(run.paths)
    have = set(int(i) for i in fg["ids"])
    new = [i for i in todo if i not in have]
    files: list[tuple[Path, bytes]] = []
    if new:
        fg = {"ids": [int(i) for i in fg["ids"]] + new,
              "requests": fg.get("requests", []) + [{"time": journal["received"], "ids": todo,
                                                     "request_id": journal["request_id"]}]}
        files.append((run.paths.forgotten, json_bytes(fg)))
    # derived data, planned before the bank file changes (run/predstore.py: it stamps what it keeps with
    # the bank after)
    files += purged_stored_predictions(run.paths.root, requested)[0]
    files += purged_cached_thresholds(run.paths.root, requested)[0]

    def after_files() -> None:  # every file above replaced, no row moved yet
        if new:
            run.forgotten_written(fg)
        crash_point("forgotten")

    purge_checkpoint_rows(run.paths.checkpoints, requested, on_file=lambda _: crash_point("checkpoint"),
                          bank=run.paths.bank, replace=files, after_files=after_files)
    crash_point("checkpoints")
    present = [i for i in todo if i in run.bank]
    if present:  # the bank file is done: the bank in memory follows it
        run.apply_deletion(present)
    crash_point("bank")
    purge_cached_maps(run.paths.root, requested)  # derived data: run/mapcache.py
    purge_tags(run.paths.root, requested)  # data about the samples: run/tags.py


def finish(run: LoadedMunkeyRun, log: AuditLog, journal: dict, *, keys=None, recovered: bool = False,
           t0: float | None = None, progress: Progress | None = None) -> ForgetResult:
    """Roll a committed journal forward in one go (recovery; the caller holds the run lock exclusively):
    files, evidence, audit entry, receipt; then drop the journal."""
    report = progress or _noop
    apply_journal(run, journal)
    seconds = time.perf_counter() - t0 if t0 is not None else 0.0
    measured = _measure_after(run, journal, keys, report, recovered=recovered)
    return _record(run, log, journal, measured, seconds=seconds, progress=report)


def _measure_after(run: LoadedMunkeyRun, journal: dict, keys, report: Progress, recovered: bool = False) -> dict:
    """The post-deletion evidence and (when asked) evaluation, as parts of the audit entry's body."""
    todo, requested = [int(i) for i in journal["ids"]], [int(i) for i in journal["requested"]]
    executed = now_utc()
    report("checking", 0.5)
    if keys is None:
        keys = own_keys(run, requested)
    pause_point("evaluating")
    ev = retrieval_evidence(run, requested, keys)
    bank_fp = run.bank.fingerprint()
    after, req = None, {}
    if not todo:
        after, source_a = journal["metrics_before"], "unchanged: this request deleted nothing new"
    elif journal["evaluate"] and len(run.bank) == 0:
        # nothing left to retrieve, so nothing to predict with: the deletion is complete and is logged as such
        source_a = EMPTY_BANK_NOTE
    elif journal["evaluate"]:
        from munkey_core.eval import evaluate as evaluation

        after = _matching_metrics(run, bank_fp)
        source_a = f"metrics.json entry of {after.get('time')}" if after else "evaluated after the deletion"
        if after is None:
            after = evaluation.evaluate(run, max_samples=journal["max_samples"],
                                        progress=_scaled(report, 0.55, 0.9, "after"))
        req = evaluation.request_accuracy_and_mia(run, todo, journal["max_samples"])
    else:
        source_a = "not evaluated (--no-evaluate)"
    crash_point("evaluated")
    ev.update({"request_FA_before": journal["request_FA_before"], "request_FA_after": req.get("FA"),
               "request_MIA": req.get("MIA"), "MIA_attack": MIA_CHEAP, "oracle": None, "oracle_gaps": None,
               "oracle_note": ORACLE_NOTE,
               **{k: req.get(k) for k in ("TPR@1%", "TPR@0.1%", "TA_same_classes", "FA_minus_TA_same_classes",
                                          "difference_se", "difference_interval", "same_class_note",
                                          "FA_remembered", "MIA_remembered", "n_remembered")}})
    notes = [n for n in [journal.get("samples_note")] if n]
    if recovered:
        notes.append("finished when the run was next opened, after the process filing it was interrupted")
    return {"executed": executed, "evidence": ev, "bank_after": {"fingerprint": bank_fp, "size": len(run.bank)},
            "model_after": run.model_fingerprint, "after": _metrics(after), "after_source": source_a,
            "recovered": recovered, "notes": notes}


def _record(run: LoadedMunkeyRun, log: AuditLog, journal: dict, m: dict, *, seconds: float,
            progress: Progress) -> ForgetResult:
    """Append the audit entry (unless the log holds it already), issue the receipt, drop the journal."""
    rid = journal["request_id"]
    todo, requested = [int(i) for i in journal["ids"]], [int(i) for i in journal["requested"]]
    body = plain({
        "kind": "deletion", "request_id": rid, "run_id": log.run_id, "dataset": run.config.get("dataset"),
        "operator": journal["operator"], "subject_ref": journal["subject_ref"], "received": journal["received"],
        "executed": m["executed"], "method": METHOD, "source": journal["source"],
        "already_deleted": journal["already_deleted"],
        "model": {"before": journal["model_before"], "after": m["model_after"]},
        "bank": {"before": journal["bank_before"], "after": m["bank_after"]},
        "metrics": {"before": journal["metrics_before"], "before_source": journal["metrics_before_source"],
                    "after": m["after"], "after_source": m["after_source"]},
        "evidence": m["evidence"], "recovered": m["recovered"], "notes": m["notes"],
        "software": f"munkey-core {__version__}", "signer": log.signer_key(),
    })
    body.update({"requested_ids": requested, "samples": journal["samples"]})  # plain already (the journal's)
    entry = log.find(rid)
    if entry is None:  # the entry, then its anchor and receipt in one group write
        entry, js, page = receipts.append_with_receipt(run.paths.root, log, body, flush_pending_removal=False)
    else:  # recorded before an interruption: the receipt again
        js, page = receipts.issue(run.paths.root, log, entry)
    crash_point("receipt")
    (run.paths.root / JOURNAL_NAME).unlink(missing_ok=True)
    fsync_dir(run.paths.root)  # the journal's removal, and audit_pending.json's (log.append), durable
    progress("done", 1.0)
    return ForgetResult(todo, [int(i) for i in journal["already_deleted"]], len(run.bank), seconds, rid, str(js),
                        str(page), entry.seq, entry.entry_hash, entry.body)


# --------------------------------------------------------------------------- recovery


def needs_recovery(run: LoadedMunkeyRun) -> bool:
    """An interrupted request to finish: a journal (or audit append) whose process is gone. Only a
    journal commits a deletion: ids in forgotten.json that the bank holds (a stale bank.store copied
    back, an id added by hand) are never deleted on open; `munkey audit verify` reports them."""
    root = run.paths.root
    if deletion_in_progress(root):  # a live request owns the journal (it is being evaluated)
        return False
    return (root / JOURNAL_NAME).exists() or (root / PENDING_NAME).exists() or bool(_stray_temp_files(root))


def recover(run: LoadedMunkeyRun) -> None:
    """Finish an interrupted deletion and its audit entry (caller holds the exclusive run lock).
    When the log cannot be reached, the files are still finished and the entry waits in the journal."""
    root = run.paths.root
    journal_path = root / JOURNAL_NAME
    if deletion_in_progress(root):
        return
    try:
        log = open_log(root, run.audit_url, create=journal_path.exists())
    except MunkeyError as exc:
        if journal_path.exists():
            apply_journal(run, read_json(journal_path))
            warnings.warn(f"An interrupted deletion was applied to the run, but its audit entry waits until the log "
                          f"is reachable: {exc}", RuntimeWarning, stacklevel=2)
        return
    if log is not None:
        with log:
            log.settle()
            if journal_path.exists():
                finish(run, log, read_json(journal_path), recovered=True)
    for tmp in _stray_temp_files(root):
        tmp.unlink(missing_ok=True)


def open_recovered(path: str | Path, device: str = "auto", audit_url: str | None = None) -> LoadedMunkeyRun:
    """Open a MUNKEY run and finish its interrupted deletion, if any (what service.MunkeyRun does)."""
    from munkey_core.run.loaded import LoadedMunkeyRun

    run = LoadedMunkeyRun(path, device=device, audit_url=audit_url)
    recover_on_open(run)
    return run


def recover_on_open(run: LoadedMunkeyRun) -> None:
    """Finish an interrupted deletion of a run just opened (journal.json, or legacy ids in forgotten.json
    still in the bank): checked under the shared run lock, finished under the exclusive one."""
    with run.runlock.hold(exclusive=False):
        run.reload_if_changed()
        busy = needs_recovery(run)
    if not busy:
        return
    with run.runlock.hold(exclusive=True):
        run.reload()
        try:
            recover(run)
        except OSError as exc:
            raise MunkeyError(f"An interrupted deletion in {run.paths.root} could not be finished "
                              f"({exc.strerror or exc}). Free disk space or make the run directory writable, then "
                              "open the run again: it is finished then.") from None


def _stray_temp_files(root: Path) -> list[Path]:
    """Temporary files left by an atomic write that was killed before its rename."""
    return [p for d in (root, RunPaths(root).checkpoints, root / receipts.RECEIPTS_DIR) if d.is_dir()
            for p in d.glob(".*.tmp")]


# --------------------------------------------------------------------------- derived runs


def start_derived_log(parent: str | Path, child: str | Path, *, method: str, operator: str | None = None,
                      url: str | None = None) -> str | None:
    """Begin the audit log of a run derived from `parent` (a class edit saved as a new run) with a
    lineage entry: the parent's run id and log head (seq, hash), and every id the child inherits as
    deleted. The child's log then accounts for its forgotten.json and verifies; the parent's log
    (and its receipts) stay where they are. The parent must verify first. Returns the entry's request
    id, or None when there is nothing to inherit (no log, no deletion)."""
    parent, child = Path(parent), Path(child)
    v = verify_run(parent, url)
    if not v.ok:
        raise MunkeyError(f"The run {parent} does not verify ({v.message}); a run derived from it would inherit an "
                          f"unaccounted audit trail. Run 'munkey audit verify {parent}' first. Nothing was saved.")
    inherited = sorted(int(i) for i in read_forgotten(RunPaths(child))["ids"])
    plog = open_log(parent, url)
    if plog is None and not inherited:
        return None
    head, parent_run_id, location = None, None, None
    if plog is not None:
        with plog:
            h = plog.head()
            head = None if h is None else {"seq": h.seq, "hash": h.entry_hash}
            parent_run_id, location = plog.run_id, plog.location.split(":", 1)[0]
    with RunLock(child).hold(exclusive=True):
        log = open_log(child, url, create=True)
        with log:
            body = plain({
                "kind": LINEAGE_KIND, "request_id": new_request_id(), "run_id": log.run_id,
                "dataset": _dataset_name(child), "operator": check_operator(operator), "received": now_utc(),
                "method": method, "parent": {"run_id": parent_run_id, "log_head": head, "log_backend": location,
                                             "folder": parent.resolve().name},
                "inherited_deleted_ids": inherited, "software": f"munkey-core {__version__}",
                "signer": log.signer_key(),
            })
            return log.append(body).request_id
