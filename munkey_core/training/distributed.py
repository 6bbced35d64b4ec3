"""Multi-process MUNKEY training with PyTorch DistributedDataParallel (gloo on CPU, NCCL on GPUs).

Launch (writes the same run directory as `munkey train`):

    torchrun --nproc_per_node 2 -m munkey_core.training.distributed --dataset digits --out runs/ddp --profile cpu

Design: data parallel over each global batch, with results equal to single-process training.
- Every rank draws the *global* batch, its augmentation and its pathway/retrieval masks from the
  same seeded generator (so the random stream is the single-process one), then keeps its
  contiguous shard of the batch (`--batch-size` is the global batch).
- The backbone, adapter and null tokens are wrapped in DDP (gradients averaged by all-reduce).
- The exemplar bank is *replicated*: every rank holds all N exemplar rows and their AdamW
  moments, and after each backward the gradient rows of the global batch (B x Dv, not N x Dv)
  are all-reduced, so every rank takes the identical AdamW step on every row. Cost per step:
  one (B, Dv) all-reduce besides DDP's; memory: the full bank on every rank (at 1M x 128 fp32 with
  two moments, 1.5 GB per rank: shard the bank by row owner beyond that).
- Each rank's loss is sum(CE over its shard) * world / B, so the averaged gradient equals the
  gradient of the global batch mean even when the last batch splits unevenly.
Rank 0 validates, writes checkpoints and the run directory. With one process it is plain training.
Tests: tests/test_ddp.py (2 CPU processes vs single-process `train_munkey`).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from munkey_core.config import ModelConfig, TrainConfig
from munkey_core.bank.memory import MemoryBank
from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
from munkey_core.training.train import (TrainData, TrainResult, _sample_tokens, cosine_schedule, neighbour_table,
                               random_shift, save_checkpoint, validation_accuracy)


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when no process group is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train_distributed(model_cfg: ModelConfig, cfg: TrainConfig, train: TrainData, *, val: TrainData | None = None,
                      device: torch.device = torch.device("cpu"), checkpoint_dir: Path | None = None,
                      keep_checkpoints: int = 10) -> TrainResult:
    """`train_munkey` across the ranks of the current process group (any world size, including 1).

    The model follows `model_cfg`, late injection included (`model_cfg.inject_at`)."""
    rank, size = world()
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = MunkeyViT(model_cfg).to(device)
    bank = MemoryBank.create(train.ids, train.labels, train.keys, model_cfg.exemplar_dim, seed=cfg.seed,
                             init_std=cfg.exemplar_init_std).to(device)
    nbr_rows, nbr_w = neighbour_table(bank, cfg.k_train, cfg.tau)
    values = nn.Parameter(bank.values.clone())
    groups = model.param_groups(cfg.weight_decay) + [{"params": [values], "weight_decay": cfg.weight_decay,
                                                      "lr": cfg.lr * cfg.exemplar_lr_scale}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    net: nn.Module = model
    if size > 1:
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    n = len(bank)
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_schedule(total, int(cfg.warmup_epochs * steps_per_epoch)))
    images = torch.from_numpy(np.ascontiguousarray(train.images)).to(device)
    labels = torch.from_numpy(train.labels.astype(np.int64)).to(device)
    history: list[dict] = []
    for epoch in range(1, cfg.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        stats = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
        for idx in torch.randperm(n, generator=gen).to(device).split(cfg.batch_size):
            b = len(idx)
            x = random_shift(preprocess_images(images[idx], model_cfg.img_size), cfg.augment_shift, gen)
            token, drop_img, drop_tok = _sample_tokens(values, idx, nbr_rows, nbr_w, cfg, gen)
            part = torch.arange(b, device=device).tensor_split(size)[rank]
            logits = net(x[part], token[part], drop_img[part], drop_tok[part])
            y = labels[idx[part]]
            loss_sum = F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing, reduction="sum")
            opt.zero_grad(set_to_none=True)
            (loss_sum * (size / b)).backward()
            if size > 1:
                rows_grad = values.grad[idx] if values.grad is not None else torch.zeros(b, values.shape[1], device=device)
                dist.all_reduce(rows_grad)
                if values.grad is None:
                    values.grad = torch.zeros_like(values)
                values.grad[idx] = rows_grad / size
            opt.step()
            sched.step()
            stats += torch.stack([loss_sum.detach().double(), (logits.argmax(1) == y).sum().double()])
        if size > 1:
            dist.all_reduce(stats)
        bank.values = values.detach()
        record = {"epoch": epoch, "loss": stats[0].item() / n, "train_acc": 100.0 * stats[1].item() / n,
                  "lr": sched.get_last_lr()[0], "seconds": time.perf_counter() - t0, "processes": size}
        if rank == 0 and val is not None and len(val.labels):
            record["val_acc"] = validation_accuracy(model, bank, val, cfg)
        history.append(record)
        if rank == 0 and checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, epoch, model, bank, record, keep_checkpoints)
    bank.values = values.detach().clone()
    state = opt.state[values]
    bank.moments = {"exp_avg": state["exp_avg"].detach().clone(), "exp_avg_sq": state["exp_avg_sq"].detach().clone()}
    return TrainResult(model.eval(), bank, history)


def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def main(argv: list[str] | None = None) -> int:
    """Entry point for `torchrun ... -m munkey_core.training.distributed`: train and (rank 0) write a run."""
    from munkey_core.data import datasets as data_mod
    from munkey_core.keys import encoders as keys_mod
    from munkey_core.config import resolve_profile, with_overrides
    from munkey_core.errors import MunkeyError
    from munkey_core.service import write_run

    p = argparse.ArgumentParser(prog="torchrun ... -m munkey_core.training.distributed", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--out", required=True)
    p.add_argument("--profile", default="auto")
    p.add_argument("--encoder", default=keys_mod.DEFAULT_ENCODER)
    p.add_argument("--data-root", default=None)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    for name in ("epochs", "batch_size", "max_train", "seed"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--inject-at", type=int, default=None,
                   help="block the exemplar token joins at (0: the paper's design; L > 0: late injection)")
    args = p.parse_args(argv)
    device = _device(args.device)
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, size = world()
    out = Path(args.out)
    try:
        if rank == 0 and (out / "config.json").exists():
            raise MunkeyError(f"{out} already holds a run. Choose another --out, or delete that directory first.")
        prof = resolve_profile(args.profile)
        overrides = {k: getattr(args, k) for k in ("epochs", "batch_size", "max_train", "seed", "lr", "inject_at")}
        with_overrides(prof.model, overrides)  # a bad --inject-at fails here, before any data is loaded
        cfg = with_overrides(prof.train, overrides)
        ds = data_mod.load_dataset(args.dataset, args.data_root, seed=cfg.data_seed, max_train=cfg.max_train or None)
        enc = keys_mod.load_encoder(args.encoder, device=device)
        for turn in range(2):  # rank 0 fills the key cache first, the others then read it
            if (turn == 0) == (rank == 0):
                tr_keys = keys_mod.cached_keys(enc, ds.train.images, ds.train.ids, dataset=ds.name, split="train",
                                               progress=False)
                va_keys = keys_mod.cached_keys(enc, ds.val.images, ds.val.ids, dataset=ds.name, split="val",
                                               progress=False)
            if size > 1:
                dist.barrier()
        model_cfg = with_overrides(prof.model, {**overrides, "in_chans": ds.channels, "num_classes": ds.num_classes})
        t0 = time.perf_counter()
        result = train_distributed(model_cfg, cfg, TrainData(ds.train.images, ds.train.labels, ds.train.ids, tr_keys),
                                   val=TrainData(ds.val.images, ds.val.labels, ds.val.ids, va_keys), device=device,
                                   checkpoint_dir=out / "checkpoints" if rank == 0 else None)
        if rank == 0:
            write_run(out, result, ds, enc, prof.name, model_cfg, cfg, data_root=args.data_root,
                      seconds=time.perf_counter() - t0, device=device, extra={"processes": size})
            print(f"trained on {size} process(es); run written to {out}")
    except MunkeyError as exc:
        print(f"error: {exc}")
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
