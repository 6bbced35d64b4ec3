"""Trace UnAct on a ResNet-18 classifier run round by round (ours, or the paper's rule) to choose its stop rule.

For each class (full class and n seeded images) one request runs `--k` rounds of the run's ResNet
working point (p, gamma) without stopping; after every round it records the request images'
probability of the class (mean, max, fraction still predicted), and Af/Ar on the validation and test
splits. A "forgotten" stop only truncates this deterministic sequence of edits, so any stop rule
(chance, a tail x chance on every request image, a round cap) is read off the trace afterwards:
`--rules` prints, per rule, the rounds it keeps and its Af/Ar (validation and test) and, where the
class oracle exists, Delta on the test split.

    OMP_NUM_THREADS=1 python scripts/unact_resnet_trace.py runs/demo_resnet18 --out trace.json
    python scripts/unact_resnet_trace.py runs/resnet64 --score activation --shots all --k 40   # the paper's rule
    python scripts/unact_resnet_trace.py runs/demo_resnet18 --second-oracle 0:runs/oracle_seed1/class_0
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

import numpy as np
import torch

from munkey_core.model.classifiers import predict_labels
from munkey_core.run.loaded import load_run
from munkey_core.unlearn.classforget import ClassEditor, class_metrics
from munkey_core.unlearn.unact import DEFAULTS, UnActConfig


def trace(ed: ClassEditor, cls: int, n: int | None, k: int, seed: int, score: str = "attribution") -> dict:
    """Per edited-round count m = 0..k: request probability stats and val/test Af/Ar. `score`:
    attribution (the run's default working point) or activation (the paper's rule, its p and gamma)."""
    images = ed.class_images(cls, n, seed=seed)
    x = ed.to_input(images)
    val, test = ed.dataset.val, ed.dataset.test
    size = ed.run.cfg.img_size
    tl = test.labels[ed.test_index]
    base = ed.default_config() if score == "attribution" else UnActConfig(*DEFAULTS["resnet18"][:2], k, "activation")
    cfg = replace(base, k=k, stop="rounds")
    rows: list[dict] = []

    def measure(model: torch.nn.Module, m: int) -> None:
        with torch.no_grad():
            probs = torch.softmax(model(x).double(), dim=1).numpy()  # (n, classes)
        pv = predict_labels(model, val.images, size)
        pt = ed.predict_test(model)
        v, t = class_metrics(pv, val.labels, cls, ed.num_classes), class_metrics(pt, tl, cls, ed.num_classes)
        rows.append({"m": m, "mean": float(probs[:, cls].mean()), "max": float(probs[:, cls].max()),
                     "still": float(np.mean(probs.argmax(1) == cls)), "Af_val": v.Af, "Ar_val": v.Ar,
                     "Af": t.Af, "Ar": t.Ar})

    seen: set[int] = set()

    def on_round(info, model: torch.nn.Module) -> None:
        measure(model, info.round)
        rows[-1]["new_units"] = len(set(info.selected) - seen)  # channels no earlier round had dampened
        seen.update(info.selected)

    measure(ed.model.eval(), 0)
    ed.run_unact(images, cfg, target=cls, on_round=on_round)
    return {"cls": cls, "n": len(images), "classes": ed.num_classes, "rows": rows}


def stop_round(tr: dict, tail: float | None, k: int) -> int:
    """Edited rounds a `stop="forgotten"` request with this tail and round cap keeps (unact's rule:
    checked before round r > 1, on the model after r - 1 rounds)."""
    chance = 1.0 / tr["classes"]
    for row in tr["rows"][1:k]:
        if row["still"] == 0.0 and row["mean"] < chance and (tail is None or row["max"] < tail * chance):
            return row["m"]
    return k


def summarise(traces: list[dict], rules: list[tuple[str, float | None, int]]) -> None:
    for label, tail, k in rules:
        for n_kind in sorted({t["n"] if t["n"] <= 25 else 0 for t in traces}):
            sel = [t for t in traces if (t["n"] if t["n"] <= 25 else 0) == n_kind]
            picks = [(t, t["rows"][min(len(t["rows"]) - 1, k if tail == "rounds" else stop_round(t, tail, k))])
                     for t in sel]
            crit = statistics.mean(r["Af_val"] + max(0.0, t["rows"][0]["Ar_val"] - r["Ar_val"]) for t, r in picks)
            deltas = [abs(r["Af"] - t["oracle"]["Af"]) + abs(r["Ar"] - t["oracle"]["Ar"]) for t, r in picks
                      if t["oracle"]]
            per = " ".join(f"{t['cls']}:m{r['m']} Af{r['Af']:.1f} Ar{r['Ar']:.1f}" for t, r in picks)
            print(f"{label:28s} n={'all' if n_kind == 0 else n_kind:>3} val crit {crit:6.2f} | "
                  f"test Delta mean {statistics.mean(deltas) if deltas else float('nan'):.2f} | {per}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("--classes", default="0,2,3,5,8")
    ap.add_argument("--shots", default="5,all")
    ap.add_argument("--k", type=int, default=40)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--score", choices=("attribution", "activation"), default="attribution",
                    help="attribution (ours, the run's working point) or activation (the paper's rule, p 99, gamma 0.01)")
    ap.add_argument("--out", default=None, help="JSON file for the traces (read back with --load)")
    ap.add_argument("--load", default=None, help="comma-separated trace files to summarise instead")
    ap.add_argument("--second-oracle", action="append", default=[], metavar="CLASS:RUN",
                    help="the oracle noise floor: Delta between the run's class oracle and this one (another seed)")
    a = ap.parse_args()
    ed = ClassEditor(a.run, device="cpu")
    if a.second_oracle:
        for spec in a.second_oracle:
            c, path = spec.split(":", 1)
            first, second = ed.oracle_metrics(int(c)), load_run(path, device="cpu")
            tl = ed.dataset.test.labels[ed.test_index]
            m = class_metrics(second.predict_split("test", ed.test_index), tl, int(c), ed.num_classes)
            print(f"class {c}: oracle Af {first.Af:.2f} Ar {first.Ar:.2f} | second oracle Af {m.Af:.2f} Ar {m.Ar:.2f} "
                  f"| oracle-vs-oracle Delta {m.delta(first):.2f}")
        return
    if a.load:
        traces = [t for f in a.load.split(",") for t in json.load(open(f))]
    else:
        traces = [trace(ed, int(c), None if s == "all" else int(s), a.k, a.seed, a.score)
                  for c in a.classes.split(",") for s in a.shots.split(",")]
        if a.out:
            json.dump(traces, open(a.out, "w"), indent=1)
    for t in traces:  # per round: test Af and the channels dampened for the first time (a stall: 0 new)
        print(f"class {t['cls']} n={t['n']}: round:Af/new channels " + " ".join(
            f"{r['m']}:{r['Af']:.0f}/{r.get('new_units', '-')}" for r in t["rows"][1:]))
    for t in traces:  # the class oracles read now (they may be trained after the trace)
        o = ed.oracle_metrics(t["cls"])
        t["oracle"] = None if o is None else {"Af": o.Af, "Ar": o.Ar}
    k = min(len(t["rows"]) - 1 for t in traces)
    rules = [("paper's k 20 (all rounds)", "rounds", 20), ("chance, k 20", None, 20), (f"chance, k {k}", None, k)]
    rules += [(f"tail {tl:g}, k {kk}", tl, kk) for tl in (1.0, 1.25, 1.5, 2.0, 3.0) for kk in (20, k)]
    rules += [(f"all rounds, k {kk}", "rounds", kk) for kk in (30, k)]
    summarise(traces, [r for r in rules if r[2] <= k])


if __name__ == "__main__":
    main()
