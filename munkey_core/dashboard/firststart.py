"""The dashboard's first start: training the demo run in the background while the pages already
show the data it trains on. No Streamlit here, by rule; light on purpose: importing this module (and
creating or starting a `TrainingJob`) loads no torch, so the first screen does not wait for the model
code (about 10 s of imports on a busy 2-core machine); the job's thread imports it.

- `TrainingJob`: trains a run off the UI thread with its own CPU thread count; `fraction`, `stage`,
  `seconds_left` (from the epochs after the first) and `status_line` for the page.
- `training_data`, `class_counts`: the dataset a profile trains on, before its run exists.

Tests: tests/dashboard/test_views.py (TrainingJob), tests/app/test_app.py (the first start).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from munkey_core.config import resolve_profile, with_overrides
from munkey_core.dashboard.jobs import BackgroundJob
from munkey_core.data.datasets import Dataset, load_dataset


def training_data(dataset: str, profile: str) -> Dataset:
    """The dataset a run of `profile` trains on, split and cut to max_train exactly as training does
    (so the ids a page shows before the run exists are the run's ids after). Loads in well under a
    second for the embedded digits; no model, no keys."""
    tc = resolve_profile(profile).train_for(dataset)
    return load_dataset(dataset, None, seed=tc.data_seed, max_train=tc.max_train or None)


def class_counts(ds: Dataset) -> list[dict]:
    """Samples per class and split of a Dataset: one row per (class, split), for a bar chart."""
    rows = []
    for split in ("train", "val", "test"):
        counts = np.bincount(ds.split(split).labels, minlength=ds.num_classes)
        rows += [{"class": name, "split": split, "samples": int(n)} for name, n in zip(ds.class_names, counts)]
    return rows


class TrainingJob(BackgroundJob):
    """Trains a run in a background thread so a UI can show progress (percent, time left) and survive
    reruns. Creating and starting one imports no model code: the thread does, off the page."""

    what = "Training"
    ETA_WINDOW = 10  # epochs the time left is measured over

    def __init__(self, out: str | Path, *, dataset: str = "digits", profile: str = "cpu", device: str = "auto",
                 overrides: dict | None = None, trainer: Callable[..., object] | None = None,
                 threads: int | None = None) -> None:
        super().__init__()
        self.out = Path(out)
        self.name = f"munkey-train-{self.out.name}"
        self.dataset, self.profile, self.device = dataset, profile, device
        self.overrides = dict(overrides or {})
        self.epochs = int(with_overrides(resolve_profile(profile).train_for(dataset), self.overrides).epochs)
        self._trainer = trainer
        # CPU threads of the training thread (torch's thread count is per thread here): all cores but one,
        # which stays with the pages and the server. On a busy 2-core machine torch's 2 threads stall at
        # every barrier: an epoch of the cpu profile took 27-46 s with 2 threads and 5-7 s with 1
        # (docs/performance.md, "Dashboard first start").
        self.threads = max(1, (os.cpu_count() or 1) - 1) if threads is None else int(threads)
        self.reset()

    def reset(self) -> None:
        self.epoch, self.last_record = 0, None
        self.epoch_ends: list[float] = []  # time.time() when each epoch ended

    def _on_epoch(self, record: dict) -> None:
        self.epoch = int(record.get("epoch", self.epoch + 1))
        self.last_record = dict(record)
        self.epoch_ends.append(time.time())

    @property
    def seconds_left(self) -> float | None:
        """Estimated seconds until the last epoch ends: the epochs left at the mean time of the last
        (up to) `ETA_WINDOW` epochs, never the first (it also loads the data and computes the keys), so
        the estimate follows a machine whose load changes. None until two epochs have ended. Writing
        and opening the run afterwards, and its one evaluation (run/predstore.py), take seconds."""
        ends = self.epoch_ends[-(self.ETA_WINDOW + 1):]
        if self.state != "running" or len(ends) < 2:
            return None
        per_epoch = (ends[-1] - ends[0]) / (len(ends) - 1)
        return max(0.0, per_epoch * (self.epochs - self.epoch) - (time.time() - ends[-1]))

    def status_line(self) -> str:
        """One honest line for a page that waits for the model: percent done and the time left."""
        if self.state == "done":
            return "The demo model is trained; opening it."
        if self.state != "running":
            return "The demo model is not training" + (f": {self.error}" if self.error else ".")
        left = self.seconds_left
        secs = None if left is None else int(round(left))
        eta = ("writing the run, evaluating it once and calibrating the copy search" if self.epoch >= self.epochs else
               "time left known after the second epoch" if secs is None else
               f"about {secs // 60} min {secs % 60:02d} s left")
        return (f"The demo model is training: {100 * self.fraction:.0f}% ({self.stage}) · {eta} "
                f"· {self.elapsed:.0f} s so far.")

    def task(self) -> None:
        import torch  # here, in the job's thread: the page that starts the job does not wait for it

        from munkey_core.service import train_run

        torch.set_num_threads(self.threads)  # this thread's own setting: the pages keep theirs
        (self._trainer or train_run)(self.dataset, self.out, profile=self.profile, device=self.device,
                      overrides=self.overrides or None, progress=False, on_epoch=self._on_epoch)

    @property
    def fraction(self) -> float:
        return 1.0 if self.state == "done" else min(1.0, self.epoch / max(self.epochs, 1))

    @property
    def stage(self) -> str:
        if self.state == "running" and self.epoch == 0:
            return "loading data and computing keys"
        if self.state == "running":
            rec = self.last_record or {}
            acc = rec.get("val_acc")
            return f"epoch {self.epoch}/{self.epochs}" + (f", validation accuracy {acc:.1f}%" if acc is not None else "")
        return self.state
