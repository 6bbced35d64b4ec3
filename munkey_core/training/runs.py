"""A run directory from a registry dataset: load the data, compute (or read) the keys, train, write.

- `train_run`: `munkey train` for a MUNKEY run (optionally without some classes or some sample
  ids: the class and random-forgetting oracles are the same recipe on the retain data).
- `write_run`: a trained model's run directory (weights, bank store, history, config), each file
  atomically (run/paths.py has the layout); distributed training writes through it too.
- `retrain`: a run's recipe trained again, as the same kind of run or as a plain ViT, without some
  classes or ids: the oracles of eval/oracles.py and unlearn/classforget.py.
Cost: the key encoder's pass over the splits once (cached on disk), then training (train.py).
Tests: tests/test_service.py, tests/eval/test_oracles.py, tests/unlearn/test_classforget.py.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from munkey_core.atomic import atomic_torch_save, atomic_write_json
from munkey_core.config import ModelConfig, TrainConfig, resolve_device, resolve_profile, with_overrides
from munkey_core.data import datasets as data_mod
from munkey_core.keys import encoders as keys_mod
from munkey_core.run import rows
from munkey_core.run.paths import (FORMAT_VERSION, RunPaths, begin_new_run_dir, check_new_run_dir, end_new_run_dir,
                                   utc_now)
from munkey_core.training.classifier import train_classifier_run
from munkey_core.training.train import TrainData, TrainResult, train_munkey


def train_run(dataset: str, out: str | Path, *, profile: str = "auto", encoder: str = keys_mod.DEFAULT_ENCODER,
              data_root: str | Path | None = None, download: bool = False, device: str = "auto",
              overrides: dict | None = None, keep_checkpoints: int = 10, progress: bool = True,
              on_epoch: Callable[[dict], None] | None = None, exclude_classes: Sequence[int] = (),
              exclude_ids: Sequence[int] = ()) -> Path:
    """Train a MUNKEY model on a registry dataset and write a run directory at `out`.

    `exclude_classes` leaves those classes out of training entirely (a class oracle); `exclude_ids`
    leaves those training samples out (a random-forgetting oracle: the same recipe on the retain set).
    Returns the run directory (service.train_run opens it)."""
    paths = RunPaths(check_new_run_dir(out))  # never overwrite a user's folder or file
    prof = resolve_profile(profile)
    overrides = dict(overrides or {})
    with_overrides(prof.model_for(dataset), overrides)  # a bad backbone option (e.g. inject_at) fails before any data is loaded
    train_cfg = with_overrides(prof.train_for(dataset), overrides)
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
    model_cfg = with_overrides(prof.model_for(dataset), {**overrides, "in_chans": ds.channels, "num_classes": ds.num_classes})
    begin_new_run_dir(paths.root)
    t0 = time.perf_counter()
    result = train_munkey(
        model_cfg, train_cfg,
        TrainData(ds.train.images, ds.train.labels, ds.train.ids, train_keys),
        val=TrainData(ds.val.images, ds.val.labels, ds.val.ids, val_keys),
        device=dev, checkpoint_dir=paths.checkpoints, keep_checkpoints=keep_checkpoints,
        progress=progress, on_epoch=on_epoch)
    seconds = time.perf_counter() - t0
    write_run(paths.root, result, ds, enc, prof.name, model_cfg, train_cfg, data_root=data_root, seconds=seconds,
              device=dev, extra={"exclude_classes": sorted(int(c) for c in exclude_classes),
                                 "excluded_ids": len(exclude_ids)})
    end_new_run_dir(paths.root)
    return paths.root


def write_run(out: Path, result: TrainResult, ds: data_mod.Dataset, enc, profile: str, model_cfg: ModelConfig,
              train_cfg: TrainConfig, *, data_root: str | Path | None, seconds: float, device: torch.device,
              extra: dict | None = None) -> None:
    """Write a trained model's run directory (weights, bank, history, config), each file atomically."""
    paths = RunPaths(Path(out))
    atomic_torch_save(paths.model, result.model.state_dict())
    rows.write_bank(paths.bank, result.bank)
    atomic_write_json(paths.history, result.history)
    atomic_write_json(paths.config, {
        "format": FORMAT_VERSION, "created": utc_now(), "dataset": ds.name,
        "data_root": None if data_root is None else str(Path(data_root).resolve()),
        "class_names": list(ds.class_names), "image_shape": list(ds.image_shape), "channels": ds.channels,
        "encoder": enc.describe(), "profile": profile, "model": asdict(model_cfg), "train": asdict(train_cfg),
        "train_size": len(ds.train), "train_seconds": round(seconds, 1), "device": str(device), **(extra or {}),
    })


def recipe_overrides(config: dict) -> dict:
    """A run's full recipe (training options and backbone sizes) as overrides for retraining it."""
    model = config.get("model") or {k: v for k, v in config.get("classifier", {}).items() if k != "arch"}
    return {**config["train"], **model}


def retrain(config: dict, out: str | Path, *, arch: str | None = None, exclude_classes: Sequence[int] = (),
            exclude_ids: Sequence[int] = (), extra_overrides: dict | None = None, device: str = "auto",
            progress: bool = True) -> Path:
    """Train `config`'s recipe again into `out`, without `exclude_classes` / `exclude_ids`: as the same
    kind of run (`arch` None) or as a classifier of `arch` ("vit": the T-oracle of a MUNKEY run);
    `extra_overrides` change the recipe (e.g. another training seed on the same data split).
    MUNKEY retrains keep one checkpoint (an oracle is never selected from)."""
    over = {**recipe_overrides(config), **(extra_overrides or {})}
    common = dict(profile=config["profile"], data_root=config.get("data_root"), device=device, overrides=over,
                  progress=progress, exclude_classes=list(exclude_classes), exclude_ids=list(exclude_ids))
    if arch is None and config.get("kind", "munkey") == "munkey":
        return train_run(config["dataset"], out, encoder=config["encoder"]["name"], keep_checkpoints=1, **common)
    return train_classifier_run(config["dataset"], out, arch=arch or config["arch"], **common).root
