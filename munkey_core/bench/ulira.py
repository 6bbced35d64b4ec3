"""`munkey bench ulira`: a per-example unlearning attack in the spirit of U-LiRA (Hayes et al., SaTML 2025).

On a small setting that fits a CPU (default: digits, the tiny profile, 16 shadow models per family),
per family (MUNKEY; the plain ViT of the same backbone and recipe):
1. T target examples are drawn from the training split (seeded); the shadow models are trained on
   complementary random halves of the training split (pairs), so every target is in half of them;
   each shadow has its own training seed;
2. from each shadow the targets it trained on are unlearned: MUNKEY by deleting their keys, the ViT
   by each post-hoc method asked for (--methods, on the shadow's own retain set, with its defaults or the
   settings given by --settings, e.g. those `munkey bench fidelity --tune` chose); "no unlearning"
   keeps the shadow as trained (the positive control: the attack must see membership there);
3. per target and shadow, the statistic is the logit-scaled confidence on its true class, and the
   likelihood-ratio test of eval/ulira.py asks, leaving each shadow out in turn, whether it looks
   unlearned or retrained (never trained on the target).
For MUNKEY, three pathway rows locate a trace: the same statistic through the image pathway alone (the
backbone, which key deletion leaves as trained) and through the token pathway alone (the bank's
neighbours), before and after deletion.
Reported per method: accuracy, AUC, TPR at 1% and 0.1% FPR, with 95% bootstrap intervals over targets.
--draws N repeats steps 1-3 for the seeds --seed .. --seed + N - 1 (each draw its own split where the
dataset carves one, targets, halves and shadows) and pools every draw's (shadow, target) scores.
50 = unlearned models are indistinguishable from retrained ones for these examples. Beside them, the
mean test-split accuracy of the attacked models (a method can reach 50 by wrecking the model; this
shows what it kept). Everything a
shadow gives is cached under --work (a re-run resumes). Cost: 2 x --shadows trainings of the profile
on half the training split, plus the post-hoc methods; about 10 minutes on one core with the defaults.
"""

from __future__ import annotations

import argparse

from munkey_core.errors import non_negative_int

HELP = "per-example unlearning attack (U-LiRA style): shadow models with/without each target, unlearned vs retrained"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="digits", help="registry name (default digits)")
    p.add_argument("--profile", default="tiny", help="size profile of every shadow model (default tiny)")
    p.add_argument("--epochs", type=int, default=100, help="training epochs of the MUNKEY shadows (default 100)")
    p.add_argument("--munkey-set", action="append", default=[], metavar="NAME=VALUE",
                   help="a training setting of the MUNKEY shadows over the profile's recipe (a TrainConfig field, e.g. "
                        "absent_skip_hardest=0 or p_retrieval=0.25; repeatable; the shadows are cached in their own "
                        "--work subfolder): which recipe leaves which trace")
    p.add_argument("--vit-epochs", type=int, default=100, help="training epochs of the plain ViT shadows (default 100)")
    p.add_argument("--vit-shift", type=float, default=0.0,
                   help="random-shift augmentation of the plain ViT shadows (default 0: they memorise, RA near 100, "
                        "so the post-hoc methods have something to forget)")
    p.add_argument("--shadows", type=int, default=16, help="shadow models per family (even, >= 8; default 16)")
    p.add_argument("--targets", type=int, default=100, help="target examples (default 100)")
    p.add_argument("--methods", default="neggrad+,amnesiac",
                   help="post-hoc methods on the plain ViT shadows ('' = MUNKEY only; default neggrad+,amnesiac)")
    p.add_argument("--settings", action="append", default=[], metavar="'METHOD:NAME=VALUE ...'",
                   help="settings of one post-hoc method over its defaults, as the fidelity table prints a tuned "
                        "method's (e.g. 'neggrad+:epochs=5 lr=0.0005 beta=0.95'); repeat for several methods")
    p.add_argument("--seed", type=int, default=0, help="seed of the data split, targets and halves (default 0)")
    p.add_argument("--draws", type=int, default=1,
                   help="independent target draws, seeds --seed, --seed + 1, ..., each with its own shadows (cached "
                        "per seed), pooled in one table: more targets, a narrower interval (default 1)")
    p.add_argument("--variance", default="global", choices=["global", "per-example"],
                   help="Gaussian variance of the likelihood ratio: pooled over targets (default) or per target")
    p.add_argument("--max-train", type=non_negative_int, default=0, help="cap on the training split (0 = all)")
    p.add_argument("--encoder", default=None, help="MUNKEY key encoder (default: the package default)")
    p.add_argument("--work", default="runs/ulira", help="folder for cached shadow outputs")
    p.add_argument("--out", default=None, help="folder for the Markdown and CSV tables")
    p.add_argument("--data-root", default=None)
    p.add_argument("--device", default="auto")


def run(args: argparse.Namespace) -> int:
    from munkey_core.bench.ulira_run import UliraBench

    return UliraBench(args).run()
