"""The work behind `munkey bench unact` (see bench/unact.py for what it measures)."""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from munkey_core.unlearn.classforget import ClassEditor, ClassRequest
from munkey_core.errors import MunkeyError
from munkey_core.unlearn.unact import UnActConfig

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


def _mean_sd(values: list[float]) -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.2f}"
    return f"{statistics.mean(vals):.2f} ± {statistics.stdev(vals):.2f}"


class UnactBench:
    """Runs the sections, collects one row per request, prints and writes the tables."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.classes = _ints(args.classes)
        self.shots = _shots(args.shots)
        self.scores = [s.strip() for s in args.scores.split(",") if s.strip()]
        self.rows: list[dict] = []
        self.lines: list[str] = []

    # ----- helpers ----------------------------------------------------------------------
    def _cfg(self, ed: ClassEditor, score: str = "activation", **over) -> UnActConfig:
        base = ed.default_config()
        a = self.args
        cfg = UnActConfig(base.p if a.p is None else a.p, base.gamma if a.gamma is None else a.gamma,
                          base.k if a.k is None else a.k, score)
        cfg = replace(cfg, **over)
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
        for c in self.classes:
            full = ed.class_images(c)
            for method in ("ssd", "lfssd"):
                cold, _, _ = ed.request(method, full, cls=c, cold=True)
                warm, _, _ = ed.request(method, full, cls=c)
                self._record("full class", name, method, warm)
                self.rows[-1]["seconds_cold"] = cold.seconds
                bar.update(2)
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
                    for method in ("ssd", "lfssd"):
                        req, _, _ = ed.request(method, imgs, cls=c)
                        self._record("few-shot", name, method, req)
                bar.update(1)

    def sequential(self, ed: ClassEditor, bar: tqdm) -> None:
        model = ed.working_copy()
        labels = ed.dataset.test.labels[ed.test_index]
        base_pred = ed.predict_test(ed.model)
        gone: list[int] = []
        cfg = self._cfg(ed, self.scores[0])
        for c in self.classes:
            t0 = time.perf_counter()
            ed.run_unact(ed.class_images(c), cfg, model=model)
            seconds = time.perf_counter() - t0
            gone.append(c)
            pred = ed.predict_test(model)
            kept = ~np.isin(labels, gone)
            forgot = np.isin(labels, gone)
            self.rows.append({
                "section": "sequential", "model": ed.arch, "method": f"unact ({cfg.score})", "class": c,
                "n": int((ed.dataset.train.labels == c).sum()), "requests": len(gone),
                "Af": float(100 * np.mean(pred[forgot] == labels[forgot])),
                "Ar": float(100 * np.mean(pred[kept] == labels[kept])),
                "Ar_before": float(100 * np.mean(base_pred[kept] == labels[kept])),
                "Af_oracle": None, "Ar_oracle": None, "Delta": None, "seconds": seconds})
            bar.update(1)

    def munkey_sections(self, ed: ClassEditor, bar: tqdm) -> None:
        for c in self.classes:
            for n in (0, 5):
                imgs = ed.class_images(c, n, seed=self.args.seed)
                for method in ("keys", "unact", "keys+unact"):
                    if method == "keys" and n:
                        continue  # key deletion does not use the images
                    a = self.args
                    cfg = UnActConfig(a.munkey_p, a.munkey_gamma, a.munkey_k)
                    req, _, _ = ed.request(method, imgs, cls=c, cfg=cfg)
                    self._record("munkey full class" if not n else "munkey few-shot", "munkey", method, req)
                    bar.update(1)

    # ----- report -----------------------------------------------------------------------
    def table(self, section: str, title: str) -> None:
        rows = [r for r in self.rows if r["section"] == section]
        if not rows:
            return
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            n = "all" if section in ("full class", "munkey full class") else r["n"]
            groups.setdefault((r["model"], r["method"], n), []).append(r)
        self.lines += [f"### {title}", "", "| model | method | n | Af | Ar | Af* | Ar* | Delta | s / request | "
                       "SSD cold s |", "|---|---|---|---|---|---|---|---|---|---|"]
        for (model, method, n), rs in groups.items():
            col = lambda k: _mean_sd([r.get(k) for r in rs])  # noqa: E731
            self.lines.append(f"| {model} | {method} | {n} | {col('Af')} | {col('Ar')} | {col('Af_oracle')} | "
                              f"{col('Ar_oracle')} | {col('Delta')} | {col('seconds')} | {col('seconds_cold')} |")
        self.lines += ["", f"Mean ± standard deviation over classes {', '.join(map(str, self.classes))}.", ""]

    def per_class_table(self, section: str, method_prefix: str) -> None:
        rows = [r for r in self.rows if r["section"] == section and r["method"].startswith(method_prefix)]
        if not rows:
            return
        self.lines += [f"### {section}: {method_prefix} per class", "", "| method | class | n | Af before | Af | Ar before "
                       "| Ar | Af* | Ar* | Delta |", "|---|---|---|---|---|---|---|---|---|---|"]
        f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        for r in rows:
            self.lines.append(f"| {r['method']} | {r['class']} | {r['n']} | {f(r['Af_before'])} | {f(r['Af'])} | "
                              f"{f(r['Ar_before'])} | {f(r['Ar'])} | {f(r['Af_oracle'])} | {f(r['Ar_oracle'])} | "
                              f"{f(r['Delta'])} |")
        self.lines.append("")

    def sequential_table(self) -> None:
        rows = [r for r in self.rows if r["section"] == "sequential"]
        if not rows:
            return
        self.lines += ["### Sequential requests (one model, one class after another)", "",
                       "| after request | class removed | Af (all removed so far) | Ar (classes kept) | "
                       "original's Ar on the same classes | s |", "|---|---|---|---|---|---|"]
        for r in rows:
            self.lines.append(f"| {r['requests']} | {r['class']} | {r['Af']:.2f} | {r['Ar']:.2f} | {r['Ar_before']:.2f} "
                              f"| {r['seconds']:.2f} |")
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

    def _cfg_text(self) -> str:
        a = self.args
        return "full" if a.k is None else f"k = {a.k}"

    def run(self) -> int:
        a = self.args
        t_start = time.perf_counter()
        ed = ClassEditor(a.run, device=a.device)
        if ed.kind != "classifier":
            raise MunkeyError(f"{a.run} is a MUNKEY run; pass a ResNet-18 / ViT run first and the MUNKEY run with "
                              "--munkey-run.")
        med = ClassEditor(a.munkey_run, device=a.device) if a.munkey_run else None
        bad = [c for c in self.classes if not 0 <= c < ed.num_classes]
        if bad:
            raise MunkeyError(f"Class(es) {bad} do not exist in this run (classes 0-{ed.num_classes - 1}).")
        if a.train_oracles:
            for e in [ed] + ([med] if med else []):
                for c in self.classes:
                    e.train_oracle(c)
        n_scores = len(self.scores) if ed.arch == "resnet18" else 1
        per_class = (5 + n_scores + len([s for s in self.shots if s])) * len(self.classes)
        total = per_class + (0 if a.no_sequential else len(self.classes)) + (5 * len(self.classes) if med else 0)
        with tqdm(total=total, desc="bench unact", unit="request", dynamic_ncols=True) as bar:
            self.classifier_sections(ed, bar)
            if not a.no_sequential:
                self.sequential(ed, bar)
            if med is not None:
                self.munkey_sections(med, bar)
        wall = time.perf_counter() - t_start
        name = ed.run.config["dataset"]
        self.lines = [f"## UnAct on {name}: {ed.arch} (width {ed.run.cfg.width})" if ed.arch == "resnet18"
                      else f"## UnAct on {name}: {ed.arch}", "",
                      f"Test images: {len(ed.test_index)} ({name} test split). Af: accuracy on the forgotten class, "
                      "Ar: on the other classes; * = the class oracle (same recipe, trained without the class); "
                      "Delta = |Ar - Ar*| + |Af - Af*|. Wall time of this benchmark: "
                      f"{wall / 60:.1f} min.", ""]
        self.table("full class", "Full class (every training image of the class)")
        self.speed_lines()
        self.table("few-shot", "Few-shot requests (n seeded training images of the class)")
        self.per_class_table("few-shot", "unact")
        self.sequential_table()
        if med is not None:
            self.lines += [f"UnAct on the MUNKEY backbone: p {a.munkey_p:g}, gamma {a.munkey_gamma:g}, k {a.munkey_k} "
                           "(image pathway scored with the null token; the bank is not read).", ""]
            self.table("munkey full class", "MUNKEY run: class key deletion, UnAct on the backbone, both (full class)")
            self.table("munkey few-shot", "MUNKEY run: n = 5 images")
        text = "\n".join(self.lines)
        print(text)
        if a.out:
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"unact_{name}.md").write_text(text + "\n")
            keys = list(COLUMNS) + sorted({k for r in self.rows for k in r} - set(COLUMNS))
            with open(out / f"unact_{name}.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(self.rows)
            print(f"\nwritten: {out / f'unact_{name}.md'} and .csv")
        return 0
