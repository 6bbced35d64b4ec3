"""Train a conventional classifier run (ResNet-18 or plain ViT): `munkey train --arch`.

A classifier run directory holds config.json (kind "classifier", arch, dataset, sizes, recipe,
excluded classes), model.pt and history.json (run/loaded.py `ClassifierRun` opens it). Class
oracles are classifier runs trained with `exclude_classes` (the same recipe on the retain data).
The recipe: AdamW, linear warm-up then cosine decay, random-shift augmentation, cross-entropy; the
same as MUNKEY's (training/train.py) so the two compare fairly.
Cost: one plain forward/backward per image and epoch. Tests: tests/unlearn/test_classforget.py, tests/eval/test_mia.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from munkey_core.atomic import atomic_torch_save, atomic_write_json
from munkey_core.config import TrainConfig, resolve_device, resolve_profile, with_overrides
from munkey_core.data import datasets as data_mod
from munkey_core.errors import MunkeyError
from munkey_core.model.classifiers import ARCHS, ClassifierConfig, build_classifier, param_groups, predict_labels
from munkey_core.model.munkey_vit import preprocess_images
from munkey_core.run.loaded import ClassifierRun
from munkey_core.run.paths import FORMAT_VERSION, RunPaths, begin_new_run_dir, check_new_run_dir, end_new_run_dir
from munkey_core.training.torchfix import odd_batch_guard
from munkey_core.training.train import cosine_schedule, random_shift

# Per-profile ResNet-18 budgets (the ViT reuses the MUNKEY profile's backbone and recipe unchanged).
RESNET_PROFILES: dict[str, tuple[dict, dict]] = {
    "tiny": ({"width": 8}, {"epochs": 3, "lr": 2e-3}),
    "cpu": ({"width": 16}, {"epochs": 12, "lr": 2e-3}),       # ~20 s/epoch on 10k 28 px images, 2 cores
    "vit-tiny": ({"width": 64, "img_size": 32}, {"epochs": 60, "lr": 1e-3}),  # the standard ResNet-18 (GPU)
}


def classifier_recipe(arch: str, profile: str, num_classes: int, in_chans: int,
                      overrides: dict | None = None, dataset: str = "") -> tuple[ClassifierConfig, TrainConfig, str]:
    """(model config, training config, profile name) for `arch` under a MUNKEY size profile (with the
    profile's measured training changes for `dataset`, as a MUNKEY run of that dataset gets; the measured
    backbone changes, `Profile.model_for`, are MUNKEY's own: the baselines keep the profile's backbone)."""
    if arch not in ARCHS:
        raise MunkeyError(f"Unknown architecture '{arch}'. Choose one of: munkey, {', '.join(ARCHS)}.")
    prof = resolve_profile(profile)
    m = prof.model
    cfg = ClassifierConfig(arch=arch, img_size=m.img_size, in_chans=in_chans, num_classes=num_classes,
                           patch_size=m.patch_size, embed_dim=m.embed_dim, depth=m.depth, num_heads=m.num_heads,
                           mlp_ratio=m.mlp_ratio, drop_path_rate=m.drop_path_rate)
    # the absent-target mix, the skip and the per-sample clip are MUNKEY training rules (the first two need the
    # bank's exemplars; train_classifier has no per-sample step): a baseline records 0
    train_cfg = replace(prof.train_for(dataset), absent_target_mix=0.0, absent_skip_hardest=0.0,
                        per_sample_clip=0.0, per_sample_noise=0.0)
    if arch == "resnet18":
        model_over, train_over = RESNET_PROFILES[prof.name]
        cfg, train_cfg = replace(cfg, **model_over), replace(train_cfg, **train_over)
    overrides = dict(overrides or {})
    return with_overrides(cfg, overrides), with_overrides(train_cfg, overrides), prof.name


def train_classifier(cfg: ClassifierConfig, train_cfg: TrainConfig, images: np.ndarray, labels: np.ndarray, *,
                     val: tuple[np.ndarray, np.ndarray] | None = None, device: torch.device = torch.device("cpu"),
                     progress: bool = True, on_epoch: Callable[[dict], None] | None = None
                     ) -> tuple[nn.Module, list[dict]]:
    """Train a classifier on uint8 images (N, H, W, C) and labels; returns the model (eval mode) and history."""
    if len(labels) == 0:
        raise MunkeyError("No training images left to train on (every class was excluded?).")
    torch.manual_seed(train_cfg.seed)
    gen = torch.Generator().manual_seed(train_cfg.seed)
    model = build_classifier(cfg).to(device)
    opt = torch.optim.AdamW(param_groups(model, train_cfg.weight_decay), lr=train_cfg.lr,
                            betas=(train_cfg.beta1, train_cfg.beta2))
    n = len(labels)
    steps = math.ceil(n / train_cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, cosine_schedule(steps * train_cfg.epochs, int(train_cfg.warmup_epochs * steps)))
    x_all = torch.from_numpy(np.ascontiguousarray(images)).to(device)
    y_all = torch.from_numpy(labels.astype(np.int64)).to(device)
    history: list[dict] = []
    bar = tqdm(total=steps * train_cfg.epochs, desc=f"train {cfg.arch}", unit="step", disable=not progress,
               dynamic_ncols=True)
    for epoch in range(1, train_cfg.epochs + 1):
        t0, loss_sum, correct = time.perf_counter(), 0.0, 0
        model.train()
        for idx in torch.randperm(n, generator=gen).to(device).split(train_cfg.batch_size):
            x = random_shift(preprocess_images(x_all[idx], cfg.img_size), train_cfg.augment_shift, gen)
            with odd_batch_guard(len(idx)):
                logits = model(x)
                loss = F.cross_entropy(logits, y_all[idx], label_smoothing=train_cfg.label_smoothing)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == y_all[idx]).sum().item()
            bar.update(1)
        record = {"epoch": epoch, "loss": loss_sum / n, "train_acc": 100.0 * correct / n,
                  "seconds": time.perf_counter() - t0}
        if val is not None and len(val[1]):
            record["val_acc"] = float(100.0 * np.mean(predict_labels(model, val[0][:1000], cfg.img_size) == val[1][:1000]))
        history.append(record)
        bar.set_postfix(epoch=epoch, loss=f"{record['loss']:.3f}", val=f"{record.get('val_acc', float('nan')):.1f}")
        if on_epoch is not None:
            on_epoch(record)
    bar.close()
    return model.eval(), history


def train_classifier_run(dataset: str, out: str | Path, *, arch: str = "resnet18", profile: str = "auto",
                         exclude_classes: Sequence[int] = (), data_root: str | Path | None = None,
                         download: bool = False, device: str = "auto", overrides: dict | None = None,
                         progress: bool = True, on_epoch: Callable[[dict], None] | None = None,
                         extra_config: dict | None = None, exclude_ids: Sequence[int] = ()) -> "ClassifierRun":
    """Train a ResNet-18 or plain ViT on a registry dataset into `out`, optionally without some classes
    (a class oracle) or without some training sample ids (a random-forgetting oracle, a reference model)."""
    paths = RunPaths(check_new_run_dir(out))  # never overwrite a user's folder or file
    dev = resolve_device(device)
    base = with_overrides(resolve_profile(profile).train_for(dataset), dict(overrides or {}))
    ds = data_mod.load_dataset(dataset, data_root, download=download, seed=base.data_seed,
                               max_train=base.max_train or None)
    bad = [c for c in exclude_classes if not 0 <= int(c) < ds.num_classes]
    if bad:
        raise MunkeyError(f"Class(es) {bad} do not exist in {ds.name} (classes 0-{ds.num_classes - 1}).")
    cfg, train_cfg, prof_name = classifier_recipe(arch, profile, ds.num_classes, ds.channels, overrides, dataset)
    keep_train = ~np.isin(ds.train.labels, list(exclude_classes))
    if len(exclude_ids):
        keep_train &= ~np.isin(ds.train.ids, np.asarray(list(exclude_ids), dtype=np.int64))
    keep_val = ~np.isin(ds.val.labels, list(exclude_classes))
    t0 = time.perf_counter()
    model, history = train_classifier(cfg, train_cfg, ds.train.images[keep_train], ds.train.labels[keep_train],
                                      val=(ds.val.images[keep_val], ds.val.labels[keep_val]), device=dev,
                                      progress=progress, on_epoch=on_epoch)
    seconds = time.perf_counter() - t0
    begin_new_run_dir(paths.root)
    atomic_torch_save(paths.model, model.state_dict())
    atomic_write_json(paths.history, history)
    atomic_write_json(paths.config, {
        "format": FORMAT_VERSION, "kind": "classifier", "arch": arch, "dataset": ds.name,
        "data_root": None if data_root is None else str(Path(data_root).resolve()),
        "class_names": list(ds.class_names), "image_shape": list(ds.image_shape), "channels": ds.channels,
        "profile": prof_name, "classifier": asdict(cfg), "train": asdict(train_cfg),
        "exclude_classes": sorted(int(c) for c in exclude_classes), "excluded_ids": len(exclude_ids),
        "train_size": int(keep_train.sum()),
        "train_seconds": round(seconds, 1), "device": str(dev), **(extra_config or {}),
    })
    end_new_run_dir(paths.root)
    return ClassifierRun(paths.root, device=device)
