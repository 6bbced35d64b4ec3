"""How often the deletion verdict says "forgotten" (eval/verdicts.py), by request size, for samples a model
never saw and for samples it still remembers, with and without the positive control (what training samples
the model still holds read). Simulated accuracies, no model: unseen samples of the same classes right at
`--unseen` (measured on 359, the digits test split), the deleted samples right at that rate when forgotten
and at `--held` when still remembered, the held samples' reading on `--held-n`.

    python scripts/verdict_power.py            # the table in docs/results/evaluation.md, section 5
"""

from __future__ import annotations

import argparse

import numpy as np

from munkey_core.eval.verdicts import FORGOTTEN, verdict


def share_forgotten(rng: np.random.Generator, n: int, p_deleted: float, args: argparse.Namespace,
                    control: bool) -> float:
    """Share of `args.trials` simulated requests of n samples (right at p_deleted) read "forgotten"."""
    fa = 100 * rng.binomial(n, p_deleted, args.trials) / n
    unseen = 100 * rng.binomial(args.unseen_n, args.unseen, args.trials) / args.unseen_n
    held = 100 * rng.binomial(args.held_n, args.held, args.trials) / args.held_n
    extra = (lambda h: {"remembered": h, "remembered_n": args.held_n}) if control else (lambda h: {})
    return float(np.mean([verdict("FA", f, t, n=n, target_n=args.unseen_n, **extra(h))["verdict"] == FORGOTTEN
                          for f, t, h in zip(fa, unseen, held)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unseen", type=float, default=0.92, help="accuracy on unseen samples (and forgotten ones)")
    ap.add_argument("--unseen-n", type=int, default=359)
    ap.add_argument("--held", type=float, default=0.995, help="accuracy on samples the model still holds")
    ap.add_argument("--held-n", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"FA verdicts on simulated requests: unseen samples {100 * args.unseen:g} % right (on {args.unseen_n}), "
          f"held samples {100 * args.held:g} % (on {args.held_n}); {args.trials} requests per cell")
    print("| deleted samples | never trained on: 'forgotten' with the control (without) "
          "| still remembered: 'forgotten' with the control (without) |")
    print("|---|---|---|")
    for n in (5, 10, 25, 30, 60, 126, 500):
        never = [share_forgotten(rng, n, args.unseen, args, c) for c in (True, False)]
        kept = [share_forgotten(rng, n, args.held, args, c) for c in (True, False)]
        print(f"| {n} | {100 * never[0]:.1f} % ({100 * never[1]:.1f} %) | {100 * kept[0]:.1f} % ({100 * kept[1]:.1f} %) |")


if __name__ == "__main__":
    main()
