"""`munkey bench fidelity`: random forgetting measured against retrained oracles, in the paper's format.

For one dataset, each forget rate and seed: train (or reuse) a MUNKEY run and a plain ViT of the same
backbone and recipe, draw a seeded random forget set, retrain (or reuse) the M-oracle and the T-oracle
without it, then measure on the same samples: MUNKEY key deletion against the M-oracle, and the
post-hoc baselines (NegGrad+, SCRUB, SSD, Amnesiac) on the ViT against the T-oracle. Each row: TA, RA,
FA, MIA (the attack named: its AUC and its TPR at 1% and 0.1% FPR), Avg Gap and forgetting seconds; the
table gives mean ± sample standard deviation over seeds and each seed's Avg Gap. Beside every Avg Gap:
its family's noise floor (`--floor-oracles` oracles retrained with other training seeds on the same
split and retain set, against the oracle), and per family a positive control (the undeleted model
against the oracle). The strong attack's references are of the target's family and never trained on
a forget set of the seed (forget and test samples scored against the same references). Writes fidelity_<dataset>.md and .csv to --out. Everything trained is cached
under --work (oracles inside their run's oracles/ folder) and each finished cell's rows too, so a
re-run resumes and an identical re-run trains nothing.

`--inject-at L` (L > 0) measures the late-injection variant instead of the paper's design: the MUNKEY
run and its M-oracles are built with the exemplar token joining at block L, cached in their own
--work subfolder (<dataset>_<profile>_late<L>), never shared with paper-design models. `--munkey-set
NAME=VALUE` trains the MUNKEY runs (and so their M-oracles) with another value of a training setting than
the profile's, in its own --work subfolder too (e.g. `per_sample_clip=1`, or `absent_skip_hardest=0.1`:
the digits default of 2026-12-05); the plain ViT family is unchanged. `--methods ''`
measures MUNKEY and its M-oracle only (no plain ViT, T-oracle or post-hoc rows). `--tune` adds, per
post-hoc method, a row with the settings chosen on a validation forget split (unlearn/tuning.py), the
settings printed under the table and in the CSV's settings column. `--merge-csv A.csv ...` joins the
per-seed rows of earlier invocations' CSVs to this invocation's seeds (bench/fidelity_merge.py), e.g.
a committed 2-seed table plus `--seed-list 2`, without retraining seeds 0 and 1.
"""

from __future__ import annotations

import argparse

from munkey_core.errors import non_negative_int

HELP = "random forgetting vs retrained oracles: TA, RA, FA, MIA, Avg Gap, seconds (MUNKEY and post-hoc baselines)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="digits", help="registry name (default digits)")
    p.add_argument("--profile", default="auto", help="auto | cpu | vit-tiny | tiny (default auto)")
    p.add_argument("--rates", default="0.1,0.02", help="forget rates (default 0.1,0.02)")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds, 0..N-1 (default 3)")
    p.add_argument("--seed-list", default=None,
                   help="comma-separated seeds to run instead of 0..N-1 (e.g. 2 to run one seed in another process; "
                        "a later run with --seeds 3 then reads every finished cell from --work)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs of every model (default: the profile's)")
    p.add_argument("--methods", default="neggrad+,scrub,ssd,amnesiac",
                   help="post-hoc baselines on the plain ViT; '' measures MUNKEY and its M-oracle only "
                        "(no plain ViT, T-oracle or post-hoc rows)")
    p.add_argument("--inject-at", type=int, default=0,
                   help="MUNKEY design: 0 (default) the paper's; L > 0 late injection at block L (models cached in "
                        "their own --work subfolder, suffix _late<L>)")
    p.add_argument("--munkey-set", action="append", default=[], metavar="NAME=VALUE",
                   help="a training setting of the MUNKEY runs over the profile's recipe (a numeric TrainConfig field, "
                        "e.g. per_sample_clip=1; repeatable; models cached in their own --work subfolder)")
    p.add_argument("--mia", default="cheap", choices=["cheap", "strong"],
                   help="cheap: loss attack; strong: RMIA-style with reference ViTs (trained per seed)")
    p.add_argument("--mia-refs", type=int, default=2,
                   help="reference models per family for --mia strong (even; default 2): MUNKEY references for the "
                        "MUNKEY rows, plain ViTs for the ViT rows, none trained on a forget set")
    p.add_argument("--floor-oracles", type=non_negative_int, default=1,
                   help="noise floor: oracles per family and cell retrained with other training seeds on the same "
                        "split and retain set (default 1; 0 = no noise floor)")
    p.add_argument("--vit-shift", type=float, default=None,
                   help="random-shift augmentation of the plain ViT family only (the ViT, its T-oracles and reference "
                        "ViTs; default: the profile's, as MUNKEY). 0 lets it memorise its training set: on digits "
                        "(cpu profile) RA 100 / TA 97.5 instead of 98.2 / 98.3")
    p.add_argument("--tune", action="store_true",
                   help="also run each post-hoc method with settings tuned on a validation forget split (drawn from "
                        "the retain set; its own T-oracle; lowest Avg Gap on the validation split, never the test "
                        "split; grids in munkey_core/unlearn/tuning.py): rows '<method> (tuned)' with the chosen settings")
    p.add_argument("--select", action="store_true",
                   help="add a row for the checkpoint 'munkey select' picks (trains one more M-oracle per seed, "
                        "for the validation forget split)")
    p.add_argument("--max-ps", type=float, default=0.3, help="--select: pathway-sensitivity bound (default 0.3)")
    p.add_argument("--val-rate", type=float, default=0.05, help="--select: validation forget split (default 0.05)")
    p.add_argument("--max-samples", type=non_negative_int, default=2000, help="cap per evaluated set (0 = all)")
    p.add_argument("--encoder", default=None, help="MUNKEY key encoder (default: the package default)")
    p.add_argument("--merge-csv", nargs="+", default=None, metavar="CSV",
                   help="fidelity CSVs of earlier invocations with the same dataset, profile and options: their "
                        "per-seed rows join this invocation's seeds in one table (mean ± sd over all seeds, as one "
                        "invocation computes them), so a seed is added without retraining the others; --seeds 0 "
                        "renders the table from the CSVs alone")
    p.add_argument("--work", default="runs/fidelity", help="folder for the trained models (reused on re-runs)")
    p.add_argument("--out", default=None, help="folder for the Markdown and CSV tables")
    p.add_argument("--data-root", default=None)
    p.add_argument("--device", default="auto")


def run(args: argparse.Namespace) -> int:
    from munkey_core.bench.fidelity_run import FidelityBench

    return FidelityBench(args).run()
