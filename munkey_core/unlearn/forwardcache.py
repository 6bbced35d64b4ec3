"""Forward passes of a MUNKEY run's test images, kept and reused by class-unlearning requests.

A class request measures many (model, bank) pairs on the same test images: the unedited run, the
copy UnAct edits after each round, the bank without the class (key deletion), the masked logit.
They share most of their computation:
- retrieval reads only keys, and a bank derived from the run's by deletions changes an image's
  neighbours only where one of them was deleted: every other (image, exemplar) pair is the same;
- UnAct edits the MLPs of the last `vit_blocks(depth)` blocks and the classifier only, so for a
  given (image, exemplar) pair everything before the first edited MLP (patch embedding, the earlier
  blocks, that block's attention) is the unedited model's.

`ForwardCache` keeps, per (test image, exemplar id) pair it has seen, the residual stream entering
the first editable MLP (the "prefix", (T, D)) and the unedited model's final [CLS] features (D,).
A prediction for (model, bank) retrieves the neighbours in `bank`, computes the pairs it has not
seen with the unedited model, then runs only what the model changes: the classifier alone when
nothing else differs from the unedited weights (the unedited run itself, the masked logit), the
blocks from the first editable MLP on when only those and the classifier differ (UnAct), the whole
`predict` otherwise. Which case applies is decided by comparing the weights tensor by tensor, never
assumed. The computation is `predict`'s (ensemble mode), split in two; tests check that the labels
and probabilities agree. Pairs are stored while they fit `PREFIX_BUDGET` bytes; beyond it the
prediction is computed in full. The last few predictions are also remembered by the content of the
weights that differ, the bank and the rows, so asking twice costs nothing.
Tests: tests/unlearn/test_forwardcache.py.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from munkey_core.bank.memory import MemoryBank
from munkey_core.model.predict import neighbour_weights, predict
from munkey_core.run.loaded import LoadedMunkeyRun
from munkey_core.unlearn.unact import vit_blocks

PREFIX_BUDGET = 512 * 2**20  # bytes of stored prefixes (cpu profile: 9 KB a pair; ~58,000 pairs)
MEMO = 8  # predictions remembered
_BATCH = 256  # pairs per forward (predict's CPU batch: 256 sequences)


def _digest(*tensors: torch.Tensor | np.ndarray) -> str:
    h = hashlib.sha1()
    for t in tensors:
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def prefix_of(model: nn.Module, x: torch.Tensor, v: torch.Tensor, cut: int) -> torch.Tensor:
    """A MUNKEY ViT's residual stream entering block `cut`'s MLP (cut >= the block the exemplar token
    joins at): x (B, C, S, S) images, v (B, Dv) exemplars -> (B, T, D)."""
    shared = model.encode_image(model.embed_image(x))  # (B, 1+N, D)
    h = torch.cat([shared, model.vit.norm_pre(model.exemplar_token(v))], dim=1)
    for block in model.vit.blocks[model.inject_at:cut]:
        h = block(h)
    b = model.vit.blocks[cut]
    return h + b.drop_path1(b.ls1(b.attn(b.norm1(h))))


def suffix_of(model: nn.Module, h: torch.Tensor, cut: int, pre_logits: bool = False) -> torch.Tensor:
    """From the prefix (B, T, D) to the logits (B, classes) or the [CLS] features (B, D) under `model`.

    The head reads only the [CLS] token (global_pool "token"), so after the last block's attention
    (which reads every token) only the [CLS] row goes on: the last MLP runs on B rows, not B*T. The
    same operations on the same rows as the whole block, so the same numbers (a test checks equality)."""
    blocks = model.vit.blocks
    last = len(blocks) - 1
    # the head reads the [CLS] row only
    token = getattr(model.vit, "global_pool", None) == "token" and getattr(model.vit, "attn_pool", None) is None
    b = blocks[cut]
    if token and cut == last:
        h = h[:, :1]
    h = h + b.drop_path2(b.ls2(b.mlp(b.norm2(h))))
    for j in range(cut + 1, len(blocks)):
        b = blocks[j]
        if token and j == last:  # attention reads every token; what follows it, the [CLS] row only (B, 1, D)
            h = h[:, :1] + b.drop_path1(b.ls1(b.attn(b.norm1(h))[:, :1]))
            h = h + b.drop_path2(b.ls2(b.mlp(b.norm2(h))))
        else:
            h = b(h)
    return model.forward_head(model.vit.norm(h), pre_logits=pre_logits)


def prefix_ensemble_forward(model: nn.Module, x: torch.Tensor, values: torch.Tensor, weights: torch.Tensor,
                            cut: int, budget: int = PREFIX_BUDGET):
    """unact.py `munkey_ensemble_forward` for a fixed set of images x (n, C, S, S), each with its K
    exemplars values (n, K, Dv) and ensemble weights (n, K), whose model is edited only from block
    `cut`'s MLP on (UnAct's scope; the retain probe of a class request, re-run every round): the part
    before is computed once, here, and each call runs only the rest, with the model as it is then.
    None when the exemplar token joins after `cut` or the stored part would exceed `budget` bytes."""
    n, k = values.shape[:2]
    tokens = model.vit.patch_embed.num_patches + 2
    if cut < model.inject_at or n * k * tokens * model.cfg.embed_dim * 4 > budget:
        return None
    flat_v = values.reshape(n * k, -1).to(x.device)  # pair (image i, neighbour j) at i*K + j
    parts = []
    with torch.no_grad():
        for s in range(0, n * k, _BATCH):
            pairs = torch.arange(s, min(s + _BATCH, n * k))
            parts.append(prefix_of(model, x[pairs // k], flat_v[pairs], cut))
    pre = torch.cat(parts)  # (n*K, T, D)

    def forward(_x: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        # one call (no chunks): the scope's hooks read each block's activations once per forward
        logits = suffix_of(model, pre[rows.start * k:rows.stop * k], cut)
        return logits, weights[rows].to(logits.device)
    return forward


class ForwardCache:
    """Reusable forwards of one split's images for a MUNKEY run whose model is never edited in place."""

    def __init__(self, run: LoadedMunkeyRun, split: str = "test", budget: int = PREFIX_BUDGET) -> None:
        self.run, self.split, self.budget = run, split, int(budget)
        self.model = run.model.eval()
        self.k, self.tau = int(run.train_cfg.k), float(run.train_cfg.tau)
        blocks = self.model.vit.blocks
        self.cut = len(blocks) - vit_blocks(len(blocks))  # the first block whose MLP UnAct may edit
        self.prefix_ok = self.cut >= self.model.inject_at  # the exemplar token has joined by then
        suffix = [f"vit.blocks.{self.cut}.norm2.", f"vit.blocks.{self.cut}.mlp.", f"vit.blocks.{self.cut}.ls2.",
                  *(f"vit.blocks.{j}." for j in range(self.cut + 1, len(blocks))), "vit.norm.", "vit.fc_norm.",
                  "vit.head."]
        self._suffix_names = tuple(suffix)
        self._base = {n: t.detach().clone() for n, t in self._tensors(self.model)}  # the unedited weights
        self._lock = threading.Lock()
        self._pairs: dict[tuple[int, int], int] = {}  # (split row, exemplar id) -> store position
        dv, d = self.model.cfg.exemplar_dim, self.model.cfg.embed_dim
        self._values = torch.zeros((0, dv))
        self._feats = torch.zeros((0, d))
        self._prefix: torch.Tensor | None = None  # (P, T, D), allocated on first use
        self._memo: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.stats = {"pairs_computed": 0, "pairs_reused": 0, "suffix_runs": 0, "head_runs": 0, "full_runs": 0,
                      "memo_hits": 0}

    # ----- which weights differ -----------------------------------------------------------------
    @staticmethod
    def _tensors(model: nn.Module):
        yield from model.named_parameters()
        yield from model.named_buffers()

    def _differing(self, model: nn.Module) -> list[str]:
        """Names of the model's weights that differ from the unedited model's."""
        if model is self.model:
            return []
        named = dict(self._tensors(model))
        if named.keys() != self._base.keys():
            return ["?"]  # another architecture: nothing is shared
        return [n for n, t in named.items()
                if self._base[n].shape != t.shape or not torch.equal(self._base[n], t.detach().to(self._base[n].device))]

    # ----- the pair store -------------------------------------------------------------------------
    def _ensure_pairs(self, rows: np.ndarray, ids: np.ndarray, values: torch.Tensor) -> np.ndarray | None:
        """Store positions (n, K) of the pairs (rows[i], ids[i, j]) with exemplars values (n, K, Dv),
        computing the ones not stored (or stored with another exemplar); None when they do not fit."""
        n, k = ids.shape
        pos = np.array([[self._pairs.get((int(r), int(e)), -1) for e in row_ids] for r, row_ids in zip(rows, ids)],
                       dtype=np.int64).reshape(n, k)
        found = pos >= 0
        if found.any():  # an id's exemplar is the same in every bank derived from the run's: checked anyway
            same = (self._values[pos[found]] == values[torch.from_numpy(found)]).all(dim=1).numpy()
            stale = np.flatnonzero(found)[~same]
            pos.reshape(-1)[stale] = -1
        need = np.argwhere(pos < 0)  # (M, 2) (image, neighbour)
        self.stats["pairs_reused"] += int(n * k - len(need))
        if not len(need):
            return pos
        tokens = self.model.vit.patch_embed.num_patches + 2  # [CLS], patches, exemplar token
        per_pair = tokens * self.model.cfg.embed_dim * 4
        if (len(self._feats) + len(need)) * per_pair > self.budget:
            return None
        images = self.run.dataset.split(self.split).images
        new_prefix, new_feats = [], []
        with torch.inference_mode():
            for s in range(0, len(need), _BATCH):
                part = need[s:s + _BATCH]
                x = self.run.to_input(images[rows[part[:, 0]]])
                v = values[torch.from_numpy(part[:, 0]), torch.from_numpy(part[:, 1])].to(x.device)
                h = prefix_of(self.model, x, v, self.cut)
                new_prefix.append(h.float().cpu())
                new_feats.append(suffix_of(self.model, h, self.cut, pre_logits=True).float().cpu())
        start = len(self._feats)
        self._prefix = torch.cat(([] if self._prefix is None else [self._prefix]) + new_prefix)
        self._feats = torch.cat([self._feats] + new_feats)
        self._values = torch.cat([self._values, values[torch.from_numpy(need[:, 0]),
                                                       torch.from_numpy(need[:, 1])].float().cpu()])
        at = np.arange(start, start + len(need))
        for (i, j), p in zip(need, at):
            self._pairs[(int(rows[i]), int(ids[i, j]))] = int(p)
        pos[need[:, 0], need[:, 1]] = at
        self.stats["pairs_computed"] += int(len(need))
        return pos

    # ----- predictions ----------------------------------------------------------------------------
    def probabilities(self, model: nn.Module, bank: MemoryBank, index: np.ndarray) -> np.ndarray:
        """Ensemble class probabilities (n, C) of split rows `index` under `model` and `bank`: what
        `predict(model, bank, ...)` returns, reusing every stored pair."""
        index = np.asarray(index, np.int64)
        with self._lock:
            differing = self._differing(model)
            key = (_digest(bank.ids, bank.values), _digest(index),
                   _digest(*[t for n, t in self._tensors(model) if n in set(differing)]), tuple(differing))
            if key in self._memo:
                self._memo.move_to_end(key)
                self.stats["memo_hits"] += 1
                return self._memo[key]
            probs = self._compute(model, bank, index, differing)
            self._memo[key] = probs
            while len(self._memo) > MEMO:
                self._memo.popitem(last=False)
            return probs

    def predict(self, model: nn.Module, bank: MemoryBank, index: np.ndarray) -> np.ndarray:
        """Predicted labels (n,) of split rows `index` under `model` and `bank`."""
        return self.probabilities(model, bank, index).argmax(axis=1)

    @torch.inference_mode()
    def _compute(self, model: nn.Module, bank: MemoryBank, index: np.ndarray, differing: list[str]) -> np.ndarray:
        head_only = all(n.startswith("vit.head.") for n in differing)
        suffix_only = self.prefix_ok and all(n.startswith(self._suffix_names) for n in differing)
        keys = self.run.split_keys(self.split)[index]
        if not (head_only or suffix_only):
            return self._full(model, bank, index, keys)
        sims, found = self._searcher(bank).search(torch.as_tensor(keys, dtype=torch.float32), self.k)  # (n, K)
        at = found.cpu().numpy()
        values = bank.values[found].float().cpu()  # (n, K, Dv)
        pos = self._ensure_pairs(index, bank.ids[at], values)
        if pos is None:  # over the budget: the plain forward
            return self._full(model, bank, index, keys)
        flat = torch.from_numpy(pos.reshape(-1))
        device = next(model.parameters()).device
        if head_only:
            self.stats["head_runs"] += 1
            logits = model.vit.head(self._feats[flat].to(device))
        else:
            self.stats["suffix_runs"] += 1
            logits = torch.cat([suffix_of(model, self._prefix[flat[s:s + _BATCH]].to(device), self.cut,
                                             pre_logits=False) for s in range(0, len(flat), _BATCH)])
        n, k = pos.shape
        w = neighbour_weights(sims.float().to(device), self.tau, "ensemble")  # (n, K)
        probs = (w[..., None] * torch.softmax(logits.reshape(n, k, -1), dim=-1)).sum(dim=1)
        return probs.float().cpu().numpy()

    def _searcher(self, bank: MemoryBank):
        """How `predict_split` searches `bank`: the run's own search path for the run's bank (exact below
        its size threshold, bank/search.py), exact for any other bank."""
        searcher = getattr(self.run, "searcher", None)
        return searcher if bank is self.run.bank and searcher is not None else bank

    def _full(self, model: nn.Module, bank: MemoryBank, index: np.ndarray, keys: np.ndarray) -> np.ndarray:
        self.stats["full_runs"] += 1
        x = self.run.to_input(self.run.dataset.split(self.split).images[index])
        return predict(model, bank, x, keys, k=self.k, tau=self.tau, neighbour_predictions=False,
                       searcher=self._searcher(bank)).probs
