"""Distributed training: 2 CPU processes (gloo) give the single-process result within tolerance."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from sklearn.datasets import load_digits

from munkey_core.config import PROFILES, with_overrides
from munkey_core.training.train import TrainData, train_munkey


def _data(n: int = 240) -> TrainData:
    d = load_digits()
    images = (d.images[:n] * (255 / 16)).astype(np.uint8)[..., None]
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(n, 24)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    return TrainData(images, d.target[:n].astype(np.int64), np.arange(n) + 1000, keys)


def _cfgs():
    prof = PROFILES["tiny"]
    # 100 is not a multiple of 240 nor of 2 ranks x the last batch, so uneven shards are covered
    return prof.model, with_overrides(prof.train, {"epochs": 2, "batch_size": 100})


def _worker(rank: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from munkey_core.training.distributed import train_distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    model_cfg, cfg = _cfgs()
    result = train_distributed(model_cfg, cfg, _data())
    if rank == 0:
        torch.save({"model": result.model.state_dict(), "values": result.bank.values,
                    "exp_avg": result.bank.moments["exp_avg"], "loss": result.history[-1]["loss"]}, out)
    dist.destroy_process_group()


def test_two_processes_match_single_process(tmp_path: Path) -> None:
    out = tmp_path / "ddp.pt"
    mp.start_processes(_worker, args=(str(tmp_path / "init"), str(out)), nprocs=2, join=True, start_method="spawn")
    model_cfg, cfg = _cfgs()
    single = train_munkey(model_cfg, cfg, _data(), progress=False)
    ddp = torch.load(out, weights_only=True)
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(ddp["model"][name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(ddp["values"], single.bank.values, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ddp["exp_avg"], single.bank.moments["exp_avg"], rtol=1e-4, atol=1e-6)
    assert ddp["loss"] == pytest.approx(single.history[-1]["loss"], rel=1e-4)


def test_one_process_is_plain_training() -> None:
    from munkey_core.training.distributed import train_distributed

    model_cfg, cfg = _cfgs()
    cfg = with_overrides(cfg, {"epochs": 1})
    a = train_distributed(model_cfg, cfg, _data())
    b = train_munkey(model_cfg, cfg, _data(), progress=False)
    assert torch.equal(a.bank.values, b.bank.values)
    for name, tensor in b.model.state_dict().items():
        assert torch.equal(a.model.state_dict()[name], tensor), name


def test_torchrun_writes_a_run(tiny_run_template: Path, tmp_path: Path) -> None:
    """The launcher end to end (keys come from the session's cache, filled by the tiny run)."""
    from munkey_core.service import MunkeyRun

    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "munkey_core.training.distributed", "--dataset", "digits", "--out", str(out), "--profile", "tiny",
           "--epochs", "1", "--device", "cpu"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = MunkeyRun(out, device="cpu")
    assert len(run.bank) > 1000 and run.config["processes"] == 2


def test_torchrun_refuses_per_sample_clip_with_advice_that_its_launcher_accepts(tiny_run_template: Path,
                                                                                 tmp_path: Path) -> None:
    """The clip trains in one process only (the cpu profile's digits recipe sets it): under torchrun every
    rank stops before training with advice naming `--per-sample-clip 0`, an option this launcher takes
    (argparse would otherwise refuse the clip itself), and no run is written."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "munkey_core.training.distributed", "--dataset", "digits", "--out", str(out), "--profile", "tiny",
           "--epochs", "1", "--device", "cpu", "--per-sample-clip", "1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    said = proc.stdout + proc.stderr
    assert "per_sample_clip trains in one process only" in said and "--per-sample-clip 0" in said, said[-2000:]
    assert "unrecognized arguments" not in said and "Traceback" not in proc.stdout
    assert not (out / "config.json").exists()
