"""What a deletion receipt proves, computed on the live run: fingerprints and post-deletion checks.

- `model_fingerprint`: sha256 over the weights (names, dtypes, shapes, bytes; sorted by name).
- `sample_fingerprints`: per deleted sample, sha256 of its memory-bank row (key + exemplar) and of
  its image (as the dataset holds it). Only these hashes are recorded, never the vectors.
- `retrieval_evidence`: the deleted ids cannot be retrieved any more: the bank is searched with
  their own keys and with a probe set (the test split's keys, at most `PROBE_CAP`), top-k with k
  well above the K used at inference; and none of them is in the bank in memory, in the bank file
  or in any checkpoint. Cost: two bank searches and reading the id column of each saved file.
- `request_accuracy_and_mia`: FA on this request's samples and the cheap membership attack (forget
  vs test, metrics.mia_auc, with its TPR at 1% / 0.1% FPR), next to the accuracy on *unseen test
  samples of the same classes* (weighted to the request's class mix, not TA overall) and what that
  comparison does and does not show (`SAME_CLASS_NOTE`). Cost: forwards over the request and over
  <= max_samples test images.
Tests: tests/test_audit.py, tests/test_purge.py.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from munkey_core.errors import MunkeyError
from munkey_core.eval.metrics import MIA_CHEAP, accuracy, class_weights, cross_entropy, mia_auc, mia_tprs
from munkey_core.run.rows import bank_ids, checkpoint_ids_present

if TYPE_CHECKING:
    from munkey_core.service import MunkeyRun

PROBE_CAP = 2000
SAME_CLASS_NOTE = (
    "The deleted samples are compared with unseen test samples of the same classes (weighted to the deleted "
    "samples' class mix). A difference within about two standard errors, and a membership-attack AUC near 50, say "
    "the model now treats the deleted samples, on average, like samples it never saw. This is a population "
    "comparison: it does not show that no single deleted sample is still recognised (a per-example attack, "
    "'munkey bench ulira', measures that), nor that the model matches one retrained without them (only a "
    "retrained oracle shows that, next to its noise floor: 'munkey evaluate RUN --oracle --noise-floor 2').")
ORACLE_NOTE = ("No retrained oracle (the same model trained without the deleted samples) exists for this run, so "
               "the gaps to it cannot be computed; they are recorded as null.")


def model_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over the state dict: equal weights give equal fingerprints, whatever file holds them."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        arr = t.detach().cpu().contiguous().numpy()
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _row_hash(key: np.ndarray, value: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(key, dtype=np.float32).tobytes())
    h.update(np.ascontiguousarray(value, dtype=np.float32).tobytes())
    return h.hexdigest()


def _image_hash(image: np.ndarray) -> str:
    img = np.ascontiguousarray(image)
    return hashlib.sha256(f"{img.dtype.str}|{img.shape}|".encode() + img.tobytes()).hexdigest()


def sample_fingerprints(run: "MunkeyRun", ids: Sequence[int]) -> tuple[list[dict], str | None]:
    """[{id, memory_sha256, image_sha256}] for ids still in the bank, plus a note when the dataset
    (and so the image hashes) is unavailable."""
    rows = run.bank.rows_of(ids)
    keys = run.bank.keys[torch.as_tensor(rows)].cpu().numpy() if len(rows) else np.zeros((0, 1), np.float32)
    values = run.bank.values[torch.as_tensor(rows)].cpu().numpy() if len(rows) else np.zeros((0, 1), np.float32)
    note = None
    try:
        images = run.dataset.lookup([int(i) for i in ids]).images if len(ids) else None
    except MunkeyError as exc:
        images, note = None, f"image fingerprints unavailable: {exc}"
    out = []
    for j, i in enumerate(ids):
        out.append({"id": int(i), "memory_sha256": _row_hash(keys[j], values[j]),
                    "image_sha256": None if images is None else _image_hash(images[j])})
    return out, note


def own_keys(run: "MunkeyRun", ids: Sequence[int]) -> np.ndarray | None:
    """The deleted samples' keys (N, Dk), from the bank while they are in it, else from the key cache;
    None when neither has them (dataset unavailable)."""
    ids = [int(i) for i in ids]
    if all(i in run.bank for i in ids):
        return run.bank.keys[torch.as_tensor(run.bank.rows_of(ids))].cpu().numpy().copy()
    try:
        train = run.dataset.train
        keys = run.split_keys("train")
    except MunkeyError:
        return None
    pos = {int(x): p for p, x in enumerate(train.ids)}
    if not all(i in pos for i in ids):
        return None
    return keys[[pos[i] for i in ids]]


def _search_hits(run: "MunkeyRun", queries: np.ndarray, ids: set[int], k: int) -> list[int]:
    if len(run.bank) == 0 or len(queries) == 0:
        return []
    with run.lock:
        _, rows = run.bank.search(queries, k)
        found = set(int(x) for x in run.bank.ids[rows.cpu().numpy()].ravel())
    return sorted(found & ids)


def saved_copies(run: "MunkeyRun", ids: Sequence[int]) -> tuple[list[int], dict[str, list[int]], int]:
    """Which of `ids` the bank file still holds, which each checkpoint file still holds rows for, and
    how many checkpoints were checked."""
    wanted = np.asarray(sorted(set(int(i) for i in ids)), dtype=np.int64)
    in_bank = [int(i) for i in wanted[np.isin(wanted, bank_ids(run.paths.root))]]
    in_ckpts, n_ckpts = checkpoint_ids_present(run.paths.checkpoints, wanted)
    return in_bank, in_ckpts, n_ckpts


def retrieval_evidence(run: "MunkeyRun", ids: Sequence[int], keys: np.ndarray | None) -> dict:
    """Checks that none of `ids` can be retrieved or is stored any more (see module docstring)."""
    ids = [int(i) for i in dict.fromkeys(ids)]
    wanted = set(ids)
    k = max(1, min(len(run.bank), max(10, 4 * int(run.train_cfg.k))))
    out: dict = {"ids_checked": len(ids), "k": k}
    if keys is not None:
        out["own_key_search"] = {"queries": int(len(keys)), "retrieved": _search_hits(run, keys, wanted, k)}
    else:
        out["own_key_search"] = {"queries": 0, "retrieved": [], "note": "the deleted samples' keys are unavailable "
                                 "(dataset missing); only the stored-copies checks below apply"}
    try:
        probe = run.split_keys("test")
        probe = probe[np.random.default_rng(0).permutation(len(probe))[:PROBE_CAP]]
        out["probe_search"] = {"set": "test split", "queries": int(len(probe)),
                               "retrieved": _search_hits(run, probe, wanted, k)}
    except MunkeyError as exc:
        out["probe_search"] = {"set": None, "queries": 0, "retrieved": [], "note": f"no probe set: {exc}"}
    in_bank_file, in_ckpts, n_ckpts = saved_copies(run, ids)
    out["in_memory_bank"] = sorted(i for i in ids if i in run.bank)
    out["in_bank_file"] = in_bank_file
    out["in_checkpoints"] = in_ckpts
    out["checkpoints_checked"] = n_ckpts
    out["passed"] = not (out["own_key_search"]["retrieved"] or out["probe_search"]["retrieved"]
                         or out["in_memory_bank"] or out["in_bank_file"] or out["in_checkpoints"])
    return out


def request_accuracy_and_mia(run: "MunkeyRun", ids: Sequence[int], max_samples: int = 2000) -> dict:
    """FA (percent) on `ids` with the current bank, and the cheap MIA AUC (percent) of those samples
    against the test split (null when undefined)."""
    ds = run.dataset
    ids_arr = np.asarray([int(i) for i in ids], dtype=np.int64)
    idx = np.flatnonzero(np.isin(ds.train.ids, ids_arr))
    test_idx = np.arange(len(ds.test))
    if max_samples and len(test_idx) > max_samples:
        test_idx = np.sort(np.random.default_rng(0).choice(test_idx, size=max_samples, replace=False))
    if len(idx) == 0:
        return {"FA": None, "MIA": None, "MIA_attack": MIA_CHEAP, "n": 0, "n_test": int(len(test_idx))}
    train_keys = run.split_keys("train")
    fy = ds.train.labels[idx]
    fgt = run.predict_prepared(ds.train.images[idx], train_keys[idx], neighbour_predictions=False)
    test = run.predict_prepared(ds.test.images[test_idx], run.split_keys("test")[test_idx],
                                neighbour_predictions=False)
    ty = ds.test.labels[test_idx]
    f_loss, t_loss = cross_entropy(fgt.probs, fy), cross_entropy(test.probs, ty)
    return {"FA": accuracy(fgt.labels, fy), "MIA": mia_auc(f_loss, fy, t_loss, ty),
            **mia_tprs(-f_loss, fy, -t_loss, ty), "MIA_attack": MIA_CHEAP, "n": int(len(idx)),
            "n_test": int(len(test_idx)), **same_class_comparison(fgt.labels == fy, fy, test.labels == ty, ty)}


def same_class_comparison(forget_correct: np.ndarray, forget_labels: np.ndarray, test_correct: np.ndarray,
                          test_labels: np.ndarray) -> dict:
    """FA next to the accuracy on unseen test samples of the same classes, reweighted to the forget
    samples' class mix (percent), their difference and its standard error (binomial, both sides)."""
    keep, w = class_weights(forget_labels, test_labels)  # w sums to 1 over the test samples of shared classes
    if not keep.any():
        return {"TA_same_classes": None, "FA_minus_TA_same_classes": None, "difference_se": None,
                "same_class_note": SAME_CLASS_NOTE}
    fa = float(np.mean(forget_correct[keep]))
    ta = float(np.sum(w * test_correct))
    var_f = fa * (1 - fa) / keep.sum()
    var_t = sum(w[test_labels == c].sum() ** 2 * _binom_var(test_correct[test_labels == c])
                for c in np.unique(forget_labels[keep]))
    return {"TA_same_classes": 100.0 * ta, "FA_minus_TA_same_classes": 100.0 * (fa - ta),
            "difference_se": 100.0 * float(np.sqrt(var_f + var_t)), "same_class_note": SAME_CLASS_NOTE}


def _binom_var(correct: np.ndarray) -> float:
    """Variance of the mean of 0/1 outcomes."""
    p = float(np.mean(correct))
    return p * (1 - p) / len(correct)
