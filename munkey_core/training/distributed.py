"""Multi-process MUNKEY training with PyTorch DistributedDataParallel (gloo on CPU, NCCL on GPUs).

Launch (writes the same run directory as `munkey train`):

    torchrun --nproc_per_node 2 -m munkey_core.training.distributed --dataset digits --out runs/ddp --profile cpu

(per-sample clipping, `--per-sample-clip C`, trains in one process only: every rank refuses it before training)

Design: data parallel over each global batch, with results equal to single-process training; the
loop is train.py's (one loop for one or many processes), this module launches it.
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
Tests: tests/training/test_ddp.py (2 CPU processes vs single-process `train_munkey`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from munkey_core.config import ModelConfig, TrainConfig, resolve_profile, with_overrides
from munkey_core.data import datasets as data_mod
from munkey_core.errors import MunkeyError
from munkey_core.keys import encoders as keys_mod
from munkey_core.run.paths import RunPaths, check_new_run_dir
from munkey_core.training.train import TrainData, TrainResult, train_munkey, world
from munkey_core.training.runs import write_run


def train_distributed(model_cfg: ModelConfig, cfg: TrainConfig, train: TrainData, *, val: TrainData | None = None,
                      device: torch.device = torch.device("cpu"), checkpoint_dir: Path | None = None,
                      keep_checkpoints: int = 10) -> TrainResult:
    """`train_munkey` (one loop, train.py) across the ranks of the current process group (any world
    size, including 1); each history record names the number of processes. The model follows
    `model_cfg`, late injection included (`model_cfg.inject_at`)."""
    result = train_munkey(model_cfg, cfg, train, val=val, device=device, checkpoint_dir=checkpoint_dir,
                          keep_checkpoints=keep_checkpoints, progress=False)
    size = world()[1]
    for record in result.history:
        record["processes"] = size
    return result


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
    p.add_argument("--per-sample-clip", type=float, default=None,
                   help="per-sample gradient clip (0 = off, the profiles' default; above 0 trains in one process only)")
    args = p.parse_args(argv)
    device = _device(args.device)
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, size = world()
    out = Path(args.out)
    try:
        if rank == 0:
            check_new_run_dir(out)  # never overwrite a user's folder or file
        prof = resolve_profile(args.profile)
        overrides = {k: getattr(args, k) for k in ("epochs", "batch_size", "max_train", "seed", "lr", "inject_at",
                                                   "per_sample_clip")}
        with_overrides(prof.model_for(args.dataset), overrides)  # a bad --inject-at fails here, before any data is loaded
        cfg = with_overrides(prof.train_for(args.dataset), overrides)
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
        model_cfg = with_overrides(prof.model_for(args.dataset), {**overrides, "in_chans": ds.channels, "num_classes": ds.num_classes})
        t0 = time.perf_counter()
        result = train_distributed(model_cfg, cfg, TrainData(ds.train.images, ds.train.labels, ds.train.ids, tr_keys),
                                   val=TrainData(ds.val.images, ds.val.labels, ds.val.ids, va_keys), device=device,
                                   checkpoint_dir=RunPaths(out).checkpoints if rank == 0 else None)
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
