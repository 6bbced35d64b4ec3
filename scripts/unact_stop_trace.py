"""Round-by-round trace of one keys+unact request on a MUNKEY run, for choosing the "forgotten" stop:
after every round, what the request's own images say (the share still predicted as the class, the
class's mean and largest probability over them) beside what the class's unseen test images do (Af,
their largest probability of the class) and the kept classes' test accuracy (Ar) and the retain
probe's. The request runs all k rounds (the retain guard on), so every candidate stop can be read off.

    python scripts/unact_stop_trace.py RUN [--classes 0,2,3,5,8] [--n 0] [--k 12]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import torch

from munkey_core.unlearn.classforget import ClassEditor
from munkey_core.unlearn.unact import munkey_ensemble_forward, scope_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--classes", default="0,2,3,5,8")
    ap.add_argument("--n", type=int, default=0, help="request images (0: the whole class)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--k", type=int, default=12)
    a = ap.parse_args()
    ed = ClassEditor(a.run, device="cpu")
    cfg = replace(ed.default_config(), stop="rounds", k=a.k)
    idx = ed.test_index
    labels = ed.dataset.test.labels[idx]
    for c in (int(x) for x in a.classes.split(",")):
        imgs = ed.class_images(c, a.n or None, seed=a.seed)
        bank, _ = ed.class_bank(c)
        x = ed.to_input(imgs)
        nb = ed.neighbours(imgs, bank)
        print(f"\n=== class {c}, n {len(imgs)}: round | request: predicted c, mean p_c, q90 p_c, max p_c | "
              "test: Af, mean p_c, max p_c | Ar | probe", flush=True)

        def show(info, model) -> None:
            with torch.no_grad():
                logp, _ = scope_for(model, forward=munkey_ensemble_forward(model, *nb)).forward_stats(x, slice(0, len(x)))
            p = logp.exp().double().numpy()
            tp = ed.forwards.probabilities(model, bank, idx)
            f = labels == c
            pred = tp.argmax(1)
            print(f"  {info.round:2d} | {np.mean(p.argmax(1) == c):.2f} {p[:, c].mean():.4f} "
                  f"{np.quantile(p[:, c], 0.9):.4f} {p[:, c].max():.4f} | {100 * np.mean(pred[f] == c):5.2f} "
                  f"{tp[f, c].mean():.4f} {tp[f, c].max():.4f} | {100 * np.mean(pred[~f] == labels[~f]):.2f} | "
                  f"{info.probe_accuracy}", flush=True)

        _, res = ed.run_unact(imgs, cfg, bank=bank, target=c, on_round=show)
        print(f"  stop: {res.stop_reason or 'all rounds'}; probe at start {res.probe_start}; backed off at "
              f"round {res.backed_off}", flush=True)


if __name__ == "__main__":
    main()
