"""What the dashboard shows, as plain functions of a `MunkeyRun` (no Streamlit here, by rule).

The pages in `pages/` only lay things out; every number, image and decision they show comes from
this module or from `service.MunkeyRun`:

- evidence: `predict_test_sample`, `evidence_rows`, `training_images`, `display_image`
- the first start (no run yet): `TrainingJob`, `training_data`, `class_counts`, from firststart.py
  (re-exported here)
- selection for deletion: `ids_from_bytes`, `similar_training_samples`, `classify_ids`
- deletion with before/after metrics: `delete_and_measure` (its retrieval check is the receipt's,
  forget/evidence.py), `metrics_table`
- charts: `deletion_requests`, `latest_metrics` (the audit log's views are in auditviews.py)
- the operator check: `check_credential`

Costs: everything here is a few forwards or one bank search, except `delete_and_measure`, which
runs `MunkeyRun.evaluate` once or twice (each <= max_samples images per set, K forwards each).
Tests: tests/dashboard/test_views.py.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.eval.verdicts import class_matched_accuracy, class_matched_n, forgetting_verdicts
from munkey_core.eval.verdicts import overall as overall_verdict
from munkey_core.dashboard.jobs import ProgressJob
from munkey_core.model.predict import Predictions
from munkey_core.service import MunkeyRun, Progress

if TYPE_CHECKING:
    from munkey_core.data.duplicates import NearDuplicateIndex
from munkey_core.forget.ids import ids_from_bytes  # noqa: F401  (re-exported for the pages)
from munkey_core.dashboard.firststart import TrainingJob, class_counts, training_data  # noqa: F401  (re-exported)
from munkey_core.data.images import display_image  # noqa: F401  (re-exported for the pages)

METRIC_NAMES = ("TA", "RA", "FA", "MIA", "Ps")


# --------------------------------------------------------------------------- images


def training_images(run: MunkeyRun, ids: Sequence[int]) -> np.ndarray:
    """Images (N, H, W, C) uint8 of training samples by id, in the order asked (deleted ones too:
    the dataset still holds them; only the model's memory forgets). Unknown ids: MunkeyError."""
    if len(ids) == 0:
        shape = tuple(run.config["image_shape"])
        return np.zeros((0, *shape, run.config["channels"]), np.uint8)
    return run.dataset.lookup([int(i) for i in ids]).images


# --------------------------------------------------------------------------- evidence


@dataclass(frozen=True)
class SamplePrediction:
    """A prediction for one test-set sample, with its image and true label."""

    predictions: Predictions
    image: np.ndarray  # (H, W, C) uint8
    label: int
    id: int


def predict_test_sample(run: MunkeyRun, index: int, *, k: int | None = None,
                        mode: str = "ensemble") -> SamplePrediction:
    """Predict the test sample at position `index` (0-based) with the current bank."""
    test = run.dataset.test
    if not 0 <= int(index) < len(test):
        raise MunkeyError(f"Test sample index {index} is out of range; choose 0 to {len(test) - 1}.")
    i = int(index)
    keys = run.split_keys("test")[i:i + 1]
    preds = run.predict_prepared(test.images[i:i + 1], keys, k=k, mode=mode)
    return SamplePrediction(preds, test.images[i], int(test.labels[i]), int(test.ids[i]))


def evidence_rows(run: MunkeyRun, preds: Predictions, i: int = 0) -> list[dict]:
    """One row per retrieved training case of prediction i, most similar first: id, label, similarity,
    weight, the neighbour's own vote, and whether that vote agrees with the prediction."""
    names = run.class_names
    predicted = int(preds.labels[i])
    rows = []
    for rank, n in enumerate(preds.neighbours(i), start=1):
        rows.append({
            "rank": rank, "id": n.id, "label": n.label, "label_name": names[n.label],
            "similarity": n.similarity, "weight": n.weight,
            "votes_for": n.predicted, "votes_for_name": None if n.predicted is None else names[n.predicted],
            "supports_prediction": n.predicted == predicted if n.predicted is not None else n.label == predicted,
        })
    return rows


# --------------------------------------------------------------------------- selecting samples


def similar_training_samples(run: MunkeyRun, images: Sequence[np.ndarray], n: int = 10,
                             copies: "NearDuplicateIndex | None" = None) -> list[dict]:
    """The `n` training samples still in the bank most similar to any of `images` ("find this
    person's images"). With `copies` (trust.copy_index), a training image an upload is a copy of
    (resized, re-encoded, lightly cropped) comes first, whatever its key similarity.

    Each row: id, label, label_name, similarity (key cosine, best over the queries), query (index of
    the best-matching image), copy (True for an exact/near-duplicate copy), copy_score (pixel
    similarity of a copy, else None). Cost: one encoder pass, one bank search, one copy search per image.
    """
    if n < 1:
        raise MunkeyError(f"The number of similar samples must be at least 1 (got {n}).")
    batch = run.prepare_images(images)
    keys = run.encoder.encode(batch)
    hits = run.search(keys, n)
    sims, ids, labels = hits.similarities.cpu().numpy(), hits.ids, hits.labels
    best: dict[int, dict] = {}
    for q in range(len(ids)):
        for j in range(ids.shape[1]):
            sid, s = int(ids[q, j]), float(sims[q, j])
            if sid not in best or s > best[sid]["similarity"]:
                best[sid] = {"id": sid, "label": int(labels[q, j]), "similarity": s, "query": q,
                             "copy": False, "copy_score": None}
    if copies is not None:
        from munkey_core.dashboard.trust import find_copies

        for q, found in enumerate(find_copies(run, copies, list(images), top=1)):
            if not (found["found"] and found["in_bank"]):
                continue
            sid = int(found["id"])
            with run.lock:
                row = int(run.bank.rows_of([sid])[0])
                key_sim = float(run.bank.keys[row].cpu().numpy() @ keys[q])
                label = int(run.bank.labels[row])
            prev = best.get(sid)
            if prev is None or not prev["copy"] or found["score"] > prev["copy_score"]:
                best[sid] = {"id": sid, "label": label, "similarity": max(key_sim, prev["similarity"] if prev else -1.0),
                             "query": q, "copy": True, "copy_score": float(found["score"])}
    names = run.class_names
    out = sorted(best.values(), key=lambda r: (not r["copy"], -(r["copy_score"] or 0.0), -r["similarity"], r["id"]))[:n]
    for r in out:
        r["label_name"] = names[r["label"]]
    return out


def classify_ids(run: MunkeyRun, ids: Sequence[int]) -> dict:
    """Split requested ids into those in the bank, those deleted earlier, and unknown ones (an unknown
    id makes `forget` refuse the whole request). `other_split` names the split of each unknown id that
    is a validation or test sample (not a training sample, so nothing to delete)."""
    done = set(run.forgotten_ids)
    out: dict = {"in_bank": [], "already_deleted": [], "unknown": [], "other_split": {}}
    for i in dict.fromkeys(int(x) for x in ids):
        out["already_deleted" if i in done else "in_bank" if i in run.bank else "unknown"].append(i)
    if out["unknown"]:
        ds = run.dataset
        for split in ("val", "test", "train"):
            try:
                sids = ds.split(split).ids
            except MunkeyError:
                continue
            hit = np.asarray(out["unknown"], np.int64)[np.isin(out["unknown"], sids)]
            for i in hit:
                out["other_split"].setdefault(int(i), split)
    return out


def unknown_ids_message(groups: dict, limit: int = 10) -> str:
    """Plain words for the unknown ids of `classify_ids`: which are test/validation samples, which are
    no sample of this run at all ("train" means a training sample the bank does not hold any more)."""
    unknown = groups["unknown"]
    where = groups.get("other_split", {})
    named = {"val": "the validation split", "test": "the test split",
             "train": "the training split, but not in the memory bank (removed outside a deletion request)"}
    parts = []
    for split in ("test", "val", "train"):
        ids = [i for i in unknown if where.get(i) == split]
        if ids:
            shown = ", ".join(map(str, ids[:limit])) + (" ..." if len(ids) > limit else "")
            parts.append(f"{shown} {'is' if len(ids) == 1 else 'are'} in {named[split]}")
    rest = [i for i in unknown if i not in where]
    if rest:
        shown = ", ".join(map(str, rest[:limit])) + (" ..." if len(rest) > limit else "")
        parts.append(f"{shown} {'is' if len(rest) == 1 else 'are'} not a sample of this run's dataset")
    return (f"{len(unknown)} id(s) cannot be deleted: " + "; ".join(parts) + ". Only training samples are in the "
            "model's memory. A request with such ids is refused as a whole; drop them to continue.")


# --------------------------------------------------------------------------- deletion


def check_credential(given: str | None, expected: str | None) -> bool:
    """True when an operator credential is configured and `given` equals it (constant-time)."""
    if not expected or not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class CredentialGate:
    """The operator check with failed attempts logged and slowed: each distinct wrong credential is
    logged (logger "munkey.auth", never the value itself) and answered only after a delay that doubles
    with every failure in the last `window` seconds (from `base_delay`, at most `max_delay`); after
    `lockout` failures in the window every attempt is refused without comparing, until it passes.
    One gate per process (the dashboard's `credential_gate`), so every session counts towards it."""

    def __init__(self, *, base_delay: float = 0.5, max_delay: float = 8.0, lockout: int = 20,
                 window: float = 900.0, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_delay, self.max_delay, self.lockout, self.window = base_delay, max_delay, lockout, window
        self._sleep, self._clock = sleep, clock
        self._failures: list[float] = []
        self._seen: dict[str, bool] = {}  # keyed digest of a recently checked value -> its outcome
        self._salt = secrets.token_bytes(16)
        self._mutex = threading.Lock()
        self.log = logging.getLogger("munkey.auth")

    def recent_failures(self) -> int:
        now = self._clock()
        with self._mutex:
            self._failures = [t for t in self._failures if now - t < self.window]
            return len(self._failures)

    def check(self, given: str | None, expected: str | None, *, who: str = "dashboard") -> bool:
        """True when `given` is the configured credential. A value already judged is answered as before
        (a page re-runs on every click); a new wrong one is logged, counted and slowed."""
        if not expected or not given:
            return False
        digest = hmac.new(self._salt, given.encode("utf-8"), hashlib.sha256).hexdigest()
        if digest in self._seen:  # judged already (a rerun of the page): no new attempt, no new delay
            return check_credential(given, expected)
        failures = self.recent_failures()
        if failures >= self.lockout:
            self.log.warning("operator credential refused without checking (%s): %d failed attempts in the last "
                             "%d s", who, failures, int(self.window))
            return False
        ok = check_credential(given, expected)
        if ok:
            self._seen[digest] = True
            return True
        with self._mutex:
            self._failures.append(self._clock())
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[digest] = False
        self.log.warning("failed operator credential attempt (%s); %d in the last %d s", who, failures + 1,
                         int(self.window))
        self._sleep(min(self.max_delay, self.base_delay * 2 ** failures))
        return False


credential_gate = CredentialGate()  # the dashboard's, shared by every session of the process


def latest_metrics(run: MunkeyRun, *, current_only: bool = False) -> dict | None:
    """The newest metrics.json entry; with `current_only`, only if it was measured on the bank as it
    is now (same bank size and deleted count), else None."""
    hist = run.metrics_history
    if not hist:
        return None
    last = hist[-1]
    if current_only and (last.get("bank_size") != len(run.bank) or last.get("deleted") != len(run.forgotten_ids)):
        return None
    return last


def delete_and_measure(run: MunkeyRun, ids: Sequence[int], *, operator: str, subject: str | None = None,
                       max_samples: int = 2000, progress: Progress | None = None) -> dict:
    """Delete `ids` as one audited request (MunkeyRun.forget with evaluation) and summarise it for the
    page, from its audit-log entry; the receipt files are named in `receipt_json` / `receipt_html`.

    Before: TA, RA, Ps from the newest metrics entry if it describes the current bank, else measured
    now; FA = accuracy on this request's samples while still in the bank; MIA is undefined before.
    After: a fresh evaluation, whose FA and MIA cover every sample deleted so far, plus FA on this
    request's samples alone. Unknown ids refuse the whole request (MunkeyError, nothing changes, the
    refusal is logged); an empty operator name is refused before anything happens.
    """
    if not str(operator or "").strip():
        raise MunkeyError("Enter the operator's name: every deletion is recorded with who filed it. Nothing was "
                          "deleted.")
    requested = [int(i) for i in dict.fromkeys(int(x) for x in ids)]
    res = run.forget(requested, operator=operator, subject=subject, evaluate=True, max_samples=max_samples,
                     source="dashboard", progress=progress)
    body = res.entry
    met, ev = body["metrics"], body["evidence"]
    before = {**(met["before"] or {}), "FA": ev.get("request_FA_before"), "MIA": None}
    after = met["after"] or {}
    retrieved = sorted(set(ev["own_key_search"]["retrieved"]) | set(ev["probe_search"]["retrieved"]))
    return {
        "kind": "MUNKEY deletion summary (the tamper-evident record is the receipt: receipt_json)",
        "time": body["executed"], "run": str(Path(run.paths.root).resolve()), "dataset": run.config["dataset"],
        "operator": body["operator"], "subject_ref": body["subject_ref"], "requested_ids": requested,
        "deleted": res.deleted, "already_deleted": res.already_deleted,
        "bank_size_before": body["bank"]["before"]["size"], "bank_size_after": res.bank_size,
        "delete_seconds": res.seconds, "before_source": met["before_source"],
        "metrics_before": _metric_subset(before), "metrics_after": _metric_subset(after),
        "FA_this_request_after": ev.get("request_FA_after"), "MIA_this_request": ev.get("request_MIA"),
        "n_forget_after": after.get("n_forget"), "MIA_attack": after.get("MIA_attack") or ev.get("MIA_attack"),
        "retrieval_check": {"ok": bool(ev["passed"]), "ids_checked": ev["ids_checked"], "k": ev["k"],
                            "probe_queries": ev["probe_search"]["queries"], "retrieved": retrieved,
                            "in_memory_bank": ev["in_memory_bank"], "in_bank_file": ev["in_bank_file"],
                            "in_checkpoints": ev["in_checkpoints"]},
        "oracle_note": ev.get("oracle_note"),
        # the deleted samples vs unseen test samples of their own classes, and what that does not show
        "same_class": {k: ev.get(k) for k in ("TA_same_classes", "FA_minus_TA_same_classes", "difference_se",
                                              "difference_interval", "TPR@1%", "TPR@0.1%", "same_class_note")},
        "assessment": forgetting_assessment(run, after, run.forgotten_ids, max_samples=max_samples) if after else None,
        "request_id": res.request_id, "log_entry": res.entry_seq,
        "entry_hash": res.entry_hash, "receipt_json": res.receipt, "receipt_html": res.receipt_html,
    }


def unseen_class_target(run: MunkeyRun, forget_ids: Sequence[int], *,
                        max_samples: int = 2000) -> tuple[float | None, float | None]:
    """FA's target: accuracy (percent) on unseen test samples of the deleted samples' classes (per class,
    weighted by the deleted samples' class counts), with the current bank, and how many samples it is
    worth (`class_matched_n`). One pass over <= max_samples test images."""
    if len(forget_ids) == 0:
        return None, None
    ds = run.dataset
    idx = np.arange(len(ds.test))
    if max_samples and len(idx) > max_samples:
        idx = np.sort(np.random.default_rng(0).choice(idx, size=max_samples, replace=False))
    pred = run.predict_rows("test", idx).argmax(axis=1)  # cached per bank state: usually no forward
    labels = ds.test.labels[idx]
    forget_labels = ds.lookup([int(i) for i in forget_ids]).labels
    return class_matched_accuracy(labels, pred == labels, forget_labels), class_matched_n(labels, forget_labels)


def forgetting_assessment(run: MunkeyRun, after: dict, forget_ids: Sequence[int], *,
                          max_samples: int = 2000) -> dict:
    """Verdicts (eval/verdicts.py) for an evaluation's FA and MIA over the deleted samples `forget_ids`:
    FA against the unseen-sample accuracy of the same classes, MIA against 50. {"verdicts", "overall"}."""
    target, target_n = (unseen_class_target(run, forget_ids, max_samples=max_samples) if after.get("FA") is not None
                        else (None, None))
    vs = forgetting_verdicts(after, fa_target=target, fa_target_n=target_n,
                             fa_target_label="(accuracy on unseen test samples of the same classes)")
    return {"verdicts": vs, "overall": overall_verdict(vs)}


def _metric_subset(m: dict) -> dict:
    keep = (*METRIC_NAMES, "n_test", "n_retain", "n_forget", "bank_size", "deleted", "time")
    return {k: m.get(k) for k in keep if k in m}


def metrics_table(before: dict, after: dict) -> list[dict]:
    """Rows metric / before / after / change for TA, RA, FA, MIA, Ps (None where undefined)."""
    rows = []
    for name in METRIC_NAMES:
        b, a = before.get(name), after.get(name)
        rows.append({"metric": name, "before": b, "after": a,
                     "change": None if a is None or b is None else a - b})
    return rows


def oracle_check(run: MunkeyRun, *, max_samples: int = 2000) -> dict | None:
    """The run against the M-oracle already trained for its current deletions (and the noise-floor oracles
    of other seeds that exist): a table of rows (model, TA, RA, FA, MIA), the Avg Gap, the floor and the
    verdict in words (eval/floors.py `gap_verdict`). Trains nothing; None when no such oracle exists
    (`munkey evaluate RUN --oracle --noise-floor 2` trains them)."""
    from munkey_core.eval.floors import gap_verdict
    from munkey_core.eval.oracles import stored_oracle_comparison

    r = stored_oracle_comparison(run, max_samples=max_samples)
    if r is None:
        return None
    floor_models = r["noise_floor"]["oracles"]
    models = [("this model, after the deletions", r["run"], r["AvgGap"]), ("retrained without them (M-oracle)", r["oracle"], 0.0)]
    models += [(f"retrained, training seed {f['train_seed']} (noise floor)", f["metrics"], f["AvgGap"]) for f in floor_models]
    c = r["control"]  # the positive control: the deleted samples read like the samples this model still holds
    models.append(("this model, had they read like the samples it still holds (positive control)",
                   {**r["run"], "FA": c["FA"], "MIA": c["MIA"]}, c["AvgGap"]))
    rows = [{"model": name, **{k: m.get(k) for k in ("TA", "RA", "FA", "MIA")}, "Avg Gap to the M-oracle": gap}
            for name, m, gap in models]
    return {"rows": rows, "AvgGap": r["AvgGap"], "floor": r["noise_floor"]["AvgGap"], "n_floor": len(floor_models),
            "n_forget": r["n_forget"], "forget_set": r["forget_set"], "MIA_attack": r["MIA_attack"],
            **gap_verdict(r["AvgGap"], r["noise_floor"]["AvgGap"], len(floor_models), control_gap=c["AvgGap"],
                          needs_control=True)}


# --------------------------------------------------------------------------- audit


def deletion_requests(run: MunkeyRun) -> list[dict]:
    """Every deletion request recorded in forgotten.json, oldest first: time, count, ids."""
    rows = []
    for n, req in enumerate(run.forgotten.get("requests", []), start=1):
        ids = [int(i) for i in req.get("ids", [])]
        rows.append({"request": n, "time": req.get("time"), "n_ids": len(ids), "ids": ids})
    return rows


# --------------------------------------------------------------------------- jobs


class DeletionJob(ProgressJob):
    """One audited deletion with its before/after evaluation (`delete_and_measure`), off the UI thread:
    the page polls `stage` and `fraction` while the evaluation runs and shows `summary` when done."""

    name = "munkey-deletion"
    what = "The deletion"

    def __init__(self, run: MunkeyRun, ids: Sequence[int], *, operator: str, subject: str | None = None,
                 max_samples: int = 2000) -> None:
        super().__init__()
        self.run, self.ids, self.operator, self.subject = run, [int(i) for i in ids], operator, subject
        self.max_samples = max_samples
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.summary = None

    def task(self) -> None:
        self.summary = delete_and_measure(self.run, self.ids, operator=self.operator, subject=self.subject,
                                          max_samples=self.max_samples, progress=self.progress)


class EvaluationJob(ProgressJob):
    """`run.evaluate(record=False)` off the UI thread (TA, RA, FA, MIA, Ps); `result` when done."""

    name = "munkey-evaluation"
    what = "The evaluation"

    def __init__(self, run: MunkeyRun, max_samples: int = 2000) -> None:
        super().__init__()
        self.run, self.max_samples = run, max_samples
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.result = None

    def task(self) -> None:
        self.result = self.run.evaluate(max_samples=self.max_samples, record=False, progress=self.progress)
