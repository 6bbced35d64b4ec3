"""The work behind `munkey bench fidelity` (see bench/fidelity.py for what it measures)."""

from __future__ import annotations

import argparse
import copy
import os
import csv
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm.auto import tqdm

from munkey_core.bench.unact_run import _mean_sd
from munkey_core.errors import MunkeyError
from munkey_core.atomic import atomic_write_json, read_json

COLUMNS = ("rate", "seed", "method", "oracle", "TA", "RA", "FA", "MIA", "AvgGap", "seconds", "MIA_attack", "epoch")
SELECTED = "MUNKEY (selected checkpoint)"
TABLE = ("TA", "RA", "FA", "MIA", "AvgGap", "seconds")


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
            **{m: metrics[m] for m in ("TA", "RA", "FA", "MIA")}, "AvgGap": gaps(metrics, oracle)["AvgGap"],
            "seconds": seconds, "MIA_attack": metrics["MIA_attack"], **extra}


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


def _seeds(count: int, listed: str | None) -> list[int]:
    """The seeds to run: `listed` (comma-separated) when given, else 0..count-1."""
    if listed:
        try:
            seeds = sorted({int(t) for t in listed.split(",") if t.strip()})
        except ValueError:
            raise MunkeyError(f"--seed-list expects comma-separated integers such as 0,2, got {listed!r}.") from None
        if not seeds or min(seeds) < 0:
            raise MunkeyError(f"--seed-list needs at least one seed, none negative; got {listed!r}.")
        return seeds
    if count < 1:
        raise MunkeyError("--seeds must be at least 1.")
    return list(range(count))


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
        self.seeds = _seeds(args.seeds, getattr(args, "seed_list", None))
        self.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise MunkeyError(f"Unknown method(s) {bad}; choose from: {', '.join(METHODS)}.")
        self.inject_at = int(getattr(args, "inject_at", 0) or 0)
        self.design = design_label(self.inject_at)
        from munkey_core.config import resolve_profile, with_overrides

        with_overrides(resolve_profile(args.profile).model, {"inject_at": self.inject_at})  # a bad L fails now
        suffix = f"_late{self.inject_at}" if self.inject_at else ""  # never reuse paper-design models
        self.work = Path(args.work) / f"{args.dataset.replace(':', '_').replace('/', '_')}_{args.profile}{suffix}"
        self.trained = 0  # models trained by this invocation (0 on a full resume)
        self.audited: dict[tuple[float, int], dict] = {}  # (rate, seed) -> seconds of the audited request

    # ----- models ---------------------------------------------------------------------------
    def _overrides(self, seed: int) -> dict:
        """The recipe of the plain ViT (and of the strong attack's reference ViTs)."""
        return {"seed": seed, "epochs": self.args.epochs}

    def _munkey_overrides(self, seed: int) -> dict:
        """The MUNKEY recipe: the ViT's plus the design (its M-oracles inherit it from the run's config)."""
        return {**self._overrides(seed), "inject_at": self.inject_at}

    def _originals(self, seed: int):
        """(MUNKEY run, ViT classifier run or None when no post-hoc method is asked for) of this seed,
        trained when missing."""
        from munkey_core.keys import encoders as keys
        from munkey_core.run.classifier import ClassifierRun, train_classifier_run
        from munkey_core.service import MunkeyRun, train_run

        a, root = self.args, self.work / f"seed_{seed}"
        if not (root / "munkey" / "config.json").exists():
            train_run(a.dataset, root / "munkey", profile=a.profile, encoder=a.encoder or keys.DEFAULT_ENCODER,
                      data_root=a.data_root, device=a.device, overrides=self._munkey_overrides(seed), progress=True)
            self.trained += 1
        mrun = MunkeyRun(root / "munkey", device=a.device)
        if mrun.model_cfg.inject_at != self.inject_at:
            raise MunkeyError(f"{root / 'munkey'} was trained with inject_at {mrun.model_cfg.inject_at}, not "
                              f"{self.inject_at}; use another --work or delete that folder.")
        if not self.methods:
            return mrun, None
        if not (root / "vit" / "config.json").exists():
            train_classifier_run(a.dataset, root / "vit", arch="vit", profile=a.profile, data_root=a.data_root,
                                 device=a.device, overrides=self._overrides(seed), progress=True)
            self.trained += 1
        return mrun, ClassifierRun(root / "vit", device=a.device)

    def _oracle(self, run_config: dict, run_root: Path, ids: list[int], kind: str) -> Path:
        from munkey_core.eval.oracles import train_oracle

        path, trained = train_oracle(run_config, run_root, ids, kind, device=self.args.device, progress=True)
        self.trained += int(trained)
        return path

    def _strong(self, seed: int, vit, ds, sets):
        """The strong attack of this seed: reference ViTs of the plain ViT's recipe (`vit` None: the
        recipe it would have), cached in --work/seed_<seed>/refs."""
        from munkey_core.eval.mia import StrongAttack, train_reference_models
        from munkey_core.eval.oracles import recipe_overrides

        a = self.args
        recipe = self._overrides(seed) if vit is None else recipe_overrides(vit.config)
        refs = train_reference_models(a.dataset, self.work / f"seed_{seed}" / "refs", n_refs=a.mia_refs,
                                      seed=seed, profile=a.profile, overrides=recipe, data_root=a.data_root,
                                      device=a.device, on_trained=self._count)
        f, t = sets.forget, sets.test
        return StrongAttack(refs, (ds.train.images[f], ds.train.labels[f], ds.train.ids[f]),
                            (ds.test.images[t], ds.test.labels[t]))

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
               "val_rate": a.val_rate}
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
            strong = self._strong(seed, vit, ds, sets) if a.mia == "strong" else None
            m_star = next(r for r in base_rows if r["method"].startswith("Retrain (M-oracle"))
            model, bank, epoch = checkpoint_state(mrun, mrun.paths.checkpoints / sel["selected"])
            seconds = _timed_key_deletion(bank, ids)
            k, tau = mrun.train_cfg.k, mrun.train_cfg.tau
            m = measure(munkey_scorer(model, bank, ds, mrun.split_keys, k, tau), ds, sets, strong)
            rows.append(_row(rate, seed, SELECTED, "M", m, m_star, seconds, epoch=epoch))
        atomic_write_json(path, {"tag": tag, "rows": rows})
        return rows

    def _base_cell(self, rate: float, seed: int) -> list[dict]:
        """Rows of one (rate, seed): oracles, MUNKEY key deletion, the ViT and its post-hoc methods."""
        from munkey_core.run.classifier import ClassifierRun
        from munkey_core.eval.oracles import classifier_scorer, eval_sets, measure, munkey_scorer
        from munkey_core.service import MunkeyRun
        from munkey_core.data.sampling import random_ids
        from munkey_core.unlearn.posthoc import run_posthoc

        a = self.args
        path = self.work / f"seed_{seed}" / f"rate_{rate:g}.json"
        tag = {"methods": self.methods, "mia": a.mia, "mia_refs": a.mia_refs, "max_samples": a.max_samples}
        if path.exists() and read_json(path).get("tag") == tag:
            return read_json(path)["rows"]
        mrun, vit = self._originals(seed)
        ds = mrun.dataset
        ids = random_ids(ds.train.ids, rate, seed)
        m_oracle = self._oracle(mrun.config, mrun.paths.root, ids, "munkey")
        t_oracle = None if vit is None else self._oracle(vit.config, vit.root, ids, "vit")
        sets = eval_sets(ds, ids, max_samples=a.max_samples, seed=seed)
        # the ViT's carved splits follow the same seed: the same sample ids and the same rows
        if vit is not None and not np.array_equal(vit.dataset.train.ids, ds.train.ids):
            raise MunkeyError("The MUNKEY run and the ViT saw different training splits; delete --work and re-run.")
        strong = self._strong(seed, vit, ds, sets) if a.mia == "strong" else None
        k, tau = mrun.train_cfg.k, mrun.train_cfg.tau
        rows: list[dict] = []

        def add(method: str, oracle_name: str, metrics: dict, oracle: dict, seconds: float | None) -> None:
            rows.append(_row(rate, seed, method, oracle_name, metrics, oracle, seconds))

        orun = MunkeyRun(m_oracle, device=a.device)
        m_star = measure(munkey_scorer(orun.model, orun.bank, ds, mrun.split_keys, k, tau), ds, sets, strong)
        late = f", late@{self.inject_at}" if self.inject_at else ""
        add(f"Retrain (M-oracle{late})", "M", m_star, m_star, None)
        bank = copy.deepcopy(mrun.bank)
        seconds = _timed_key_deletion(bank, ids)
        add(f"MUNKEY (key deletion{late})", "M",
            measure(munkey_scorer(mrun.model, bank, ds, mrun.split_keys, k, tau), ds, sets, strong), m_star, seconds)
        if vit is None:  # --methods '': MUNKEY rows only
            atomic_write_json(path, {"tag": tag, "rows": rows})
            return rows
        trun = ClassifierRun(t_oracle, device=a.device)
        t_star = measure(classifier_scorer(trun.model, ds, trun.cfg.img_size), ds, sets, strong)
        add("Retrain (T-oracle)", "T", t_star, t_star, None)
        add("ViT, no unlearning", "T", measure(classifier_scorer(vit.model, ds, vit.cfg.img_size), ds, sets, strong),
            t_star, 0.0)
        f = np.isin(ds.train.ids, ids)
        forget, retain = (ds.train.images[f], ds.train.labels[f]), (ds.train.images[~f], ds.train.labels[~f])
        for method in self.methods:
            res = run_posthoc(method, vit.model, vit.to_input, forget, retain, num_classes=ds.num_classes, seed=seed)
            add(method, "T", measure(classifier_scorer(res.model, ds, vit.cfg.img_size), ds, sets, strong),
                t_star, res.seconds)
        atomic_write_json(path, {"tag": tag, "rows": rows})
        return rows

    # ----- tables ---------------------------------------------------------------------------
    def table(self, rows: list[dict], wall: float) -> str:
        a = self.args
        attack = next((r["MIA_attack"] for r in rows if r["MIA_attack"]), "-")
        lines = [f"## {a.dataset}, profile {a.profile}: random forgetting, {len(self.seeds)} seed(s) "
                 f"({', '.join(map(str, self.seeds))})", "",
                 f"MUNKEY design: {self.design}."
                 + ("" if self.methods else " MUNKEY and its M-oracle only (--methods ''): no plain ViT, T-oracle "
                                            "or post-hoc rows."), "",
                 f"MIA attack: {attack}. Mean ± sample standard deviation over seeds; Avg Gap against the "
                 "M-oracle (MUNKEY) or the T-oracle (plain ViT and post-hoc methods); seconds = the forgetting "
                 f"step alone. Wall time of this invocation: {wall:.0f} s ({self.trained} model(s) trained by it; "
                 "cells and models found in --work are read, not recomputed).", "",
                 "Command: `munkey " + " ".join(shlex.quote(x) for x in sys.argv[1:]) + "`", ""]
        for rate in self.rates:
            lines += [f"### forget {rate * 100:g}%", "", "| method | oracle | " + " | ".join(TABLE) + " |",
                      "|---|---|" + "---|" * len(TABLE)]
            methods = list(dict.fromkeys(r["method"] for r in rows if r["rate"] == rate))
            for m in methods:
                sel = [r for r in rows if r["rate"] == rate and r["method"] == m]
                cells = [_mean_sd([r[c] for r in sel]) for c in TABLE]
                lines.append(f"| {m} | {sel[0]['oracle']} | " + " | ".join(cells) + " |")
            chosen = [f"seed {r['seed']}: epoch {r['epoch']}" for r in rows
                      if r["rate"] == rate and r["method"] == SELECTED]
            audited = [v for (r, _), v in self.audited.items() if r == rate]
            if audited:
                lines += ["", "MUNKEY's forgetting as the product does it (an audited, durable `munkey forget` "
                          "request on a copy of the run: journal, bank and checkpoints purged on disk, audit entry, "
                          f"receipt; no evaluation): {_mean_sd([v['request_seconds'] for v in audited])} s per "
                          f"request of {audited[0]['deleted']} ids, of which the deletion proper (commit point to "
                          f"bank saved) {_mean_sd([v['deletion_seconds'] for v in audited])} s."]
            if chosen:
                lines += ["", f"Selected checkpoints (Ps <= {a.max_ps:g}, lowest Avg Gap on a validation forget split "
                          f"of {a.val_rate:g}): " + ", ".join(chosen) + "."]
            lines.append("")
        return "\n".join(lines)

    def run(self) -> int:
        t0 = time.perf_counter()
        cells = [(r, s) for r in self.rates for s in self.seeds]
        if not self.methods:
            print("--methods is empty: measuring MUNKEY and its M-oracle only (no plain ViT, T-oracle or post-hoc "
                  "rows, so no ViT is trained)")
        print(f"MUNKEY design: {self.design}; models cached under {self.work}")
        rows: list[dict] = []
        for rate, seed in tqdm(cells, desc="fidelity", unit="cell", dynamic_ncols=True):
            rows += self.cell(rate, seed)
        text = self.table(rows, time.perf_counter() - t0)
        print(text)
        print(f"\ntrained {self.trained} model(s) in this run; cached models under {self.work}")
        if self.args.out:
            out = Path(self.args.out)
            out.mkdir(parents=True, exist_ok=True)
            name = f"fidelity_{self.args.dataset.replace(':', '_').replace('/', '_')}"
            (out / f"{name}.md").write_text(text + "\n")
            with open(out / f"{name}.csv", "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=COLUMNS)
                w.writeheader()
                w.writerows({c: r.get(c) for c in COLUMNS} for r in rows)
            print(f"wrote {out / name}.md and .csv")
        return 0
