"""What the CLI and the dashboard call: train a run, open it, predict with evidence, forget, evaluate.

One `MunkeyRun` holds one loaded run (model, bank, lazily the dataset and key encoder) and two
locks: a thread lock, so a UI thread and a background job never interleave a deletion with a
prediction, and the run directory's file lock (runlock.py), so processes never do either. Opening
a run finishes an interrupted deletion (deletion.py); `forget` is an audited request.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from munkey_core.data import datasets as data_mod
from munkey_core.forget import request as deletion
from munkey_core.keys import encoders as keys_mod
from munkey_core.run import rows as runstore
from munkey_core.config import ModelConfig, TrainConfig, from_dict, resolve_device, resolve_profile, with_overrides
from munkey_core.forget.request import ForgetResult
from munkey_core.errors import MunkeyError
from munkey_core.forget.evidence import model_fingerprint
from munkey_core.data.images import match_channels, read_image_file, resize_to
from munkey_core.eval.metrics import MIA_CHEAP, accuracy, cross_entropy, mia_auc, pathway_sensitivity
from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
from munkey_core.model.predict import Predictions, predict
from munkey_core.run.paths import (FORMAT_VERSION, RunPaths, begin_new_run_dir, check_new_run_dir, end_new_run_dir,
                                   load_state_dict, open_run, read_config, read_forgotten, read_list)
from munkey_core.run.lock import RunLock
from munkey_core.atomic import atomic_torch_save, atomic_write_json
from munkey_core.training.train import TrainData, train_munkey
from munkey_core.data.sampling import random_ids

Progress = Callable[[str, float], None]  # (stage, fraction done)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def train_run(dataset: str, out: str | Path, *, profile: str = "auto", encoder: str = keys_mod.DEFAULT_ENCODER,
              data_root: str | Path | None = None, download: bool = False, device: str = "auto",
              overrides: dict | None = None, keep_checkpoints: int = 10, progress: bool = True,
              on_epoch: Callable[[dict], None] | None = None, exclude_classes: Sequence[int] = (),
              exclude_ids: Sequence[int] = ()) -> "MunkeyRun":
    """Train a MUNKEY model on a registry dataset and write a run directory at `out`.

    `exclude_classes` leaves those classes out of training entirely (a class oracle); `exclude_ids`
    leaves those training samples out (a random-forgetting oracle: the same recipe on the retain set)."""
    out = check_new_run_dir(out)  # never overwrite a user's folder or file
    prof = resolve_profile(profile)
    overrides = dict(overrides or {})
    with_overrides(prof.model, overrides)  # a bad backbone option (e.g. inject_at) fails before any data is loaded
    train_cfg = with_overrides(prof.train, overrides)
    dev = resolve_device(device)
    ds = data_mod.load_dataset(dataset, data_root, download=download, seed=train_cfg.data_seed,
                               max_train=train_cfg.max_train or None)
    enc = keys_mod.load_encoder(encoder, device=dev)
    # keys of the whole splits (the cache the full run made is reused), then the class filter
    train_keys = keys_mod.cached_keys(enc, ds.train.images, ds.train.ids, dataset=ds.name, split="train",
                                      progress=progress)
    val_keys = keys_mod.cached_keys(enc, ds.val.images, ds.val.ids, dataset=ds.name, split="val", progress=progress)
    if exclude_classes:
        keep_tr = ~np.isin(ds.train.labels, list(exclude_classes))
        keep_va = ~np.isin(ds.val.labels, list(exclude_classes))
        ds = dataclasses.replace(ds, train=ds.train.subset(keep_tr), val=ds.val.subset(keep_va))
        train_keys, val_keys = train_keys[keep_tr], val_keys[keep_va]
    if len(exclude_ids):
        keep_ids = ~np.isin(ds.train.ids, np.asarray(list(exclude_ids), dtype=np.int64))
        ds = dataclasses.replace(ds, train=ds.train.subset(keep_ids))
        train_keys = train_keys[keep_ids]
    model_cfg = with_overrides(prof.model, {**overrides, "in_chans": ds.channels, "num_classes": ds.num_classes})
    begin_new_run_dir(out)
    t0 = time.perf_counter()
    result = train_munkey(
        model_cfg, train_cfg,
        TrainData(ds.train.images, ds.train.labels, ds.train.ids, train_keys),
        val=TrainData(ds.val.images, ds.val.labels, ds.val.ids, val_keys),
        device=dev, checkpoint_dir=out / "checkpoints", keep_checkpoints=keep_checkpoints,
        progress=progress, on_epoch=on_epoch)
    seconds = time.perf_counter() - t0
    write_run(out, result, ds, enc, prof.name, model_cfg, train_cfg, data_root=data_root, seconds=seconds,
              device=dev, extra={"exclude_classes": sorted(int(c) for c in exclude_classes),
                                 "excluded_ids": len(exclude_ids)})
    end_new_run_dir(out)
    return MunkeyRun(out, device=device)


def write_run(out: Path, result, ds: "data_mod.Dataset", enc, profile: str, model_cfg: ModelConfig,
              train_cfg: TrainConfig, *, data_root: str | Path | None, seconds: float, device: torch.device,
              extra: dict | None = None) -> None:
    """Write a trained model's run directory (weights, bank, history, config), each file atomically."""
    paths = RunPaths(Path(out))
    atomic_torch_save(paths.model, result.model.state_dict())
    runstore.write_bank(paths.bank, result.bank)
    atomic_write_json(paths.history, result.history)
    atomic_write_json(paths.config, {
        "format": FORMAT_VERSION, "created": _now(), "dataset": ds.name,
        "data_root": None if data_root is None else str(Path(data_root).resolve()),
        "class_names": list(ds.class_names), "image_shape": list(ds.image_shape), "channels": ds.channels,
        "encoder": enc.describe(), "profile": profile, "model": asdict(model_cfg), "train": asdict(train_cfg),
        "train_size": len(ds.train), "train_seconds": round(seconds, 1), "device": str(device), **(extra or {}),
    })


class MunkeyRun:
    """A loaded run directory: the model, its current bank, and the operations on them."""

    def __init__(self, path: str | Path, device: str = "auto", audit_url: str | None = None) -> None:
        self.paths = open_run(path)
        self.audit_url = audit_url  # PostgreSQL log URL; None: $MUNKEY_AUDIT_URL or the run's SQLite log
        self.config = read_config(self.paths)
        self.device = resolve_device(device)
        self.model_cfg: ModelConfig = from_dict(ModelConfig, self.config["model"])
        self.train_cfg: TrainConfig = from_dict(TrainConfig, self.config["train"])
        self.model = MunkeyViT(self.model_cfg).to(self.device)
        try:
            self.model.load_state_dict(load_state_dict(self.paths.model, self.device))
        except RuntimeError:
            raise MunkeyError(f"{self.paths.model} does not match the run's config; the run is damaged.") from None
        self.model.eval()
        self._model_fp: str | None = None
        self.lock = threading.RLock()  # threads of this process
        self.runlock = RunLock(self.paths.root)  # processes: deletions and appends hold it exclusively
        self._encoder: keys_mod.KeyEncoder | None = None
        self._dataset = None
        if runstore.needs_migration(self.paths.root):  # a format-1 run: bank.npz -> bank.store, once
            with self.runlock.hold(exclusive=True):
                runstore.migrate(self.paths.root)
            self.config = read_config(self.paths)
        with self.runlock.hold(exclusive=False):
            self._load_state()
            busy = deletion.needs_recovery(self)
        if busy:
            with self.runlock.hold(exclusive=True):
                self._load_state()
                self._recover()

    def _disk_stamp(self) -> tuple:
        out = []
        for p in (self.paths.bank, self.paths.forgotten):
            try:
                s = p.stat()
                out.append((s.st_ino, s.st_mtime_ns, s.st_size))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def _load_state(self) -> None:
        """(Re)read the bank and forgotten.json from disk (opening the store finishes an interrupted
        row update first; bankstore.py). A run this process may not write loads read-only."""
        with runstore.open_bank(self.paths.bank) as store:
            self.bank = store.to_bank().to(self.device)
        self.forgotten = read_forgotten(self.paths)
        self._stamp = self._disk_stamp()

    def _reload_if_changed(self) -> None:
        """Another process may have deleted since we loaded: re-read before changing anything."""
        if self._disk_stamp() != self._stamp:
            self._load_state()

    @property
    def model_fingerprint(self) -> str:
        """sha256 of the weights (computed once: key deletion never changes them)."""
        if self._model_fp is None:
            self._model_fp = model_fingerprint(self.model)
        return self._model_fp

    # ----- lazily loaded parts -------------------------------------------------------------
    @property
    def encoder(self) -> keys_mod.KeyEncoder:
        if self._encoder is None:
            enc = self.config["encoder"]
            self._encoder = keys_mod.load_encoder(enc["name"], device=self.device, resolution=enc.get("resolution"))
        return self._encoder

    @property
    def dataset(self):
        if self._dataset is None:
            self._dataset = data_mod.load_dataset(self.config["dataset"], self.config.get("data_root"),
                                                  seed=self.train_cfg.data_seed, max_train=self.train_cfg.max_train or None)
        return self._dataset

    @property
    def class_names(self) -> list[str]:
        return list(self.config["class_names"])

    @property
    def forgotten_ids(self) -> list[int]:
        return [int(i) for i in self.forgotten["ids"]]

    @property
    def history(self) -> list[dict]:
        return read_list(self.paths.history)

    @property
    def metrics_history(self) -> list[dict]:
        return read_list(self.paths.metrics)

    # ----- prediction ----------------------------------------------------------------------
    def prepare_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """User images (H, W, C) uint8 of any size/channels -> (B, H0, W0, C0) like the training data."""
        if len(images) == 0:
            raise MunkeyError("No image given; pass at least one PNG, JPEG or NPY file.")
        shape = tuple(self.config["image_shape"])
        return np.stack([resize_to(match_channels(img, self.config["channels"]), shape) for img in images])

    def predict_images(self, images: Sequence[np.ndarray], *, k: int | None = None, mode: str = "ensemble",
                       pathway: str = "both") -> Predictions:
        """Predict user images with the current bank; each prediction carries its evidence."""
        batch = self.prepare_images(images)
        keys = self.encoder.encode(batch)
        return self.predict_prepared(batch, keys, k=k, mode=mode, pathway=pathway)

    def predict_prepared(self, images: np.ndarray, keys: np.ndarray, *, k: int | None = None,
                         mode: str = "ensemble", pathway: str = "both", neighbour_predictions: bool = True,
                         exclude=None) -> Predictions:
        """Predict dataset-shaped uint8 images whose keys are known."""
        x = preprocess_images(torch.from_numpy(np.ascontiguousarray(images)).to(self.device), self.model_cfg.img_size)
        with self.lock:
            return predict(self.model, self.bank, x, keys, k=k or self.train_cfg.k, tau=self.train_cfg.tau,
                           mode=mode, pathway=pathway, neighbour_predictions=neighbour_predictions, exclude=exclude)

    def predict_files(self, paths: Sequence[str | Path], **kwargs) -> Predictions:
        return self.predict_images([read_image_file(p) for p in paths], **kwargs)

    # ----- deletion ------------------------------------------------------------------------
    def forget(self, ids: Sequence[int], *, operator: str | None = None, subject: str | None = None,
               evaluate: bool = False, max_samples: int = 2000, source: str = "ids",
               progress: Progress | None = None) -> ForgetResult:
        """Delete training samples by id: bank rows, their optimiser moments, checkpoint rows; record
        the request in the audit log and write its receipt (deletion.py has the protocol).

        Unknown ids refuse the whole request (nothing changes; the refusal is logged); ids deleted
        earlier are reported. `evaluate` measures the metrics before and after (slower).
        `operator` None records the OS user (the CLI and the dashboard always name one).
        """
        return deletion.forget(self, ids, operator=operator, subject=subject, evaluate=evaluate,
                               max_samples=max_samples, source=source, progress=progress)

    def forget_random(self, fraction: float, seed: int = 0, **kwargs) -> ForgetResult:
        """Delete a seeded random fraction of the samples still in the bank."""
        return self.forget(random_ids(self.bank.ids, fraction, seed), **{"source": "random-fraction", **kwargs})

    def _apply_deletion(self, ids: Sequence[int]) -> None:
        """Remove ids from the bank in memory and in bank.store (swap-with-last, vacated rows zeroed,
        durable on return): O(#ids) in time and bytes written, whatever the bank size. The file first:
        if it fails, the bank in memory still matches it and the journal is rolled forward later."""
        runstore.delete_bank_rows(self.paths.bank, ids)
        self.bank.delete(ids)
        self._stamp = self._disk_stamp()

    def _recover(self) -> None:
        """Finish an interrupted deletion (journal.json, or legacy ids in forgotten.json still in the bank)."""
        try:
            deletion.recover(self)
        except OSError as exc:
            raise MunkeyError(f"An interrupted deletion in {self.paths.root} could not be finished "
                              f"({exc.strerror or exc}). Free disk space or make the run directory writable, then "
                              "open the run again: it is finished then.") from None
        self._stamp = self._disk_stamp()

    # ----- evaluation ----------------------------------------------------------------------
    def evaluate(self, *, max_samples: int = 2000, seed: int = 0, record: bool = True,
                 progress: Progress | None = None) -> dict:
        """TA, RA, FA (percent), cheap MIA AUC (percent), Ps; FA and MIA are None when nothing is deleted.

        Each set is a seeded subsample of at most `max_samples` (0 = all), counts reported.
        """
        ds = self.dataset
        report = progress or (lambda stage, frac: None)
        rng = np.random.default_rng(seed)
        train_keys = self.split_keys("train")
        in_bank = np.isin(ds.train.ids, self.bank.ids)
        forgotten = np.isin(ds.train.ids, self.forgotten_ids)
        test_idx = _subsample(np.arange(len(ds.test)), max_samples, rng)
        retain_idx = _subsample(np.flatnonzero(in_bank), max_samples, rng)
        forget_idx = _subsample(np.flatnonzero(forgotten), max_samples, rng)
        report("test", 0.0)
        test_keys = self.split_keys("test")[test_idx]
        test_imgs, test_y = ds.test.images[test_idx], ds.test.labels[test_idx]
        both = self.predict_prepared(test_imgs, test_keys, neighbour_predictions=False)
        report("pathways", 0.3)
        a_img = accuracy(self.predict_prepared(test_imgs, test_keys, pathway="image",
                                               neighbour_predictions=False).labels, test_y)
        a_tok = accuracy(self.predict_prepared(test_imgs, test_keys, pathway="token",
                                               neighbour_predictions=False).labels, test_y)
        ta = accuracy(both.labels, test_y)
        report("retain", 0.6)
        ret = self.predict_prepared(ds.train.images[retain_idx], train_keys[retain_idx], neighbour_predictions=False)
        result = {
            "TA": ta, "RA": accuracy(ret.labels, ds.train.labels[retain_idx]), "FA": None, "MIA": None,
            "MIA_attack": MIA_CHEAP, "Ps": pathway_sensitivity(a_img, a_tok, ta), "A_img": a_img, "A_tok": a_tok,
            "A_both": ta, "n_test": int(len(test_idx)), "n_retain": int(len(retain_idx)),
            "n_forget": int(len(forget_idx)), "bank_size": len(self.bank), "deleted": len(self.forgotten_ids),
            "bank_fingerprint": self.bank.fingerprint(), "model_fingerprint": self.model_fingerprint,
        }
        if len(forget_idx):
            report("forget", 0.85)
            fy = ds.train.labels[forget_idx]
            fgt = self.predict_prepared(ds.train.images[forget_idx], train_keys[forget_idx],
                                        neighbour_predictions=False)
            result["FA"] = accuracy(fgt.labels, fy)
            result["MIA"] = mia_auc(cross_entropy(fgt.probs, fy), fy, cross_entropy(both.probs, test_y), test_y)
        report("done", 1.0)
        if record:
            with self.lock, self.runlock.hold(exclusive=True):
                atomic_write_json(self.paths.metrics, self.metrics_history + [{"time": _now(), **result}])
        return result

    def accuracy_on_ids(self, ids: Sequence[int]) -> float | None:
        """Ensemble accuracy (percent) on the given training samples with the current bank."""
        ds = self.dataset
        idx = np.flatnonzero(np.isin(ds.train.ids, np.asarray(list(ids), dtype=np.int64)))
        if len(idx) == 0:
            return None
        preds = self.predict_prepared(ds.train.images[idx], self.split_keys("train")[idx],
                                      neighbour_predictions=False)
        return accuracy(preds.labels, ds.train.labels[idx])

    def split_keys(self, split: str) -> np.ndarray:
        """Keys (N, Dk) of a dataset split, from the on-disk key cache (computed on first use)."""
        s = self.dataset.split(split)
        return keys_mod.cached_keys(_CacheEncoder(self), s.images, s.ids, dataset=self.dataset.name, split=split,
                                    progress=False)

    def summary(self) -> dict:
        """The model card: what this run is, and how big its bank is now."""
        c = self.config
        return {"dataset": c["dataset"], "encoder": c["encoder"]["name"], "profile": c["profile"],
                "classes": len(c["class_names"]), "train_size": c.get("train_size"), "bank_size": len(self.bank),
                "deleted": len(self.forgotten_ids), "created": c.get("created"),
                "train_seconds": c.get("train_seconds"), "device": str(self.device),
                "inject_at": self.model_cfg.inject_at, "design": design_name(self.model_cfg.inject_at)}


def design_name(inject_at: int) -> str:
    """How a run's model is built, in words: the paper's design or late injection at block L."""
    return "paper (token from block 0)" if inject_at == 0 else f"late injection (token from block {inject_at})"


class _CacheEncoder:
    """The run's key encoder as the key cache sees it: described by the run's config, loaded only on a
    cache miss (loading the encoder costs seconds; reading cached keys, milliseconds)."""

    def __init__(self, run: MunkeyRun) -> None:
        self._run = run
        self._desc = dict(run.config["encoder"])
        self.name = str(self._desc["name"])
        self.resolution = int(self._desc["resolution"])
        self.dim = int(self._desc["dim"])

    def describe(self) -> dict:
        return dict(self._desc)

    def encode(self, images: np.ndarray, batch_size: int = 256, progress: bool = False) -> np.ndarray:
        return self._run.encoder.encode(images, batch_size=batch_size, progress=progress)


def _subsample(index: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    if cap and len(index) > cap:
        return np.sort(rng.choice(index, size=cap, replace=False))
    return index
