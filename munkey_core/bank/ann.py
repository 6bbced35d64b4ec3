"""Approximate top-K for large banks: an inverted-file (IVF) index over a BankStore, O(1) deletes.

Why: exact search reads every key (O(N * Dk) per query batch: about 5 GB at 1M x 1280 fp32).
IVF scores `nlist` centroids, then only the rows of the `nprobe` best lists, exactly (re-ranked on
the stored keys), so a query reads about N * nprobe / nlist keys.

Deletion keeps the store's guarantees:
- the index holds *row numbers only*, never key bytes; it follows every store delete through the
  store's listener hook in O(1) per id (remove the row from its list by swap-with-last, rename the
  row the store moved);
- the centroids are fitted on keys *outside* the bank (a held-out or public sample, e.g. the
  validation split), so no centroid is a function of a key that may later be deleted.
  `fit` says so by taking the training keys explicitly.
Build it after the last append (rows appended later are not indexed). The index is derived data kept in memory (4 + 8 bytes per row plus the lists); rebuilding it is
one assignment pass, O(N * nlist * Dk).
Tests: tests/bank/test_perf_ann.py.
"""

from __future__ import annotations

import numpy as np
import torch

from munkey_core.bank.store import BankStore, as_tensor
from munkey_core.errors import MunkeyError


def spherical_kmeans(x: np.ndarray, nlist: int, iters: int = 10, seed: int = 0) -> np.ndarray:
    """Unit-norm centroids (nlist, D) of the unit vectors x by cosine k-means."""
    if len(x) < nlist:
        raise MunkeyError(f"Fitting {nlist} lists needs at least {nlist} training keys (got {len(x)}).")
    gen = np.random.default_rng(seed)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    cent = xt[torch.from_numpy(gen.choice(len(x), nlist, replace=False))].clone()
    for _ in range(iters):
        assign = (xt @ cent.T).argmax(1)
        sums = torch.zeros_like(cent).index_add_(0, assign, xt)
        counts = torch.bincount(assign, minlength=nlist)
        empty = counts == 0
        sums[empty] = xt[torch.from_numpy(gen.choice(len(x), int(empty.sum()), replace=False))]
        cent = sums / sums.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return cent.numpy()


class IVFIndex:
    """Inverted lists of store rows under fixed centroids; follows the store's deletions."""

    def __init__(self, store: BankStore, centroids: np.ndarray, *, nprobe: int = 8, chunk: int = 65_536) -> None:
        """Assign every row of `store` to its nearest centroid and subscribe to its deletions."""
        self.store = store
        self.centroids = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
        self.nlist = len(centroids)
        self.nprobe = nprobe
        cap = store.capacity
        self.list_of = np.full(cap, -1, dtype=np.int32)   # row -> list
        self.pos_of = np.full(cap, -1, dtype=np.int64)    # row -> position inside its list
        self._lists = [np.empty(16, dtype=np.int64) for _ in range(self.nlist)]
        self._len = np.zeros(self.nlist, dtype=np.int64)
        assign = np.empty(len(store), dtype=np.int32)
        for start in range(0, len(store), chunk):
            block = as_tensor(store.keys[start:start + chunk])
            assign[start:start + len(block)] = (block @ self.centroids.T).argmax(1).numpy()
        order = np.argsort(assign, kind="stable")
        bounds = np.searchsorted(assign[order], np.arange(self.nlist + 1))
        for lst in range(self.nlist):
            rows = order[bounds[lst]:bounds[lst + 1]].astype(np.int64)
            self._lists[lst] = np.concatenate([rows, np.empty(max(16, len(rows) // 4), dtype=np.int64)])
            self._len[lst] = len(rows)
            self.list_of[rows] = lst
            self.pos_of[rows] = np.arange(len(rows))
        store.listeners.append(self)

    @classmethod
    def fit(cls, store: BankStore, train_keys: np.ndarray, *, nlist: int, nprobe: int = 8, iters: int = 10,
            seed: int = 0) -> "IVFIndex":
        """Centroids from `train_keys` (keys *not* in the bank), then index every row of `store`."""
        return cls(store, spherical_kmeans(train_keys, nlist, iters, seed), nprobe=nprobe)

    def list_rows(self, lst: int) -> np.ndarray:
        return self._lists[lst][:self._len[lst]]

    def on_delete(self, removed_rows: np.ndarray, moves: list[tuple[int, int]]) -> None:
        """Mirror a store swap-delete: drop the removed rows, then rename each moved row source -> target."""
        for row in removed_rows.tolist():
            lst, pos = int(self.list_of[row]), int(self.pos_of[row])
            last = self._len[lst] - 1
            tail = int(self._lists[lst][last])
            self._lists[lst][pos] = tail
            self.pos_of[tail] = pos
            self._lists[lst][last] = -1
            self._len[lst] = last
            self.list_of[row] = -1
            self.pos_of[row] = -1
        for target, source in moves:
            lst, pos = int(self.list_of[source]), int(self.pos_of[source])
            self._lists[lst][pos] = target
            self.list_of[target], self.pos_of[target] = lst, pos
            self.list_of[source], self.pos_of[source] = -1, -1

    def search(self, queries: torch.Tensor | np.ndarray, k: int,
               nprobe: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Approximate cosine top-k: (similarities (Q, k), rows (Q, k)); -inf / -1 pad when too few rows.

        Cost per query: nlist centroid scores plus exact scores of the probed lists' rows.
        """
        q = torch.as_tensor(np.asarray(queries, dtype=np.float32))
        if q.ndim == 1:
            q = q[None]
        if len(self.store) == 0:
            raise MunkeyError("The memory bank is empty: every training sample has been deleted.")
        probes = torch.topk(q @ self.centroids.T, min(nprobe or self.nprobe, self.nlist), dim=1).indices.numpy()
        out_s = torch.full((len(q), k), float("-inf"))
        out_r = torch.full((len(q), k), -1, dtype=torch.int64)
        for i, lists in enumerate(probes):
            rows = np.concatenate([self.list_rows(int(lst)) for lst in lists])
            if len(rows) == 0:
                continue
            rows.sort()  # sequential reads of the memory map
            scores = self.store.gather_keys(rows) @ q[i]
            s, pos = torch.topk(scores, min(k, len(rows)))
            out_s[i, :len(s)] = s
            out_r[i, :len(s)] = torch.from_numpy(rows)[pos]
        return out_s, out_r
