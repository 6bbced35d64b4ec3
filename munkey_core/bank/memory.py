"""The exemplar memory bank M = {(id_i, label_i, k_i, v_i)}: search, physical deletion, atomic save.

Storage: dense torch tensors, one row per training sample, plus a dict id -> row.
- search: exact cosine top-K (keys are unit norm, so a matrix product), queries chunked so the
  score matrix never exceeds ~64M floats. Cost O(Q * N * D).
- delete: swap-with-last (one batch, as bank/store.py does it), then the vacated tail rows are
  zeroed and dropped. O(1) per id (one row copy per tensor, vectorised over the batch), and the deleted bytes are overwritten, not tombstoned: nothing of the deleted
  key, exemplar or optimiser-moment rows survives in memory or, after `save`, on disk. Each
  `listeners` entry (an IVF index, bank/ann.py) is told of every row removed and moved, in O(1).
- save: one .npz written to a temporary file, fsync'ed, then renamed over the old one.

Row order is therefore *not* stable across deletions; always address samples by id.
Tests: tests/bank/test_memory.py.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from munkey_core.errors import MunkeyError
from munkey_core.atomic import atomic_write_bytes
from munkey_core.bank.rowmap import DeleteResult, bank_fingerprint, rows_in  # noqa: F401 (DeleteResult: importers)

_SCORE_BUDGET = 64 * 1024 * 1024  # floats in one (queries x bank) score chunk


class MemoryBank:
    """Ids, labels, unit-norm keys (N, Dk), exemplar vectors (N, Dv) and optional optimiser moments."""

    def __init__(
        self,
        ids: np.ndarray,
        labels: np.ndarray,
        keys: torch.Tensor | np.ndarray,
        values: torch.Tensor | np.ndarray,
        moments: dict[str, torch.Tensor | np.ndarray] | None = None,
    ) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if len(np.unique(ids)) != len(ids):
            raise MunkeyError("Memory bank ids must be unique; the run directory looks corrupt.")
        self.ids = ids.copy()
        self.labels = np.asarray(labels, dtype=np.int64).copy()
        self.keys = torch.as_tensor(keys, dtype=torch.float32).contiguous()  # (N, Dk)
        self.values = torch.as_tensor(values, dtype=torch.float32).contiguous()  # (N, Dv)
        self.moments = {k: torch.as_tensor(v, dtype=torch.float32).contiguous() for k, v in (moments or {}).items()}
        n = len(self.ids)
        for name, t in [("labels", self.labels), ("keys", self.keys), ("values", self.values), *self.moments.items()]:
            if len(t) != n:
                raise MunkeyError(f"Memory bank field '{name}' has {len(t)} rows, expected {n}; the run looks corrupt.")
        self._row = {int(i): r for r, i in enumerate(self.ids)}
        self.listeners: list = []  # objects mirroring row positions (an IVF index): told of every swap-delete

    @classmethod
    def create(cls, ids: np.ndarray, labels: np.ndarray, keys: np.ndarray, value_dim: int, *, seed: int = 0,
               init_std: float = 0.02) -> "MemoryBank":
        """A new bank with exemplar vectors drawn from N(0, init_std^2), reproducibly from `seed`."""
        gen = torch.Generator().manual_seed(seed)
        values = torch.randn(len(ids), value_dim, generator=gen) * init_std
        return cls(ids, labels, torch.from_numpy(np.ascontiguousarray(keys, dtype=np.float32)), values)

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, sample_id: int) -> bool:
        return int(sample_id) in self._row

    @property
    def key_dim(self) -> int:
        return int(self.keys.shape[1])

    @property
    def value_dim(self) -> int:
        return int(self.values.shape[1])

    def rows_of(self, ids: Iterable[int]) -> np.ndarray:
        """Row positions of `ids` (all must be present)."""
        return rows_in(self._row, ids)

    def gather_keys(self, rows: np.ndarray) -> torch.Tensor:
        """The keys (len(rows), Dk) of the given rows (a copy, on the bank's device)."""
        return self.keys[torch.as_tensor(np.asarray(rows, dtype=np.int64), device=self.keys.device)]

    def search(self, queries: torch.Tensor | np.ndarray, k: int,
               exclude: Sequence[Iterable[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact cosine top-k: (similarities (Q, k), rows (Q, k)), best first.

        `exclude[q]` lists ids query q must not retrieve (retrieval simulation excludes the sample
        itself). k is clipped to the number of retrievable entries.
        """
        q = torch.as_tensor(queries, dtype=torch.float32).to(self.keys.device)
        if q.ndim == 1:
            q = q[None]
        if len(self) == 0:
            raise MunkeyError("The memory bank is empty: every training sample has been deleted.")
        max_excluded = max((len(list(e)) for e in exclude), default=0) if exclude is not None else 0
        k = max(1, min(k, len(self) - max_excluded))
        chunk = max(1, _SCORE_BUDGET // max(1, len(self)))
        sims, rows = [], []
        for start in range(0, len(q), chunk):
            scores = q[start:start + chunk] @ self.keys.T  # (q, N)
            if exclude is not None:
                for j, ex in enumerate(exclude[start:start + chunk]):
                    ex_rows = [self._row[int(i)] for i in ex if int(i) in self._row]
                    if ex_rows:
                        scores[j, ex_rows] = float("-inf")
            s, r = torch.topk(scores, k, dim=1)
            sims.append(s)
            rows.append(r)
        return torch.cat(sims), torch.cat(rows)

    def delete(self, ids: Iterable[int]) -> DeleteResult:
        """Physically remove the given ids (keys, exemplars, moments); report ids that were absent.

        One batch swap-with-last, as the bank file does it (bank/store.py): each hole below the new
        size takes a kept row from the tail (ascending), the vacated tail rows are zeroed, then
        dropped; the listeners hear of all removed rows and moves at once. Vectorised: a batch of
        1,000 ids costs one gather per tensor, not 1,000 row copies."""
        result = DeleteResult()
        rows: list[int] = []
        for sample_id in dict.fromkeys(int(i) for i in ids):
            row = self._row.get(sample_id)
            if row is None:
                result.absent.append(sample_id)
            else:
                rows.append(row)
                result.deleted.append(sample_id)
        if not rows:
            return result
        n = len(self.ids)
        n_after = n - len(rows)
        dead = set(rows)
        holes = np.array(sorted(r for r in rows if r < n_after), dtype=np.int64)
        sources = np.array([r for r in range(n_after, n) if r not in dead], dtype=np.int64)
        for sample_id in result.deleted:
            del self._row[sample_id]
        if len(holes):
            self.ids[holes] = self.ids[sources]
            self.labels[holes] = self.labels[sources]
            for t in self._tensors():
                t[torch.as_tensor(holes, device=t.device)] = t[torch.as_tensor(sources, device=t.device)]
            for target, moved in zip(holes.tolist(), self.ids[holes].tolist()):
                self._row[moved] = target
        for t in self._tensors():
            t[n_after:n] = 0.0  # overwrite the vacated rows before dropping them
        self.ids[n_after:n] = -1
        self._truncate(n_after)
        moves = list(zip(holes.tolist(), sources.tolist()))
        for listener in self.listeners:  # row positions: all removed rows, then every move source -> target
            listener.on_delete(np.array(rows, dtype=np.int64), moves)
        return result

    def _tensors(self) -> list[torch.Tensor]:
        return [self.keys, self.values, *self.moments.values()]

    def _truncate(self, n: int) -> None:
        # Slicing keeps the same storage; the dropped tail row was zeroed by `delete`.
        self.ids = self.ids[:n]
        self.labels = self.labels[:n]
        self.keys = self.keys[:n]
        self.values = self.values[:n]
        self.moments = {k: v[:n] for k, v in self.moments.items()}

    def compact(self) -> None:
        """Copy every tensor into fresh storage of exactly the current size (frees the tail)."""
        self.ids = self.ids.copy()
        self.labels = self.labels.copy()
        self.keys = self.keys.clone()
        self.values = self.values.clone()
        self.moments = {k: v.clone() for k, v in self.moments.items()}

    def fingerprint(self) -> str:
        """sha256 over ids, labels, keys and exemplars in id order: equal banks give equal hashes."""
        return bank_fingerprint(self.ids, self.labels, self.keys.detach().cpu().numpy(),
                                self.values.detach().cpu().numpy())

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain numpy copies of every field (moments under 'moment_<name>')."""
        arrays = {
            "ids": self.ids.copy(),
            "labels": self.labels.copy(),
            "keys": self.keys.detach().cpu().numpy().copy(),
            "values": self.values.detach().cpu().numpy().copy(),
        }
        for name, t in self.moments.items():
            arrays[f"moment_{name}"] = t.detach().cpu().numpy().copy()
        return arrays

    def save(self, path: str | Path) -> None:
        """Write the bank atomically (temp file, fsync, rename): a crash leaves the old or the new file."""
        buf = io.BytesIO()
        np.savez(buf, **self.to_arrays())
        atomic_write_bytes(Path(path), buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> "MemoryBank":
        """Read a bank written by `save`; a missing or damaged file raises MunkeyError."""
        path = Path(path)
        if not path.exists():
            raise MunkeyError(f"No memory bank at {path}. Is this a run directory made by 'munkey train'?")
        try:
            with np.load(path) as data:
                arrays = {k: data[k] for k in data.files}
            moments = {k[len("moment_"):]: v for k, v in arrays.items() if k.startswith("moment_")}
            return cls(arrays["ids"], arrays["labels"], arrays["keys"], arrays["values"], moments)
        except MunkeyError:
            raise
        except Exception as exc:  # zip/pickle/format errors: the file is damaged
            raise MunkeyError(f"The memory bank {path} is damaged or truncated ({type(exc).__name__}). "
                              "Restore the run directory from a backup or retrain it.") from None

    def to(self, device: str | torch.device) -> "MemoryBank":
        """Move keys, exemplars and moments to `device` (in place); returns self."""
        self.keys = self.keys.to(device)
        self.values = self.values.to(device)
        self.moments = {k: v.to(device) for k, v in self.moments.items()}
        return self

