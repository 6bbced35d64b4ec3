"""Helpers shared by the audit, atomicity, purge and PostgreSQL tests (not a test module)."""

from __future__ import annotations

import os
import sqlite3
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from munkey_core.run.rows import load_bank, load_checkpoint


def fork(fn: Callable[[], int], env: dict[str, str] | None = None) -> int:
    """Start `fn` in a forked child process; returns its pid (reap it with `reap`).

    A fork (not a fresh interpreter) keeps each crash test to a fraction of a second: torch is
    already imported. The child uses one thread, as torch's own forked DataLoader workers do.
    """
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            torch.set_num_threads(1)
            os.environ.update(env or {})
            code = int(fn() or 0)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def reap(pid: int) -> int:
    """Wait for a child: its exit status, or -signal when it was killed."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def forked(fn: Callable[[], int], env: dict[str, str] | None = None) -> int:
    """Run `fn` in a forked child and wait: its exit status, or -signal when it was killed."""
    return reap(fork(fn, env))


def cli(*argv: str) -> Callable[[], int]:
    from munkey_core.cli import main

    return lambda: main(list(argv))


def deleted_byte_patterns(run: Path, ids: list[int]) -> dict[str, bytes]:
    """Every stored copy of the given samples' vectors: bank key, exemplar and moment rows, and each
    checkpoint's exemplar row. Keys shared with a retained sample (duplicate images) are left out."""
    arrays = load_bank(run).to_arrays()
    row = {int(i): r for r, i in enumerate(arrays["ids"])}
    keep = np.ones(len(arrays["ids"]), bool)
    keep[[row[i] for i in ids]] = False
    retained_keys = {arrays["keys"][r].tobytes() for r in np.flatnonzero(keep)}
    patterns: dict[str, bytes] = {}
    for i in ids:
        r = row[i]
        for field in [f for f in arrays if f not in ("ids", "labels")]:
            b = np.ascontiguousarray(arrays[field][r]).tobytes()
            if (field == "keys" and b in retained_keys) or not any(b):
                continue
            patterns[f"{field}[{i}]"] = b
    for ck in sorted((run / "checkpoints").glob("*.pt")):
        c = load_checkpoint(ck)
        pos = {int(x): p for p, x in enumerate(c["ids"].tolist())}
        for i in ids:
            if i in pos:
                patterns[f"{ck.name}:values[{i}]"] = c["values"][pos[i]].numpy().tobytes()
    return patterns


def files_holding(run: Path, patterns: dict[str, bytes]) -> dict[str, list[str]]:
    """{pattern name: [files under run (any depth, hidden ones too) that contain it, whole or its
    first 32 bytes]}; empty when no file holds any."""
    found: dict[str, list[str]] = {}
    files = [p for p in run.rglob("*") if p.is_file()]
    blobs = {p: p.read_bytes() for p in files}
    for name, pat in patterns.items():
        prefix = pat[:32] if pat[:32].count(0) < 8 else pat  # a mostly-zero prefix would match anything
        hits = [str(p.relative_to(run)) for p, blob in blobs.items() if pat in blob or prefix in blob]
        if hits:
            found[name] = hits
    return found


def sqlite_exec(run: Path, *statements: str) -> None:
    """Run SQL on a run's audit.sqlite as an attacker would (the append-only triggers dropped first)."""
    con = sqlite3.connect(run / "audit.sqlite", isolation_level=None)
    try:
        con.execute("DROP TRIGGER IF EXISTS audit_log_no_update")
        con.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
        for s in statements:
            con.execute(s)
    finally:
        con.close()


def file_digests(root: Path, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under `root` (relative path -> hex), skipping top-level folders in `exclude`:
    how tests prove that an operation left a run directory byte-identical."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] not in exclude}


def forbid_autograd(monkeypatch) -> None:
    """Make every way to compute a gradient raise (forward-only methods: UnAct and its protections)."""
    import torch

    def forbidden(*args, **kwargs):
        raise AssertionError("UnAct must not call this")

    monkeypatch.setattr(torch.Tensor, "backward", forbidden)
    monkeypatch.setattr(torch.autograd, "backward", forbidden)
    monkeypatch.setattr(torch.autograd, "grad", forbidden)
    monkeypatch.setattr(torch.Tensor, "requires_grad_", forbidden)
    monkeypatch.setattr(torch.nn.Module, "requires_grad_", forbidden)


def assert_same_metrics(a: dict, b: dict, names) -> None:
    """Two evaluations agree on `names`: floats to 1e-9, everything else exactly."""
    import pytest

    for name in names:
        if isinstance(a[name], float):
            assert a[name] == pytest.approx(b[name], abs=1e-9), name
        else:
            assert a[name] == b[name], name
