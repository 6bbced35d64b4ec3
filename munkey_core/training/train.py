"""MUNKEY training: backbone, adapter, null tokens and every exemplar v_i, jointly, with cross-entropy.

Per sample and step (SPEC.md section 2):
- pathway dropout: with p_drop_image the patches become null_img, with p_drop_token the exemplar
  token becomes null_tok (mutually exclusive; otherwise both pathways are on);
- retrieval simulation: with p_retrieval the token is h(sum_j w_j v_j) over the K' nearest *other*
  training samples (w = softmax(sim / tau)), with gradients into those v_j stopped; otherwise h(v_i).
- target (`absent_target_mix` = a, default 0): on steps where the sample's own exemplar is absent
  (retrieval simulation or token dropped, image present) the target is (1 - a) onehot(y_i) + a q_i,
  q_i its K' neighbours' label distribution (the retrieval weights); a > 0 keeps the backbone from
  fitting the hard label of an image without its exemplar, which is what survives a deletion.
- skipping (`absent_skip_hardest` = s, default 0): on those steps the share s of the absent samples of the
  batch with the highest loss gives no gradient, so an image whose neighbours' exemplars disagree with
  its label is fitted only together with its own exemplar, which a deletion removes.
Keys are frozen, so the K' neighbour lists are computed once before the first epoch.
AdamW (betas 0.9/0.99) over everything, linear warm-up then cosine decay per step.
With `ema_epochs` > 0 the weights and exemplars validated, checkpointed and shipped are an exponential
moving average of the trained ones (torch's AveragedModel; the optimiser's trajectory is unchanged).
With `per_sample_clip` > 0 (an option; per_sample.py) each sample's gradient of the shared weights is
clipped, and optionally noised, before the batch mean (DP-SGD style), at about 2.4 times the step cost.
Cost per step: one plain-ViT forward/backward with one extra token, plus a (B, K', Dv) gather.

One loop serves one process and a DistributedDataParallel group (distributed.py launches it):
every rank draws the *global* batch, its augmentation and its pathway/retrieval masks from the same
seeded generator (the single-process random stream), then keeps its contiguous shard of the batch.
The backbone is wrapped in DDP; the exemplar rows of the batch (B x Dv, not N x Dv) have their
gradients all-reduced, so every rank takes the same AdamW step on every row. Each rank's loss is
sum(CE over its shard) * world / B, so the averaged gradient is that of the global batch mean even
when the last batch splits unevenly. Rank 0 validates and writes the checkpoints.
Tests: tests/training/test_train.py, tests/training/test_ddp.py (2 processes equal 1).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm.auto import tqdm

from munkey_core.config import ModelConfig, TrainConfig
from munkey_core.errors import MunkeyError
from munkey_core.bank.memory import MemoryBank
from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
from munkey_core.model.predict import predict
from munkey_core.run.paths import checkpoint_file
from munkey_core.run.rows import checkpoints, remove_checkpoint, write_checkpoint
from munkey_core.training.losses import step_loss
from munkey_core.training.per_sample import clipped_backward
from munkey_core.training.torchfix import odd_batch_guard

EpochCallback = Callable[[dict], None]
_VAL_CAP = 1000  # validation samples scored per epoch (enough to follow the curve)
_POSTFIX_EVERY = 50  # steps between the progress bar's loss readings


@dataclass
class TrainData:
    """One split ready for training: uint8 images (N, H, W, C), labels, ids and unit-norm keys."""

    images: np.ndarray
    labels: np.ndarray
    ids: np.ndarray
    keys: np.ndarray


@dataclass
class TrainResult:
    model: MunkeyViT
    bank: MemoryBank
    history: list[dict] = field(default_factory=list)


def neighbour_table(bank: MemoryBank, k_train: int, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For every bank row, its K' nearest other rows and their softmax(sim / tau) weights."""
    sims, rows = bank.search(bank.keys, k_train, exclude=[[int(i)] for i in bank.ids])
    return rows, torch.softmax(sims / tau, dim=1)


def random_shift(x: torch.Tensor, fraction: float, gen: torch.Generator) -> torch.Tensor:
    """Translate each image by up to `fraction` of its side (border padding): cheap augmentation."""
    if fraction <= 0:
        return x
    b = x.shape[0]
    shift = to_device(torch.rand(b, 2, generator=gen) * 2 - 1, x.device) * (2 * fraction)  # normalised coords
    theta = torch.zeros(b, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    theta[:, :, 2] = shift
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (drawn on the CPU from the seeded generator) on `device`. On a GPU through pinned memory and
    without blocking, so a step's random draws do not make the host wait for the GPU's queue to drain."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def cosine_schedule(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up to 1, then cosine to 0."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


class _Trained(nn.Module):
    """The backbone and the exemplar matrix as one module, so one AveragedModel averages both."""

    def __init__(self, model: MunkeyViT, values: nn.Parameter) -> None:
        super().__init__()
        self.model = model
        self.values = values


def weight_average(model: MunkeyViT, values: nn.Parameter, ema_epochs: float,
                   steps_per_epoch: int) -> tuple[_Trained, AveragedModel | None]:
    """(the trained weights, their exponential moving average or None when ema_epochs is 0). The per-step
    decay 1 - 1 / (ema_epochs x steps_per_epoch) gives the average a horizon of about ema_epochs epochs."""
    trained = _Trained(model, values)
    if ema_epochs <= 0:
        return trained, None
    decay = max(0.0, 1.0 - 1.0 / (ema_epochs * steps_per_epoch))
    return trained, AveragedModel(trained, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


def world() -> tuple[int, int]:
    """(rank, world size) of the current process group; (0, 1) when none is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train_munkey(model_cfg: ModelConfig, cfg: TrainConfig, train: TrainData, *, val: TrainData | None = None,
                 device: torch.device = torch.device("cpu"), checkpoint_dir: Path | None = None,
                 keep_checkpoints: int = 10, progress: bool = True,
                 on_epoch: EpochCallback | None = None) -> TrainResult:
    """Train a MUNKEY model on `train`; returns the model, the trained bank and per-epoch history.
    Across the ranks of the current process group when there is one (see the module docstring)."""
    rank, size = world()
    if size > 1 and cfg.per_sample_clip > 0:
        raise MunkeyError("per_sample_clip trains in one process only (its per-sample gradients are not split across "
                          "ranks): train without torchrun, or pass --per-sample-clip 0 (per_sample_clip=0).")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = MunkeyViT(model_cfg).to(device)
    bank = MemoryBank.create(train.ids, train.labels, train.keys, model_cfg.exemplar_dim, seed=cfg.seed,
                             init_std=cfg.exemplar_init_std).to(device)
    nbr_rows, nbr_w = neighbour_table(bank, cfg.k_train, cfg.tau)  # (N, K'), (N, K')
    nbr_q = neighbour_label_dist(bank, nbr_rows, nbr_w, model_cfg.num_classes).to(device)  # (N, C)
    values = nn.Parameter(bank.values.clone())  # (N, Dv), row i = exemplar of bank.ids[i]
    groups = model.param_groups(cfg.weight_decay) + [{"params": [values], "weight_decay": cfg.weight_decay,
                                                      "lr": cfg.lr * cfg.exemplar_lr_scale}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                            fused=True if device.type == "cuda" else None)  # one kernel per step on a GPU
    net: nn.Module = model
    if size > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    n = len(bank)
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_schedule(total, int(cfg.warmup_epochs * steps_per_epoch)))
    trained, averaged = weight_average(model, values, cfg.ema_epochs, steps_per_epoch)
    shipped = trained if averaged is None else averaged.module  # what is validated, checkpointed and returned
    images = torch.from_numpy(np.ascontiguousarray(train.images)).to(device)  # (N, H, W, C) uint8
    labels = torch.from_numpy(train.labels.astype(np.int64)).to(device)
    history: list[dict] = []
    bar = tqdm(total=total, desc="train", unit="step", disable=not progress or rank != 0, dynamic_ncols=True)
    for epoch in range(1, cfg.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        stats = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct (this rank's shard)
        for idx in to_device(torch.randperm(n, generator=gen), device).split(cfg.batch_size):
            b = len(idx)
            x = random_shift(preprocess_images(images[idx], model_cfg.img_size), cfg.augment_shift, gen)
            token, drop_img, drop_tok, absent = _sample_tokens(values, idx, nbr_rows, nbr_w, cfg, gen)
            part = torch.arange(b, device=device).tensor_split(size)[rank]  # this rank's shard of the batch
            y = labels[idx[part]]
            opt.zero_grad(set_to_none=True)
            with odd_batch_guard(len(part)):
                if cfg.per_sample_clip > 0:  # one process (checked above); sets every .grad itself
                    logits, loss_sum = clipped_backward(model, x, token, drop_img, drop_tok, y, absent, nbr_q[idx],
                                                        cfg, gen)
                    loss_sum = loss_sum.double()
                elif size == 1:
                    logits = net(x, token, drop_img, drop_tok)  # the batch mean, as one process always computed it
                    loss = step_loss(logits, y, absent, nbr_q[idx], cfg, reduction="mean")
                    loss_sum = loss.detach().double() * b
                    loss.backward()
                else:
                    logits = net(x[part], token[part], drop_img[part], drop_tok[part])
                    loss_sum = step_loss(logits, y, absent[part], nbr_q[idx[part]], cfg)
                    loss = loss_sum * (size / b)
                    loss.backward()
            if size > 1:  # every rank steps every exemplar row of the global batch alike
                rows_grad = values.grad[idx] if values.grad is not None else torch.zeros(b, values.shape[1], device=device)
                dist.all_reduce(rows_grad)
                if values.grad is None:
                    values.grad = torch.zeros_like(values)
                values.grad[idx] = rows_grad / size
            opt.step()
            sched.step()
            if averaged is not None:
                averaged.update_parameters(trained)
            stats += torch.stack([loss_sum.detach().double(), (logits.argmax(1) == y).sum().double()])
            bar.update(1)
            if bar.n % _POSTFIX_EVERY == 0 and not bar.disable:  # .item() waits for the GPU: not every step
                bar.set_postfix(epoch=epoch, loss=f"{loss_sum.item() / len(part):.3f}")
        if size > 1:
            dist.all_reduce(stats)
        bank.values = shipped.values.detach()
        record = {"epoch": epoch, "loss": stats[0].item() / n, "train_acc": 100.0 * stats[1].item() / n,
                  "lr": sched.get_last_lr()[0], "seconds": time.perf_counter() - t0}
        if rank == 0 and val is not None and len(val.labels):
            record["val_acc"] = validation_accuracy(shipped.model, bank, val, cfg)
        history.append(record)
        bar.set_postfix(epoch=epoch, loss=f"{record['loss']:.3f}", acc=f"{record['train_acc']:.1f}",
                        val=f"{record.get('val_acc', float('nan')):.1f}")
        if rank == 0 and checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, epoch, shipped.model, bank, record, keep_checkpoints)
        if rank == 0 and on_epoch is not None:
            on_epoch(record)
    bar.close()
    bank.values = shipped.values.detach().clone()
    state = opt.state[values]  # the optimiser's moments of the trained rows (the average has none)
    bank.moments = {"exp_avg": state["exp_avg"].detach().clone(), "exp_avg_sq": state["exp_avg_sq"].detach().clone()}
    return TrainResult(shipped.model.eval(), bank, history)


def neighbour_label_dist(bank: MemoryBank, nbr_rows: torch.Tensor, nbr_w: torch.Tensor,
                         num_classes: int) -> torch.Tensor:
    """(N, C): row i = sum_j w_ij onehot(label of neighbour j), the label distribution retrieval gives sample i."""
    labels = torch.as_tensor(np.asarray(bank.labels), dtype=torch.int64)[nbr_rows.cpu()]  # (N, K')
    return torch.zeros(len(nbr_rows), num_classes).scatter_add_(1, labels, nbr_w.cpu().float())


def _sample_tokens(values: torch.Tensor, idx: torch.Tensor, nbr_rows: torch.Tensor, nbr_w: torch.Tensor,
                   cfg: TrainConfig, gen: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exemplar vectors (B, Dv) for a batch, the pathway-dropout masks (B,), (B,) and the mask (B,) of
    samples whose own exemplar is absent while their image is present."""
    b = len(idx)
    u = to_device(torch.rand(b, generator=gen), idx.device)
    drop_img = u < cfg.p_drop_image
    drop_tok = (u >= cfg.p_drop_image) & (u < cfg.p_drop_image + cfg.p_drop_token)
    use_nbrs = to_device(torch.rand(b, generator=gen) < cfg.p_retrieval, idx.device)
    own = values[idx]  # (B, Dv)
    mixed = (nbr_w[idx][..., None] * values.detach()[nbr_rows[idx]]).sum(dim=1)  # (B, Dv), stop-grad
    absent = (drop_tok | use_nbrs) & ~drop_img
    return torch.where(use_nbrs[:, None], mixed, own), drop_img, drop_tok, absent


def validation_accuracy(model: MunkeyViT, bank: MemoryBank, val: TrainData, cfg: TrainConfig) -> float:
    """Ensemble accuracy (percent) on up to _VAL_CAP validation samples."""
    m = min(len(val.labels), _VAL_CAP)
    device = next(model.parameters()).device
    x = preprocess_images(torch.from_numpy(np.ascontiguousarray(val.images[:m])).to(device), model.cfg.img_size)
    preds = predict(model, bank, x, val.keys[:m], k=cfg.k, tau=cfg.tau, neighbour_predictions=False)
    model.train()
    return float(100.0 * (preds.labels == val.labels[:m]).mean())


def save_checkpoint(directory: Path, epoch: int, model: MunkeyViT, bank: MemoryBank, record: dict,
                    keep: int) -> Path:
    """Write epoch `epoch`'s weights (epoch_NNN.pt) and exemplar rows (epoch_NNN.rows, a fixed-row file
    that a deletion purges in place; runstore.py); keep only the newest `keep` (0 keeps all)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_file(directory, epoch)
    write_checkpoint(path, {"epoch": epoch, "record": record, "model": model.state_dict()},
                     bank.ids, bank.labels, bank.values.detach().cpu().numpy())
    if keep > 0:
        for old in checkpoints(directory)[:-keep]:
            remove_checkpoint(old)
    return path
