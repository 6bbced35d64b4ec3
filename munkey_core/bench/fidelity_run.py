"""The work behind `munkey bench fidelity` (see bench/fidelity.py for what it measures)."""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm.auto import tqdm

from munkey_core.bench._common import mean_sd, munkey_settings, settings_phrases, settings_suffix, write_tables
from munkey_core.bench.fidelity_merge import AUDITED, merged, read_rows, with_audited
from munkey_core.errors import MunkeyError
from munkey_core.atomic import atomic_write_json, read_json
from munkey_core.run.paths import RunPaths

COLUMNS = ("rate", "seed", "method", "oracle", "TA", "RA", "FA", "MIA", "TPR@1%", "TPR@0.1%", "AvgGap", "seconds",
           "MIA_attack", "epoch", "train_seed", "settings", "val_AvgGap", *AUDITED)
SELECTED = "MUNKEY (selected checkpoint)"
FLOOR = {"M": "Noise floor: M-oracle retrained, other training seed", "T": "Noise floor: T-oracle retrained, other "
         "training seed"}
MUNKEY_NONE = "MUNKEY, no unlearning (positive control)"
VIT_NONE = "ViT, no unlearning (positive control)"
TABLE = ("TA", "RA", "FA", "MIA", "TPR@1%", "TPR@0.1%", "AvgGap")
TUNED = " (tuned)"  # suffix of a post-hoc row whose settings were chosen on a validation forget split
CELL_VERSION = 2  # 2: noise-floor and positive-control rows, TPRs at low FPR, same-family references


def _floats(text: str) -> list[float]:
    try:
        vals = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise MunkeyError(f"--rates expects comma-separated fractions such as 0.1,0.02, got {text!r}.") from None
    if not vals or not all(0 < v < 1 for v in vals):
        raise MunkeyError(f"--rates must be fractions between 0 and 1 (exclusive), got {text!r}.")
    return vals


def _row(rate: float, seed: int, method: str, oracle_name: str, metrics: dict, oracle: dict,
         seconds: float | None, **extra) -> dict:
    """One table row: the model's TA/RA/FA/MIA, its Avg Gap to `oracle`, the forgetting seconds."""
    from munkey_core.eval.oracles import gaps

    return {"rate": rate, "seed": seed, "method": method, "oracle": oracle_name,
            **{m: metrics.get(m) for m in ("TA", "RA", "FA", "MIA", "TPR@1%", "TPR@0.1%")},
            "AvgGap": gaps(metrics, oracle)["AvgGap"], "seconds": seconds, "MIA_attack": metrics["MIA_attack"], **extra}


def _timed_key_deletion(bank, ids: list[int]) -> float:
    """MUNKEY's whole unlearning step, in memory (no audit, no disk): delete the keys; its seconds."""
    t0 = time.perf_counter()
    bank.delete(ids)
    bank.compact()
    return time.perf_counter() - t0


@contextmanager
def _own_sqlite_log() -> Iterator[None]:
    """Within: a run without a log gets its own SQLite log, whatever $MUNKEY_AUDIT_URL says."""
    from munkey_core.audit.log import URL_ENV

    saved = os.environ.pop(URL_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[URL_ENV] = saved


def _seeds(count: int, listed: str | None, merging: bool = False) -> list[int]:
    """The seeds to run: `listed` (comma-separated) when given, else 0..count-1 (none for count 0 when
    `merging`: the table then comes from --merge-csv alone)."""
    if listed:
        try:
            seeds = sorted({int(t) for t in listed.split(",") if t.strip()})
        except ValueError:
            raise MunkeyError(f"--seed-list expects comma-separated integers such as 0,2, got {listed!r}.") from None
        if not seeds or min(seeds) < 0:
            raise MunkeyError(f"--seed-list needs at least one seed, none negative; got {listed!r}.")
        return seeds
    if count < 1 and not (merging and count == 0):
        raise MunkeyError("--seeds must be at least 1 (0 only with --merge-csv).")
    return list(range(count))


def _grids_tag(methods: list[str]) -> dict:
    """The tuning grids of `methods` (part of a cached cell's tag: another grid re-tunes)."""
    from munkey_core.unlearn.tuning import GRIDS

    return {m: GRIDS[m] for m in methods}


def design_label(inject_at: int) -> str:
    """The MUNKEY design a table measures, in words."""
    if inject_at == 0:
        return "the paper's (exemplar token from block 0)"
    return f"late injection at block {inject_at} (late@{inject_at}: blocks before {inject_at} shared by the K neighbours)"


class FidelityBench:
    """Trains what is missing, measures every cell (rate x seed), writes the tables."""

    def __init__(self, args: argparse.Namespace) -> None:
        from munkey_core.unlearn.posthoc import METHODS

        self.args = args
        self.rates = _floats(args.rates)
        self.merge_csv: list[str] = list(getattr(args, "merge_csv", None) or [])
        self.seeds = _seeds(args.seeds, getattr(args, "seed_list", None), merging=bool(self.merge_csv))
        self.merged_seeds: list[int] = []  # seeds whose rows come from --merge-csv
        self.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise MunkeyError(f"Unknown method(s) {bad}; choose from: {', '.join(METHODS)}.")
        self.inject_at = int(getattr(args, "inject_at", 0) or 0)
        self.design = design_label(self.inject_at)
        from munkey_core.config import resolve_profile, with_overrides

        profile = resolve_profile(args.profile)
        with_overrides(profile.model, {"inject_at": self.inject_at})  # a bad L fails now
        # and so do bad epochs, --vit-shift or --mia-refs (not after the hour of training they would follow)
        with_overrides(profile.train_for(args.dataset), {"epochs": getattr(args, "epochs", None)})
        shift = getattr(args, "vit_shift", None)
        if shift is not None and not 0 <= shift < 1:
            raise MunkeyError(f"--vit-shift is the plain ViT's random shift, a fraction of the image side from 0 (off, "
                              f"lets it memorise) to below 1 (got {shift:g}).")
        from munkey_core.eval.oracles import check_floor_oracles

        check_floor_oracles(int(getattr(args, "floor_oracles", 1)))
        if getattr(args, "mia", "cheap") == "strong":
            from munkey_core.eval.mia import check_n_refs

            check_n_refs(int(getattr(args, "mia_refs", 2)))
        self.munkey_over = munkey_settings(args.profile, args.dataset, getattr(args, "munkey_set", None) or [])
        # the recipe every MUNKEY run of this command has: the profile's for the dataset with --munkey-set on top
        self.munkey_recipe = {**profile.dataset_recipe.get(args.dataset, {}), **self.munkey_over}
        suffix = f"_late{self.inject_at}" if self.inject_at else ""  # never reuse paper-design models
        suffix += settings_suffix(self.munkey_over)  # nor the profile's recipe's
        self.work = Path(args.work) / f"{args.dataset.replace(':', '_').replace('/', '_')}_{args.profile}{suffix}"
        self.trained = 0  # models trained by this invocation (0 on a full resume)
        self.audited: dict[tuple[float, int], dict] = {}  # (rate, seed) -> seconds of the audited request

    # ----- models ---------------------------------------------------------------------------
    def _overrides(self, seed: int) -> dict:
        """The recipe of the plain ViT (its T-oracles and reference ViTs inherit it from its config):
        MUNKEY's, with --vit-shift when given."""
        return {"seed": seed, "epochs": self.args.epochs, "augment_shift": getattr(self.args, "vit_shift", None)}

    def _munkey_overrides(self, seed: int) -> dict:
        """The MUNKEY recipe: the design and --munkey-set on the profile's (its M-oracles inherit them from the
        run's config)."""
        return {**self.munkey_over, "seed": seed, "epochs": self.args.epochs, "inject_at": self.inject_at}

    def _check_cached_recipe(self, seed: int) -> None:
        """Refuses a cached MUNKEY run (and so its cached rows) of another recipe than this command measures: the
        profile's for the dataset with --munkey-set (the profile's recipe may have changed since it was trained)."""
        from munkey_core.config import recorded_settings

        config = RunPaths(self.work / f"seed_{seed}" / "munkey").config
        if not config.exists():
            return
        trained = recorded_settings(read_json(config), self.munkey_recipe)
        if trained != self.munkey_recipe:
            raise MunkeyError(f"{config.parent} was trained with {trained}, not the recipe this command measures "
                              f"({self.munkey_recipe}: the profile's for {self.args.dataset}, with --munkey-set); use "
                              "another --work or delete that folder.")

    def _originals(self, seed: int):
        """(MUNKEY run, ViT classifier run or None when no post-hoc method is asked for) of this seed,
        trained when missing."""
        from munkey_core.keys import encoders as keys
        from munkey_core.run.loaded import ClassifierRun
        from munkey_core.training.classifier import train_classifier_run
        from munkey_core.service import MunkeyRun, train_run

        a, root = self.args, self.work / f"seed_{seed}"
        if not RunPaths(root / "munkey").config.exists():
            train_run(a.dataset, root / "munkey", profile=a.profile, encoder=a.encoder or keys.DEFAULT_ENCODER,
                      data_root=a.data_root, device=a.device, overrides=self._munkey_overrides(seed), progress=True)
            self.trained += 1
        mrun = MunkeyRun(root / "munkey", device=a.device)
        if mrun.model_cfg.inject_at != self.inject_at:
            raise MunkeyError(f"{root / 'munkey'} was trained with inject_at {mrun.model_cfg.inject_at}, not "
                              f"{self.inject_at}; use another --work or delete that folder.")
        if not self.methods:
            return mrun, None
        if not RunPaths(root / "vit").config.exists():
            train_classifier_run(a.dataset, root / "vit", arch="vit", profile=a.profile, data_root=a.data_root,
                                 device=a.device, overrides=self._overrides(seed), progress=True)
            self.trained += 1
        vit = ClassifierRun(root / "vit", device=a.device)
        shift = getattr(a, "vit_shift", None)
        if shift is not None and vit.config["train"]["augment_shift"] != shift:
            raise MunkeyError(f"{root / 'vit'} was trained with augment_shift {vit.config['train']['augment_shift']}, "
                              f"not --vit-shift {shift:g}; use another --work or delete that folder.")
        return mrun, vit

    def _oracle(self, run_config: dict, run_root: Path, ids: list[int], kind: str,
                train_seed: int | None = None) -> Path:
        from munkey_core.eval.oracles import train_oracle

        path, trained = train_oracle(run_config, run_root, ids, kind, train_seed=train_seed, device=self.args.device,
                                     progress=True)
        self.trained += int(trained)
        return path

    def _floor_oracles(self, run_config: dict, run_root: Path, ids: list[int], kind: str, seed: int) -> list[Path]:
        """The noise floor's oracles: `--floor-oracles` retrains with other training seeds, same split."""
        from munkey_core.eval.oracles import floor_seeds

        n = int(getattr(self.args, "floor_oracles", 1))
        return [self._oracle(run_config, run_root, ids, kind, s) for s in floor_seeds(seed, n)]

    def _strong(self, seed: int, family: str, run_config: dict, ds, sets):
        """The strong attack of this seed for targets of `family`: reference models of that family and of
        the run's recipe, trained without any forget set of this seed (so forget and test samples are
        scored against the same references), cached in --work/seed_<seed>/refs_<family>_<tag>."""
        from munkey_core.eval.mia import StrongAttack
        from munkey_core.eval.oracles import forget_tag, train_reference_models
        from munkey_core.data.sampling import random_ids

        a = self.args
        excluded = sorted({i for r in self.rates for i in random_ids(ds.train.ids, r, seed)})
        folder = self.work / f"seed_{seed}" / f"refs_{family}_{forget_tag(excluded)}"
        refs = train_reference_models(run_config, folder, family=family, n_refs=a.mia_refs, seed=seed,
                                      exclude_ids=excluded, device=a.device, on_trained=self._count)
        return StrongAttack(refs, ds, sets.forget, sets.test)

    def _count(self) -> None:
        self.trained += 1

    # ----- one cell -------------------------------------------------------------------------
    def cell(self, rate: float, seed: int) -> list[dict]:
        """Rows of one (rate, seed), plus the selected checkpoint's row with --select."""
        rows = self._base_cell(rate, seed)
        if getattr(self.args, "select", False):
            rows = rows + self._selected_rows(rate, seed, rows)
        self.audited[(rate, seed)] = self._audited_request(rate, seed)
        return rows

    def _audited_request(self, rate: float, seed: int) -> dict:
        """Seconds of MUNKEY's forgetting as the product does it: an audited, durable `forget` request
        (journal, bank and checkpoints purged on disk, audit entry, receipt; no evaluation), on a copy
        of the run so the cached models stay as trained. Cached in seed_k/rate_<r>_audited.json."""
        import shutil

        from munkey_core.service import MunkeyRun
        from munkey_core.data.sampling import random_ids

        path = self.work / f"seed_{seed}" / f"rate_{rate:g}_audited.json"
        if path.exists():
            return read_json(path)
        mrun, _ = self._originals(seed)
        copy_dir = self.work / f"seed_{seed}" / "_audited_copy"
        shutil.rmtree(copy_dir, ignore_errors=True)
        shutil.copytree(mrun.paths.root, copy_dir, ignore=shutil.ignore_patterns("oracles"))
        try:
            run = MunkeyRun(copy_dir, device=self.args.device)
            ids = random_ids(run.dataset.train.ids, rate, seed)
            t0 = time.perf_counter()
            with _own_sqlite_log():  # never append bench entries to a shared PostgreSQL log
                res = run.forget(ids, operator="fidelity bench", source="random-fraction")
            out = {"request_seconds": time.perf_counter() - t0, "deletion_seconds": res.seconds,
                   "deleted": len(res.deleted), "bank_size": res.bank_size}
        finally:
            shutil.rmtree(copy_dir, ignore_errors=True)
        atomic_write_json(path, out)
        return out

    def _selection(self, mrun, seed: int) -> dict:
        """This seed's checkpoint selection (cached in seed_k/selection.json)."""
        from munkey_core.eval.selection import select_checkpoint

        a = self.args
        path = self.work / f"seed_{seed}" / "selection.json"
        tag = {"max_ps": a.max_ps, "val_rate": a.val_rate, "max_samples": a.max_samples}
        if path.exists() and read_json(path).get("tag") == tag:
            return read_json(path)["selection"]
        sel = select_checkpoint(mrun, val_rate=a.val_rate, seed=seed, max_ps=a.max_ps,
                                max_samples=a.max_samples).to_dict()
        self.trained += int(sel["oracle_trained"])
        atomic_write_json(path, {"tag": tag, "selection": sel})
        return sel

    def _selected_rows(self, rate: float, seed: int, base_rows: list[dict]) -> list[dict]:
        """MUNKEY's key deletion on the checkpoint `munkey select` picks (lowest Avg Gap on a validation
        forget split among Ps <= max_ps), against the same M-oracle measurement (the cell's own row) and
        the same samples as the final model."""
        from munkey_core.eval.oracles import eval_sets, measure, munkey_scorer
        from munkey_core.eval.selection import checkpoint_state
        from munkey_core.data.sampling import random_ids

        a = self.args
        path = self.work / f"seed_{seed}" / f"rate_{rate:g}_selected.json"
        tag = {"mia": a.mia, "mia_refs": a.mia_refs, "max_samples": a.max_samples, "max_ps": a.max_ps,
               "val_rate": a.val_rate, "rates": self.rates, "v": CELL_VERSION}
        if path.exists() and read_json(path).get("tag") == tag:
            return read_json(path)["rows"]
        mrun, vit = self._originals(seed)
        sel = self._selection(mrun, seed)
        rows: list[dict] = []
        if sel["selected"] is None:
            tqdm.write(f"seed {seed}: no checkpoint has Ps <= {a.max_ps}; no selected-checkpoint row")
        else:
            ds = mrun.dataset
            ids = random_ids(ds.train.ids, rate, seed)
            sets = eval_sets(ds, ids, max_samples=a.max_samples, seed=seed)
            strong = self._strong(seed, "munkey", mrun.config, ds, sets) if a.mia == "strong" else None
            m_star = next(r for r in base_rows if r["method"].startswith("Retrain (M-oracle"))
            model, bank, epoch = checkpoint_state(mrun, mrun.paths.checkpoints / sel["selected"])
            seconds = _timed_key_deletion(bank, ids)
            k, tau = mrun.train_cfg.k, mrun.train_cfg.tau
            m = measure(munkey_scorer(model, bank, ds, mrun.split_keys, k, tau), ds, sets, strong)
            rows.append(_row(rate, seed, SELECTED, "M", m, m_star, seconds, epoch=epoch))
        atomic_write_json(path, {"tag": tag, "rows": rows})
        return rows

    def _tuning(self, rate: float, seed: int, vit, ds, ids: list[int]) -> dict:
        """This cell's post-hoc tuning on a validation forget split (unlearn/tuning.py), cached in
        seed_k/rate_<r>_tuning.json; trains the split's T-oracle when missing."""
        from munkey_core.unlearn.tuning import tune_posthoc

        a = self.args
        path = self.work / f"seed_{seed}" / f"rate_{rate:g}_tuning.json"
        tag = {"grids": _grids_tag(self.methods), "max_samples": a.max_samples, "forget": len(ids)}
        if path.exists() and read_json(path).get("tag") == tag:
            return read_json(path)["tuning"]
        tuning = tune_posthoc(vit, ds, ids, self.methods, seed=seed, max_samples=a.max_samples, device=a.device,
                              on_trained=self._count)
        atomic_write_json(path, {"tag": tag, "tuning": tuning})
        return tuning

    def _base_cell(self, rate: float, seed: int) -> list[dict]:
        """Rows of one (rate, seed): per family the oracle, its noise floor (oracles retrained with other
        training seeds, against the oracle), the undeleted model (positive control) and the unlearning
        methods (MUNKEY key deletion; the post-hoc methods on the ViT)."""
        from munkey_core.eval.oracles import classifier_scorer, eval_sets, floor_seeds, measure, munkey_scorer
        from munkey_core.run.loaded import ClassifierRun
        from munkey_core.service import MunkeyRun
        from munkey_core.data.sampling import random_ids
        from munkey_core.unlearn.tuning import settings_text
        from munkey_core.unlearn.posthoc import run_posthoc

        a = self.args
        path = self.work / f"seed_{seed}" / f"rate_{rate:g}.json"
        n_floor = int(getattr(a, "floor_oracles", 1))
        tune = bool(getattr(a, "tune", False)) and bool(self.methods)
        tag = {"methods": self.methods, "mia": a.mia, "mia_refs": a.mia_refs, "max_samples": a.max_samples,
               "floor_oracles": n_floor, "rates": self.rates if a.mia == "strong" else None, "v": CELL_VERSION,
               **({"tune": _grids_tag(self.methods)} if tune else {}),
               **({"vit_shift": a.vit_shift} if getattr(a, "vit_shift", None) is not None else {})}
        if path.exists() and read_json(path).get("tag") == tag:
            return read_json(path)["rows"]
        mrun, vit = self._originals(seed)
        ds = mrun.dataset
        ids = random_ids(ds.train.ids, rate, seed)
        m_oracle = self._oracle(mrun.config, mrun.paths.root, ids, "munkey")
        m_floor = self._floor_oracles(mrun.config, mrun.paths.root, ids, "munkey", seed)
        sets = eval_sets(ds, ids, max_samples=a.max_samples, seed=seed)
        # the ViT's carved splits follow the same seed: the same sample ids and the same rows
        if vit is not None and not np.array_equal(vit.dataset.train.ids, ds.train.ids):
            raise MunkeyError("The MUNKEY run and the ViT saw different training splits; delete --work and re-run.")
        strong = a.mia == "strong"
        m_attack = self._strong(seed, "munkey", mrun.config, ds, sets) if strong else None
        k, tau = mrun.train_cfg.k, mrun.train_cfg.tau
        rows: list[dict] = []
        floor_seed = floor_seeds(seed, n_floor)

        def add(method: str, oracle_name: str, metrics: dict, oracle: dict, seconds: float | None, **extra) -> None:
            rows.append(_row(rate, seed, method, oracle_name, metrics, oracle, seconds, **extra))

        def munkey_measure(root: Path) -> dict:
            orun = MunkeyRun(root, device=a.device)
            return measure(munkey_scorer(orun.model, orun.bank, ds, mrun.split_keys, k, tau), ds, sets, m_attack)

        m_star = munkey_measure(m_oracle)
        late = f", late@{self.inject_at}" if self.inject_at else ""
        add(f"Retrain (M-oracle{late})", "M", m_star, m_star, None)
        for root, s in zip(m_floor, floor_seed):
            add(FLOOR["M"], "M", munkey_measure(root), m_star, None, train_seed=s)
        add(MUNKEY_NONE, "M", measure(munkey_scorer(mrun.model, mrun.bank, ds, mrun.split_keys, k, tau), ds, sets,
                                      m_attack), m_star, 0.0)
        bank = copy.deepcopy(mrun.bank)
        seconds = _timed_key_deletion(bank, ids)
        add(f"MUNKEY (key deletion{late})", "M",
            measure(munkey_scorer(mrun.model, bank, ds, mrun.split_keys, k, tau), ds, sets, m_attack), m_star, seconds)
        if vit is None:  # --methods '': MUNKEY rows only
            atomic_write_json(path, {"tag": tag, "rows": rows})
            return rows
        t_oracle = self._oracle(vit.config, vit.root, ids, "vit")
        t_floor = self._floor_oracles(vit.config, vit.root, ids, "vit", seed)
        t_attack = self._strong(seed, "vit", vit.config, ds, sets) if strong else None

        def vit_measure(model, img_size: int) -> dict:
            return measure(classifier_scorer(model, ds, img_size), ds, sets, t_attack)

        trun = ClassifierRun(t_oracle, device=a.device)
        t_star = vit_measure(trun.model, trun.cfg.img_size)
        add("Retrain (T-oracle)", "T", t_star, t_star, None)
        for root, s in zip(t_floor, floor_seed):
            frun = ClassifierRun(root, device=a.device)
            add(FLOOR["T"], "T", vit_measure(frun.model, frun.cfg.img_size), t_star, None, train_seed=s)
        add(VIT_NONE, "T", vit_measure(vit.model, vit.cfg.img_size), t_star, 0.0)
        f = np.isin(ds.train.ids, ids)
        forget, retain = (ds.train.images[f], ds.train.labels[f]), (ds.train.images[~f], ds.train.labels[~f])
        for method in self.methods:
            res = run_posthoc(method, vit.model, vit.to_input, forget, retain, num_classes=ds.num_classes, seed=seed)
            add(method, "T", vit_measure(res.model, vit.cfg.img_size), t_star, res.seconds,
                settings=settings_text(res.details["settings"]))
        if tune:
            tuning = self._tuning(rate, seed, vit, ds, ids)
            for method in self.methods:
                chosen = tuning["methods"][method]
                res = run_posthoc(method, vit.model, vit.to_input, forget, retain, num_classes=ds.num_classes,
                                  seed=seed, settings=chosen["chosen"])
                add(method + TUNED, "T", vit_measure(res.model, vit.cfg.img_size), t_star, res.seconds,
                    settings=settings_text(res.details["settings"]), val_AvgGap=chosen["AvgGap"])
        atomic_write_json(path, {"tag": tag, "rows": rows})
        return rows

    # ----- tables ---------------------------------------------------------------------------
    def table(self, rows: list[dict], wall: float) -> str:
        a = self.args
        attack = next((r["MIA_attack"] for r in rows if r["MIA_attack"]), "-")
        lines = [f"## {a.dataset}, profile {a.profile}: random forgetting, {len(self.seeds)} seed(s) "
                 f"({', '.join(map(str, self.seeds))})", "",
                 f"MUNKEY design: {self.design}."
                 + "".join(f" MUNKEY {p} (--munkey-set; the profile's otherwise)."
                           for p in settings_phrases(self.munkey_over))
                 + ("" if self.methods else " MUNKEY and its M-oracle only (--methods ''): no plain ViT, T-oracle "
                                            "or post-hoc rows.")
                 + ("" if getattr(a, "vit_shift", None) is None else
                    f" Plain ViT family (ViT, T-oracles, reference ViTs): augment_shift {a.vit_shift:g} (--vit-shift; "
                    "MUNKEY keeps the profile's)."), "",
                 f"MIA attack: {attack}; MIA = its AUC, TPR@1% / TPR@0.1% = its true-positive rate at 1% / 0.1% "
                 "false-positive rate (forget vs test; below 1/n_test FPR a TPR counts forget samples scored above "
                 "every test sample). Mean ± sample standard deviation over seeds; Avg Gap against the "
                 "M-oracle (MUNKEY) or the T-oracle (plain ViT and post-hoc methods). **Noise floor**: the Avg Gap "
                 "to the same oracle of oracles retrained with other training seeds on the same data split and "
                 "retain set (what retraining chance alone gives); a row's Avg Gap means something only next to "
                 "its family's floor. The 'no unlearning' rows are the positive controls: the undeleted model "
                 "against the oracle, what the metrics and the attack see when nothing is forgotten. seconds = the "
                 f"forgetting step alone. Wall time of this invocation: {wall:.0f} s ({self.trained} model(s) "
                 "trained by it; cells and models found in --work are read, not recomputed).", "",
                 "Command: `munkey " + " ".join(shlex.quote(x) for x in sys.argv[1:]) + "`", ""]
        if self.merged_seeds:
            lines += [f"Merged: the rows of seed(s) {', '.join(map(str, self.merged_seeds))} are read from "
                      f"{', '.join(self.merge_csv)} (--merge-csv: measured by an earlier invocation with the same "
                      "options, not re-measured here); means and standard deviations are over all seeds as one "
                      "invocation computes them.", ""]
        for rate in self.rates:
            here = [r for r in rows if r["rate"] == rate]
            floors = {o: [r["AvgGap"] for r in here if r["method"] == FLOOR[o]] for o in FLOOR}
            lines += [f"### forget {rate * 100:g}%", "",
                      "| method | oracle | " + " | ".join(TABLE) + " | noise floor | Avg Gap per seed | seconds |",
                      "|---|---|" + "---|" * (len(TABLE) + 3)]
            methods = list(dict.fromkeys(r["method"] for r in here))
            for m in methods:
                sel = [r for r in here if r["method"] == m]
                cells = [mean_sd([r[c] for r in sel]) for c in TABLE]
                per_seed = ", ".join(f"s{sd}: {mean_sd([r['AvgGap'] for r in sel if r['seed'] == sd])}"
                                     for sd in dict.fromkeys(r["seed"] for r in sel))
                lines.append(f"| {m} | {sel[0]['oracle']} | " + " | ".join(cells)
                             + f" | {mean_sd(floors[sel[0]['oracle']])} | {per_seed} | "
                             + mean_sd([r["seconds"] for r in sel]) + " |")
            for o, name in (("M", "MUNKEY (key deletion"), ("T", None)):
                if not floors[o]:
                    continue
                for m in methods:
                    sel = [r["AvgGap"] for r in here if r["method"] == m and r["oracle"] == o]
                    if (name and m.startswith(name)) or (name is None and m.removesuffix(TUNED) in self.methods):
                        gap, floor = float(np.mean(sel)), float(np.mean(floors[o]))
                        lines.append(f"\n{m}: Avg Gap {gap:.2f} against a noise floor of {floor:.2f} "
                                     f"({gap - floor:+.2f} vs the floor).")
            lines += self._retrain_pool_lines(here)
            lines += self._settings_lines(here)
            chosen = [f"seed {r['seed']}: epoch {r['epoch']}" for r in rows
                      if r["rate"] == rate and r["method"] == SELECTED]
            audited = [v for (r, _), v in sorted(self.audited.items()) if r == rate]
            table_seeds = list(dict.fromkeys(r["seed"] for r in here))
            without = [s for s in table_seeds if (rate, s) not in self.audited]
            if audited:
                lines += ["", "MUNKEY's forgetting as the product does it (an audited, durable `munkey forget` "
                          "request on a copy of the run: journal, bank and checkpoints purged on disk, audit entry, "
                          f"receipt; no evaluation): {mean_sd([v['request_seconds'] for v in audited])} s per "
                          f"request of {audited[0]['deleted']} ids, of which the deletion proper (commit point to "
                          f"bank saved) {mean_sd([v['deletion_seconds'] for v in audited])} s"
                          + (f" (seeds {', '.join(str(s) for s in table_seeds if s not in without)} only: the CSV "
                             f"of seed(s) {', '.join(map(str, without))} carries no audited request)." if without
                             else ".")]
            if chosen:
                lines += ["", f"Selected checkpoints (Ps <= {a.max_ps:g}, lowest Avg Gap on a validation forget split "
                          f"of {a.val_rate:g}): " + ", ".join(chosen) + "."]
            lines.append("")
        return "\n".join(lines)

    @staticmethod
    def _retrain_pool_cells(here: list[dict], oracle: str, row: Callable[[str], bool]) -> list[tuple[list[dict], list[dict]]]:
        """Per seed, ([the row], every retrain of family `oracle`: its oracle and floor oracles) for the rows
        `row(method)` accepts; seeds without one such row, two retrains or finite gap metrics are left out."""
        from munkey_core.eval.metrics import GAP_KEYS
        from munkey_core.eval.verdicts import finite_number

        cells = []
        for seed in dict.fromkeys(r["seed"] for r in here):
            mine = [r for r in here if r["seed"] == seed]
            runs = [r for r in mine if row(r["method"])]
            retrains = [r for r in mine if (r["method"].startswith("Retrain (") and r["oracle"] == oracle)
                        or r["method"] == FLOOR[oracle]]
            if len(runs) == 1 and len(retrains) >= 2 and all(finite_number(x[k]) for x in runs + retrains
                                                             for k in GAP_KEYS):
                cells.append((runs, retrains))
        return cells

    @staticmethod
    def _retrain_pool_lines(here: list[dict]) -> list[str]:
        """Under a rate's table: each row against every retrain of its family on its split at once (the
        oracle and its floor oracles alike, so no single unlucky oracle decides), with
        `eval.floors.relabelling_test`: could the row be one more retrain? MUNKEY's key deletion and its
        positive control as sentences, the plain-ViT rows (post-hoc methods, their positive control) as a
        table. Needs >= 1 floor oracle per seed."""
        from munkey_core.eval.floors import relabelling_test, signed_offsets
        from munkey_core.eval.metrics import GAP_KEYS

        def p_text(res: dict) -> str:
            return f"{res['p']:.{3 if res['p'] < 0.01 else 2}f}"

        out = []
        for prefix in ("MUNKEY (key deletion", MUNKEY_NONE):
            cells = FidelityBench._retrain_pool_cells(here, "M", lambda m, prefix=prefix: m.startswith(prefix))
            if not cells:
                continue
            name = cells[-1][0][0]["method"]
            res = relabelling_test(cells)
            sizes = sorted({len(o) for _, o in cells})
            signed = {k: float(np.mean(v)) for k, v in signed_offsets(cells).items()}  # mean over seeds
            out.append(f"\n{name} against every retrain of its split ({' or '.join(map(str, sizes))} per seed: the "
                       f"M-oracle and its floor oracles alike; {len(cells)} seed(s)): Avg Gap {res['gap']:.2f}, the "
                       f"retrains among themselves {res['floor']:.2f} ({res['excess']:+.2f}); relabelling test "
                       f"p = {p_text(res)} over {res['relabellings']} relabellings"
                       + (f" (the smallest p they allow: {1 / res['relabellings']:.3f})" if res["exact"] else
                          " (sampled)")
                       + ": a low p tells the row apart from one more retrain. Signed offsets from its split's "
                       "retrains (mean over seeds; FA and MIA above zero = the forgotten samples still recognised): "
                       + ", ".join(f"{k} {v:+.2f}" for k, v in signed.items()) + ".")
        vit_rows = [m for m in dict.fromkeys(r["method"] for r in here if r["oracle"] == "T")
                    if not m.startswith("Retrain (") and m != FLOOR["T"]]
        table = []
        for m in vit_rows:
            cells = FidelityBench._retrain_pool_cells(here, "T", lambda x, m=m: x == m)
            if not cells:
                continue
            res = relabelling_test(cells)
            signed = {k: float(np.mean(v)) for k, v in signed_offsets(cells).items()}
            smallest = f"{1 / res['relabellings']:.3f}" if res["exact"] else "sampled"
            table.append(f"| {m} | {len(cells)} | {res['gap']:.2f} | {res['floor']:.2f} | {res['excess']:+.2f} | "
                         f"{res['p']:.3f} ({smallest}) | " + " / ".join(f"{v:+.2f}" for v in signed.values()) + " |")
        if table:
            keys = " / ".join(GAP_KEYS)  # signed_offsets' keys, in its order
            out += ["", "The plain-ViT rows against every retrain of their split (the T-oracle and its floor oracles "
                    "alike), the same relabelling test: a low p tells the row apart from one more retrain.", "",
                    f"| row | seeds | Avg Gap | retrains among themselves | excess | relabelling p (smallest "
                    f"possible) | signed offsets {keys} (mean over seeds) |", "|---|---|---|---|---|---|---|", *table]
        return out

    def _settings_lines(self, here: list[dict]) -> list[str]:
        """Under a rate's table: each post-hoc method's settings, fixed and tuned (per seed, with the
        validation Avg Gap that chose them)."""
        from munkey_core.unlearn.tuning import GRIDS

        out = []
        for m in self.methods:
            fixed = list(dict.fromkeys(r.get("settings") for r in here if r["method"] == m and r.get("settings")))
            tuned = [r for r in here if r["method"] == m + TUNED]
            if not fixed and not tuned:
                continue
            line = f"- {m}: fixed settings {'; '.join(fixed) or '-'}"
            if tuned:
                line += (f"; tuned ({len(GRIDS[m])}-point grid, lowest Avg Gap on the validation forget split): "
                         + "; ".join(f"seed {r['seed']}: {r['settings']} (validation Avg Gap {r['val_AvgGap']:.2f})"
                                     for r in tuned))
            out.append(line)
        return (["", "Post-hoc settings:", *out] if out else [])

    def run(self) -> int:
        t0 = time.perf_counter()
        cells = [(r, s) for r in self.rates for s in self.seeds]
        if not self.methods:
            print("--methods is empty: measuring MUNKEY and its M-oracle only (no plain ViT, T-oracle or post-hoc "
                  "rows, so no ViT is trained)")
        print(f"MUNKEY design: {self.design}"
              + "".join(f", {p} (--munkey-set)" for p in settings_phrases(self.munkey_over))
              + f"; models cached under {self.work}")
        read, read_audited = read_rows(self.merge_csv, self.rates) if self.merge_csv else ([], {})
        clash = sorted({r["seed"] for r in read} & set(self.seeds))
        if clash:  # fail before hours of training, not after
            raise MunkeyError(f"--merge-csv: seed(s) {clash} are both in the CSV and asked for here; leave them out "
                              "of --seed-list.")
        merged(read, [], self.rates, optional=(SELECTED,))  # the CSVs' own checks, before training too
        for seed in self.seeds:
            self._check_cached_recipe(seed)
        rows: list[dict] = []
        for rate, seed in tqdm(cells, desc="fidelity", unit="cell", dynamic_ncols=True):
            rows += self.cell(rate, seed)
        if read:
            rows = merged(read, rows, self.rates, optional=(SELECTED,))
            self.merged_seeds = sorted({r["seed"] for r in read})
            self.seeds = sorted(set(self.seeds) | set(self.merged_seeds))
            self.audited.update(read_audited)
        text = self.table(rows, time.perf_counter() - t0)
        print(text)
        print(f"\ntrained {self.trained} model(s) in this run; cached models under {self.work}")
        if self.args.out:
            name = f"fidelity_{self.args.dataset.replace(':', '_').replace('/', '_')}"
            write_tables(self.args.out, name, text + "\n", with_audited(rows, self.audited), COLUMNS)
        return 0
