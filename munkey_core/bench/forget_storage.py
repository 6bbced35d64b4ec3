"""`munkey bench perf --sections forget`: the storage part of a `munkey forget` request, end to end,
on synthetic run directories, format 1 (bank.npz and the exemplar rows inside each checkpoint, all
rewritten per request) against format 2 (row files purged in place; runstore.py), in the same run.

Timed: `forget.request.apply_journal`, the product's own step after the commit point (forgotten.json,
every checkpoint, the bank in memory and on disk), called on a `run.loaded.DeletionTarget` that holds
only what that step reads (a set of ids for the bank: a 1M-row run does not fit in memory here). Not timed: validation, fingerprints, evidence, the audit entry and the receipt
(the same in both formats). Bytes written are the kernel's count for this process (/proc/self/io,
`wchar`: bytes handed to write/pwrite).
Run directory: N rows of 1280-d keys, 128-d exemplars and two AdamW moment rows (float32) and
`checkpoints` checkpoints, each the cpu profile's weights plus N exemplar rows.
Memory: the format-1 run keeps its bank in RAM as MunkeyRun does (about 6.7 KB per row, twice while
saving), so it is measured up to `legacy_max` rows; disk: about 12 GB at 1M rows with 10 checkpoints.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from munkey_core.atomic import atomic_torch_save, atomic_write_json
from munkey_core.bench._common import KEY_DIM, VALUE_DIM, chunks, table
from munkey_core.run.paths import RunPaths
from munkey_core.run.rows import bank_ids, checkpoint_ids_present, delete_bank_rows, rows_path

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class _Run:
    """A `DeletionTarget` (run/loaded.py) on a synthetic run directory: the bank is a set of ids and
    `apply` removes ids from the bank file (the way of the format measured)."""

    paths: RunPaths
    bank: set
    apply: Callable[[list[int]], None]
    forgotten: dict = field(default_factory=lambda: {"ids": [], "requests": []})

    def forgotten_written(self, forgotten: dict) -> None:
        self.forgotten = forgotten

    def apply_deletion(self, ids: list[int]) -> None:
        self.bank.difference_update(ids)
        self.apply(ids)


def _weights() -> dict:
    import torch

    from munkey_core.config import resolve_profile
    from munkey_core.model.munkey_vit import MunkeyViT

    torch.manual_seed(0)
    return MunkeyViT(resolve_profile("cpu").model).state_dict()


def _values(ids: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(int(ids[0]) + 1)
    return rng.standard_normal((len(ids), VALUE_DIM), dtype=np.float32) * np.float32(0.02)


def _written() -> int:
    """Bytes this process has passed to write(2)-like calls so far."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def _base(root: Path) -> RunPaths:
    paths = RunPaths(root)
    paths.checkpoints.mkdir(parents=True, exist_ok=True)
    atomic_write_json(paths.forgotten, {"ids": [], "requests": []})
    return paths


def build_format2(root: Path, n: int, seed: int, checkpoints: int, weights: dict) -> None:
    """A format-2 run directory's row files, written in chunks (bounded memory)."""
    from munkey_core.bank.store import BankStore

    paths = _base(root)
    bank = BankStore.create(paths.bank, capacity=n, key_dim=KEY_DIM, value_dim=VALUE_DIM,
                            moment_names=MOMENTS)
    cks = [BankStore.create(rows_path(paths.checkpoint(e)), capacity=n, key_dim=0,
                            value_dim=VALUE_DIM) for e in range(1, checkpoints + 1)]
    for ids, keys in chunks(n, seed):
        v = _values(ids)
        bank.append(ids, ids % 10, keys, v, {"exp_avg": v * np.float32(0.1), "exp_avg_sq": v * v})
        for e, ck in enumerate(cks, start=1):
            ck.append(ids, ids % 10, np.zeros((len(ids), 0), np.float32), v * np.float32(e / checkpoints))
    for s in (bank, *cks):
        s.close()
    for e in range(1, checkpoints + 1):
        atomic_torch_save(paths.checkpoint(e), {"epoch": e, "record": {}, "model": weights})


def build_format1(root: Path, n: int, seed: int, checkpoints: int, weights: dict):
    """A format-1 run directory (bank.npz, rows inside each checkpoint); returns its bank in memory."""
    import torch

    from munkey_core.bank.memory import MemoryBank

    paths = _base(root)
    parts = list(chunks(n, seed))
    ids = np.concatenate([i for i, _ in parts])
    keys = np.concatenate([k for _, k in parts])
    del parts
    v = np.concatenate([_values(ids[lo:lo + 50_000]) for lo in range(0, n, 50_000)])
    bank = MemoryBank(ids, ids % 10, keys, v, {"exp_avg": v * np.float32(0.1), "exp_avg_sq": v * v})
    del keys
    bank.save(paths.legacy_bank)
    for e in range(1, checkpoints + 1):
        atomic_torch_save(paths.checkpoint(e),
                          {"epoch": e, "record": {}, "model": weights, "ids": torch.from_numpy(ids.copy()),
                           "values": torch.from_numpy(v * np.float32(e / checkpoints))})
    return bank


def _requests(run: _Run, requests: list[list[int]]) -> tuple[list[float], list[int]]:
    """Time `apply_journal` per request; (seconds, bytes written) per request."""
    from munkey_core.forget.request import apply_journal

    secs, written = [], []
    for k, ids in enumerate(requests):
        journal = {"ids": ids, "received": datetime.now(timezone.utc).isoformat(), "request_id": f"req-bench-{k}"}
        gc.collect()
        w0, t0 = _written(), time.perf_counter()
        apply_journal(run, journal)
        secs.append(time.perf_counter() - t0)
        written.append(_written() - w0)
    return secs, written


def _purged(root: Path, ids: list[int]) -> bool:
    return not (set(ids) & set(bank_ids(root).tolist())) and not checkpoint_ids_present(RunPaths(root).checkpoints, ids)[0]


def _dir_bytes(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def bench_forget(sizes: list[int], quick: bool, seed: int, workdir: Path, *, checkpoints: int = 10,
                 legacy_max: int = 100_000) -> list[str]:
    """One table: per bank size, a 1-id and a 1,000-id request in each format (see module docstring)."""
    weights = _weights()
    weight_mib = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20
    rng = np.random.default_rng(seed + 11)
    singles = 3 if quick else 5
    rows = []
    for n in sizes:
        victims = [int(x) for x in rng.choice(n, singles + 1000, replace=False)]
        requests = [[v] for v in victims[:singles]] + [victims[singles:]]
        print(f"[perf] forget, {n:,} rows: building the format-2 run ...", flush=True)
        new_root = workdir / f"forget2_{n}"
        build_format2(new_root, n, seed, checkpoints, weights)
        size2 = _dir_bytes(new_root)
        live = set(range(n))

        def apply_new(ids: list[int], root: Path = new_root) -> None:
            delete_bank_rows(RunPaths(root).bank, ids)  # the in-memory bank: the set (MemoryBank.delete: O(1) per id)

        t_new, w_new = _requests(_Run(RunPaths(new_root), live, apply_new), requests)
        ok_new = _purged(new_root, victims)
        shutil.rmtree(new_root, ignore_errors=True)
        t_old = w_old = None
        if n <= legacy_max:
            print(f"[perf] forget, {n:,} rows: building the format-1 run ...", flush=True)
            old_root = workdir / f"forget1_{n}"
            bank = build_format1(old_root, n, seed, checkpoints, weights)

            def apply_old(ids: list[int], root: Path = old_root, bank=bank) -> None:
                bank.delete(ids)  # what a run's apply_deletion did in format 1
                bank.compact()
                bank.save(RunPaths(root).legacy_bank)

            t_old, w_old = _requests(_Run(RunPaths(old_root), set(range(n)), apply_old), requests)
            ok_old = _purged(old_root, victims)
            del bank
            gc.collect()
            shutil.rmtree(old_root, ignore_errors=True)
            ok_new = ok_new and ok_old
        s_new, b_new = 1e3 * statistics.median(t_new[:singles]), 1e3 * t_new[-1]
        s_old = None if t_old is None else 1e3 * statistics.median(t_old[:singles])
        b_old = None if t_old is None else 1e3 * t_old[-1]
        rows.append([n, checkpoints,
                     "-" if s_old is None else s_old, s_new, "-" if s_old is None else s_old / s_new,
                     "-" if b_old is None else b_old, b_new, "-" if b_old is None else b_old / b_new,
                     "-" if w_old is None else statistics.median(w_old[:singles]) / 2**20,
                     statistics.median(w_new[:singles]) / 2**10, w_new[-1] / 2**10,
                     size2 / 2**30, "yes" if ok_new else "NO"])
    return [table(f"Forget request, storage part end to end (ms; deletion.apply_journal on a run directory "
                   f"with {checkpoints} checkpoints of {weight_mib:.1f} MiB weights each; format 1 = bank.npz + "
                   "rows inside each checkpoint, rewritten; format 2 = row files purged in place)",
                   ["bank rows", "checkpoints", "format 1, 1 id", "format 2, 1 id", "format 1 / format 2 (1 id)",
                    "format 1, 1,000 ids", "format 2, 1,000 ids", "format 1 / format 2 (1,000 ids)",
                    "format 1 MiB written (1 id)", "format 2 KiB written (1 id)", "format 2 KiB written (1,000 ids)",
                    "format 2 run dir GiB", "ids gone from every file"], rows)]
