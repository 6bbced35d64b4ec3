"""Class unlearning on a run: UnAct, SSD, LFSSD, logit masking and (MUNKEY runs) class key deletion,
with Af/Ar/Delta.

`ClassEditor` opens a run (a ResNet-18 / ViT classifier run, or a MUNKEY run) and keeps the original
model untouched: every request edits a working copy, is measured on the test split, and can be saved
as a *new* run directory (`save`). What each method reads:
- UnAct: only the request's images (forward passes, pseudo-label from the model's own logits).
- SSD: the images with their labels (the pseudo-label when the request has none) plus the whole
  training split for I_D (cached per model: "cold" computes it, "warm" reads it). LFSSD: no labels.
- class key deletion (MUNKEY only): every bank entry labelled with the class; the backbone still sees
  the image, so it is reported alone and combined with UnAct (`keys+unact`, the class removal a MUNKEY
  run offers). On a MUNKEY run UnAct scores and edits the backbone along the path inference takes:
  each request image with its K neighbours retrieved from the bank the request leaves (for
  `keys+unact`: without the class), weighted as the ensemble weighs them; its scope is the MLP neurons
  of the last third of the blocks plus the classifier's inputs, and it stops once no request image
  gives the class more than chance (`MUNKEY_CONFIG`; docs/results/unact_digits.md measures it).
  The pseudo-label is the class the unedited run predicts for the images (its own inference path).
- mask: the class's output logit forced to -1e4 (the trivial suppression): Af falls to 0 by
  construction, but nothing inside the model changes: the features, the units and (MUNKEY) the
  class's keys and exemplars all remain, so a probe on the features or a retrieval still finds it.
Accuracies: Af = test accuracy on the forgotten class, Ar = on the other classes; with a class oracle
(the same recipe trained without the class, `oracles/class_C/` inside the run) Delta = |Ar - Ar*| +
|Af - Af*|. Tests: tests/unlearn/test_classforget.py.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from munkey_core.data.sampling import stratified_sample
from munkey_core.eval.verdicts import NOT_YET, verdict
from munkey_core.errors import MunkeyError
from munkey_core.forget.request import forget, open_recovered, start_derived_log
from munkey_core.bank.memory import MemoryBank
from munkey_core.run import rows
from munkey_core.run.loaded import ClassifierRun, LoadedMunkeyRun, LoadedRun, load_run, run_kind
from munkey_core.run.paths import RunPaths, check_new_run_dir, make_private
from munkey_core.atomic import atomic_torch_save, atomic_write_json, read_json
from munkey_core.model.predict import neighbour_weights
from munkey_core.training.runs import retrain
from munkey_core.unlearn.forwardcache import ForwardCache, prefix_ensemble_forward
from munkey_core.unlearn.ssd import SSDConfig, cached_importance, importance, reference_order, ssd_forget
from munkey_core.unlearn.unact import (DEFAULTS, RetainProbe, RoundInfo, UnActConfig, forgotten_below, munkey_ensemble_forward,
                                       scope_for, unact, vit_blocks)

METHODS = ("unact", "ssd", "lfssd", "keys", "keys+unact", "mask")
# UnAct on a MUNKEY backbone (along its inference path): p 90 (10 % of each group a round), gamma 0.01,
# k 20, the classifier's inputs in scope, the "forgotten" stopping rule with a 15-image margin (c's
# mean probability over the request below n / (n + 15) of chance: a quarter of it for 5 images, so that
# a few images generalise to the class) and a tail (c's largest probability over the request below twice
# chance, so that the class's least typical unseen images go too), and a 2-point retain guard on a probe
# of the kept classes' bank exemplars that also undoes a round costing one kept class two of its probe
# images, which at its first breach goes on at p 99 (the top 1 % of each group a round) and stops at
# the next (docs/results/unact_digits.md)
PROBE_PER_CLASS = 10  # kept-class images per class in the retain probe (seeded)
MUNKEY_CONFIG = UnActConfig(*DEFAULTS["munkey"], "attribution", stop="forgotten", guard=2.0, backoff=99.0,
                            margin=15.0, tail=2.0, class_guard=100.0 / PROBE_PER_CLASS)
MUNKEY_HEAD = True
MASK_LOGIT = -1e4
ORACLE_DIR = "oracles"
_MUNKEY_TEST_CAP = 2000  # MUNKEY's K-fold ensemble is slower: evaluate on a stratified subset
# UnAct on a ResNet-18 classifier (ours; the paper's rule is DEFAULTS["resnet18"] with activation scores):
# attribution scoring (far better than the activation rule on our CPU ResNets), the paper's p 99 and
# gamma 0.01, all k rounds, k 30: the paper's 20 rounds of the top 1 % left up to 9-19 % of a digits class
# on a width-16 net; k 30 was the best of the stop rules and round caps measured on the validation split
# (scripts/unact_resnet_trace.py; docs/results/README.md)
RESNET_CONFIG = UnActConfig(DEFAULTS["resnet18"][0], DEFAULTS["resnet18"][1], 30, "attribution")


@dataclass
class ClassMetrics:
    cls: int
    Af: float
    Ar: float
    per_class: list[float]
    n_test: int

    def delta(self, oracle: "ClassMetrics | None") -> float | None:
        if oracle is None:
            return None
        return abs(self.Ar - oracle.Ar) + abs(self.Af - oracle.Af)


@dataclass
class ClassRequest:
    """One class-unlearning request and what it did."""

    method: str
    cls: int                       # the class measured (the pseudo-label when the images carried none)
    pseudo_label: int | None
    n_images: int
    seconds: float
    before: ClassMetrics
    after: ClassMetrics
    oracle: ClassMetrics | None
    delta: float | None
    details: dict = field(default_factory=dict)

    def as_row(self) -> dict:
        return {"method": self.method, "class": self.cls, "pseudo_label": self.pseudo_label, "n": self.n_images,
                "seconds": round(self.seconds, 4), "Af_before": self.before.Af, "Ar_before": self.before.Ar,
                "Af": self.after.Af, "Ar": self.after.Ar, "Af_oracle": None if self.oracle is None else self.oracle.Af,
                "Ar_oracle": None if self.oracle is None else self.oracle.Ar, "Delta": self.delta, **self.details}


def _per_class(pred: np.ndarray, labels: np.ndarray, num_classes: int) -> list[float]:
    return [float(100.0 * np.mean(pred[labels == c] == c)) if np.any(labels == c) else float("nan")
            for c in range(num_classes)]


def class_metrics(pred: np.ndarray, labels: np.ndarray, cls: int, num_classes: int) -> ClassMetrics:
    """Af (accuracy on class `cls`) and Ar (on every other class, pooled) in percent."""
    f = labels == cls
    if not f.any():
        raise MunkeyError(f"The test set holds no image of class {cls}.")
    return ClassMetrics(int(cls), float(100.0 * np.mean(pred[f] == cls)), float(100.0 * np.mean(pred[~f] == labels[~f])),
                        _per_class(pred, labels, num_classes), int(len(labels)))


class ClassEditor:
    """A run opened for class unlearning; the loaded model is never modified (requests edit copies)."""

    def __init__(self, path: str | Path, device: str = "auto", max_test: int | None = None) -> None:
        self.root = Path(path)
        self.kind = run_kind(self.root)
        self.run: LoadedRun = (ClassifierRun(self.root, device=device) if self.kind == "classifier"
                               else open_recovered(self.root, device=device))
        self.arch = self.run.arch if isinstance(self.run, ClassifierRun) else "munkey"
        self.device = self.run.device
        self.model = self.run.model
        ds = self.dataset
        cap = _MUNKEY_TEST_CAP if (max_test is None and self.kind == "munkey") else (max_test or 0)
        self.test_index = stratified_sample(ds.test.labels, cap, seed=0)
        self._original_pred: np.ndarray | None = None  # the loaded model is never edited: cacheable
        self._train_rows: dict[bytes, int] | None = None  # training image bytes -> row (request keys)
        self._forwards: ForwardCache | None = None
        self._warm: threading.Thread | None = None
        self._warm_lock = threading.Lock()

    # ----- data ---------------------------------------------------------------------------
    @property
    def dataset(self):
        return self.run.dataset

    @property
    def class_names(self) -> list[str]:
        return self.run.class_names

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def default_config(self) -> UnActConfig:
        if self.kind == "munkey":
            return MUNKEY_CONFIG
        if self.arch == "resnet18":
            return RESNET_CONFIG
        p, gamma, k = DEFAULTS[self.arch if self.arch in DEFAULTS else "vit"]
        # ViTs always score by attribution
        return UnActConfig(p, gamma, k, "attribution")

    def class_images(self, cls: int, n: int | None = None, seed: int = 0) -> np.ndarray:
        """n seeded-random training images of class `cls` (all of them when n is None or 0)."""
        if not 0 <= int(cls) < self.num_classes:
            raise MunkeyError(f"Class {cls} does not exist: this run's classes are 0-{self.num_classes - 1} "
                              f"({', '.join(self.class_names)}).")
        tr = self.dataset.train
        idx = np.flatnonzero(tr.labels == cls)
        if n:
            if n < 1:
                raise MunkeyError(f"n (--n) is how many of the class's training images to use: 1 or more, or 0 for all of "
                                  f"them (got {n}).")
            idx = np.sort(np.random.default_rng(seed).choice(idx, size=min(int(n), len(idx)), replace=False))
        return tr.images[idx]

    def prepare(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """User images of any size/channels -> dataset-shaped uint8 (n, H, W, C)."""
        return self.run.prepare_images(images)

    def to_input(self, images_u8: np.ndarray) -> torch.Tensor:
        return self.run.to_input(images_u8)

    # ----- evaluation ---------------------------------------------------------------------

    @property
    def forwards(self) -> ForwardCache:
        """The test images' forwards kept for this editor (MUNKEY runs; unlearn/forwardcache.py)."""
        with self._warm_lock:
            if self._forwards is None:
                self._forwards = ForwardCache(self.run)
            return self._forwards

    def predict_test(self, model: torch.nn.Module, bank: MemoryBank | None = None,
                     index: np.ndarray | None = None) -> np.ndarray:
        """Predicted labels of the evaluated test images (or of test rows `index`) under `model`
        (and `bank` for MUNKEY; default the run's bank). MUNKEY runs reuse the forwards that every
        request shares (`forwards`): the same labels as a full prediction, most of the work done once."""
        index = self.test_index if index is None else index
        if isinstance(self.run, LoadedMunkeyRun):
            with self.run.lock:
                return self.forwards.predict(model, self.run.bank if bank is None else bank, index)
        return self.run.predict_split("test", index, model, bank)

    def warm_up(self, *more: np.ndarray) -> threading.Thread:
        """Start computing, off the caller's thread, what every request measures and none changes: the
        unedited run's predictions on the evaluated test images (and on test rows `more`, e.g. a job's
        probe); on a MUNKEY run this stores their forwards (`forwards`). Once per editor; a request
        started meanwhile waits for the shared part and loses nothing. Errors are left to the request."""
        with self._warm_lock:
            if self._warm is None:
                def work() -> None:
                    try:
                        self.original_predictions()
                        for index in more:
                            self.predict_test(self.model, index=index)
                    except Exception:  # the request that needs it raises it with its own message
                        pass
                self._warm = threading.Thread(target=work, name="munkey-class-warm-up", daemon=True)
                self._warm.start()
            return self._warm

    def original_predictions(self) -> np.ndarray:
        """The unedited run's labels on the evaluated test images (computed once: the model is never edited)."""
        if self._original_pred is None:
            self._original_pred = self.predict_test(self.model)
        return self._original_pred

    def metrics(self, cls: int, model: torch.nn.Module | None = None, bank: MemoryBank | None = None) -> ClassMetrics:
        """Af/Ar of `model` (default: the unedited run, whose test predictions are computed once)."""
        if model is None and bank is None:
            pred = self.original_predictions()
        else:
            pred = self.predict_test(self.model if model is None else model, bank)
        return class_metrics(pred, self.dataset.test.labels[self.test_index], cls, self.num_classes)

    def af_verdict(self, req: ClassRequest) -> dict:
        """The request's Af against its target, in words (eval/verdicts.py): the class oracle's Af when one
        exists, else 0 (a model that never learnt the class), with the interval of the class's test images;
        a "not yet" reason ends by saying the class is not gone (the page and the CLI show it as is)."""
        n_cls = int((self.dataset.test.labels[self.test_index] == req.cls).sum())
        target = req.oracle.Af if req.oracle is not None else 0.0
        v = verdict("Af", req.after.Af, target, n=n_cls,
                    target_label="(the class oracle: the same recipe trained without the class)" if req.oracle
                    is not None else "(a model that never learnt the class scores 0 on it)")
        if v["verdict"] == NOT_YET:
            v["reason"] += " The class is not gone."
        return v

    # ----- oracles -------------------------------------------------------------------------
    def oracle_path(self, cls: int) -> Path:
        return self.root / ORACLE_DIR / f"class_{int(cls)}"

    def oracle_metrics(self, cls: int) -> ClassMetrics | None:
        """Af*, Ar* of the class oracle on the same test images (cached in the oracle's directory)."""
        path = self.oracle_path(cls)
        if not RunPaths(path).config.exists():
            return None
        cache = path / "class_eval.json"
        tag = {"cls": int(cls), "n_test": int(len(self.test_index)), "test_hash": _index_hash(self.test_index)}
        if cache.exists():
            data = read_json(cache)
            if data.get("tag") == tag:
                return ClassMetrics(**data["metrics"])
        oracle = load_run(path, device=str(self.device))  # its own model (and bank), on the same test images
        m = class_metrics(oracle.predict_split("test", self.test_index), self.dataset.test.labels[self.test_index],
                          cls, self.num_classes)
        atomic_write_json(cache, {"tag": tag, "metrics": asdict(m)})
        return m

    def train_oracle(self, cls: int, progress: bool = True) -> Path:
        """Retrain this run's recipe without class `cls` into oracles/class_C (skipped when it exists)."""
        path = self.oracle_path(cls)
        if RunPaths(path).config.exists():
            return path
        return retrain(self.run.config, path, exclude_classes=[cls], device=str(self.device), progress=progress)

    # ----- requests -------------------------------------------------------------------------
    def fingerprint(self) -> str:
        return self.run.model_fingerprint

    def working_copy(self) -> torch.nn.Module:
        return copy.deepcopy(self.model).eval()

    def run_unact(self, images_u8: np.ndarray, cfg: UnActConfig | None = None, *, model: torch.nn.Module | None = None,
                  on_round: Callable[[RoundInfo, torch.nn.Module], None] | None = None,
                  bank: MemoryBank | None = None, target: int | None = None, path: str = "inference",
                  head: bool | None = None, blocks: int | None = None, retain_exclude: Sequence[int] = ()):
        """UnAct on a copy (or on `model`, edited in place). Returns (edited model, UnActResult).

        MUNKEY runs: `path="inference"` scores the backbone along the path inference takes, each image
        with its K neighbours retrieved from `bank` (default the run's bank; class removal passes the
        bank its key deletion leaves); `path="image"` scores the image pathway alone (null token, the
        earlier design). `target`: the class to suppress (default the pseudo-label); `head`: also edit
        the classifier's inputs (default: on MUNKEY runs); `blocks`: final ViT blocks in scope. When
        `cfg` protects the kept classes (protect / guard) the request builds their probe
        (`retain_probe`), leaving out the classes in `retain_exclude` (removed by earlier requests)."""
        cfg = cfg or self.default_config()
        cfg.check()
        if len(images_u8) == 0:
            raise MunkeyError("UnAct needs at least one image of the class to forget.")
        if path not in ("inference", "image"):
            raise MunkeyError(f"Unknown scoring path '{path}'; choose inference or image.")
        work = self.working_copy() if model is None else model
        head = (self.kind == "munkey" and MUNKEY_HEAD) if head is None else head
        forward = None
        if self.kind == "munkey" and path == "inference":
            values, weights = self.neighbours(images_u8, bank)
            depth = len(work.vit.blocks)
            cut = depth - (vit_blocks(depth) if blocks is None else int(blocks))  # the first block UnAct edits
            # the request's images are re-scored every round: what comes before the edited blocks, once
            forward = (prefix_ensemble_forward(work, self.to_input(images_u8), values, weights, cut)
                       or munkey_ensemble_forward(work, values, weights))
        scope = scope_for(work, forward=forward, score=cfg.score, blocks=blocks, head=head)
        callback = None if on_round is None else (lambda info: on_round(info, work))
        probe = None
        if cfg.needs_probe:
            if target is None:
                target = self.pseudo_label(images_u8, model=work, bank=bank)
            probe = self.retain_probe(work, int(target), bank=bank, scope=scope, blocks=blocks, head=head,
                                      path=path, exclude=retain_exclude)
        result = unact(scope, self.to_input(images_u8), cfg, on_round=callback, target=target, retain=probe)
        return work, result

    def retain_probe(self, model: torch.nn.Module, target: int, *, bank: MemoryBank | None = None,
                     scope=None, blocks: int | None = None, head: bool = False, path: str = "inference",
                     exclude: Sequence[int] = (), per_class: int = PROBE_PER_CLASS, seed: int = 0) -> RetainProbe:
        """The kept classes' probe for a request that removes `target`: `per_class` seeded training images
        of every other class (MUNKEY: of the classes left in `bank`, drawn from its entries, each fed with
        its K neighbours from that bank but never itself, as an unseen image would be), minus the classes
        in `exclude` (already removed). Forward-only, like the request; the request's own images are
        never in it (they are the target's)."""
        tr = self.dataset.train
        if self.kind == "munkey":
            with self.run.lock:
                b = self.run.bank if bank is None else bank
                ids, labels = b.ids.copy(), b.labels.copy()
        else:
            ids, labels = tr.ids, tr.labels
        rng = np.random.default_rng(seed)
        keep = [c for c in np.unique(labels) if c != target and c not in set(int(e) for e in exclude)]
        chosen = np.concatenate([np.sort(rng.choice(ids[labels == c], size=min(per_class, int((labels == c).sum())),
                                                    replace=False)) for c in keep]) if keep else np.zeros(0, np.int64)
        if len(chosen) == 0:
            raise MunkeyError("No class is left to keep: the retain probe is empty.")
        row_of = {int(i): r for r, i in enumerate(tr.ids)}
        rows_ = np.array([row_of[int(i)] for i in chosen])
        images = tr.images[rows_]
        if self.kind != "munkey":
            return RetainProbe(scope or scope_for(model), self.to_input(images), tr.labels[rows_], chosen)
        forward = None
        if path == "inference":
            keys = torch.as_tensor(self.run.split_keys("train")[rows_])
            k = self.run.train_cfg.k
            with self.run.lock:
                b = self.run.bank if bank is None else bank
                sims, found = b.search(keys, k, exclude=[[int(i)] for i in chosen])
                values = b.values.to(found.device)[found].float()
            weights = neighbour_weights(sims.float(), self.run.train_cfg.tau, "ensemble")
            depth = len(model.vit.blocks)
            cut = depth - (vit_blocks(depth) if blocks is None else int(blocks))  # the first block UnAct edits
            # the probe is re-run every round: what comes before the edited blocks is computed once
            forward = (prefix_ensemble_forward(model, self.to_input(images), values, weights, cut)
                       or munkey_ensemble_forward(model, values, weights))
        probe_scope = scope_for(model, forward=forward, score="attribution", blocks=blocks, head=head)
        return RetainProbe(probe_scope, self.to_input(images), tr.labels[rows_], chosen)

    # ----- the MUNKEY inference path ------------------------------------------------------------
    def request_keys(self, images_u8: np.ndarray) -> np.ndarray:
        """Keys (n, Dk) of request images: a training image's cached key, the key encoder's for any other."""
        if self._train_rows is None:
            self._train_rows = {hashlib.sha1(img.tobytes()).digest(): i
                                for i, img in enumerate(np.ascontiguousarray(self.dataset.train.images))}
        rows = [self._train_rows.get(hashlib.sha1(np.ascontiguousarray(img).tobytes()).digest()) for img in images_u8]
        known = [i for i, r in enumerate(rows) if r is not None]
        unknown = [i for i, r in enumerate(rows) if r is None]
        keys: dict[int, np.ndarray] = {}
        if known:
            keys.update(zip(known, self.run.split_keys("train")[[rows[i] for i in known]]))
        if unknown:
            keys.update(zip(unknown, self.run.encoder.encode(np.ascontiguousarray(images_u8[unknown]))))
        return np.stack([keys[i] for i in range(len(images_u8))]).astype(np.float32)

    def neighbours(self, images_u8: np.ndarray, bank: MemoryBank | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """What MUNKEY inference feeds the backbone for the request images: the exemplars of their K
        nearest keys in `bank` (default the run's) (n, K, Dv) and the ensemble weights (n, K)."""
        if self.kind != "munkey":
            raise MunkeyError("Retrieved neighbours exist only on MUNKEY runs.")
        keys, k = torch.as_tensor(self.request_keys(images_u8)), self.run.train_cfg.k
        if bank is None:  # the run's own bank: searched under its lock (a deletion moves rows)
            hits = self.run.search(keys, k, values=True)
            sims, values = hits.similarities, hits.values
        else:  # a private copy (class removal's bank without the class)
            sims, rows = bank.search(keys, k)
            values = bank.values.to(rows.device)[rows]
        weights = neighbour_weights(sims.float(), self.run.train_cfg.tau, "ensemble")
        return values.float(), weights

    def run_ssd(self, images_u8: np.ndarray, labels: np.ndarray | None, cfg: SSDConfig, *, cls: int,
                cold: bool = False):
        """SSD/LFSSD on a copy, forgetting class `cls`; `cold` recomputes I_D even when it is cached.
        I_D runs over the training data in the reference order for `cls` (ssd.reference_order: the
        retain classes in order, then `cls`). Returns (model, SSDResult)."""
        if self.kind != "classifier":
            raise MunkeyError("SSD and LFSSD edit conventional classifiers (ResNet-18 / ViT runs).")
        if len(images_u8) == 0:
            raise MunkeyError("SSD needs at least one image of the class to forget.")
        work = self.working_copy()
        tr = self.dataset.train
        cache = self.root / "importance"
        fp = self.fingerprint()

        order = reference_order(tr.labels, int(cls))

        def compute():
            return importance(work, self.to_input, tr.images[order], tr.labels[order], cfg.method, cfg.batch_size)

        def full():
            return cached_importance(cache, fp, cfg.method, cfg.batch_size, compute, refresh=cold, order=f"c{int(cls)}")

        res = ssd_forget(work, self.to_input, images_u8, labels, full, cfg)
        return work, res

    def class_bank(self, cls: int, base: MemoryBank | None = None) -> tuple[MemoryBank, list[int]]:
        """A copy of the MUNKEY bank (or of `base`) without every entry labelled `cls`, and the deleted ids."""
        if self.kind != "munkey":
            raise MunkeyError("Class key deletion needs a MUNKEY run (its memory bank).")
        b = self.run.bank if base is None else base
        bank = MemoryBank(b.ids, b.labels, b.keys.clone(), b.values.clone())
        ids = [int(i) for i in b.ids[b.labels == cls]]
        bank.delete(ids)
        bank.compact()
        return bank, ids

    def request(self, method: str, images_u8: np.ndarray, *, cls: int | None = None,
                labels: np.ndarray | None = None, cfg: UnActConfig | None = None,
                ssd: SSDConfig | None = None, cold: bool = False,
                on_round: Callable[[RoundInfo, torch.nn.Module], None] | None = None,
                unact_options: dict | None = None
                ) -> tuple[ClassRequest, torch.nn.Module, MemoryBank | None]:
        """Run one request with `method` on the images; measured against the class `cls` (default: the
        pseudo-label). `unact_options` go to `run_unact` (path, head, blocks). Returns the report, the
        edited model and (MUNKEY) the edited bank."""
        if method not in METHODS:
            raise MunkeyError(f"Unknown method '{method}'; choose one of {', '.join(METHODS)}.")
        if len(images_u8) == 0:
            raise MunkeyError("The request holds no image of the class to forget.")
        uses_unact = method in ("unact", "keys+unact")
        munkey = self.kind == "munkey"
        # UnAct finds the pseudo-label in its first pass; on a MUNKEY run it is the class the unedited run
        # predicts (inference path, whole bank), found first: key deletion changes what UnAct would read
        pseudo = None if uses_unact and not munkey else self.pseudo_label(images_u8)
        details: dict = {}
        bank = None
        t0 = time.perf_counter()
        excluded = 0.0  # time spent measuring rounds for the caller, not part of the request
        if method.startswith("keys"):
            bank, ids = self.class_bank(pseudo if cls is None else int(cls))
            if not len(ids) and method == "keys":
                raise MunkeyError(f"Class {pseudo if cls is None else int(cls)} has no training sample left in this "
                                  "run's memory bank (its keys were deleted earlier): key deletion has nothing to "
                                  "remove. Nothing was changed.")
            details.update(keys_deleted=len(ids))
        if uses_unact:
            t_unact = time.perf_counter()
            # a named class is the one UnAct suppresses: where the model reads the images as another class (e.g.
            # the named one is already gone), following the pseudo-label would erase a class nobody asked about
            target = int(cls) if cls is not None else (pseudo if munkey else None)
            model, res = self.run_unact(images_u8, cfg, on_round=on_round, bank=bank, target=target,
                                        **(unact_options or {}))
            excluded = time.perf_counter() - t_unact - res.seconds
            read_as = pseudo if munkey else int(np.argmax(res.mean_logits))  # what the unedited model predicts
            if cls is not None and read_as != int(cls):
                details.update(read_as=read_as)
            pseudo = read_as
            details.update(target=res.pseudo_label, rounds=len(res.rounds), units=len({u for r in res.rounds for u in r.selected}),
                           p=res.config.p, gamma=res.config.gamma, k=res.config.k, stop=res.config.stop,
                           stop_reason=res.stop_reason or "all rounds")
            if res.config.guard is not None:  # the retain guard: the kept classes' probe before and after
                details.update(guard=res.config.guard, class_guard=res.config.class_guard, probe_before=res.probe_start,
                               probe_after=next((r.probe_accuracy for r in reversed(res.rounds)), res.probe_start))
            if res.left_predicted is not None:  # the request's own images when a stop rule ended it
                details.update(left_class=res.pseudo_label, left_predicted=res.left_predicted, left_mean_prob=res.left_mean_prob,
                               left_max_prob=res.left_max_prob, chance=1.0 / len(res.mean_logits),
                               tail=res.config.tail, forgotten_below=forgotten_below(res.config, res.n_images))
            if self.arch == "resnet18":
                details["score"] = res.config.score
        cls = pseudo if cls is None else int(cls)
        if method == "mask":
            model = mask_logit(self.working_copy(), cls)
        elif method in ("ssd", "lfssd"):
            scfg = ssd or SSDConfig(method=method, alpha=10.0 if self.arch == "resnet18" else 5.0)
            lab = None if method == "lfssd" else (np.full(len(images_u8), cls) if labels is None else labels)
            model, res = self.run_ssd(images_u8, lab, scfg, cls=cls, cold=cold)
            details.update(dampened=res.dampened, dampened_pct=res.dampened_pct,
                           importance_cached=res.full_importance_cached)
        elif not uses_unact:
            model = self.model
        seconds = time.perf_counter() - t0 - excluded
        before = self.metrics(cls)
        after = self.metrics(cls, model, bank)
        oracle = self.oracle_metrics(cls)
        return (ClassRequest(method, cls, pseudo, len(images_u8), seconds, before, after, oracle,
                             after.delta(oracle), details), model, bank)

    @torch.no_grad()
    def pseudo_label(self, images_u8: np.ndarray, model: torch.nn.Module | None = None,
                     bank: MemoryBank | None = None) -> int:
        """argmax of the mean logits over the images (MUNKEY: of the mean log ensemble probabilities,
        each image with its neighbours in the run's bank: the class the run predicts)."""
        m = self.model if model is None else model
        x = self.to_input(images_u8)
        if self.kind != "munkey":
            return int(torch.cat([m(x[i:i + 256]) for i in range(0, len(x), 256)]).double().mean(0).argmax())
        scope = scope_for(m, forward=munkey_ensemble_forward(m, *self.neighbours(images_u8, bank)))
        total = None
        for i in range(0, len(x), 256):
            logits, _ = scope.forward_stats(x[i:i + 256], slice(i, min(i + 256, len(x))))
            total = logits.double().sum(0) if total is None else total + logits.double().sum(0)
        return int(total.argmax())

    # ----- saving ---------------------------------------------------------------------------
    def save(self, out: str | Path, model: torch.nn.Module, request: ClassRequest, *,
             operator: str | None = None) -> Path:
        """Write the edited model as a new run at `out` (the original run stays untouched)."""
        out = check_new_run_dir(out)  # a new or empty folder only: never a user's files
        if out.resolve() == self.root.resolve():
            raise MunkeyError("The edited model is saved as a new run; --out must differ from the run.")
        config = dict(self.run.config)
        lineage = list(config.get("edits", [])) + [{"method": request.method, "class": request.cls,
                                                    "from_run": str(self.root), "n_images": request.n_images,
                                                    "details": request.details, "Af": request.after.Af,
                                                    "Ar": request.after.Ar, "Delta": request.delta}]
        config["edits"] = lineage
        created = not out.exists()
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        src, dest = self.run.paths, RunPaths(out)
        try:
            if isinstance(self.run, LoadedMunkeyRun):
                with self.run.runlock.hold(exclusive=False):  # no deletion of the source while copying
                    rows.write_bank(dest.bank, rows.load_bank(src.root))
                    for name in (src.forgotten.name, src.history.name):
                        if (src.root / name).exists():
                            shutil.copy2(src.root / name, dest.root / name)
                    atomic_torch_save(dest.model, model.state_dict())
                    atomic_write_json(dest.config, config)
                    # the new run's log starts from the parent's log head and lists the deletions it inherits
                    start_derived_log(self.root, out, method=request.method, operator=operator,
                                      url=self.run.audit_url)
            else:
                atomic_torch_save(dest.model, model.state_dict())
                atomic_write_json(dest.config, config)
        except BaseException:
            if created:
                shutil.rmtree(out, ignore_errors=True)
            else:
                for p in list(out.iterdir()):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            raise
        if isinstance(self.run, LoadedMunkeyRun) and request.method.startswith("keys"):
            new = open_recovered(out, device=str(self.device))
            ids = [int(i) for i in new.bank.ids[new.bank.labels == request.cls]]
            if ids:  # none when the class's keys were deleted earlier: the UnAct edit alone is saved
                forget(new, ids, operator=operator, source=f"class {request.cls} ({request.method})")
        make_private(out)
        return out


def guard_limits(details: dict) -> str:
    """How far a request's retain guard let the kept classes' probe fall ("2 points", or "2 points, or
    one kept class more than 10"), for the messages of the CLI and the Class unlearning page."""
    text = f"{details.get('guard', 0):g} points"
    return text if details.get("class_guard") is None else f"{text}, or one kept class more than {details['class_guard']:g}"


def read_as_note(request: ClassRequest, class_names: Sequence[str]) -> str:
    """When the unedited model read the request's images as another class than the one named (the named class
    already gone, or images it gets wrong), what UnAct did about it; "" otherwise."""
    seen = request.details.get("read_as")
    if seen is None:
        return ""
    return (f"The unedited model read these images as class {seen} ({class_names[seen]}), not class {request.cls} "
            f"({class_names[request.cls]}): UnAct suppressed class {request.cls}, the class named, and left class "
            f"{seen} alone.")


def request_left(request: ClassRequest) -> str:
    """What the request's own images showed when a stop rule ended it early, against what the
    "forgotten" stop asks ("3 of 35 image(s) still predicted as the class (the stop asks for none); its
    mean probability over them 4.1 % (below 8.2 %), largest 27.0 % (below 20.0 %)"), or "" when
    the request ran all its rounds. It says what was measured; whether the class is gone from the test
    split is Af's verdict."""
    details, n_images = request.details, request.n_images
    if details.get("left_predicted") is None:
        return ""
    chance, target = float(details["chance"]), int(details["left_class"])
    still = int(round(float(details["left_predicted"]) * n_images))
    which = "the class" if target == request.cls else f"class {target} (the images' pseudo-label)"
    text = (f"{still} of {n_images} image(s) still predicted as {which} (the stop asks for none); its mean "
            f"probability over them {100 * details['left_mean_prob']:.1f} % (below "
            f"{100 * details['forgotten_below'] * chance:.1f} %)")
    tail = details.get("tail")
    return text + ("" if tail is None else
                   f", largest {100 * details['left_max_prob']:.1f} % (below {100 * float(tail) * chance:.1f} %)")


def mask_logit(model: torch.nn.Module, cls: int) -> torch.nn.Module:
    """The trivial suppression, in place: the classifier row of `cls` zeroed and its bias set to
    MASK_LOGIT, so the class is never predicted. Nothing else changes: the features still carry it."""
    head = getattr(model, "fc", None) or getattr(getattr(model, "vit", model), "head")
    with torch.no_grad():
        head.weight[int(cls)] = 0.0
        head.bias[int(cls)] = MASK_LOGIT
    return model


def _index_hash(index: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(index, dtype=np.int64).tobytes()).hexdigest()[:16]
