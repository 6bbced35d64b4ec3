"""Why a single class removal (keys+unact) on a MUNKEY run misses its class oracle: what is left of the
class and what the kept classes lose, image by image, against the oracle.

For each class: the request's rounds and stop; the forgotten class's test images still predicted as it
after the request (with their probability of the class and their neighbours' classes in the bank
the request leaves); the kept classes' accuracy per class before, after and for the class oracle(s)
(`RUN/oracles/class_C`, and every `RUN/oracles_seed*/class_C` as a second training seed: the
oracle-vs-oracle spread); the kept test images the request flips (right -> wrong, wrong -> right)
and where the forgotten class's test images go, beside where the oracle sends them.

    python scripts/unact_class_diagnose.py RUN [--classes 0,2,3,5,8] [--n 0] [--margin M] [--guard G]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from munkey_core.run.loaded import load_run
from munkey_core.unlearn.classforget import ClassEditor


def _acc(pred: np.ndarray, labels: np.ndarray, c: int) -> float:
    m = labels == c
    return float(100 * np.mean(pred[m] == c)) if m.any() else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--classes", default="0,2,3,5,8")
    ap.add_argument("--n", type=int, default=0, help="request images (0: the whole class)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--margin", type=float, default=None)
    ap.add_argument("--guard", type=float, default=None)
    a = ap.parse_args()
    ed = ClassEditor(a.run, device="cpu")
    cfg = ed.default_config()
    over = {k: getattr(a, k) for k in ("margin", "guard") if getattr(a, k) is not None}
    cfg = replace(cfg, **over)
    print(cfg, flush=True)
    idx = ed.test_index
    labels = ed.dataset.test.labels[idx]
    before = ed.forwards.probabilities(ed.model, ed.run.bank, idx)
    pb = before.argmax(1)
    for c in (int(x) for x in a.classes.split(",")):
        imgs = ed.class_images(c, a.n or None, seed=a.seed)
        req, model, bank = ed.request("keys+unact", imgs, cls=c, cfg=cfg)
        after = ed.forwards.probabilities(model, bank, idx)
        pa = after.argmax(1)
        d = req.details
        print(f"\n=== class {c}: n {len(imgs)}, rounds {d.get('rounds')}, stop {d.get('stop_reason')}, "
              f"probe {d.get('probe_before')} -> {d.get('probe_after')}; Af {req.before.Af:.2f} -> {req.after.Af:.2f}, "
              f"Ar {req.before.Ar:.2f} -> {req.after.Ar:.2f}", flush=True)
        fc = np.flatnonzero(labels == c)
        left = fc[pa[fc] == c]
        print(f"class {c} test images: {len(fc)}; still predicted {c}: {len(left)}; p_c after "
              f"mean {after[fc, c].mean():.4f}, max {after[fc, c].max():.4f}; pred after: "
              f"{np.bincount(pa[fc], minlength=ed.num_classes).tolist()}")
        keys = ed.run.split_keys("test")[idx]
        import torch
        for r in left:
            sims, rows = bank.search(torch.as_tensor(keys[r:r + 1]), ed.run.train_cfg.k)
            nb = bank.labels[rows.numpy()[0]].tolist()
            top2 = np.argsort(-after[r])[:2].tolist()
            print(f"  test row {int(idx[r])}: p_c before {before[r, c]:.3f} after {after[r, c]:.3f}, top2 {top2} "
                  f"{[round(float(after[r, t]), 3) for t in top2]}, neighbours' classes {nb}")
        oracles = {"oracle": ed.oracle_path(c)}
        for extra in sorted(Path(a.run).glob("oracles_seed*")):
            oracles[extra.name] = extra / f"class_{c}"
        opred = {}
        for name, path in oracles.items():
            if (path / "config.json").exists():
                opred[name] = load_run(path, device="cpu").predict_split("test", idx)
        kept = labels != c
        print("kept-class accuracy per class: class  before  after  " + "  ".join(opred))
        for k in range(ed.num_classes):
            if k == c:
                continue
            print(f"  {k}: {_acc(pb, labels, k):6.2f} {_acc(pa, labels, k):6.2f} "
                  + " ".join(f"{_acc(p, labels, k):6.2f}" for p in opred.values()))
        ar = {"before": 100 * np.mean(pb[kept] == labels[kept]), "after": 100 * np.mean(pa[kept] == labels[kept])}
        ar.update({n: 100 * np.mean(p[kept] == labels[kept]) for n, p in opred.items()})
        print("Ar: " + ", ".join(f"{n} {v:.2f}" for n, v in ar.items()))
        rw = kept & (pb == labels) & (pa != labels)
        wr = kept & (pb != labels) & (pa == labels)
        print(f"kept images flipped by the request: right->wrong {int(rw.sum())} "
              f"{[(int(labels[i]), int(pa[i])) for i in np.flatnonzero(rw)]}, wrong->right {int(wr.sum())} "
              f"{[(int(pb[i]), int(labels[i])) for i in np.flatnonzero(wr)]}")
        for n, p in opred.items():
            orw = kept & (pb == labels) & (p != labels)
            owr = kept & (pb != labels) & (p == labels)
            print(f"  {n} vs the unedited run: right->wrong {int(orw.sum())}, wrong->right {int(owr.sum())}; "
                  f"kept images where the request and {n} disagree on right/wrong: "
                  f"{int(((pa == labels) != (p == labels))[kept].sum())}")
            print(f"  class {c} images under {n}: {np.bincount(p[fc], minlength=ed.num_classes).tolist()}")


if __name__ == "__main__":
    main()
