"""`munkey bench unact`: UnAct against SSD, LFSSD and class-retrained oracles, in one run.

Sections (each row: Af, Ar on the test set, the oracle's Af* and Ar*, Delta, seconds per request):
- SSD/LFSSD tuning (--ssd-tune): alpha x lambda x batch size on the validation split, one working
  point per method for the dataset (I_D in the reference order; docs/results/README.md);
- full class: every training image of the class; UnAct (each scoring asked for), one-round UnAct,
  SSD and LFSSD, each timed cold (I_D computed) and warm (I_D cached), and the masked logit
  (`--no-ssd` leaves SSD/LFSSD out, e.g. on a width-64 ResNet on a CPU);
- few-shot: n images (seeded), UnAct for each n, SSD/LFSSD at the smallest n;
- sequential: the classes forgotten one after another in the same model, with the paper's rule (all k
  rounds) and ours (stop once forgotten) (retain accuracy over the classes still kept, against the
  original's on the same classes);
- MUNKEY (a MUNKEY run as RUN or --munkey-run): class key deletion alone, the masked logit, UnAct
  alone, key deletion + UnAct along the inference path (the default) and along the image pathway (the
  earlier design), full class and n = 5, and five sequential key deletion + UnAct requests
  (`--munkey-rows controls`: only keys+unact and its controls, and the product's sequential rule).
Every timing is a ratio against SSD cold on the same model and images, measured in the same run.
Writes unact_<dataset>.md and unact_<dataset>.csv to --out.
"""

from __future__ import annotations

import argparse

HELP = "UnAct vs SSD / LFSSD vs class oracles: full class, few-shot, sequential requests, time per request"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a ResNet-18 or ViT classifier run ('munkey train --arch resnet18'), or a MUNKEY run "
                   "(then only the MUNKEY sections)")
    p.add_argument("--munkey-run", default=None, help="also measure class removal on this MUNKEY run")
    p.add_argument("--classes", default="0,2,3,5,8", help="classes to forget, one at a time (default 0,2,3,5,8)")
    p.add_argument("--shots", default="5,10,25,100,all", help="few-shot sizes n (default 5,10,25,100,all)")
    p.add_argument("--seed", type=int, default=42, help="which n images (default 42, the paper's)")
    p.add_argument("--p", type=float, default=None, help="UnAct percentile (default: the run's working point)")
    p.add_argument("--gamma", type=float, default=None)
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--munkey-p", type=float, default=None, help="UnAct p on the MUNKEY backbone (default: the "
                   "product's, 90)")
    p.add_argument("--munkey-gamma", type=float, default=None, help="(default 0.01)")
    p.add_argument("--munkey-k", type=int, default=None, help="(default 20)")
    p.add_argument("--ssd-tune", action="store_true", help="tune SSD/LFSSD (alpha, lambda, batch size) on the "
                   "validation split first and use the chosen working points")
    p.add_argument("--one-round-p", type=float, default=90.0, help="p of the one-round request (default 90)")
    p.add_argument("--scores", default="activation,attribution", help="ResNet scorings to compare; the first is used "
                   "for few-shot and sequential rows")
    p.add_argument("--train-oracles", action="store_true", help="train missing class oracles first")
    p.add_argument("--no-sequential", action="store_true")
    p.add_argument("--no-ssd", action="store_true", help="skip the SSD/LFSSD rows (each cold request is a backward "
                   "pass over the whole training set: the most expensive rows on a wide model)")
    p.add_argument("--munkey-rows", choices=("all", "controls"), default="all",
                   help="MUNKEY sections: all (default) or controls: keys+unact with its controls only (keys alone, "
                   "the masked logit, UnAct alone) and only the product's rule in the sequential section; the "
                   "earlier designs' rows take most of the time on a 10,000-image run")
    p.add_argument("--out", default=None, help="folder for the Markdown and CSV tables")
    p.add_argument("--device", default="auto")


def run(args: argparse.Namespace) -> int:
    from munkey_core.bench.unact_run import UnactBench

    return UnactBench(args).run()

