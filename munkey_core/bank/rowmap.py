"""What the bank in memory and the bank on disk share, in numpy alone: the id -> row lookup, the
result of a deletion, and the bank's fingerprint.

Kept apart from bank/memory.py (torch tensors) so that the file side (bank/store.py, run/rows.py)
and a deletion that needs no model (run/bankonly.py) import no torch.
Tests: tests/bank/test_memory.py, tests/run/test_bankonly.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from munkey_core.errors import MunkeyError


@dataclass
class DeleteResult:
    """What a deletion did: ids removed now, and ids that were not in the bank."""

    deleted: list[int] = field(default_factory=list)
    absent: list[int] = field(default_factory=list)


def rows_in(row_of_id: dict[int, int], ids: Iterable[int]) -> np.ndarray:
    """Row positions of `ids` in a bank's id -> row map; a clear error names the first absent id."""
    try:
        return np.array([row_of_id[int(i)] for i in ids], dtype=np.int64)
    except KeyError as exc:
        raise MunkeyError(f"Sample id {exc.args[0]} is not in the memory bank.") from None


def bank_fingerprint(ids: np.ndarray, labels: np.ndarray, keys: np.ndarray, values: np.ndarray) -> str:
    """sha256 over ids, labels, keys and exemplars (float32) in id order: equal banks give equal hashes,
    whatever their row order. ids, labels (N,) int64; keys (N, Dk), values (N, Dv)."""
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    h = hashlib.sha256()
    # each gathered table is a new C-contiguous array: hashed as it is (no second copy by tobytes)
    h.update(ids[order])
    h.update(np.asarray(labels, dtype=np.int64)[order])
    h.update(np.asarray(keys, dtype=np.float32)[order])
    h.update(np.asarray(values, dtype=np.float32)[order])
    return h.hexdigest()
