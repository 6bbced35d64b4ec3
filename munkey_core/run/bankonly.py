"""A MUNKEY run opened without its model: what a deletion without evaluation reads and changes.

Key deletion needs no forward pass: the request validates ids against the bank, hashes the rows and
images it deletes, purges the bank and checkpoint row files and the derived data, searches the bank
with the deleted keys and the test keys for its evidence, and records the audit entry and receipt
(forget/request.py). `BankOnlyRun` gives that protocol the part of `LoadedMunkeyRun` it uses, in
numpy alone, so `munkey forget --no-evaluate` loads no torch and no timm (the imports were ~95 %
of the command's time):
- the bank as numpy arrays (`NumpyBank`: membership, rows, fingerprint, exact cosine top-k);
- the model's fingerprint read from model.pt without torch (`weights_fingerprint`: the zip and
  pickle layout torch.save writes, restricted to plain tensors; the same sha256 as
  run/loaded.py `fingerprint` of the loaded model, tested);
- the dataset, and the keys from the key cache (keys/cache.py; a miss needs the encoder).
`open_bank_only` returns None where this path does not apply, and the caller opens the run in
full: an unfinished deletion to finish (it may need an evaluation), a format-1 run, a search
that would not be exact, a key-cache miss, a weights file this reader does not know. A request that
meets a case needing the model anyway raises `NeedsModel` before anything is committed.
Tests: tests/run/test_bankonly.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import sys
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from munkey_core.bank.rowmap import bank_fingerprint, rows_in
from munkey_core.config import SearchConfig, TrainConfig, from_dict
from munkey_core.data import datasets as data_mod
from munkey_core.errors import MunkeyError
from munkey_core.keys.cache import read_cached_keys
from munkey_core.run import rows
from munkey_core.run.lock import RunLock
from munkey_core.run.paths import RunPaths, disk_stamp, open_run, read_config, read_forgotten

_SCORE_BUDGET = 64 * 1024 * 1024  # floats in one (queries x bank) score chunk, as bank/memory.py
_STORAGES = {"FloatStorage": np.float32}  # weights this reader knows (a run's model is float32)


class NeedsModel(MunkeyError):
    """This step needs the model (or the key encoder): open the run in full instead."""


class NumpyBank:
    """The bank's rows in memory as numpy arrays: ids, labels (N,) int64, keys (N, Dk) and exemplars
    (N, Dv) float32, in the file's row order."""

    def __init__(self, ids: np.ndarray, labels: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        self.ids, self.labels = np.array(ids, dtype=np.int64), np.array(labels, dtype=np.int64)
        self.keys, self.values = np.array(keys, dtype=np.float32), np.array(values, dtype=np.float32)
        self._row = {int(i): r for r, i in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, sample_id: int) -> bool:
        return int(sample_id) in self._row

    def rows_of(self, ids: Iterable[int]) -> np.ndarray:
        return rows_in(self._row, ids)

    def fingerprint(self) -> str:
        return bank_fingerprint(self.ids, self.labels, self.keys, self.values)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact cosine top-k (keys are unit norm): (similarities (Q, k), rows (Q, k)), best first."""
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if len(self) == 0:
            raise MunkeyError("The memory bank is empty: every training sample has been deleted.")
        k = max(1, min(int(k), len(self)))
        chunk = max(1, _SCORE_BUDGET // len(self))
        sims, found = [], []
        for start in range(0, len(q), chunk):
            scores = q[start:start + chunk] @ self.keys.T  # (q, N)
            part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
            top = np.take_along_axis(part, order, 1)
            sims.append(np.take_along_axis(scores, top, 1))
            found.append(top)
        return np.concatenate(sims), np.concatenate(found)


class _Hits:
    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids  # (Q, k) sample ids


class _ConfigEncoder:
    """The run's key encoder as the key cache sees it (its description in config.json); keys that
    are not cached need the encoder itself: NeedsModel."""

    def __init__(self, config: dict) -> None:
        self._desc = dict(config["encoder"])
        self.name, self.resolution, self.dim = str(self._desc["name"]), int(self._desc["resolution"]), \
            int(self._desc["dim"])

    def describe(self) -> dict:
        return dict(self._desc)


class BankOnlyRun:
    """A MUNKEY run without its model: the files, locks and bank a deletion without evaluation uses
    (the attributes of run/loaded.py `LoadedMunkeyRun` that forget/request.py reads)."""

    def __init__(self, path: str | Path, audit_url: str | None = None) -> None:
        self.paths: RunPaths = open_run(path)
        self.config = read_config(self.paths)
        self.train_cfg: TrainConfig = from_dict(TrainConfig, self.config["train"])
        self.audit_url = audit_url
        self.lock = threading.RLock()
        self.runlock = RunLock(self.paths.root)
        self._dataset: data_mod.Dataset | None = None
        self._model_fp: str | None = None
        self._split_keys: dict[str, np.ndarray] = {}
        with self.runlock.hold(exclusive=False):
            self.reload()

    @property
    def root(self) -> Path:
        return self.paths.root

    # ----- the files a deletion changes (as LoadedMunkeyRun) ----------------------------------
    def _disk_stamp(self) -> tuple:
        return disk_stamp(self.paths)

    def reload(self) -> None:
        """(Re)read the bank and forgotten.json (opening the store finishes an interrupted row update)."""
        with rows.open_bank(self.paths.bank) as store:
            self.bank = NumpyBank(store.ids, store.labels, store.keys, store.values)
        self.forgotten = read_forgotten(self.paths)
        self._stamp = self._disk_stamp()

    def reload_if_changed(self) -> None:
        if self._disk_stamp() != self._stamp:
            self.reload()

    def forgotten_written(self, forgotten: dict) -> None:
        self.forgotten = forgotten
        self._stamp = self._disk_stamp()

    def apply_deletion(self, ids: Sequence[int]) -> None:
        """Remove ids from bank.store (durable on return), then re-read the bank: the file's
        swap-with-last order is the one MemoryBank.delete keeps in memory."""
        rows.delete_bank_rows(self.paths.bank, ids)
        with self.lock:
            self.reload()

    @property
    def forgotten_ids(self) -> list[int]:
        return [int(i) for i in self.forgotten["ids"]]

    @property
    def metrics_history(self) -> list[dict]:
        raise NeedsModel("An evaluation needs the model.")  # only an evaluated request reads it

    # ----- what the evidence and the receipt read -----------------------------------------------
    @property
    def model_fingerprint(self) -> str:
        if self._model_fp is None:
            fp = weights_fingerprint(self.paths.model)
            if fp is None:
                raise NeedsModel(f"{self.paths.model} is not a weights file this reader knows.")
            self._model_fp = fp
        return self._model_fp

    @property
    def dataset(self) -> data_mod.Dataset:
        if self._dataset is None:
            self._dataset = data_mod.load_dataset(self.config["dataset"], self.config.get("data_root"),
                                                  seed=self.train_cfg.data_seed,
                                                  max_train=self.train_cfg.max_train or None)
        return self._dataset

    def split_keys(self, split: str) -> np.ndarray:
        """(N, Dk) keys of a split, read from the key cache once per run object (the open and the
        evidence read the test keys: one read)."""
        if split not in self._split_keys:
            s = self.dataset.split(split)
            keys = read_cached_keys(_ConfigEncoder(self.config), s.images, s.ids, dataset=self.dataset.name,
                                    split=split)
            if keys is None:
                raise NeedsModel(f"The {split} keys are not in the key cache: the key encoder computes them.")
            self._split_keys[split] = keys
        return self._split_keys[split]

    def search(self, queries: np.ndarray, k: int) -> _Hits:
        with self.lock:
            _, found = self.bank.search(queries, k)
            return _Hits(self.bank.ids[found])


def open_bank_only(path: str | Path, audit_url: str | None = None, search: str | None = None) -> BankOnlyRun | None:
    """The run opened for a deletion without evaluation, or None where that needs the full run: a
    format-1 run, a search that would not be exact, weights or keys this path cannot read. (An
    unfinished deletion is the caller's check: forget/request.py `forget_without_model`.)"""
    paths = open_run(path)
    if rows.needs_migration(paths.root) or not paths.bank.exists():
        return None
    cfg = SearchConfig(mode=search or os.environ.get("MUNKEY_SEARCH") or "auto")
    run = BankOnlyRun(path, audit_url=audit_url)
    if not (cfg.mode == "exact" or (cfg.mode == "auto" and len(run.bank) < cfg.exact_below)):
        return None  # an IVF search: the full run builds and follows the index
    try:  # what the request reads, read now: it never finds it missing after its commit point (the train
        # keys, read only for ids no longer in the bank: forget/request.py `forget_without_model`)
        _ = run.model_fingerprint
        run.split_keys("test")
    except MunkeyError:
        return None
    return run


def weights_fingerprint(path: Path) -> str | None:
    """run/loaded.py `fingerprint` of the model a weights file loads into (sha256 over name, dtype,
    shape and bytes of each tensor, sorted by name), read from the file without torch; None when the
    file holds anything but float32 tensors in torch's zip format (the caller then loads it)."""
    if sys.byteorder != "little":
        return None
    try:
        with zipfile.ZipFile(path) as zf:
            pkl = [n for n in zf.namelist() if n.endswith("/data.pkl")]
            if len(pkl) != 1:
                return None
            prefix = pkl[0][:-len("data.pkl")]
            if zf.read(prefix + "byteorder").decode().strip() != "little":
                return None
            state = _WeightsUnpickler(zf, prefix).load()
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, _Unknown):
        return None
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        return None
    h = hashlib.sha256()
    for name, arr in sorted(state.items()):
        arr = np.ascontiguousarray(arr)
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


class _Unknown(Exception):
    """Something in the weights file this reader does not rebuild."""


class _Storage:
    def __init__(self, dtype: type) -> None:
        self.dtype = dtype


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple, requires_grad: bool = False,
                    hooks: object = None, metadata: object = None) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 in numpy: a strided view of the storage, copied contiguous."""
    item = storage.dtype.itemsize
    if offset < 0 or any(int(s) < 0 for s in stride):
        raise _Unknown("negative offset or stride")
    need = offset + (sum((int(n) - 1) * int(s) for n, s in zip(size, stride)) + 1 if all(size) else 0)
    if need > len(storage):
        raise _Unknown("tensor beyond its storage")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(int(n) for n in size),
                                           strides=tuple(int(s) * item for s in stride), writeable=False)
    return np.ascontiguousarray(view)


class _WeightsUnpickler(pickle.Unpickler):
    """Rebuilds only an ordered dict of plain tensors (what torch.save of a state dict writes)."""

    def __init__(self, zf: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(io.BytesIO(zf.read(prefix + "data.pkl")))
        self._zf, self._prefix = zf, prefix
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGES:
            return _Storage(_STORAGES[name])
        raise _Unknown(f"{module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Storage)):
            raise _Unknown("storage record")
        _, kind, key, _location, numel = pid
        if key not in self._storages:
            data = np.frombuffer(self._zf.read(f"{self._prefix}data/{key}"), dtype=kind.dtype)
            if len(data) < int(numel):
                raise _Unknown("short storage")
            self._storages[key] = data[:int(numel)]
        return self._storages[key]
