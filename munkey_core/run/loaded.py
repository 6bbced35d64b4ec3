"""The run interface: one loaded run directory, as every layer above `run` sees it.

- `LoadedRun`: what both kinds of run have (config.json "kind": "munkey" or "classifier"): paths,
  config, device, the model (eval mode, its weights checked against the config), the dataset
  (loaded on first use), class names, user images made dataset-shaped, the model's input tensor,
  labels predicted on a split, and the weights' fingerprint.
- `LoadedMunkeyRun`: a MUNKEY run: also its memory bank, the forgotten ids, two locks (`lock`, a
  thread lock, so a page and a background job never interleave a deletion with a search;
  `runlock`, the run directory's file lock, so processes never do), `reload_if_changed`,
  `forgotten_written` and `apply_deletion` (the two steps of a deletion that change this object),
  `search` (top-k of the current bank, under the lock: callers never take it themselves) and
  prediction with evidence; both go through `searcher` (bank/search.py: exact, or an IVF index
  for a bank of `SearchConfig.exact_below` rows or more, or as the `search` option says). Opening one migrates a format-1 run first (run/rows.py). It does not
  finish an interrupted deletion: that is the deletion protocol's (forget/request.py,
  `recover_on_open`), which `service.MunkeyRun` runs when it opens a run.
- `DeletionTarget`: the part of a run the deletion protocol's file steps use
  (forget/request.py `apply_journal`), written down so that a benchmark can time those steps on a
  run directory too large to load (bench/forget_storage.py).
- `ClassifierRun`: a ResNet-18 / plain ViT run (training/classifier.py trains one);
  `classifier_runs_in(folders)` lists them.
- `load_run(path)`: a run of either kind.
Cost: opening reads the weights and the whole bank (keys, exemplars, moments) into memory once;
`reload_if_changed` is two stat calls unless another process deleted.
Tests: tests/test_service.py, tests/run/test_runstore.py (format-1 runs), tests/run/test_atomicity.py,
tests/unlearn/test_classforget.py (both kinds).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Container, Protocol, Sequence

import numpy as np
import torch

from munkey_core.atomic import atomic_write_json, read_json
from munkey_core.bank.memory import MemoryBank
from munkey_core.bank.search import BankSearch
from munkey_core.config import ModelConfig, SearchConfig, TrainConfig, from_dict, resolve_device
from munkey_core.data import datasets as data_mod
from munkey_core.data.duplicates import to_native
from munkey_core.errors import MunkeyError
from munkey_core.keys import encoders as keys_mod
from munkey_core.model.classifiers import ClassifierConfig, build_classifier, predict_labels
from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
from munkey_core.model.predict import Predictions, predict
from munkey_core.run import rows
from munkey_core.run.lock import RunLock
from munkey_core.run import predstore
from munkey_core.run.predcache import PredictionCache
from munkey_core.run.paths import RunPaths, disk_stamp, load_state_dict, open_run, read_config, read_forgotten, read_list


def fingerprint(model: torch.nn.Module) -> str:
    """sha256 over the state dict (names, dtypes, shapes, bytes; sorted by name): equal weights give
    equal fingerprints, whatever file holds them."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        arr = t.detach().cpu().contiguous().numpy()
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def run_kind(path: str | Path) -> str:
    """'munkey' or 'classifier' for a run directory (raises a clear error when it is not one)."""
    cfg_path = RunPaths(Path(path)).config
    if not cfg_path.exists():
        raise MunkeyError(f"{path} is not a run directory (no config.json). Train one with 'munkey train --out {path}'.")
    return str(read_json(cfg_path).get("kind", "munkey"))


class LoadedRun(ABC):
    """What every loaded run has. Subclasses build `self.model` and call `load_weights` once."""

    kind: str = ""

    def __init__(self, paths: RunPaths, config: dict, device: str = "auto") -> None:
        self.paths = paths
        self.config = config
        self.device = resolve_device(device)
        self.train_cfg: TrainConfig = from_dict(TrainConfig, config["train"])
        self.model: torch.nn.Module
        self._dataset: data_mod.Dataset | None = None
        self._model_fp: str | None = None

    def load_weights(self, model: torch.nn.Module) -> None:
        """Load model.pt into `model` (moved to the device), in eval mode, as `self.model`."""
        model = model.to(self.device)
        try:
            model.load_state_dict(load_state_dict(self.paths.model, self.device))
        except RuntimeError:
            raise MunkeyError(f"{self.paths.model} does not match the run's config; the run is damaged.") from None
        self.model = model.eval()

    @property
    def root(self) -> Path:
        return self.paths.root

    @property
    @abstractmethod
    def img_size(self) -> int:
        """The side the model's input is resized to."""

    @property
    def class_names(self) -> list[str]:
        return list(self.config["class_names"])

    @property
    def dataset(self) -> data_mod.Dataset:
        """The run's dataset, loaded (and cut to the run's max_train) on first use."""
        if self._dataset is None:
            self._dataset = data_mod.load_dataset(self.config["dataset"], self.config.get("data_root"),
                                                  seed=self.train_cfg.data_seed, max_train=self.train_cfg.max_train or None)
        return self._dataset

    @property
    def model_fingerprint(self) -> str:
        """sha256 of the loaded weights (computed once: nothing edits a loaded run's model in place)."""
        if self._model_fp is None:
            self._model_fp = fingerprint(self.model)
        return self._model_fp

    def prepare_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """User images (H, W, C) uint8 of any size/channels -> (B, H0, W0, C0) like the training data."""
        if len(images) == 0:
            raise MunkeyError("No image given; pass at least one PNG, JPEG or NPY file.")
        shape = tuple(self.config["image_shape"])
        # area-averaged when shrinking: an enlarged copy of a training image gets (nearly) its key back
        return np.stack([to_native(img, shape, self.config["channels"]) for img in images])

    def to_input(self, images_u8: np.ndarray) -> torch.Tensor:
        """Dataset-shaped uint8 images (B, H, W, C) -> the model's input tensor (B, C, S, S)."""
        x = torch.from_numpy(np.ascontiguousarray(images_u8)).to(self.device)
        return preprocess_images(x, self.img_size)

    @abstractmethod
    def predict_split(self, split: str, index: np.ndarray, model: torch.nn.Module | None = None,
                      bank: MemoryBank | None = None) -> np.ndarray:
        """Labels predicted for rows `index` of a dataset split under `model` (default: the run's own)
        and, for a MUNKEY run, `bank` (default: the run's current bank)."""


class DeletionTarget(Protocol):
    """What the deletion protocol's file steps read and change (forget/request.py `apply_journal`)."""

    paths: RunPaths
    bank: Container[int]  # the ids still in the bank

    def forgotten_written(self, forgotten: dict) -> None:
        """forgotten.json now says `forgotten` (the deletion's group commit replaced it): so does this object."""

    def apply_deletion(self, ids: Sequence[int]) -> None:
        """Remove `ids` (all present) from the bank file and the bank in memory, durably."""


@dataclass(frozen=True)
class Hits:
    """The k nearest bank rows of each query (best first), read in one piece under the run's lock."""

    similarities: torch.Tensor    # (Q, k) cosine
    ids: np.ndarray               # (Q, k) int64 sample ids
    labels: np.ndarray            # (Q, k)
    values: torch.Tensor | None   # (Q, k, Dv) exemplars (a copy), when asked for


class LoadedMunkeyRun(LoadedRun):
    """A loaded MUNKEY run: the model, its current bank and forgotten ids, and the locks that guard them."""

    kind = "munkey"

    def __init__(self, path: str | Path, device: str = "auto", audit_url: str | None = None,
                 search: SearchConfig | str | None = None) -> None:
        """`search`: how neighbours are found (a SearchConfig, or just its mode 'auto' / 'exact' / 'ivf';
        None: $MUNKEY_SEARCH or 'auto')."""
        paths = open_run(path)
        super().__init__(paths, read_config(paths), device)
        self.audit_url = audit_url  # PostgreSQL log URL; None: $MUNKEY_AUDIT_URL or the run's SQLite log
        self.model_cfg: ModelConfig = from_dict(ModelConfig, self.config["model"])
        self.load_weights(MunkeyViT(self.model_cfg))
        self.lock = threading.RLock()  # threads of this process
        self.runlock = RunLock(self.paths.root)  # processes: deletions and appends hold it exclusively
        self._encoder: keys_mod.KeyEncoder | None = None
        if not isinstance(search, SearchConfig):
            search = SearchConfig(mode=search or os.environ.get("MUNKEY_SEARCH") or "auto")
        self.search_cfg = search
        self.searcher: BankSearch | None = None
        self.predictions = PredictionCache()  # dataset-row predictions of the current bank (run/predcache.py)
        self._tried_store: set[tuple[tuple, str]] = set()  # (bank state, table) looked up in the run's store
        self._sorted_ids: tuple[tuple | None, np.ndarray] = (None, np.zeros(0, np.int64))
        self._bank_generation = 0  # +1 on every change of the bank in memory
        if rows.needs_migration(self.paths.root):  # a format-1 run: bank.npz -> bank.store, once
            with self.runlock.hold(exclusive=True):
                rows.migrate(self.paths.root)
            self.config = read_config(self.paths)
        with self.runlock.hold(exclusive=False):
            self.reload()

    # ----- state on disk -------------------------------------------------------------------
    def _disk_stamp(self) -> tuple:
        return disk_stamp(self.paths)

    def reload(self) -> None:
        """(Re)read the bank and forgotten.json from disk (opening the store finishes an interrupted
        row update first; bank/store.py). A run this process may not write loads read-only."""
        with rows.open_bank(self.paths.bank) as store:
            self.bank = store.to_bank().to(self.device)
        if self.searcher is None:  # centroids from the validation keys: never from a bank key
            self.searcher = BankSearch(self.bank, self.search_cfg, lambda: self.split_keys("val"))
        else:
            self.searcher.rebind(self.bank)
        self.forgotten = read_forgotten(self.paths)
        self._stamp = self._disk_stamp()
        self._bank_generation += 1
        self.predictions.clear(self._cache_state())

    def reload_if_changed(self) -> None:
        """Another process may have deleted since we loaded: re-read before changing anything."""
        if self._disk_stamp() != self._stamp:
            self.reload()

    def forgotten_written(self, forgotten: dict) -> None:
        """forgotten.json was replaced by `forgotten` ({'ids': [...], 'requests': [...]}, the deletion's
        group commit, forget/request.py `apply_journal`): the run in memory follows it."""
        self.forgotten = forgotten
        self._stamp = self._disk_stamp()

    def apply_deletion(self, ids: Sequence[int]) -> None:
        """Remove ids from the bank in memory and in bank.store (swap-with-last, vacated rows zeroed,
        durable on return): O(#ids) in time and bytes written, whatever the bank size. The file first:
        if it fails, the bank in memory still matches it and the journal is rolled forward later."""
        rows.delete_bank_rows(self.paths.bank, ids)
        with self.lock:
            mode = self._search_mode()
            self.bank.delete(ids)
            self._bank_generation += 1
            if self._search_mode() == mode:
                self.predictions.deleted(ids, self._cache_state())  # only the queries that retrieved them
            else:  # the bank crossed the exact/IVF size: every query searches another way now
                self.predictions.clear(self._cache_state())
        self._stamp = self._disk_stamp()

    def _cache_state(self) -> tuple:
        """What the cached predictions are valid for: this bank (object, size, generation), model and search."""
        return (self._bank_generation, id(self.bank), len(self.bank), id(self.model), id(self.searcher),
                self._search_mode())

    def _search_mode(self) -> str | None:
        return None if self.searcher is None else self.searcher.mode

    def append_metrics(self, entry: dict) -> None:
        """Append one evaluation to metrics.json (under both locks: appends never interleave)."""
        with self.lock, self.runlock.hold(exclusive=True):
            atomic_write_json(self.paths.metrics, self.metrics_history + [entry])

    # ----- what the run holds ----------------------------------------------------------------
    @property
    def img_size(self) -> int:
        return self.model_cfg.img_size

    @property
    def encoder(self) -> keys_mod.KeyEncoder:
        """The run's key encoder (loaded on first use: seconds)."""
        if self._encoder is None:
            enc = self.config["encoder"]
            self._encoder = keys_mod.load_encoder(enc["name"], device=self.device, resolution=enc.get("resolution"))
        return self._encoder

    @property
    def forgotten_ids(self) -> list[int]:
        return [int(i) for i in self.forgotten["ids"]]

    @property
    def history(self) -> list[dict]:
        return read_list(self.paths.history)

    @property
    def metrics_history(self) -> list[dict]:
        return read_list(self.paths.metrics)

    def split_keys(self, split: str) -> np.ndarray:
        """Keys (N, Dk) of a dataset split, from the on-disk key cache (computed on first use)."""
        s = self.dataset.split(split)
        return keys_mod.cached_keys(_CacheEncoder(self), s.images, s.ids, dataset=self.dataset.name, split=split,
                                    progress=False)

    # ----- search and prediction ---------------------------------------------------------------
    def search(self, queries: np.ndarray | torch.Tensor, k: int, *, values: bool = False) -> Hits:
        """The k nearest rows of the current bank for each query key (Q, Dk), under the run's lock (a
        deletion moves rows: ids, labels and exemplars are read before it can)."""
        with self.lock:
            sims, found = self.searcher.search(queries, k)
            at = found.cpu().numpy()
            return Hits(sims, self.bank.ids[at], self.bank.labels[at],
                        self.bank.values[found] if values else None)

    def exemplars(self, ids: Sequence[int]) -> np.ndarray:
        """The bank's exemplar vectors (N, Dv) of `ids`, all of which must be in the bank."""
        with self.lock:
            at = self.bank.rows_of(ids)
            return self.bank.values[torch.as_tensor(at)].float().cpu().numpy()

    def predict_prepared(self, images: np.ndarray, keys: np.ndarray, *, k: int | None = None,
                         mode: str = "ensemble", pathway: str = "both", neighbour_predictions: bool = True,
                         exclude=None) -> Predictions:
        """Predict dataset-shaped uint8 images whose keys are known, with the current bank."""
        x = self.to_input(images)
        with self.lock:
            return predict(self.model, self.bank, x, keys, k=self.train_cfg.k if k is None else k, tau=self.train_cfg.tau,
                           mode=mode, pathway=pathway, neighbour_predictions=neighbour_predictions, exclude=exclude,
                           searcher=self.searcher)

    def predict_rows(self, split: str, index: np.ndarray, *, pathway: str = "both") -> np.ndarray:
        """Ensemble class probabilities (n, C) of rows `index` of a dataset split with the current bank
        and the run's K. Cached per bank state (run/predcache.py) and kept in the run (run/predstore.py),
        so a fresh process starts from the last one's predictions: only rows never predicted, or whose
        neighbours a deletion removed since, are run through the model; the rest are reused."""
        index = np.asarray(index, dtype=np.int64)
        s = self.dataset.split(split)
        keys = self.split_keys(split)
        k = self.train_cfg.k
        with self.lock:
            table = self.predictions.table((split, pathway, k), len(s), self.model_cfg.num_classes, k,
                                           self._cache_state())
            desc = self._table_desc(split, pathway, k)
            if not table.valid.any() and (self._cache_state(), desc) not in self._tried_store:
                self._tried_store.add((self._cache_state(), desc))
                predstore.load_table(self.paths.root, json.loads(desc), s.ids, self._bank_ids_sorted(), table)
            todo = table.missing(index)
            if len(todo):
                p = predict(self.model, self.bank, self.to_input(s.images[todo]), keys[todo], k=k,
                            tau=self.train_cfg.tau, pathway=pathway, neighbour_predictions=False,
                            searcher=self.searcher)
                found = np.full((len(todo), k), -1, dtype=np.int64)  # a bank smaller than K: fewer
                found[:, :p.neighbour_ids.shape[1]] = p.neighbour_ids
                table.put(todo, p.probs, found)
                self._store_table(desc, s.ids, table)
            return table.probs[index].copy()

    def _table_desc(self, split: str, pathway: str, k: int) -> str:
        """What a stored prediction table depends on besides the bank (run/predstore.py), as canonical JSON."""
        return json.dumps({"model": self.model_fingerprint, "split": split, "pathway": pathway, "k": int(k),
                           "tau": float(self.train_cfg.tau), "search": self._search_mode()}, sort_keys=True)

    def _bank_ids_sorted(self) -> np.ndarray:
        """The loaded bank's ids, sorted (computed once per bank state, as the prediction cache sees it:
        a bank edited in memory behind the run's back is another state)."""
        state = self._cache_state()
        if self._sorted_ids[0] != state:
            self._sorted_ids = (state, np.sort(np.asarray(self.bank.ids, dtype=np.int64)))
        return self._sorted_ids[1]

    def _store_table(self, desc: str, split_ids: np.ndarray, table) -> None:
        """Keep a prediction table in the run for the next process, if the run lock is free now (a cache:
        never waits for a deletion) and the run is writable; a failure only costs the next process time."""
        try:
            with self.runlock.try_hold_shared() as held:
                if held:
                    predstore.save_table(self.paths.root, json.loads(desc), split_ids, self._bank_ids_sorted(),
                                         table, self.forgotten_ids)
        except (OSError, MunkeyError):
            pass  # read-only run, full disk, damaged bank file: predictions are recomputed when needed

    @torch.no_grad()
    def predict_split(self, split: str, index: np.ndarray, model: torch.nn.Module | None = None,
                      bank: MemoryBank | None = None) -> np.ndarray:
        if model is None and bank is None:
            return self.predict_rows(split, index).argmax(axis=1)
        images = self.dataset.split(split).images[index]
        keys = self.split_keys(split)[index]
        with self.lock:
            return predict(self.model if model is None else model, self.bank if bank is None else bank,
                           self.to_input(images), keys, k=self.train_cfg.k, tau=self.train_cfg.tau,
                           neighbour_predictions=False, searcher=self.searcher if bank is None else None).labels


class _CacheEncoder:
    """The run's key encoder as the key cache sees it: described by the run's config, loaded only on a
    cache miss (loading the encoder costs seconds; reading cached keys, milliseconds)."""

    def __init__(self, run: LoadedMunkeyRun) -> None:
        self._run = run
        self._desc = dict(run.config["encoder"])
        self.name = str(self._desc["name"])
        self.resolution = int(self._desc["resolution"])
        self.dim = int(self._desc["dim"])

    def describe(self) -> dict:
        return dict(self._desc)

    def encode(self, images: np.ndarray, batch_size: int = 256, progress: bool = False) -> np.ndarray:
        return self._run.encoder.encode(images, batch_size=batch_size, progress=progress)


class ClassifierRun(LoadedRun):
    """A loaded classifier run (ResNet-18 or plain ViT; trained by training/classifier.py)."""

    kind = "classifier"

    def __init__(self, path: str | Path, device: str = "auto") -> None:
        paths = RunPaths(Path(path))
        if run_kind(paths.root) != "classifier":
            raise MunkeyError(f"{paths.root} is a MUNKEY run, not a ResNet-18/ViT classifier run.")
        super().__init__(paths, read_json(paths.config), device)
        self.cfg: ClassifierConfig = from_dict(ClassifierConfig, self.config["classifier"])
        self.load_weights(build_classifier(self.cfg))

    @property
    def arch(self) -> str:
        return self.cfg.arch

    @property
    def img_size(self) -> int:
        return self.cfg.img_size

    def predict_labels(self, images_u8: np.ndarray) -> np.ndarray:
        return predict_labels(self.model, images_u8, self.img_size)

    def predict_split(self, split: str, index: np.ndarray, model: torch.nn.Module | None = None,
                      bank: MemoryBank | None = None) -> np.ndarray:
        images = self.dataset.split(split).images[index]
        return predict_labels(self.model if model is None else model, images, self.img_size)

    def summary(self) -> dict:
        c = self.config
        return {"arch": self.arch, "dataset": c["dataset"], "profile": c["profile"], "classes": len(c["class_names"]),
                "train_size": c.get("train_size"), "exclude_classes": c.get("exclude_classes", []),
                "train_seconds": c.get("train_seconds")}


def classifier_runs_in(*folders: str | Path) -> list[Path]:
    """Classifier runs (ResNet-18 / ViT) directly inside the given folders, newest first."""
    found: dict[Path, float] = {}
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for cfg in folder.glob("*/config.json"):
            try:
                if read_json(cfg).get("kind") == "classifier":
                    found[cfg.parent.resolve()] = cfg.stat().st_mtime
            except (MunkeyError, OSError, ValueError):
                continue  # not a readable run: not offered
    return sorted(found, key=lambda p: -found[p])


def load_run(path: str | Path, device: str = "auto") -> LoadedRun:
    """The run at `path`, of either kind (a MUNKEY run is not recovered here: see the module docstring)."""
    return ClassifierRun(path, device=device) if run_kind(path) == "classifier" else LoadedMunkeyRun(path, device)
