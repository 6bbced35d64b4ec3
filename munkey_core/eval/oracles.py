"""Random-forgetting oracles and the measurements compared against them (TA, RA, FA, MIA, Avg Gap).

An oracle is the same recipe retrained from scratch without the forget set: a MUNKEY ("M-oracle",
the reference for MUNKEY's key deletion) and a plain ViT of the same backbone ("T-oracle", the
reference for post-hoc methods). Both are cached inside the original run directory, keyed by the
forget set: RUN/oracles/random_<sha256 of the sorted ids, 12 hex>_{munkey,vit}/ (class oracles use
RUN/oracles/class_C/). A re-request of the same forget set reuses them.

The noise floor: the same oracle retrained with another *training* seed (`train_seed`; the data
split stays the run's, TrainConfig.data_seed), in RUN/oracles/random_<tag>_<kind>_t<seed>/. The Avg
Gap between two such oracles is what retraining chance alone gives; a method's gap means something
only next to it (`floor_seeds` names the seeds, `evaluate_against_oracle(noise_floor=n)` measures it).
`train_reference_models` trains the strong attack's reference models of either family.

`measure` scores any model given as a `Scorer` (split name, row index -> class probabilities) on one
`EvalSets` (seeded subsamples of test, retain and forget rows), so a model and its oracle are always
compared on the same samples. MIA is the cheap attack unless a `StrongAttack` bound to the same
forget and test rows is given; each result names its attack and carries its TPR at 1% and 0.1% FPR.
Tests: tests/eval/test_oracles.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from munkey_core.config import TrainConfig, from_dict
from munkey_core.errors import MunkeyError
from munkey_core.eval.metrics import GAP_KEYS, LOW_FPRS, MIA_CHEAP, accuracy, avg_gap, remembered_reference, tpr_key
from munkey_core.eval.mia import MIA_STRONG, ReferenceModels, Scorer, StrongAttack, cheap_attack, half_splits
from munkey_core.atomic import atomic_write_json, read_json
from munkey_core.run.loaded import ClassifierRun, LoadedMunkeyRun
from munkey_core.run.paths import RunPaths
from munkey_core.training.runs import retrain

ORACLE_DIR = "oracles"
KINDS = ("munkey", "vit")
TPR_KEYS = tuple(tpr_key(f) for f in LOW_FPRS)  # ("TPR@1%", "TPR@0.1%")
_FLOOR_STEP = 1000  # noise-floor oracle j of seed s trains with seed s + 1000 j
MAX_FLOOR_ORACLES = 10  # noise-floor oracles one evaluation or bench cell may ask for


def forget_tag(ids: Sequence[int]) -> str:
    """A short stable name of a forget set: sha256 of its sorted ids, 12 hex digits."""
    text = ",".join(str(i) for i in sorted(int(i) for i in ids))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def oracle_path(run_root: str | Path, ids: Sequence[int], kind: str, train_seed: int | None = None) -> Path:
    """RUN/oracles/random_<tag>_<kind>[_t<train_seed>]: where the oracle for this forget set lives (with
    `train_seed`: the one retrained with that training seed, for the noise floor)."""
    if kind not in KINDS:
        raise MunkeyError(f"Unknown oracle kind '{kind}'; choose munkey or vit.")
    suffix = "" if train_seed is None else f"_t{int(train_seed)}"
    return Path(run_root) / ORACLE_DIR / f"random_{forget_tag(ids)}_{kind}{suffix}"


def check_floor_oracles(n: int) -> None:
    """Refuse a noise floor of more than MAX_FLOOR_ORACLES oracles before any training: each is a full
    retraining, so a typo would mean days of it."""
    if not 0 <= int(n) <= MAX_FLOOR_ORACLES:
        raise MunkeyError(f"A noise floor of {n} oracles would retrain the model {n} times (each as long as "
                          f"'munkey train'); give 0 to {MAX_FLOOR_ORACLES} (2 is usually enough to see the spread).")


def floor_seeds(seed: int, n: int) -> list[int]:
    """Training seeds of `n` noise-floor oracles for a run trained with `seed` (never `seed` itself)."""
    check_floor_oracles(n)
    return [int(seed) + _FLOOR_STEP * j for j in range(1, n + 1)]


def data_seed_of(config: dict) -> int:
    """The data split seed of a run's config (runs made before split_seed existed: their seed)."""
    return from_dict(TrainConfig, config["train"]).data_seed


def train_oracle(config: dict, run_root: str | Path, forget_ids: Sequence[int], kind: str, *,
                 train_seed: int | None = None, device: str = "auto", progress: bool = True) -> tuple[Path, bool]:
    """Retrain `config`'s recipe without `forget_ids` as a MUNKEY or a plain ViT; (path, trained now).

    `train_seed`: retrain with that training seed on the run's own data split (a noise-floor oracle).
    An existing oracle for the same forget set (and seed) is reused (trained now = False)."""
    path = oracle_path(run_root, forget_ids, kind, train_seed)
    if RunPaths(path).config.exists():
        return path, False
    ids = sorted(int(i) for i in forget_ids)
    if not ids:
        raise MunkeyError("The forget set is empty: there is nothing to retrain without.")
    seed_over = None if train_seed is None else {"seed": int(train_seed), "split_seed": data_seed_of(config)}
    if kind == "munkey" and "encoder" not in config:
        raise MunkeyError("An M-oracle needs a MUNKEY run (its key encoder); this is a classifier run.")
    retrain(config, path, arch=None if kind == "munkey" else "vit", exclude_ids=ids, extra_overrides=seed_over,
            device=device, progress=progress)
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


def measure(score: Scorer, ds, sets: EvalSets, strong: StrongAttack | None = None, control: bool = False) -> dict:
    """TA, RA, FA and MIA (percent) of one model on `sets`; MIA_attack names the attack. `control` (cheap
    attack) adds FA_remembered / MIA_remembered / n_remembered: the same on the retain samples, weighted to
    the forget samples' classes (metrics.remembered_reference), what a sample still remembered reads."""
    test_p, ret_p, fgt_p = score("test", sets.test), score("train", sets.retain), score("train", sets.forget)
    ty, ry, fy = ds.test.labels[sets.test], ds.train.labels[sets.retain], ds.train.labels[sets.forget]
    out = {"TA": accuracy(test_p.argmax(1), ty), "RA": accuracy(ret_p.argmax(1), ry),
           "FA": accuracy(fgt_p.argmax(1), fy), "MIA": None, **{k: None for k in TPR_KEYS}, "MIA_attack": None}
    if len(sets.forget):
        if strong is None:
            out.update(cheap_attack(fgt_p, fy, test_p, ty), MIA_attack=MIA_CHEAP)
            if control:
                out.update(remembered_reference(ret_p, ry, test_p, ty, fy))
        else:
            out.update(strong.metrics(fgt_p, test_p), MIA_attack=MIA_STRONG)
    return out


def remembered_control(run: dict, oracle: dict) -> dict:
    """The oracle comparison's positive control: the run's Avg Gap to the M-oracle had the deleted samples
    read like the samples it still holds (FA and MIA replaced by FA_remembered / MIA_remembered of
    `measure(..., control=True)`; TA and RA its own). Within the bar too, the gaps cannot show a remembered
    sample (floors.gap_verdict). AvgGap None where the run holds no sample of the deleted classes."""
    held = {**run, "FA": run.get("FA_remembered"), "MIA": run.get("MIA_remembered")}
    return {"AvgGap": gaps(held, oracle)["AvgGap"], "FA": held["FA"], "MIA": held["MIA"],
            "what": "the run's Avg Gap to the M-oracle had the deleted samples read like the samples it still "
                    "holds (same classes): what a model still remembering them would read"}


def gaps(metrics: dict, oracle: dict) -> dict:
    """|metric - oracle| per TA/RA/FA/MIA and their mean, Avg Gap (None where a metric is missing)."""
    if any(metrics.get(k) is None or oracle.get(k) is None for k in GAP_KEYS):
        return {**{f"gap_{k}": None for k in GAP_KEYS}, "AvgGap": None}
    return {**{f"gap_{k}": abs(metrics[k] - oracle[k]) for k in GAP_KEYS}, "AvgGap": avg_gap(metrics, oracle)}


def train_reference_models(config: dict, folder: str | Path, *, family: str, n_refs: int, seed: int,
                           exclude_ids: Sequence[int], device: str = "auto", progress: bool = True,
                           on_trained: Callable[[], None] | None = None) -> ReferenceModels:
    """The strong attack's reference models for targets of `family` ("munkey" or "vit"), with the recipe
    of `config` (a run of that family, or one whose recipe it shares), cached in `folder/ref_<i>/`.

    Each trains on one of `n_refs` complementary random halves of the training split minus
    `exclude_ids` (the forget sets they will be asked about), with its own training seed on the run's
    data split; so every forget sample and every test sample is "out" for all of them."""
    from munkey_core.data import datasets as data_mod

    if family not in KINDS:
        raise MunkeyError(f"Unknown reference family '{family}'; choose munkey or vit.")
    if family == "munkey" and "encoder" not in config:
        raise MunkeyError("MUNKEY reference models need a MUNKEY run's recipe (its key encoder).")
    folder = Path(folder)
    meta = folder / "references.json"
    excluded = sorted(int(i) for i in exclude_ids)
    if not meta.exists():
        train_cfg = from_dict(TrainConfig, config["train"])
        ds = data_mod.load_dataset(config["dataset"], config.get("data_root"), seed=train_cfg.data_seed,
                                   max_train=train_cfg.max_train or None)
        pool = np.setdiff1d(ds.train.ids, excluded)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(meta, {"family": family, "seed": seed, "excluded": forget_tag(excluded) if excluded else None,
                                 "train_ids": ds.train.ids.tolist(),
                                 "halves": [h.tolist() for h in half_splits(pool, n_refs, seed)]})
    info = read_json(meta)
    if len(info["halves"]) != n_refs or info.get("family") != family:
        raise MunkeyError(f"{folder} holds {len(info['halves'])} {info.get('family')} reference models, not {n_refs} "
                          f"{family}; delete it or ask for that many.")
    train_ids = np.asarray(info["train_ids"], dtype=np.int64)
    scorers, members = [], []
    for i, half in enumerate(info["halves"]):
        member = np.asarray(half, dtype=np.int64)
        path = folder / f"ref_{i}"
        over = {"seed": int(seed) + 100 + i, "split_seed": data_seed_of(config)}
        if not RunPaths(path).config.exists():
            leave_out = np.setdiff1d(train_ids, member).tolist()
            retrain(config, path, arch=None if family == "munkey" else "vit", exclude_ids=leave_out,
                    extra_overrides=over, device=device, progress=progress)
            if on_trained is not None:
                on_trained()
        scorers.append(_reference_scorer(path, family, device))
        members.append(member)
    return ReferenceModels(scorers, members, family)


def _reference_scorer(path: Path, family: str, device: str) -> Scorer:
    """The Scorer of a trained reference run (MUNKEY: its own bank; retrieval with the cached keys)."""
    if family == "munkey":
        run = LoadedMunkeyRun(path, device=device)
        return munkey_scorer(run.model, run.bank, run.dataset, run.split_keys, run.train_cfg.k, run.train_cfg.tau)
    run = ClassifierRun(path, device=device)
    return classifier_scorer(run.model, run.dataset, run.cfg.img_size)


def _cached_measure(path: Path, score: Callable[[], Scorer], ds, sets: EvalSets, tag: dict) -> dict:
    """`measure` of the model at `path`, cached in path/oracle_metrics.json under `tag`."""
    cache = path / "oracle_metrics.json"
    if cache.exists() and read_json(cache).get("tag") == tag:
        return read_json(cache)["metrics"]
    metrics = measure(score(), ds, sets)
    atomic_write_json(cache, {"tag": tag, "metrics": metrics})
    return metrics


def stored_oracle_comparison(run, *, max_samples: int = 2000, seed: int = 0, max_floor: int = 5) -> dict | None:
    """`evaluate_against_oracle` with only the oracles already trained for the run's current forget set (the
    M-oracle and the first noise-floor oracles that exist, up to `max_floor`): trains nothing, so a screen can
    offer it. None when nothing is deleted or no M-oracle exists for exactly these deletions."""
    forget_ids = run.forgotten_ids
    if not forget_ids or not RunPaths(oracle_path(run.paths.root, forget_ids, "munkey")).config.exists():
        return None
    n = 0
    for s in floor_seeds(run.train_cfg.seed, max_floor):
        if not RunPaths(oracle_path(run.paths.root, forget_ids, "munkey", s)).config.exists():
            break
        n += 1
    return evaluate_against_oracle(run, max_samples=max_samples, seed=seed, train_missing=False, noise_floor=n,
                                   progress=False)


def evaluate_against_oracle(run, *, max_samples: int = 2000, seed: int = 0, train_missing: bool = True,
                            noise_floor: int = 0, progress: bool = True) -> dict:
    """`munkey evaluate RUN --oracle`: the run and its M-oracle (same recipe retrained without every id
    deleted so far) on the same samples, with the gaps and Avg Gap. Trains the oracle when missing.

    `noise_floor` n > 0 also retrains n M-oracles with other training seeds (same data split, same
    forget set) and reports their Avg Gap to the M-oracle: the gap retraining chance alone gives."""
    forget_ids = run.forgotten_ids
    if not forget_ids:
        raise MunkeyError("Nothing has been deleted from this run yet, so there is no forget set to compare with "
                          "an oracle. Delete samples first ('munkey forget RUN --ids ...').")
    seeds = floor_seeds(run.train_cfg.seed, noise_floor)
    missing = [p for p in [oracle_path(run.paths.root, forget_ids, "munkey")]
               + [oracle_path(run.paths.root, forget_ids, "munkey", s) for s in seeds] if not RunPaths(p).config.exists()]
    if missing and not train_missing:
        raise MunkeyError(f"No M-oracle for the current forget set yet ({missing[0]}); run 'munkey evaluate RUN "
                          "--oracle' to train it (the run's recipe, minutes on the CPU profile).")
    path, trained = train_oracle(run.config, run.paths.root, forget_ids, "munkey", device=str(run.device),
                                 progress=progress)
    ds = run.dataset
    sets = eval_sets(ds, forget_ids, max_samples=max_samples, seed=seed)
    cfg = run.train_cfg
    mine = measure(munkey_scorer(run.model, run.bank, ds, run.split_keys, cfg.k, cfg.tau), ds, sets, control=True)
    tag = {"max_samples": max_samples, "seed": seed, "metrics": 2}  # 2: with the TPRs at low FPR

    def scorer_of(p: Path) -> Callable[[], Scorer]:
        def make() -> Scorer:
            orun = LoadedMunkeyRun(p, device=str(run.device))
            return munkey_scorer(orun.model, orun.bank, ds, run.split_keys, cfg.k, cfg.tau)
        return make

    oracle = _cached_measure(path, scorer_of(path), ds, sets, tag)
    floor = []
    for s in seeds:
        p, t = train_oracle(run.config, run.paths.root, forget_ids, "munkey", train_seed=s, device=str(run.device),
                            progress=progress)
        m = _cached_measure(p, scorer_of(p), ds, sets, tag)
        floor.append({"train_seed": s, "path": str(p), "trained": t, "metrics": m, "AvgGap": gaps(m, oracle)["AvgGap"]})
    vals = [f["AvgGap"] for f in floor if f["AvgGap"] is not None]
    return {"run": mine, "oracle": oracle, **gaps(mine, oracle), "oracle_path": str(path), "oracle_trained": trained,
            "noise_floor": {"AvgGap": float(np.mean(vals)) if vals else None, "oracles": floor,
                            "what": "Avg Gap to the M-oracle of M-oracles retrained with other training seeds (same "
                                    "data split, same forget set): what retraining chance alone gives"},
            "control": remembered_control(mine, oracle),
            "forget_set": forget_tag(forget_ids), "n_forget": len(forget_ids), "n_test": int(len(sets.test)),
            "n_retain": int(len(sets.retain)), "n_forget_evaluated": int(len(sets.forget)),
            "MIA_attack": MIA_CHEAP}
