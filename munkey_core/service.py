"""What the CLI and the dashboard call: train a run, open it, predict with evidence, forget, evaluate.

One `MunkeyRun` is one loaded run (run/loaded.py `LoadedMunkeyRun`: model, bank, forgotten ids,
the thread lock and the run directory's file lock, search and prediction) plus the operations a
user asks for by name. Opening a run finishes an interrupted deletion (forget/request.py);
`forget` is an audited request; `evaluate` measures TA, RA, FA, MIA and Ps (eval/evaluate.py).
Tests: tests/test_service.py, tests/test_cli.py, tests/forget/test_forget.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from munkey_core.data.images import read_image_file
from munkey_core.data.sampling import random_ids
from munkey_core.eval import evaluate as evaluation
from munkey_core.forget import request as deletion
from munkey_core.forget.request import ForgetResult
from munkey_core.model.predict import Predictions
from munkey_core.run import copycache
from munkey_core.run.loaded import LoadedMunkeyRun
from munkey_core.training import runs

Progress = Callable[[str, float], None]  # (stage, fraction done)


def train_run(dataset: str, out: str | Path, *, device: str = "auto", prime: bool = True, **kwargs) -> "MunkeyRun":
    """Train a MUNKEY model on a registry dataset into the run directory `out` and open it (the
    options are training/runs.py `train_run`'s: profile, encoder, overrides, exclude_classes ...).
    `prime`: evaluate the new run once (not recorded), which keeps its predictions in the run
    (run/predstore.py), so the first evaluated deletion of any later process recomputes only what the
    deletion changes (seconds on the training time; the demo's first deletion 1 s instead of 13 s), and
    calibrates the copy search (run/copycache.py), so that the first uploaded image gets its answer in
    seconds, not after 600 calibration searches."""
    run = MunkeyRun(runs.train_run(dataset, out, device=device, **kwargs), device=device)
    if prime:
        run.evaluate(record=False)
        copycache.copy_index(run)
    return run


class MunkeyRun(LoadedMunkeyRun):
    """A loaded run directory, its interrupted deletion finished, and the operations on it."""

    def __init__(self, path: str | Path, device: str = "auto", audit_url: str | None = None,
                 search: str | None = None) -> None:
        super().__init__(path, device=device, audit_url=audit_url, search=search)
        deletion.recover_on_open(self)

    # ----- prediction ----------------------------------------------------------------------
    def predict_images(self, images: Sequence[np.ndarray], *, k: int | None = None, mode: str = "ensemble",
                       pathway: str = "both") -> Predictions:
        """Predict user images with the current bank; each prediction carries its evidence."""
        batch = self.prepare_images(images)
        keys = self.encoder.encode(batch)
        return self.predict_prepared(batch, keys, k=k, mode=mode, pathway=pathway)

    def predict_files(self, paths: Sequence[str | Path], **kwargs) -> Predictions:
        return self.predict_images([read_image_file(p) for p in paths], **kwargs)

    # ----- deletion ------------------------------------------------------------------------
    def forget(self, ids: Sequence[int], *, operator: str | None = None, subject: str | None = None,
               evaluate: bool = False, max_samples: int = 2000, source: str = "ids",
               progress: Progress | None = None) -> ForgetResult:
        """Delete training samples by id: bank rows, their optimiser moments, checkpoint rows; record
        the request in the audit log and write its receipt (forget/request.py has the protocol).

        Unknown ids refuse the whole request (nothing changes; the refusal is logged); ids deleted
        earlier are reported. `evaluate` measures the metrics before and after (slower).
        `operator` None records the OS user (the CLI and the dashboard always name one).
        """
        return deletion.forget(self, ids, operator=operator, subject=subject, evaluate=evaluate,
                               max_samples=max_samples, source=source, progress=progress)

    def forget_random(self, fraction: float, seed: int = 0, **kwargs) -> ForgetResult:
        """Delete a seeded random fraction of the samples still in the bank."""
        return self.forget(random_ids(self.bank.ids, fraction, seed), **{"source": "random-fraction", **kwargs})

    # ----- evaluation ----------------------------------------------------------------------
    def evaluate(self, *, max_samples: int = 2000, seed: int = 0, record: bool = True,
                 progress: Progress | None = None) -> dict:
        """TA, RA, FA (percent), cheap MIA AUC (percent), Ps; FA and MIA are None when nothing is deleted.

        Each set is a seeded subsample of at most `max_samples` (0 = all), counts reported.
        """
        return evaluation.evaluate(self, max_samples=max_samples, seed=seed, record=record, progress=progress)

    def accuracy_on_ids(self, ids: Sequence[int]) -> float | None:
        """Ensemble accuracy (percent) on the given training samples with the current bank."""
        return evaluation.accuracy_on_ids(self, ids)

    def summary(self) -> dict:
        """The model card: what this run is, and how big its bank is now."""
        c = self.config
        return {"dataset": c["dataset"], "encoder": c["encoder"]["name"], "profile": c["profile"],
                "classes": len(c["class_names"]), "train_size": c.get("train_size"), "bank_size": len(self.bank),
                "deleted": len(self.forgotten_ids), "created": c.get("created"),
                "train_seconds": c.get("train_seconds"), "device": str(self.device),
                "inject_at": self.model_cfg.inject_at, "design": design_name(self.model_cfg.inject_at)}


def design_name(inject_at: int) -> str:
    """How a run's model is built, in words: the paper's design or late injection at block L."""
    return "paper (token from block 0)" if inject_at == 0 else f"late injection (token from block {inject_at})"
