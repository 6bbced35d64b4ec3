"""Checkpoint model selection: the per-epoch checkpoint that forgets best, among the balanced ones.

The paper selects, among its models with pathway sensitivity Ps <= 0.3, the one with the lowest
Avg Gap (SPEC.md section 2, "rewind"). We do it over a run's per-epoch checkpoints, without ever
looking at the test split:
1. a seeded random *validation forget split* (`val_rate` of the samples still in the bank) plays
   the forget set; the M-oracle retrained without it (and without anything already deleted) is
   trained once and cached in RUN/oracles/ like every other oracle;
2. each checkpoint is scored on the dataset's validation split (standing in for "test"), the
   retain set and the validation forget split after deleting its keys: TA, RA, FA, MIA (cheap
   attack), Avg Gap against the oracle, and Ps from the image-only, token-only and both pathways;
3. the selected checkpoint has the lowest Avg Gap among those with Ps <= `max_ps` (none if no
   checkpoint is balanced enough; the report says so).
`write_selected` writes the chosen checkpoint as a new run directory (the original is untouched);
it is the run to use for deletions from then on. Tests: tests/eval/test_selection.py.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from munkey_core.run import rows as runstore
from munkey_core.errors import MunkeyError
from munkey_core.bank.memory import MemoryBank
from munkey_core.eval.metrics import MIA_CHEAP, accuracy, pathway_sensitivity
from munkey_core.eval.oracles import eval_sets, forget_tag, gaps, measure, munkey_scorer, oracle_path, train_oracle
from munkey_core.atomic import atomic_torch_save, atomic_write_json, read_json
from munkey_core.data.sampling import random_ids
from munkey_core.model.munkey_vit import preprocess_images
from munkey_core.model.predict import predict
from munkey_core.run.loaded import LoadedMunkeyRun
from munkey_core.run.paths import RunPaths

MAX_PS = 0.3
Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class CheckpointScore:
    """One checkpoint's measurements on the validation forget split (percent; Ps a ratio)."""

    epoch: int
    name: str
    TA: float
    RA: float
    FA: float
    MIA: float
    AvgGap: float
    Ps: float
    A_img: float
    A_tok: float
    eligible: bool  # Ps <= max_ps


@dataclass
class Selection:
    """What `select_checkpoint` measured and chose (`selected` is a checkpoint name or None)."""

    max_ps: float
    val_forget: str           # forget_tag of the validation forget split
    n_val_forget: int
    oracle_path: str
    oracle: dict
    oracle_trained: bool = False  # the split's M-oracle was trained by this call (not found cached)
    scores: list[CheckpointScore] = field(default_factory=list)
    selected: str | None = None

    @property
    def best(self) -> CheckpointScore | None:
        return next((s for s in self.scores if s.name == self.selected), None)

    def to_dict(self) -> dict:
        return {"max_ps": self.max_ps, "val_forget": self.val_forget, "n_val_forget": self.n_val_forget,
                "oracle_path": self.oracle_path, "oracle": self.oracle, "oracle_trained": self.oracle_trained,
                "selected": self.selected,
                "MIA_attack": MIA_CHEAP, "scores": [asdict(s) for s in self.scores]}


class ValidationView:
    """The run's dataset with its validation split in the role of "test" (selection never sees test)."""

    def __init__(self, ds) -> None:
        self.train, self.test, self.num_classes = ds.train, ds.val, ds.num_classes

    def split(self, name: str):
        return self.test if name == "test" else self.train


def checkpoint_files(run: LoadedMunkeyRun) -> list[Path]:
    """The run's per-epoch checkpoint files, oldest first."""
    return runstore.checkpoints(run.paths.checkpoints)


def checkpoint_state(run: LoadedMunkeyRun, path: Path) -> tuple[torch.nn.Module, MemoryBank, int]:
    """(model, bank, epoch) as they were at a checkpoint: its weights and exemplar vectors with the
    run's keys and labels (a checkpoint holds exactly the ids still in the bank)."""
    ckpt = runstore.load_checkpoint(path)  # weights from the .pt, exemplar rows from its row file
    ids = np.asarray(ckpt["ids"], dtype=np.int64)
    if len(ids) != len(run.bank) or not np.isin(ids, run.bank.ids).all():
        raise MunkeyError(f"{path.name} holds other samples than the run's bank: a deletion ran while selecting "
                          "(run 'munkey select' again), or the run directory is damaged.")
    model = copy.deepcopy(run.model)
    model.load_state_dict(ckpt["model"])
    model.eval()
    rows = np.asarray(run.bank.rows_of(ids), dtype=np.int64)
    bank = MemoryBank(ids, run.bank.labels[rows], run.bank.keys[torch.from_numpy(rows)], ckpt["values"])
    return model, bank, int(ckpt["epoch"])


def _val_forget_ids(run: LoadedMunkeyRun, val_rate: float, seed: int) -> list[int]:
    if not 0.0 < val_rate < 0.5:
        raise MunkeyError(f"--val-rate must be between 0 and 0.5 (exclusive), got {val_rate}.")
    return random_ids(run.bank.ids, val_rate, seed + 7919)  # never the same draw as a seed-s forget set


def _pathways(model, bank, view, split_keys, sets, k: int, tau: float) -> tuple[float, float, float]:
    """Accuracy (percent) on the validation rows with the image pathway alone, the token alone, both."""
    index = sets.test
    x = preprocess_images(torch.from_numpy(np.ascontiguousarray(view.test.images[index])), model.cfg.img_size)
    keys, y = split_keys("test")[index], view.test.labels[index]
    acc = {p: accuracy(predict(model, bank, x, keys, k=k, tau=tau, pathway=p,
                               neighbour_predictions=False).labels, y) for p in ("image", "token", "both")}
    return acc["image"], acc["token"], acc["both"]


def select_checkpoint(run: LoadedMunkeyRun, *, val_rate: float = 0.05, seed: int = 0, max_ps: float = MAX_PS,
                      max_samples: int = 1000, train_missing: bool = True, progress: Progress | None = None,
                      oracle_progress: bool = True) -> Selection:
    """Score every per-epoch checkpoint of `run` on a validation forget split; pick the lowest Avg Gap
    among those with Ps <= max_ps. Trains the split's M-oracle when missing (unless train_missing is
    False, then a MunkeyError says how to train it)."""
    report = progress or (lambda stage, frac: None)
    files = checkpoint_files(run)
    if not files:
        raise MunkeyError(f"{run.paths.root} has no per-epoch checkpoints to select from; train with "
                          "'munkey train --keep-checkpoints N' (N > 1).")
    if max_ps <= 0:
        raise MunkeyError(f"--max-ps must be positive, got {max_ps}.")
    val_ids = _val_forget_ids(run, val_rate, seed)
    excluded = sorted(set(val_ids) | set(run.forgotten_ids))
    if not train_missing and not RunPaths(oracle_path(run.paths.root, excluded, "munkey")).config.exists():
        raise MunkeyError("No M-oracle for the validation forget split yet; run 'munkey select RUN' without "
                          "--no-train to train it (the run's recipe, minutes on the CPU profile).")
    report("oracle", 0.0)
    path, trained = train_oracle(run.config, run.paths.root, excluded, "munkey", device=str(run.device),
                           progress=oracle_progress)
    view = ValidationView(run.dataset)
    sets = eval_sets(view, val_ids, max_samples=max_samples, seed=seed, also_deleted=run.forgotten_ids)

    def split_keys(name: str) -> np.ndarray:
        return run.split_keys("val" if name == "test" else name)

    k, tau = run.train_cfg.k, run.train_cfg.tau
    cache, tag = path / "selection_oracle_metrics.json", {"max_samples": max_samples, "seed": seed,
                                                          "val_forget": forget_tag(val_ids)}
    oracle = read_json(cache)["metrics"] if cache.exists() and read_json(cache).get("tag") == tag else None
    if oracle is None:
        orun = LoadedMunkeyRun(path, device=str(run.device))
        oracle = measure(munkey_scorer(orun.model, orun.bank, view, split_keys, k, tau), view, sets)
        atomic_write_json(cache, {"tag": tag, "metrics": oracle})
    out = Selection(max_ps, forget_tag(val_ids), len(val_ids), str(path), oracle, oracle_trained=trained)
    for n, file in enumerate(files):
        report(file.stem, 0.1 + 0.9 * n / len(files))
        model, bank, epoch = checkpoint_state(run, file)
        a_img, a_tok, a_both = _pathways(model, bank, view, split_keys, sets, k, tau)
        bank.delete(val_ids)
        bank.compact()
        m = measure(munkey_scorer(model, bank, view, split_keys, k, tau), view, sets)
        ps = pathway_sensitivity(a_img, a_tok, a_both)
        out.scores.append(CheckpointScore(epoch, file.name, m["TA"], m["RA"], m["FA"], m["MIA"],
                                          gaps(m, oracle)["AvgGap"], ps, a_img, a_tok, ps <= max_ps))
    eligible = [s for s in out.scores if s.eligible]
    out.selected = min(eligible, key=lambda s: (s.AvgGap, -s.epoch)).name if eligible else None
    report("done", 1.0)
    return out


def check_target(run: LoadedMunkeyRun, out: str | Path) -> Path:
    """Refuse, before minutes of scoring, a selected run that could not be written: the run already has
    deletions (their audit trail belongs to it), or `out` is a file or a folder that is not empty."""
    if run.forgotten_ids:
        raise MunkeyError("This run already has deletions, and their audit trail belongs to it: select a checkpoint "
                          "right after training, before the first deletion (without --out, 'munkey select' still "
                          "scores the checkpoints).")
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise MunkeyError(f"{dest} already exists and is not an empty folder; choose a new folder for the "
                          "selected run.")
    return dest


def write_selected(run: LoadedMunkeyRun, selection: Selection, out: str | Path) -> Path:
    """A new run directory whose weights and exemplars are the selected checkpoint's (original untouched)."""
    if selection.selected is None:
        raise MunkeyError(f"No checkpoint has Ps <= {selection.max_ps}; nothing to write. Try a larger --max-ps "
                          "or retrain with more pathway dropout.")
    dest = check_target(run, out)
    model, bank, epoch = checkpoint_state(run, run.paths.checkpoints / selection.selected)
    paths = RunPaths(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        atomic_torch_save(paths.model, model.state_dict())
        runstore.write_bank(paths.bank, bank)
        shutil.copyfile(run.paths.history, paths.history)
        best = selection.best
        atomic_write_json(paths.config, {
            **run.config, "selected_from": {"run": str(Path(run.paths.root).resolve().name), "epoch": epoch,
                                            "checkpoint": selection.selected, "Ps": best.Ps, "AvgGap": best.AvgGap,
                                            "max_ps": selection.max_ps, "val_forget": selection.val_forget}})
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest
