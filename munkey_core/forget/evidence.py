"""What a deletion receipt proves, computed on the live run: fingerprints and post-deletion checks.

- the model's fingerprint is `LoadedRun.model_fingerprint` (run/loaded.py).
- `sample_fingerprints`: per deleted sample, sha256 of its memory-bank row (the key's then the
  exemplar's float32 bytes) and of its image ("<dtype>|<shape>|" then its bytes, as the dataset holds
  it). Only these hashes are recorded, never the vectors.
- `retrieval_evidence`: the deleted ids cannot be retrieved any more: the bank is searched with
  their own keys and with a probe set (the test split's keys, at most `PROBE_CAP`), top-k with k
  well above the K used at inference; and none of them is in the bank in memory, in the bank file
  or in any checkpoint. Cost: two bank searches and reading the id column of each saved file.
(FA and the membership attack on a request's samples are eval/evaluate.py `request_accuracy_and_mia`.)
Tests: tests/audit/test_audit.py, tests/run/test_purge.py, tests/run/test_bankonly.py (the fingerprints
recomputed from the run).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

from typing import TYPE_CHECKING

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.run.rows import bank_ids, checkpoint_ids_present

if TYPE_CHECKING:  # the run interface (run/loaded.py); a run opened without its model (run/bankonly.py) also does
    from munkey_core.run.loaded import LoadedMunkeyRun

PROBE_CAP = 2000
ORACLE_NOTE = ("No retrained oracle (the same model trained without the deleted samples) exists for this run, so "
               "the gaps to it cannot be computed; they are recorded as null.")


def _rows(table, rows: np.ndarray) -> np.ndarray:
    """Rows of a bank field, a torch tensor (the bank in memory) or a numpy array, as a numpy copy."""
    part = table[rows]
    return part.detach().cpu().numpy() if hasattr(part, "detach") else np.array(part)


def sample_fingerprints(run: LoadedMunkeyRun, ids: Sequence[int]) -> tuple[list[dict], str | None]:
    """[{id, memory_sha256, image_sha256}] for ids still in the bank, plus a note when the dataset
    (and so the image hashes) is unavailable."""
    rows = run.bank.rows_of(ids)
    keys = _rows(run.bank.keys, rows) if len(rows) else np.zeros((0, 1), np.float32)
    values = _rows(run.bank.values, rows) if len(rows) else np.zeros((0, 1), np.float32)
    note = None
    try:
        images = run.dataset.lookup([int(i) for i in ids]).images if len(ids) else None
    except MunkeyError as exc:
        images, note = None, f"image fingerprints unavailable: {exc}"
    # one contiguous copy of each table, hashed row by row without further copies
    k = np.ascontiguousarray(keys, dtype=np.float32)  # (m, Dk)
    v = np.ascontiguousarray(values, dtype=np.float32)  # (m, Dv)
    imgs = None if images is None else np.ascontiguousarray(images)  # (m, H, W, C)
    prefix = None if imgs is None else f"{imgs.dtype.str}|{imgs.shape[1:]}|".encode()
    out = []
    for j, i in enumerate(ids):
        h = hashlib.sha256(k[j])
        h.update(v[j])
        out.append({"id": int(i), "memory_sha256": h.hexdigest(),
                    "image_sha256": None if imgs is None else hashlib.sha256(prefix + imgs[j].tobytes()).hexdigest()})
    return out, note


def own_keys(run: LoadedMunkeyRun, ids: Sequence[int]) -> np.ndarray | None:
    """The deleted samples' keys (N, Dk), from the bank while they are in it, else from the key cache;
    None when neither has them (dataset unavailable)."""
    ids = [int(i) for i in ids]
    if all(i in run.bank for i in ids):
        return _rows(run.bank.keys, run.bank.rows_of(ids))
    try:
        train = run.dataset.train
        keys = run.split_keys("train")
    except MunkeyError:
        return None
    pos = {int(x): p for p, x in enumerate(train.ids)}
    if not all(i in pos for i in ids):
        return None
    return keys[[pos[i] for i in ids]]


def _search_hits(run: LoadedMunkeyRun, queries: np.ndarray, ids: set[int], k: int) -> list[int]:
    if len(run.bank) == 0 or len(queries) == 0:
        return []
    found = np.asarray(run.search(queries, k).ids)  # (Q, k) ids
    wanted = np.fromiter(ids, dtype=np.int64, count=len(ids))
    return sorted(set(found[np.isin(found, wanted)].tolist()))  # (np.unique would import numpy.ma: ~10 ms)


def saved_copies(run: LoadedMunkeyRun, ids: Sequence[int]) -> tuple[list[int], dict[str, list[int]], int]:
    """Which of `ids` the bank file still holds, which each checkpoint file still holds rows for, and
    how many checkpoints were checked."""
    wanted = np.asarray(sorted(set(int(i) for i in ids)), dtype=np.int64)
    with run.runlock.hold(exclusive=False):  # the files change in place during a deletion: read between two
        in_bank = [int(i) for i in wanted[np.isin(wanted, bank_ids(run.paths.root))]]
        in_ckpts, n_ckpts = checkpoint_ids_present(run.paths.checkpoints, wanted)
    return in_bank, in_ckpts, n_ckpts


def retrieval_evidence(run: LoadedMunkeyRun, ids: Sequence[int], keys: np.ndarray | None) -> dict:
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
