"""The work behind `munkey bench unact` (see bench/unact.py for what it measures)."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import numpy as np
from tqdm.auto import tqdm

from munkey_core.bench._common import mean_sd, num_or_dash, write_tables
from munkey_core.unlearn.classforget import ClassEditor, ClassRequest, class_metrics
from munkey_core.errors import MunkeyError
from munkey_core.unlearn.ssd import SSDConfig, cached_importance, dampen, importance, reference_order
from munkey_core.unlearn.unact import DEFAULTS, UnActConfig

# SSD / LFSSD tuning grid (validation split): the paper's values bracketed (alpha 8-50, lambda 0.5-1,
# batch 64-512 on CIFAR); two batch sizes because alpha's meaning moves with the batch size
SSD_ALPHAS = (2.0, 5.0, 10.0, 20.0, 50.0)
SSD_LAMBDAS = (0.5, 1.0)
SSD_BATCHES = (64, 256)
# the earlier MUNKEY design, kept as a comparison row: image pathway (null token), every block, no head
# the default before the retain guard: stop once the request images give c less than chance, no guard
EARLIER_DEFAULT = "keys+unact (inference path, stop at chance, no retain guard)"
EARLIER = UnActConfig(99.0, 0.01, 20, "attribution")

COLUMNS = ("section", "model", "method", "class", "n", "Af", "Ar", "Af_oracle", "Ar_oracle", "Delta", "seconds")


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise MunkeyError(f"Expected comma-separated whole numbers, got {text!r}.") from None


def _shots(text: str) -> list[int]:
    out = []
    for t in text.split(","):
        t = t.strip()
        if t:
            out.append(0 if t == "all" else _ints(t)[0])
    return out


class UnactBench:
    """Runs the sections, collects one row per request, prints and writes the tables."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.classes = _ints(args.classes)
        self.shots = _shots(args.shots)
        self.scores = [s.strip() for s in args.scores.split(",") if s.strip()]
        self.rows: list[dict] = []
        self.lines: list[str] = []
        self.ssd_cfg: dict[str, SSDConfig] = {}   # tuned working points (--ssd-tune)
        self.tuning: list[dict] = []

    # ----- helpers ----------------------------------------------------------------------
    def _cfg(self, ed: ClassEditor, score: str = "activation", **over) -> UnActConfig:
        """The run's default (ours: its stopping rule included) for the default's scoring; any other
        scoring (ResNet: the paper's activation rule) at the paper's working point, all k rounds."""
        base = ed.default_config()
        if score != base.score:
            base = UnActConfig(*DEFAULTS.get(ed.arch, (base.p, base.gamma, base.k)), score)
        a = self.args
        given = {"p": a.p, "gamma": a.gamma, "k": a.k}
        cfg = replace(base, **{**{key: v for key, v in given.items() if v is not None}, **over})
        cfg.check()
        return cfg

    def _record(self, section: str, model: str, method: str, req: ClassRequest, seconds: float | None = None) -> dict:
        row = {"section": section, "model": model, "method": method, "class": req.cls, "n": req.n_images,
               "Af": req.after.Af, "Ar": req.after.Ar, "Af_oracle": req.oracle.Af if req.oracle else None,
               "Ar_oracle": req.oracle.Ar if req.oracle else None, "Delta": req.delta,
               "seconds": req.seconds if seconds is None else seconds,
               "Af_before": req.before.Af, "Ar_before": req.before.Ar}
        self.rows.append(row)
        return row

    # ----- sections ---------------------------------------------------------------------
    def classifier_sections(self, ed: ClassEditor, bar: tqdm) -> None:
        name = ed.arch
        primary = self.scores[0]
        small = min(n for n in self.shots if n) if any(self.shots) else 5
        ssd_methods = () if self.args.no_ssd else ("ssd", "lfssd")
        for c in self.classes:
            full = ed.class_images(c)
            for method in ssd_methods:
                scfg = self.ssd_cfg.get(method)
                cold, _, _ = ed.request(method, full, cls=c, cold=True, ssd=scfg)
                warm, _, _ = ed.request(method, full, cls=c, ssd=scfg)
                self._record("full class", name, method, warm)
                self.rows[-1].update(seconds_cold=cold.seconds, dampened_pct=warm.details.get("dampened_pct"))
                bar.update(2)
            req, _, _ = ed.request("mask", full, cls=c)
            self._record("full class", name, "mask (logit)", req)
            self._record("full class", name, "none (unedited)", replace(  # positive control: the class still there
                req, after=req.before, delta=req.before.delta(req.oracle)), seconds=0.0)
            for score in self.scores if name == "resnet18" else ["attribution"]:
                req, _, _ = ed.request("unact", full, cls=c, cfg=self._cfg(ed, score))
                self._record("full class", name, f"unact ({score})" if name == "resnet18" else "unact", req)
                bar.update(1)
            one, _, _ = ed.request("unact", full, cls=c, cfg=self._cfg(ed, primary, p=self.args.one_round_p, k=1))
            self._record("full class", name, f"unact one round (p {self.args.one_round_p:g})", one)
            bar.update(1)
            for n in [s for s in self.shots if s]:
                imgs = ed.class_images(c, n, seed=self.args.seed)
                for score in self.scores if name == "resnet18" else ["attribution"]:
                    req, _, _ = ed.request("unact", imgs, cls=c, cfg=self._cfg(ed, score))
                    self._record("few-shot", name, f"unact ({score})" if name == "resnet18" else "unact", req)
                if n == small:
                    for method in ssd_methods:
                        req, _, _ = ed.request(method, imgs, cls=c, ssd=self.ssd_cfg.get(method))
                        self._record("few-shot", name, method, req)
                        self.rows[-1]["dampened_pct"] = req.details.get("dampened_pct")
                bar.update(1)

    def sequential(self, ed: ClassEditor, bar: tqdm) -> None:
        """The classes removed one after another from one model: the paper's rule (every request runs its
        k rounds) and ours (each request stops once its images no longer give the class)."""
        labels = ed.dataset.test.labels[ed.test_index]
        base_pred = ed.predict_test(ed.model)
        ours = self._cfg(ed, self.scores[0])
        paper_k = DEFAULTS.get(ed.arch, (0, 0, ours.k))[2] if self.args.k is None else self.args.k
        for stop in ("rounds", "forgotten"):
            model = ed.working_copy()
            gone: list[int] = []
            # the paper's stop: its k rounds every request; ours: the run's default stopping rule
            cfg = replace(ours, stop="rounds", k=paper_k) if stop == "rounds" else replace(ours, stop="forgotten")
            for c in self.classes:
                t0 = time.perf_counter()
                _, res = ed.run_unact(ed.class_images(c), cfg, model=model)
                seconds = time.perf_counter() - t0
                gone.append(c)
                pred = ed.predict_test(model)
                self.rows.append(self._sequential_row(ed, f"unact ({cfg.score}), stop: {stop}", c, gone, pred, labels,
                                                      base_pred, seconds, len(res.rounds)))
                self.rows[-1]["stop_reason"] = res.stop_reason or "all rounds"
                bar.update(1)

    def _sequential_row(self, ed: ClassEditor, method: str, c: int, gone: list[int], pred: np.ndarray,
                        labels: np.ndarray, base_pred: np.ndarray, seconds: float, rounds: int) -> dict:
        kept, forgot = ~np.isin(labels, gone), np.isin(labels, gone)
        return {"section": "sequential", "model": ed.arch, "method": method, "class": c,
                "n": int((ed.dataset.train.labels == c).sum()), "requests": len(gone),
                "Af": float(100 * np.mean(pred[forgot] == labels[forgot])),
                "Ar": float(100 * np.mean(pred[kept] == labels[kept])),
                "Ar_before": float(100 * np.mean(base_pred[kept] == labels[kept])),
                "Af_this": float(100 * np.mean(pred[labels == c] == c)),
                "Af_oracle": None, "Ar_oracle": None, "Delta": None, "seconds": seconds, "rounds": rounds}

    def munkey_cfg(self, ed: ClassEditor) -> UnActConfig:
        a, base = self.args, ed.default_config()
        return replace(base, p=base.p if a.munkey_p is None else a.munkey_p,
                       gamma=base.gamma if a.munkey_gamma is None else a.munkey_gamma,
                       k=base.k if a.munkey_k is None else a.munkey_k)

    def munkey_sections(self, ed: ClassEditor, bar: tqdm) -> None:
        cfg = self.munkey_cfg(ed)
        bare = replace(cfg, guard=None, protect=None, backoff=None, margin=0.0, tail=None)  # the default before the guard
        rows = [("keys", "keys", None, None), ("mask (logit)", "mask", None, None),
                ("unact (inference path)", "unact", cfg, None), ("keys+unact (inference path)", "keys+unact", cfg, None),
                (EARLIER_DEFAULT, "keys+unact", bare, None),
                ("keys+unact (image pathway, earlier design)", "keys+unact", EARLIER,
                 {"path": "image", "head": False, "blocks": len(ed.model.vit.blocks)})]
        if self.args.munkey_rows == "controls":  # the product's request and its controls only
            rows = rows[:4]
        for c in self.classes:
            for n in (0, 5):
                imgs = ed.class_images(c, n, seed=self.args.seed)
                for label, method, mcfg, options in rows:
                    if method in ("keys", "mask") and n:
                        continue  # neither uses the images
                    req, _, _ = ed.request(method, imgs, cls=c, cfg=mcfg, unact_options=options)
                    self._record("munkey full class" if not n else "munkey few-shot", "munkey", label, req)
                    self.rows[-1].update({k: req.details.get(k) for k in ("rounds", "units", "keys_deleted", "stop_reason")})
                    bar.update(1)

    def munkey_sequential(self, ed: ClassEditor, bar: tqdm) -> None:
        """Key deletion + UnAct for the classes one after another on one model and one bank: the product
        default (retain guard), the same without the guard, and the paper's rule (all k rounds, no guard)."""
        default = self.munkey_cfg(ed)
        bare = replace(default, guard=None, protect=None, backoff=None, margin=0.0, tail=None)
        rules = [("keys+unact (inference path)", default),
                 (EARLIER_DEFAULT, bare),
                 ("keys+unact (paper's rule: all k rounds)", replace(bare, stop="rounds"))]
        if self.args.munkey_rows == "controls":
            rules = rules[:1]
        labels = ed.dataset.test.labels[ed.test_index]
        base_pred = ed.predict_test(ed.model)
        for name, cfg in rules:
            model, bank = ed.working_copy(), None
            gone: list[int] = []
            for c in self.classes:
                imgs = ed.class_images(c)
                t0 = time.perf_counter()
                target = ed.pseudo_label(imgs, model=model, bank=bank)
                bank = ed.class_bank(c, bank)[0]
                _, res = ed.run_unact(imgs, cfg, model=model, bank=bank, target=target)
                seconds = time.perf_counter() - t0
                gone.append(c)
                pred = ed.predict_test(model, bank)
                row = self._sequential_row(ed, name, c, gone, pred, labels, base_pred, seconds, len(res.rounds))
                row.update(section="munkey sequential", model="munkey", stop_reason=res.stop_reason or "all rounds")
                self.rows.append(row)
                bar.update(1)

    def tune_ssd(self, ed: ClassEditor, bar: tqdm) -> None:
        """One SSD and one LFSSD working point for the dataset: the grid point with the lowest mean over
        the forgotten classes of Af_val + max(0, Ar_val(original) - Ar_val) on the validation split."""
        from munkey_core.model.classifiers import predict_labels

        tr, val = ed.dataset.train, ed.dataset.val
        size = ed.run.cfg.img_size
        base_pred = predict_labels(ed.model, val.images, size)
        scores: dict[tuple, list[float]] = {}
        for method in ("ssd", "lfssd"):
            for batch in SSD_BATCHES:
                for c in self.classes:
                    work = ed.working_copy()
                    order = reference_order(tr.labels, c)
                    i_d, _ = cached_importance(
                        ed.root / "importance", ed.fingerprint(), method, batch,
                        lambda: importance(work, ed.to_input, tr.images[order], tr.labels[order], method, batch),
                        order=f"c{c}")
                    imgs = ed.class_images(c)
                    i_f = importance(work, ed.to_input, imgs, None if method == "lfssd" else np.full(len(imgs), c),
                                     method, batch)
                    before = class_metrics(base_pred, val.labels, c, ed.num_classes)
                    for alpha in SSD_ALPHAS:
                        for lam in SSD_LAMBDAS:
                            m = ed.working_copy()
                            n = dampen(m, i_f, i_d, alpha, lam)
                            after = class_metrics(predict_labels(m, val.images, size), val.labels, c, ed.num_classes)
                            loss = after.Af + max(0.0, before.Ar - after.Ar)
                            scores.setdefault((method, alpha, lam, batch), []).append(loss)
                            self.tuning.append({"method": method, "alpha": alpha, "lambda": lam, "batch": batch,
                                                "class": c, "Af_val": after.Af, "Ar_val": after.Ar,
                                                "Ar_val_before": before.Ar, "loss": loss,
                                                "dampened_pct": 100.0 * n / sum(p.numel() for p in m.parameters())})
                    bar.update(1)
            best = min((k for k in scores if k[0] == method), key=lambda k: statistics.mean(scores[k]))
            self.ssd_cfg[method] = SSDConfig(method=method, alpha=best[1], lam=best[2], batch_size=best[3])
        self.tuning_scores = {k: statistics.mean(v) for k, v in scores.items()}

    def tuning_table(self) -> None:
        if not self.tuning:
            return
        self.lines += ["### SSD / LFSSD working points (tuned on the validation split)", "",
                       f"Grid: alpha {', '.join(f'{a:g}' for a in SSD_ALPHAS)} x lambda "
                       f"{', '.join(f'{x:g}' for x in SSD_LAMBDAS)} x batch {', '.join(map(str, SSD_BATCHES))}; "
                       "I_D over the training data in the reference order (retain classes, then the forget class); "
                       "criterion: mean over the classes of Af_val + max(0, Ar_val before - Ar_val).", "",
                       "| method | alpha | lambda | batch | mean criterion | mean Af_val | mean Ar_val | mean % dampened |",
                       "|---|---|---|---|---|---|---|---|"]
        for method in ("ssd", "lfssd"):
            ranked = sorted((k for k in self.tuning_scores if k[0] == method), key=self.tuning_scores.get)
            for k in ranked[:3] + [k for k in ranked if (k[1], k[2]) == (10.0, 1.0) and k[3] == 64][:1]:
                rs = [r for r in self.tuning if (r["method"], r["alpha"], r["lambda"], r["batch"]) == k]
                mark = " (chosen)" if k == ranked[0] else (" (SSD default)" if (k[1], k[2], k[3]) == (10.0, 1.0, 64) else "")
                self.lines.append(f"| {method}{mark} | {k[1]:g} | {k[2]:g} | {k[3]} | {self.tuning_scores[k]:.2f} | "
                                  f"{statistics.mean(r['Af_val'] for r in rs):.2f} | "
                                  f"{statistics.mean(r['Ar_val'] for r in rs):.2f} | "
                                  f"{statistics.mean(r['dampened_pct'] for r in rs):.2f} |")
        self.lines.append("")

    # ----- report -----------------------------------------------------------------------
    def table(self, section: str, title: str) -> None:
        rows = [r for r in self.rows if r["section"] == section]
        if not rows:
            return
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            n = "all" if section in ("full class", "munkey full class") else r["n"]
            groups.setdefault((r["model"], r["method"], n), []).append(r)
        self.lines += [f"### {title}", "", "| model | method | n | Af | Ar | Ar unedited | Af* | Ar* | Delta (classes with an "
                       "oracle) | s / request | SSD cold s | % params dampened |",
                       "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for (model, method, n), rs in groups.items():
            col = lambda k: mean_sd([r.get(k) for r in rs])  # noqa: E731
            with_oracle = sum(r.get("Delta") is not None for r in rs)
            self.lines.append(f"| {model} | {method} | {n} | {col('Af')} | {col('Ar')} | {col('Ar_before')} | "
                              f"{col('Af_oracle')} | {col('Ar_oracle')} | {col('Delta')} ({with_oracle}) | {col('seconds')} | "
                              f"{col('seconds_cold')} | {col('dampened_pct')} |")
        self.lines += ["", f"Mean ± standard deviation over classes {', '.join(map(str, self.classes))}.", ""]

    def per_class_table(self, section: str, method_prefix: str | tuple[str, ...]) -> None:
        rows = [r for r in self.rows if r["section"] == section and r["method"].startswith(method_prefix)]
        if not rows:
            return
        what = method_prefix if isinstance(method_prefix, str) else ", ".join(method_prefix)
        self.lines += [f"### {section}: {what} per class", "", "| method | class | n | Af before | Af | Ar before "
                       "| Ar | Af* | Ar* | Delta |", "|---|---|---|---|---|---|---|---|---|---|"]
        f = num_or_dash
        for r in rows:
            self.lines.append(f"| {r['method']} | {r['class']} | {r['n']} | {f(r['Af_before'])} | {f(r['Af'])} | "
                              f"{f(r['Ar_before'])} | {f(r['Ar'])} | {f(r['Af_oracle'])} | {f(r['Ar_oracle'])} | "
                              f"{f(r['Delta'])} |")
        self.lines.append("")

    def sequential_table(self, section: str) -> None:
        rows = [r for r in self.rows if r["section"] == section]
        if not rows:
            return
        self.lines += [f"### Sequential requests ({'MUNKEY run, ' if section.startswith('munkey') else ''}one model, "
                       "one class after another)", "",
                       "| rule | after request | class removed | rounds | stopped by | Af (this class) | "
                       "Af (all removed so far) | Ar (classes kept) | original's Ar on the same classes | s |",
                       "|---|---|---|---|---|---|---|---|---|---|"]
        f = num_or_dash
        for r in rows:
            self.lines.append(f"| {r['method']} | {r['requests']} | {r['class']} | {r.get('rounds', '-')} | "
                              f"{r.get('stop_reason', '-')} | {f(r.get('Af_this'))} | {r['Af']:.2f} | "
                              f"{r['Ar']:.2f} | {r['Ar_before']:.2f} | {r['seconds']:.2f} |")
        self.lines.append("")

    def speed_lines(self) -> None:
        full = [r for r in self.rows if r["section"] == "full class"]
        by_class: dict[int, dict[str, dict]] = {}
        for r in full:
            by_class.setdefault(r["class"], {})[r["method"]] = r
        ratios_one, ratios_full, ratios_warm = [], [], []
        for c, m in by_class.items():
            ssd = m.get("ssd")
            one = next((v for k, v in m.items() if k.startswith("unact one round")), None)
            un = next((v for k, v in m.items() if k.startswith("unact (") or k == "unact"), None)
            if ssd and one:
                ratios_one.append(ssd["seconds_cold"] / one["seconds"])
                ratios_warm.append(ssd["seconds"] / one["seconds"])
            if ssd and un:
                ratios_full.append(ssd["seconds_cold"] / un["seconds"])
        if ratios_one:
            self.lines += ["### Time per request (same model, same images, same run)", "",
                           f"- SSD cold / one-round UnAct: median **{statistics.median(ratios_one):.1f}x** "
                           f"(per class: {', '.join(f'{x:.1f}' for x in ratios_one)})",
                           f"- SSD warm / one-round UnAct: median {statistics.median(ratios_warm):.1f}x",
                           f"- SSD cold / {self._cfg_text()} UnAct: median {statistics.median(ratios_full):.1f}x", ""]

    def resnet_rules(self, ed: ClassEditor) -> list[str]:
        """What the ResNet rows' two UnAct rules are (ours: the run's default; the paper's)."""
        ours, paper = self._cfg(ed, "attribution"), self._cfg(ed, "activation")
        stop = lambda c: ("all k rounds" if c.stop == "rounds" else  # noqa: E731
                          "stop once no request image gives c, c's mean probability below chance"
                          + ("" if getattr(c, "tail", None) is None else
                             f" and its largest below {c.tail:g} x chance") + ", at most k rounds")
        return [f"UnAct rules: unact (attribution) = ours, p {ours.p:g}, gamma {ours.gamma:g}, k {ours.k}, "
                f"{stop(ours)}; unact (activation) = the paper's, p {paper.p:g}, gamma {paper.gamma:g}, "
                f"k {paper.k}, {stop(paper)}. none (unedited): the model before any request (positive control: "
                "Delta against the oracle when nothing is removed).", ""]

    def _cfg_text(self) -> str:
        a = self.args
        return "full" if a.k is None else f"k = {a.k}"

    def run(self) -> int:
        a = self.args
        t_start = time.perf_counter()
        first = ClassEditor(a.run, device=a.device)
        ed = first if first.kind == "classifier" else None
        if ed is None and a.munkey_run:
            raise MunkeyError(f"{a.run} is a MUNKEY run; pass a ResNet-18 / ViT run first and the MUNKEY run with "
                              "--munkey-run, or the MUNKEY run alone.")
        med = first if ed is None else (ClassEditor(a.munkey_run, device=a.device) if a.munkey_run else None)
        editors = [e for e in (ed, med) if e is not None]
        if a.no_ssd and a.ssd_tune:
            raise MunkeyError("--ssd-tune tunes the SSD/LFSSD rows that --no-ssd leaves out; pass one of them.")
        bad = [c for c in self.classes if not 0 <= c < first.num_classes]
        if bad:
            raise MunkeyError(f"Class(es) {bad} do not exist in this run (classes 0-{first.num_classes - 1}).")
        if a.train_oracles:
            for e in editors:
                for c in self.classes:
                    e.train_oracle(c)
        n = len(self.classes)
        total = 0
        if ed is not None:
            n_scores = len(self.scores) if ed.arch == "resnet18" else 1
            total += ((2 if a.no_ssd else 6) + n_scores + len([s for s in self.shots if s])) * n
            total += 0 if a.no_sequential else 2 * n
            total += 2 * len(SSD_BATCHES) * n if a.ssd_tune else 0
        if med is not None:
            per_class, rules = (11, 3) if a.munkey_rows == "all" else (6, 1)
            total += per_class * n + (0 if a.no_sequential else rules * n)
        with tqdm(total=total, desc="bench unact", unit="request", dynamic_ncols=True) as bar:
            if ed is not None:
                if a.ssd_tune:
                    self.tune_ssd(ed, bar)
                self.classifier_sections(ed, bar)
                if not a.no_sequential:
                    self.sequential(ed, bar)
            if med is not None:
                self.munkey_sections(med, bar)
                if not a.no_sequential:
                    self.munkey_sequential(med, bar)
        self.report(first, ed, med, time.perf_counter() - t_start)
        return 0

    def report(self, first: ClassEditor, ed: ClassEditor | None, med: ClassEditor | None, wall: float) -> None:
        """Print the tables of the collected rows and write them (and the rows) to --out."""
        a = self.args
        name = first.run.config["dataset"]
        title = (f"{ed.arch} (width {ed.run.cfg.width})" if ed.arch == "resnet18" else ed.arch) if ed else "MUNKEY run"
        self.lines = [f"## UnAct on {name}: {title}", "",
                      f"Test images: {len(first.test_index)} ({name} test split). Af: accuracy on the forgotten class, "
                      "Ar: on the other classes; * = the class oracle (same recipe, trained without the class); "
                      "Delta = |Ar - Ar*| + |Af - Af*|. Wall time of this benchmark: "
                      f"{wall / 60:.1f} min.", ""]
        if ed is not None:
            self.tuning_table()
            if a.no_ssd:
                self.lines += ["SSD / LFSSD rows not run (--no-ssd).", ""]
            self.lines += self.resnet_rules(ed) if ed.arch == "resnet18" else []
            self.table("full class", "Full class (every training image of the class)")
            self.per_class_table("full class", ("unact", "none"))
            self.speed_lines()
            self.table("few-shot", "Few-shot requests (n seeded training images of the class)")
            self.per_class_table("few-shot", "unact")
            self.sequential_table("sequential")
        if med is not None:
            c = self.munkey_cfg(med)
            self.lines += [f"UnAct on the MUNKEY backbone (the product default): p {c.p:g}, gamma {c.gamma:g}, k {c.k}, "
                           f"stop: {c.stop} (c's mean probability below n / (n + {c.margin:g}) x chance"
                           + ("" if c.tail is None else f", its largest below {c.tail:g} x chance") + "), retain "
                           f"guard {c.guard} points" + ("" if c.class_guard is None else f", {c.class_guard:g} for one kept class")
                           + f" (backoff p {c.backoff}); scored along the inference path (each "
                           "image with its K neighbours from the bank the request leaves, ensemble-weighted), MLP "
                           "neurons of the last third of the blocks plus the classifier's inputs. The earlier design: "
                           "p 99, k 20, image pathway (null token), every block, no classifier inputs. mask: the "
                           "class's logit forced down (suppression only: the features, units, keys and exemplars all "
                           "stay).", ""]
            self.table("munkey full class", "MUNKEY run: full class")
            self.per_class_table("munkey full class", "keys+unact (inference")
            self.table("munkey few-shot", "MUNKEY run: n = 5 images")
            self.per_class_table("munkey few-shot", "keys+unact (inference")
            self.sequential_table("munkey sequential")
        text = "\n".join(self.lines)
        print(text)
        if a.out:
            keys = list(COLUMNS) + sorted({k for r in self.rows for k in r} - set(COLUMNS))
            write_tables(a.out, f"unact_{name}", text + "\n", self.rows, keys)
