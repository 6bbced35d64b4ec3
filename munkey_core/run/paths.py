"""The run directory: the unit users handle. Layout:

    config.json       dataset, encoder, profile, model and training configs, class names
    model.pt          backbone + adapter + null tokens (state dict)
    bank.store        ids, labels, keys, exemplars, AdamW moments of the exemplars: a fixed-row file
                      that deletes in place (bankstore.py), with its redo record bank.store.redo
    forgotten.json    every deleted id with its request time (written *before* the bank, see below)
    history.json      per-epoch training record
    metrics.json      every evaluation, in order
    checkpoints/      epoch_NNN.pt (weights) + epoch_NNN.rows (exemplar rows) of the newest epochs
    audit.json        the audit log's binding: run id, backend (sqlite | postgresql), where (no password)
    audit.sqlite      the audit log, when it is the run's own (default)
    audit_head.json   (seq, hash) of the log's newest entry: the anchor that shows truncation
    audit_pending.json  only while an append is in flight
    journal.json      only while a deletion is in flight: the commit point and the pending audit entry
    receipts/         <request id>.json and .html per request
    embeddings/       maps-<key>.npz: the Embeddings page's UMAP fit (derived data; only samples still in
                      the bank: a deletion removes its ids' rows, run/mapcache.py)
    tags.json         sample tags and saved grid views (run/tags.py; a deletion removes its ids from it)
    predictions/      preds-<key>.npz: dataset-row predictions of the current bank (derived data; a
                      deletion removes its ids' rows and the rows that retrieved them, run/predstore.py)
    duplicates/       thresholds-<key>.json: the copy search's calibration, made with the run (derived data:
                      per validation query its best look-alike's id and score; a deletion removes the
                      records naming its ids, and the thresholds, run/copycache.py)
    .lock             the inter-process lock file (flock; run/lock.py)
    .deletion.lock    held by a deletion request from start to end (requests queue on it)

This is format 2 (config.json "format"); a format-1 run (bank.npz, exemplar rows inside each
epoch_NNN.pt) is migrated when first opened (runstore.py). Every file is written atomically, except
the row files, which change in place through their redo records (a crash leaves the old rows or
the new ones). A deletion (deletion.py) writes journal.json first (the commit
point), then forgotten.json, the checkpoints, the bank, the audit entry and the receipt, and
removes the journal; an interrupted deletion is rolled forward when the run is next opened, so the
run is always either before or after a request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from munkey_core.errors import MunkeyError
from munkey_core.atomic import read_json

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 2  # runstore.STORE_FORMAT


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def model(self) -> Path:
        return self.root / "model.pt"

    @property
    def bank(self) -> Path:
        """The bank store (format 2)."""
        return self.root / "bank.store"

    @property
    def legacy_bank(self) -> Path:
        """The format-1 bank, present only until the run is migrated."""
        return self.root / "bank.npz"

    @property
    def forgotten(self) -> Path:
        return self.root / "forgotten.json"

    @property
    def history(self) -> Path:
        return self.root / "history.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, epoch: int) -> Path:
        """checkpoints/epoch_NNN.pt (its exemplar rows: the .rows file beside it; run/rows.py)."""
        return checkpoint_file(self.checkpoints, epoch)


def checkpoint_file(directory: Path, epoch: int) -> Path:
    """The weights file of epoch `epoch` in a checkpoint directory: epoch_NNN.pt."""
    return Path(directory) / f"epoch_{epoch:03d}.pt"


def utc_now(timespec: str = "seconds") -> str:
    """The current UTC time in ISO 8601 ("...+00:00"), as config.json and metrics.json record it."""
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def open_run(path: str | Path) -> RunPaths:
    """Check that `path` is a run directory and return its paths."""
    root = Path(path)
    if not root.is_dir():
        raise MunkeyError(f"Run directory {root} does not exist. Train one with 'munkey train --out {root}'.")
    paths = RunPaths(root)
    for required in (paths.config, paths.model, paths.bank):
        if not required.exists() and not (required == paths.bank and paths.legacy_bank.exists()):
            raise MunkeyError(f"{root} is not a complete run directory ({required.name} is missing). "
                              "Train one with 'munkey train', or restore it from a backup.")
    return paths


def read_config(paths: RunPaths) -> dict:
    """The run's config.json, checked for the fields every command needs and for a format this
    version reads (a newer run is refused before anything is written to it)."""
    cfg = read_json(paths.config)
    if not isinstance(cfg, dict):
        raise MunkeyError(f"{paths.config} is not a run's config (not a JSON object); {paths.root} is not a run "
                          "directory made by 'munkey train'.")
    missing = [k for k in ("dataset", "model", "train", "encoder", "class_names") if k not in cfg]
    if missing:
        raise MunkeyError(f"{paths.config} lacks {', '.join(missing)}; the run directory is damaged.")
    fmt = cfg.get("format", 1)
    if not isinstance(fmt, int) or isinstance(fmt, bool) or not 1 <= fmt <= FORMAT_VERSION:
        raise MunkeyError(f"{paths.root} is a run of format {fmt!r}; this version reads formats 1 to "
                          f"{FORMAT_VERSION}. Nothing was changed.")
    return cfg


def is_run(path: str | Path) -> bool:
    """True when `path` is a MUNKEY run directory this version reads (the files every run has, a
    config.json of a known format): the test a command passes before it writes anything there."""
    try:
        read_config(open_run(path))
    except MunkeyError:
        return False
    return True


TRAINING_MARKER = ".munkey-training"  # in a run folder while its training runs; removed at the end


def check_new_run_dir(out: str | Path) -> Path:
    """Refuse an output folder that would overwrite anything: `out` must not exist, or be an empty
    folder, or one an interrupted training of ours left (it holds TRAINING_MARKER and no config.json).
    Called before any work, so a refusal costs nothing and changes nothing."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise MunkeyError(f"{out} is a file, not a folder; give a new folder for the run. Nothing was changed.")
        ours = (out / TRAINING_MARKER).is_file() and not (out / "config.json").exists()
        if not ours and any(out.iterdir()):
            what = "already holds a run" if (out / "config.json").exists() else "is not empty"
            raise MunkeyError(f"{out} {what}; give a new (or empty) folder for the run. Nothing was changed.")
    return out


def begin_new_run_dir(out: str | Path) -> Path:
    """Create the (checked) run folder, owner-only, and mark it as a training in progress."""
    out = check_new_run_dir(out)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    (out / TRAINING_MARKER).touch(mode=0o600)
    return out


def end_new_run_dir(out: str | Path) -> None:
    """The run is complete: drop the in-progress marker and make every file owner-only."""
    (Path(out) / TRAINING_MARKER).unlink(missing_ok=True)
    make_private(out)


def make_private(root: str | Path) -> None:
    """Restrict a run directory to its owner: folders 0700, files 0600 (a run holds training data's
    fingerprints, its audit log and receipts)."""
    root = Path(root)
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        try:
            p.chmod(0o700 if p.is_dir() else 0o600)
        except OSError:
            pass


def read_forgotten(paths: RunPaths) -> dict:
    """{'ids': [...], 'requests': [...]} (empty when nothing was deleted)."""
    if not paths.forgotten.exists():
        return {"ids": [], "requests": []}
    data = read_json(paths.forgotten)
    if not isinstance(data, dict) or not isinstance(data.get("ids"), list):
        raise MunkeyError(f"{paths.forgotten} is damaged; restore the run from a backup.")
    return data


def disk_stamp(paths: RunPaths) -> tuple:
    """(inode, mtime ns, size) of bank.store and forgotten.json, None for a missing file: what a
    loaded run compares to notice that another process changed the bank since it read it."""
    out = []
    for p in (paths.bank, paths.forgotten):
        try:
            s = p.stat()
            out.append((s.st_ino, s.st_mtime_ns, s.st_size))
        except FileNotFoundError:
            out.append(None)
    return tuple(out)


def read_list(path: Path) -> list:
    """A JSON list file, empty when absent."""
    return read_json(path) if path.exists() else []


def load_state_dict(path: Path, device: torch.device,
                    what_to_do: str = "restore the run from a backup or retrain it") -> dict:
    """torch.load a weights file with a clear error if it is damaged (`what_to_do` ends the message)."""
    import torch  # here: the model-free paths never load torch

    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:
        raise MunkeyError(f"{path} is damaged or truncated ({type(exc).__name__}); {what_to_do}.") from None
