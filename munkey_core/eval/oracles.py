"""Random-forgetting oracles and the measurements compared against them (TA, RA, FA, MIA, Avg Gap).

An oracle is the same recipe retrained from scratch without the forget set: a MUNKEY ("M-oracle",
the reference for MUNKEY's key deletion) and a plain ViT of the same backbone ("T-oracle", the
reference for post-hoc methods). Both are cached inside the original run directory, keyed by the
forget set: RUN/oracles/random_<sha256 of the sorted ids, 12 hex>_{munkey,vit}/ (class oracles use
RUN/oracles/class_C/). A re-request of the same forget set reuses them.

`measure` scores any model given as a `Scorer` (split name, row index -> class probabilities) on one
`EvalSets` (seeded subsamples of test, retain and forget rows), so a model and its oracle are always
compared on the same samples. MIA is the cheap attack unless a `StrongAttack` bound to the same
forget and test rows is given; each result names its attack. Tests: tests/test_oracles.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from munkey_core.errors import MunkeyError
from munkey_core.eval.metrics import GAP_KEYS, MIA_CHEAP, accuracy, avg_gap
from munkey_core.eval.mia import MIA_STRONG, StrongAttack, cheap_mia
from munkey_core.atomic import atomic_write_json, read_json

ORACLE_DIR = "oracles"
KINDS = ("munkey", "vit")
Scorer = Callable[[str, np.ndarray], np.ndarray]  # (split "train" | "test", row index (n,)) -> probs (n, C)


def forget_tag(ids: Sequence[int]) -> str:
    """A short stable name of a forget set: sha256 of its sorted ids, 12 hex digits."""
    text = ",".join(str(i) for i in sorted(int(i) for i in ids))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def oracle_path(run_root: str | Path, ids: Sequence[int], kind: str) -> Path:
    """RUN/oracles/random_<tag>_<kind>: where the oracle for this forget set lives."""
    if kind not in KINDS:
        raise MunkeyError(f"Unknown oracle kind '{kind}'; choose munkey or vit.")
    return Path(run_root) / ORACLE_DIR / f"random_{forget_tag(ids)}_{kind}"


def recipe_overrides(config: dict) -> dict:
    """A run's full recipe (training options and backbone sizes) as overrides for retraining it."""
    model = config.get("model") or {k: v for k, v in config.get("classifier", {}).items() if k != "arch"}
    return {**config["train"], **model}


def train_oracle(config: dict, run_root: str | Path, forget_ids: Sequence[int], kind: str, *,
                 device: str = "auto", progress: bool = True) -> tuple[Path, bool]:
    """Retrain `config`'s recipe without `forget_ids` as a MUNKEY or a plain ViT; (path, trained now).

    An existing oracle for the same forget set is reused (trained now = False)."""
    path = oracle_path(run_root, forget_ids, kind)
    if (path / "config.json").exists():
        return path, False
    ids = sorted(int(i) for i in forget_ids)
    if not ids:
        raise MunkeyError("The forget set is empty: there is nothing to retrain without.")
    over = recipe_overrides(config)
    if kind == "munkey":
        from munkey_core.service import train_run

        if "encoder" not in config:
            raise MunkeyError("An M-oracle needs a MUNKEY run (its key encoder); this is a classifier run.")
        train_run(config["dataset"], path, profile=config["profile"], encoder=config["encoder"]["name"],
                  data_root=config.get("data_root"), device=device, overrides=over, progress=progress,
                  exclude_ids=ids, keep_checkpoints=1)
    else:
        from munkey_core.run.classifier import train_classifier_run

        train_classifier_run(config["dataset"], path, arch="vit", profile=config["profile"],
                             data_root=config.get("data_root"), device=device, overrides=over, progress=progress,
                             exclude_ids=ids)
    atomic_write_json(path / "forget_set.json", {"tag": forget_tag(ids), "size": len(ids)})
    return path, True


@dataclass(frozen=True)
class EvalSets:
    """Rows evaluated: indices into the test split, and retain / forget rows of the training split."""

    test: np.ndarray
    retain: np.ndarray
    forget: np.ndarray


def eval_sets(ds, forget_ids: Sequence[int], *, max_samples: int = 2000, seed: int = 0,
              also_deleted: Sequence[int] = ()) -> EvalSets:
    """Seeded subsamples (at most `max_samples` each, 0 = all) of the test split, the retain set (train
    minus the forget set and minus `also_deleted`) and the forget set."""
    rng = np.random.default_rng(seed)
    forget = np.isin(ds.train.ids, np.asarray(list(forget_ids), dtype=np.int64))
    gone = forget | np.isin(ds.train.ids, np.asarray(list(also_deleted), dtype=np.int64))

    def sub(index: np.ndarray) -> np.ndarray:
        if max_samples and len(index) > max_samples:
            return np.sort(rng.choice(index, size=max_samples, replace=False))
        return index

    return EvalSets(sub(np.arange(len(ds.test))), sub(np.flatnonzero(~gone)), sub(np.flatnonzero(forget)))


def munkey_scorer(model, bank, ds, split_keys: Callable[[str], np.ndarray], k: int, tau: float) -> Scorer:
    """Ensemble probabilities of a MUNKEY model with `bank` (retrieval in that bank)."""
    from munkey_core.model.munkey_vit import preprocess_images
    from munkey_core.model.predict import predict

    device = next(model.parameters()).device

    def score(split: str, index: np.ndarray) -> np.ndarray:
        s = ds.split(split)
        x = preprocess_images(torch.from_numpy(np.ascontiguousarray(s.images[index])).to(device), model.cfg.img_size)
        return predict(model, bank, x, split_keys(split)[index], k=k, tau=tau, neighbour_predictions=False).probs

    return score


def classifier_scorer(model, ds, img_size: int) -> Scorer:
    """Softmax probabilities of a plain classifier (ResNet-18 / ViT)."""
    from munkey_core.eval.mia import classifier_probs

    return lambda split, index: classifier_probs(model, ds.split(split).images[index], img_size)


def measure(score: Scorer, ds, sets: EvalSets, strong: StrongAttack | None = None) -> dict:
    """TA, RA, FA and MIA (percent) of one model on `sets`; MIA_attack names the attack."""
    test_p, ret_p, fgt_p = score("test", sets.test), score("train", sets.retain), score("train", sets.forget)
    ty, ry, fy = ds.test.labels[sets.test], ds.train.labels[sets.retain], ds.train.labels[sets.forget]
    out = {"TA": accuracy(test_p.argmax(1), ty), "RA": accuracy(ret_p.argmax(1), ry),
           "FA": accuracy(fgt_p.argmax(1), fy), "MIA": None, "MIA_attack": None}
    if len(sets.forget):
        if strong is None:
            out["MIA"], out["MIA_attack"] = cheap_mia(fgt_p, fy, test_p, ty), MIA_CHEAP
        else:
            out["MIA"], out["MIA_attack"] = strong.auc(fgt_p, test_p), MIA_STRONG
    return out


def gaps(metrics: dict, oracle: dict) -> dict:
    """|metric - oracle| per TA/RA/FA/MIA and their mean, Avg Gap (None where a metric is missing)."""
    if any(metrics.get(k) is None or oracle.get(k) is None for k in GAP_KEYS):
        return {**{f"gap_{k}": None for k in GAP_KEYS}, "AvgGap": None}
    return {**{f"gap_{k}": abs(metrics[k] - oracle[k]) for k in GAP_KEYS}, "AvgGap": avg_gap(metrics, oracle)}


def evaluate_against_oracle(run, *, max_samples: int = 2000, seed: int = 0, train_missing: bool = True,
                            progress: bool = True) -> dict:
    """`munkey evaluate RUN --oracle`: the run and its M-oracle (same recipe retrained without every id
    deleted so far) on the same samples, with the gaps and Avg Gap. Trains the oracle when missing."""
    forget_ids = run.forgotten_ids
    if not forget_ids:
        raise MunkeyError("Nothing has been deleted from this run yet, so there is no forget set to compare with "
                          "an oracle. Delete samples first ('munkey forget RUN --ids ...').")
    path = oracle_path(run.paths.root, forget_ids, "munkey")
    if not (path / "config.json").exists() and not train_missing:
        raise MunkeyError(f"No M-oracle for the current forget set yet ({path}); run 'munkey evaluate RUN --oracle' "
                          "to train it (the run's recipe, minutes on the CPU profile).")
    path, trained = train_oracle(run.config, run.paths.root, forget_ids, "munkey", device=str(run.device),
                                 progress=progress)
    ds = run.dataset
    sets = eval_sets(ds, forget_ids, max_samples=max_samples, seed=seed)
    cfg = run.train_cfg
    mine = measure(munkey_scorer(run.model, run.bank, ds, run.split_keys, cfg.k, cfg.tau), ds, sets)
    cache, tag = path / "oracle_metrics.json", {"max_samples": max_samples, "seed": seed}
    oracle = read_json(cache)["metrics"] if cache.exists() and read_json(cache).get("tag") == tag else None
    if oracle is None:
        from munkey_core.service import MunkeyRun

        orun = MunkeyRun(path, device=str(run.device))
        oracle = measure(munkey_scorer(orun.model, orun.bank, ds, run.split_keys, cfg.k, cfg.tau), ds, sets)
        atomic_write_json(cache, {"tag": tag, "metrics": oracle})
    return {"run": mine, "oracle": oracle, **gaps(mine, oracle), "oracle_path": str(path), "oracle_trained": trained,
            "forget_set": forget_tag(forget_ids), "n_forget": len(forget_ids), "n_test": int(len(sets.test)),
            "n_retain": int(len(sets.retain)), "n_forget_evaluated": int(len(sets.forget)),
            "MIA_attack": MIA_CHEAP}
