"""Top-K retrieval over a run's bank in one place: exact (the reference) or IVF, by size or by option.

- `BankSearch(bank, cfg, held_out)`: what a loaded run searches through for predict, the deletion
  evidence and the dashboard (run/loaded.py). `search(q, k, exclude)` has MemoryBank.search's
  contract (similarities (Q, k), rows (Q, k), best first).
- The mode: `cfg.mode` 'exact' or 'ivf', or 'auto' (the default): exact below `cfg.exact_below`
  rows, IVF from there on (config.py `SearchConfig`), decided at each search from the bank's size.
- The IVF index (bank/ann.py) is built on the first IVF search, kept in memory and never rebuilt
  on delete: it holds row numbers only and follows every deletion in O(1) per id through the
  bank's listener hook. Its centroids are fitted on `held_out()`, keys outside the bank (the run's
  validation keys), so no centroid depends on a key that may be deleted. `rebind(bank)`, after
  the bank is re-read from disk, keeps the centroids and each remaining id's list (no key read).
- nprobe (lists read per query), unless configured: calibrated when the index is built, the
  smallest of 8, 16, 32, ... whose recall@10 against exact search on up to 512 of the run's
  validation keys reaches `target_recall` (0.95); `recall` keeps the figure reached. The same keys
  fitted the centroids, so it reads a little high (test keys: `munkey bench search RUN`).
- `recall_at_k`: recall@k of the IVF index against exact search on given queries (a run's own
  validation keys in `munkey bench search`).
Cost: building reads every key once (O(N * nlist * Dk): 30-100 s at 1M x 1280 on one core),
plus one exact pass for the calibration queries; an IVF query reads about N * nprobe / nlist keys.
Tests: tests/bank/test_search.py, tests/run/test_search_modes.py.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from munkey_core.bank.ann import IVFIndex, spherical_kmeans
from munkey_core.bank.memory import MemoryBank
from munkey_core.config import SearchConfig
from munkey_core.errors import MunkeyError


FIRST_NPROBE = 8            # where the nprobe calibration starts (then 16, 32, ... up to nlist)
CALIBRATION_QUERIES = 512   # validation keys the recall is measured on when the index is built
RECALL_K = 10


def default_nlist(n_rows: int, n_held_out: int) -> int:
    """About sqrt(bank rows) lists, at most a quarter of the held-out keys (k-means needs several per list)."""
    return max(1, min(int(round(math.sqrt(max(1, n_rows)))), n_held_out // 4))


class BankSearch:
    """The K nearest rows of a bank, exact or through an IVF index, as the configuration says."""

    def __init__(self, bank: MemoryBank, cfg: SearchConfig | None = None,
                 held_out: Callable[[], np.ndarray] | None = None) -> None:
        self.bank = bank
        self.cfg = cfg or SearchConfig()
        self._held_out = held_out
        self.index: IVFIndex | None = None
        self.build_seconds: float | None = None
        self.recall: float | None = None  # recall@10 of the index vs exact on validation keys, once built

    @property
    def mode(self) -> str:
        """'exact' or 'ivf': what the next search uses."""
        if self.cfg.mode != "auto":
            return self.cfg.mode
        return "ivf" if len(self.bank) >= self.cfg.exact_below else "exact"

    def search(self, queries: torch.Tensor | np.ndarray, k: int,
               exclude: Sequence[Iterable[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosine top-k of the current bank: (similarities (Q, k), rows (Q, k)) on the bank's device."""
        if self.mode == "exact":
            return self.bank.search(queries, k, exclude=exclude)
        sims, rows = self.ivf().search(queries, k, exclude=exclude)
        device = self.bank.keys.device
        return sims.to(device), rows.to(device)

    def ivf(self) -> IVFIndex:
        """The IVF index of the current bank (built on first use: one pass over the keys)."""
        if self.index is None:
            if self._held_out is None:
                raise MunkeyError("IVF search needs held-out keys to fit its centroids (the run's validation keys).")
            t = time.perf_counter()
            held = np.asarray(self._held_out(), dtype=np.float32)
            if len(held) == 0:
                raise MunkeyError("IVF search needs the run's validation keys to fit its centroids and this run has "
                                  "none; use --search exact.")
            nlist = self.cfg.nlist or default_nlist(len(self.bank), len(held))
            if nlist > len(held):
                raise MunkeyError(f"IVF with {nlist} lists needs at least {nlist} validation keys (the run has "
                                  f"{len(held)}); choose a smaller nlist or --search exact.")
            index = IVFIndex(self.bank, spherical_kmeans(held, nlist), nprobe=self.cfg.nprobe or FIRST_NPROBE)
            queries = held[np.random.default_rng(0).permutation(len(held))[:CALIBRATION_QUERIES]]
            exact_ids = exact_top_ids(self.bank, queries, RECALL_K)
            if not self.cfg.nprobe:  # the smallest nprobe that reaches the target on the run's own keys
                while True:
                    self.recall = recall_at_k(index, self.bank, queries, RECALL_K, exact_ids=exact_ids)
                    if self.recall >= self.cfg.target_recall or index.nprobe >= index.nlist:
                        break
                    index.nprobe = min(2 * index.nprobe, index.nlist)
            else:
                self.recall = recall_at_k(index, self.bank, queries, RECALL_K, exact_ids=exact_ids)
            self.index = index
            self.build_seconds = time.perf_counter() - t
        return self.index

    def rebind(self, bank: MemoryBank) -> None:
        """Search `bank` (the same bank re-read from disk) from now on; an index built before keeps
        its centroids and each remaining id's list."""
        if self.index is not None:
            self.index = self.index.remap(bank)
        self.bank = bank

    def describe(self) -> dict:
        """What the search does now: mode, bank rows and, once built, the index's lists and build time."""
        out = {"mode": self.mode, "configured": self.cfg.mode, "exact_below": self.cfg.exact_below,
               "bank_rows": len(self.bank)}
        if self.index is not None:
            out.update(nlist=self.index.nlist, nprobe=self.index.nprobe, build_seconds=self.build_seconds,
                       recall_at_10_validation=self.recall)
        return out


def exact_top_ids(bank: MemoryBank, queries: np.ndarray, k: int) -> np.ndarray:
    """The ids (Q, k) of exact search's top-k (the reference recall is measured against)."""
    return bank.ids[bank.search(queries, k)[1].cpu().numpy()]


def recall_at_k(index: IVFIndex, bank: MemoryBank, queries: np.ndarray, k: int = 10,
                nprobe: int | None = None, exact_ids: np.ndarray | None = None) -> float:
    """Mean share of the exact top-k ids that the IVF top-k also returns (queries (Q, Dk))."""
    ex = exact_top_ids(bank, queries, k) if exact_ids is None else exact_ids
    ap = bank.ids[index.search(queries, k, nprobe=nprobe)[1].cpu().numpy()]
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / len(a) for a, b in zip(ex, ap)]))
