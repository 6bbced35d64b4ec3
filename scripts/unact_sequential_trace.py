"""Round-by-round trace of sequential class removals (keys+unact) on a MUNKEY run.

For each request and each UnAct round: how many units the round dampens per group, how many of them
earlier requests had already dampened, how many units in scope were ever dampened, the kept classes'
test accuracy after the round and what the kept test images are predicted as. This is the measurement
behind docs/results/unact_digits.md's diagnosis of the fifth request.

    python scripts/unact_sequential_trace.py RUN [--classes 0,2,3,5,8] [--rule default|no-guard|paper]
        [--guard POINTS] [--backoff P] [--protect RATIO] [--margin IMAGES] [--quiet]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from munkey_core.unlearn.classforget import ClassEditor
from munkey_core.unlearn.unact import RoundInfo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--classes", default="0,2,3,5,8")
    ap.add_argument("--rule", choices=("default", "no-guard", "paper"), default="no-guard",
                    help="default: the product's; no-guard: the default before the retain guard (stop at chance); "
                         "paper: all k rounds")
    ap.add_argument("--guard", type=float, default=None, help="retain guard, points (with --rule default: "
                    "overrides the product's)")
    ap.add_argument("--backoff", type=float, default=None, help="percentile after the guard's first undo (0 = none)")
    ap.add_argument("--protect", type=float, default=None, help="spare units whose score for the class is at most "
                    "this times their kept-class score")
    ap.add_argument("--margin", type=float, default=None, help="'forgotten' stop: c's mean probability below "
                    "n / (n + margin) x chance")
    ap.add_argument("--quiet", action="store_true", help="only the line after each request")
    a = ap.parse_args()
    ed = ClassEditor(a.run, device="cpu")
    cfg = ed.default_config()
    if a.rule != "default":  # the default before the retain guard, or the paper's rule
        cfg = replace(cfg, guard=None, protect=None, backoff=None, margin=0.0, tail=None,
                      stop="rounds" if a.rule == "paper" else cfg.stop)
    over = {k: getattr(a, k) for k in ("guard", "protect", "margin") if getattr(a, k) is not None}
    if a.backoff is not None:
        over["backoff"] = a.backoff or None
    cfg = replace(cfg, **over)
    cfg.check()
    print(cfg, flush=True)
    labels = ed.dataset.test.labels[ed.test_index]
    base_pred = ed.predict_test(ed.model)
    blocks = ed.model.vit.blocks
    hidden = blocks[-1].mlp.fc1.out_features
    n_mlp = hidden * max(1, -(-len(blocks) // 3))
    group = lambda u: "head" if u >= n_mlp else f"mlp{u // hidden}"  # noqa: E731
    edited_by: dict[int, set[int]] = {}  # unit -> the classes whose requests dampened it
    model, bank, gone = ed.working_copy(), None, []
    for c in (int(x) for x in a.classes.split(",")):
        imgs = ed.class_images(c)
        target = ed.pseudo_label(imgs, model=model, bank=bank)
        bank = ed.class_bank(c, bank)[0]
        kept = ~np.isin(labels, gone + [c])

        def on_round(info: RoundInfo, work) -> None:
            if a.quiet:
                return
            earlier = [u for u in info.selected if edited_by.get(u, set()) - {c}]
            per_group: dict[str, int] = {}
            for u in info.selected:
                per_group[group(u)] = per_group.get(group(u), 0) + 1
            for u in info.selected:
                edited_by.setdefault(u, set()).add(c)
            pred = ed.predict_test(work, bank)
            print(f"request {c} round {info.round}: {len(info.selected)} units {per_group}, {len(earlier)} dampened by "
                  f"earlier requests; ever dampened {len(edited_by)} of {ed.model.vit.head.in_features + n_mlp}; "
                  f"request images still predicted {c}: {info.still_predicted:.2f}; kept test accuracy "
                  f"{100 * np.mean(pred[kept] == labels[kept]):.1f}; kept images predicted as "
                  f"{np.bincount(pred[kept], minlength=ed.num_classes).tolist()}", flush=True)

        _, res = ed.run_unact(imgs, cfg, model=model, bank=bank, target=target, on_round=on_round)
        gone.append(c)
        pred = ed.predict_test(model, bank)
        kept, forgot = ~np.isin(labels, gone), np.isin(labels, gone)
        acc = lambda p, m: 100 * np.mean(p[m] == labels[m])  # noqa: E731
        print(f"== after request {len(gone)} (class {c}): {len(res.rounds)} rounds, stopped by "
              f"{res.stop_reason or 'all rounds'}; Af (this class) {acc(pred, labels == c):.2f}, Af (removed so far) "
              f"{acc(pred, forgot):.2f}, Ar {acc(pred, kept):.2f} (original {acc(base_pred, kept):.2f})", flush=True)


if __name__ == "__main__":
    main()
