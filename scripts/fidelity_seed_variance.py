"""Training-seed variance of one fidelity-bench cell: runs and M-oracles on a fixed data split.

Why: in docs/results/tuned_strong/fidelity_digits.md seed 2's key deletion is 2.51 Avg Gap from its
M-oracle (floor 0.46) because its oracles test 4 points lower than the run. This trains, on the
bench's split of a seed (split seed = forget seed = S, as `munkey bench fidelity --seed-list S` does),
MUNKEY models that differ only in their training seed, with the bench's recipe (`munkey train
--dataset digits --profile cpu --seed T --split-seed S`), either on the whole training split (a run)
or without the bench's forget set (an M-oracle, `--exclude forget`) or without another random 10%
(`--exclude randN`), and reports on the full test split, with the forget set deleted from the bank:
TA of the ensemble and of each pathway alone, errors per class, and an exact McNemar test of each
model against the first one named (paired: the same 359 test images).

    OMP_NUM_THREADS=1 python scripts/fidelity_seed_variance.py train s2_t2 --split-seed 2 --train-seed 2
    OMP_NUM_THREADS=1 python scripts/fidelity_seed_variance.py train s2_t2_oracle --split-seed 2 --train-seed 2 --exclude forget
    OMP_NUM_THREADS=1 python scripts/fidelity_seed_variance.py compare s2_t2 s2_t2_oracle
    OMP_NUM_THREADS=1 python scripts/fidelity_seed_variance.py strong s2_t2_oracle s2_t2 --recipe s2_t2

`gaps` prints, per split and recipe, every run's Avg Gap (cheap attack, forget set deleted) to each
M-oracle of its recipe, the oracles' gaps to each other (the noise floor) and the undeleted run's
(the positive control), from results.jsonl, grouped by dataset, forget rate, split and recipe (--set);
pooled over splits, the excess over the floor, a relabelling test, and the signed run - oracle offset of
TA, FA and MIA (a systematic offset, such as deleted images still recognised better, has one sign on
every split, where retraining noise has both). `--offsets 0,1000` keeps training seeds S + offset only;
`--attack strong` reads strong.jsonl (written by `strong`) instead: the same table with the strong attack.
`--also DIR` pools another folder's lines with $SEEDVAR_DIR's (e.g. a second draw of training seeds).
`--oracle-set KEY=VALUE` compares each recipe's runs with M-oracles trained with that change on top (e.g.
`epochs=89`: as many training images seen as the run, which saw the forget set too), and no other oracles;
a value equal to the profile's base is refused (the grouping drops base values, so it cannot show it).

`train --set KEY=VALUE` changes the recipe (any ModelConfig/TrainConfig field, repeatable), so a
candidate recipe is trained for a run and its oracles alike; `strong` trains its references with the
recipe of --recipe (cached in $SEEDVAR_DIR/refs_<recipe>).

`strong ORACLE NAME...` scores each model (forget set deleted) against ORACLE with the bench's strong
attack: the same two MUNKEY reference models `munkey bench fidelity --mia strong` trains for that seed
(the recipe of --recipe, a run whose training seed is its split seed, as the bench's run), so a run of
the bench's own training seed reproduces the table's row and another training seed shows what the
row would have been with that run. Each model's measurements go to $SEEDVAR_DIR/strong.jsonl (a run's
also with the forget set kept: the positive control), so naming every run and oracle of a split once
gives `gaps --attack strong` what it needs.

Models are cached under $SEEDVAR_DIR (default runs/seedvar); `train` appends one JSON line to
$SEEDVAR_DIR/results.jsonl (TA/RA/FA/cheap MIA on the bench's evaluation sets, before and after the
deletion for a run, and the validation curve). About 5-8 minutes per digits model on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from math import comb
from pathlib import Path

import numpy as np
import torch

from munkey_core.config import PROFILES, recorded_settings
from munkey_core.data import datasets as data_mod
from munkey_core.data.sampling import random_ids
from munkey_core.eval.oracles import TPR_KEYS, eval_sets, measure, munkey_scorer
from munkey_core.model.munkey_vit import preprocess_images
from munkey_core.model.predict import predict
from munkey_core.service import MunkeyRun
from munkey_core.training.runs import train_run

ROOT = Path(os.environ.get("SEEDVAR_DIR", "runs/seedvar"))
RATE = 0.1  # the bench's forget fraction
KEPT = ("TA", "RA", "FA", "MIA", *TPR_KEYS)  # what a results line keeps: the attack's AUC and its TPR at 1% / 0.1% FPR


# the cpu profile's per-dataset recipe (config.py `dataset_recipe`) before 2026-12-04, when digits added
# absent_target_mix 0.25: results.jsonl lines of that time record only their --set, on top of this
RECIPE_BEFORE_2026_12_04 = {"digits": {"augment_shift": 0.2}}


def effective_recipe(r: dict) -> dict:
    """A results.jsonl line's recipe: the profile's dataset recipe of its time with its --set on top, less
    the fields set to the profile's base value (so `--set absent_target_mix=0` today groups with the lines
    trained before the mix existed); a whole number given to a float field reads as a float (`--set
    per_sample_clip=1` and the profile's 1.0 are one recipe)."""
    recipe = r["recipe"] if "recipe" in r else {**RECIPE_BEFORE_2026_12_04.get(r.get("dataset", "digits"), {}),
                                                **r.get("set", {})}
    base = {**vars(PROFILES["cpu"].model), **vars(PROFILES["cpu"].train)}
    return {k: float(v) if isinstance(base.get(k), float) and isinstance(v, int) else v
            for k, v in recipe.items() if not (k in base and base[k] == v)}


def excluded_ids(split_seed: int, exclude: str, rate: float = RATE, dataset: str = "digits",
                 recipe: dict | None = None) -> list[int]:
    """The training ids left out: none, the forget set of this seed at `rate` (the bench's at 10%), or
    random `rate` number N. On the training split the run trains on: the cpu profile's recipe for
    `dataset` with `recipe`'s changes (its max_train subset, as train_run loads it)."""
    from munkey_core.config import with_overrides
    max_train = with_overrides(PROFILES["cpu"].train_for(dataset), recipe or {}).max_train or None
    ds = data_mod.load_dataset(dataset, seed=split_seed, max_train=max_train)
    if exclude == "none":
        return []
    if exclude == "forget":
        return random_ids(ds.train.ids, rate, split_seed)
    if exclude.startswith("rand"):
        return random_ids(ds.train.ids, rate, int(exclude[4:]))
    raise SystemExit(f"--exclude: none, forget or randN, not {exclude!r}")


def parse_set(pairs: list[str], option: str = "--set") -> dict:
    """{'augment_shift': 0.3, ...} from ['augment_shift=0.3', ...]: changes to the cpu profile's digits recipe."""
    from munkey_core.config import ModelConfig, TrainConfig
    known = {f for cls in (ModelConfig, TrainConfig) for f in cls.__dataclass_fields__}
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known or key in ("seed", "split_seed"):
            raise SystemExit(f"{option} {pair!r}: give KEY=VALUE with KEY a ModelConfig/TrainConfig field "
                             "(the seeds have their own options)")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            raise SystemExit(f"{option} {pair!r}: VALUE must be a number (or JSON)") from None
    return out


def train(args: argparse.Namespace) -> None:
    out = ROOT / args.name
    t0 = time.time()
    recipe = parse_set(args.set)
    if not (out / "config.json").exists():
        overrides = {**recipe, "seed": args.train_seed, "split_seed": args.split_seed}
        train_run(args.dataset, out, profile="cpu", overrides=overrides,
                  exclude_ids=excluded_ids(args.split_seed, args.exclude, args.rate, args.dataset,
                                           recipe), progress=False)
    run = MunkeyRun(out, device="cpu")
    want = {**PROFILES["cpu"].dataset_recipe.get(args.dataset, {}), **recipe}
    trained = recorded_settings(run.config, want)  # config.json's
    if trained != want:  # a cached model re-measured after the profile's recipe changed: name its own recipe
        raise SystemExit(f"{args.name} was trained with {trained}, not {want}: re-measure it with --set for each "
                         "field that differs, so that its line records the recipe it was trained with")
    forget = random_ids(run.dataset.train.ids, args.rate, args.split_seed)
    sets = eval_sets(run.dataset, forget, max_samples=2000, seed=args.split_seed)  # the bench's samples
    k, tau = run.train_cfg.k, run.train_cfg.tau
    res = {"name": args.name, "dataset": args.dataset, "split_seed": args.split_seed, "train_seed": args.train_seed, "exclude": args.exclude,
           "set": recipe, "recipe": want, "rate": args.rate,
           "n_train": len(run.bank), "seconds": round(time.time() - t0)}
    m = measure(munkey_scorer(run.model, run.bank, run.dataset, run.split_keys, k, tau), run.dataset, sets)
    res["as_trained"] = {c: m[c] for c in KEPT}
    if args.exclude == "none":
        bank = copy.deepcopy(run.bank)
        bank.delete(forget)
        m = measure(munkey_scorer(run.model, bank, run.dataset, run.split_keys, k, tau), run.dataset, sets)
        res["after_deletion"] = {c: m[c] for c in KEPT}
    hist = json.loads((out / "history.json").read_text())
    res["val_acc_every_10_epochs"] = [round(h.get("val_acc", -1), 1) for h in hist[9::10]]
    print(json.dumps(res))
    with open(ROOT / "results.jsonl", "a") as f:
        f.write(json.dumps(res) + "\n")


def test_correct(run: MunkeyRun, pathway: str) -> np.ndarray:
    """(N_test,) bool: which test images the run gets right, with the bench's forget set deleted."""
    ds = run.dataset
    bank = copy.deepcopy(run.bank)
    bank.delete(random_ids(ds.train.ids, RATE, run.train_cfg.data_seed))  # absent ids are skipped
    x = preprocess_images(torch.from_numpy(np.ascontiguousarray(ds.test.images)), run.model.cfg.img_size)
    p = predict(run.model, bank, x, run.split_keys("test"), k=run.train_cfg.k, tau=run.train_cfg.tau,
                pathway=pathway, neighbour_predictions=False)
    return p.labels == ds.test.labels


def mcnemar(a: np.ndarray, b: np.ndarray) -> tuple[int, int, float]:
    """(right by a only, right by b only, exact two-sided McNemar p) of two paired correctness vectors."""
    n01, n10 = int((a & ~b).sum()), int((~a & b).sum())
    n = n01 + n10
    p = min(1.0, 2 * sum(comb(n, i) for i in range(min(n01, n10) + 1)) / 2 ** n) if n else 1.0
    return n01, n10, p


def compare(args: argparse.Namespace) -> None:
    first = None
    for name in args.names:
        run = MunkeyRun(ROOT / name, device="cpu")
        right = {pw: test_correct(run, pw) for pw in ("both", "image", "token")}
        row = {pw: round(100 * float(r.mean()), 2) for pw, r in right.items()}
        row["errors_per_class"] = np.bincount(run.dataset.test.labels[~right["both"]], minlength=10).tolist()
        if first is None:
            first = (name, right["both"])
        else:
            only_first, only_this, p = mcnemar(first[1], right["both"])
            row[f"vs {first[0]}"] = {"right only there": only_first, "right only here": only_this, "p": round(p, 4)}
        print(name, json.dumps(row), flush=True)


def strong(args: argparse.Namespace) -> None:
    """Scores ORACLE and NAMES (forget set deleted) with the bench's strong attack and prints each one's Avg
    Gap to ORACLE; appends each model's measurements (a run's also as trained: the positive control) to
    strong.jsonl, in results.jsonl's format, so `gaps --attack strong` pools them over splits."""
    from munkey_core.eval.mia import StrongAttack
    from munkey_core.eval.oracles import gaps, train_reference_models

    recipe = MunkeyRun(ROOT / args.recipe, device="cpu")
    ds, seed = recipe.dataset, recipe.train_cfg.data_seed
    forget = random_ids(ds.train.ids, RATE, seed)
    sets = eval_sets(ds, forget, max_samples=2000, seed=seed)
    refs = train_reference_models(recipe.config, ROOT / f"refs_{args.recipe}", family="munkey", n_refs=2,
                                  seed=seed, exclude_ids=forget, device="cpu")
    attack = StrongAttack(refs, ds, sets.forget, sets.test)
    trained = {}  # name -> its results.jsonl line at the bench's rate (split, training seed, exclude, recipe)
    for line in (ROOT / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("rate", RATE) == RATE:
            trained[r["name"]] = r

    def metrics(name: str, delete: bool = True) -> dict:
        run = MunkeyRun(ROOT / name, device="cpu")
        bank = copy.deepcopy(run.bank)
        if delete:
            bank.delete(forget)
        k, tau = run.train_cfg.k, run.train_cfg.tau
        return measure(munkey_scorer(run.model, bank, ds, recipe.split_keys, k, tau), ds, sets, attack)

    oracle = metrics(args.oracle)
    for name in dict.fromkeys([args.oracle, *args.names]):
        m = oracle if name == args.oracle else metrics(name)  # the oracle is measured once
        row = {c: round(m[c], 2) for c in KEPT}
        row["AvgGap"] = round(gaps(m, oracle)["AvgGap"], 2)
        print(name, json.dumps(row), flush=True)
        if name not in trained:
            print(f"  ({name} has no results.jsonl line at the {RATE:g} rate: not recorded for `gaps --attack strong`)")
            continue
        rec = {**trained[name], "attack": "strong", "refs": f"refs_{args.recipe}"}
        if rec["exclude"] == "none":  # a run: the forget set deleted, and as trained (no unlearning)
            rec["after_deletion"] = {c: m[c] for c in KEPT}
            rec["as_trained"] = {c: v for c, v in metrics(name, delete=False).items() if c in KEPT}
        else:  # an oracle never saw the forget set
            rec["as_trained"] = {c: m[c] for c in KEPT}
        with open(ROOT / "strong.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")


def tprs(m: dict) -> str:
    """', TPR@1% x, TPR@0.1% y' of a measurement that has them ('' for a line written before they were kept)."""
    return "".join(f", {k} {m[k]:.2f}" for k in TPR_KEYS if m.get(k) is not None)


def shipped(dataset: str) -> str:
    """The recipe `munkey train` gives `dataset` today, as gap_table keys it."""
    return json.dumps(effective_recipe({"recipe": PROFILES["cpu"].dataset_recipe.get(dataset, {})}), sort_keys=True)


def gap_table(args: argparse.Namespace) -> None:
    """Per (dataset, rate, split, recipe): each run (forget set deleted) against every M-oracle of its recipe, the oracles
    against each other (the noise floor) and the undeleted run (the positive control), from results.jsonl.
    Models are grouped by dataset, forget rate, split and recipe (the profile's dataset recipe of their
    time with their --set on top: `effective_recipe`), so names are free."""
    from munkey_core.eval.metrics import avg_gap
    from munkey_core.eval.floors import relabelling_test, signed_offsets

    groups: dict[tuple[str, float, int, str], dict] = {}  # (dataset, rate, split seed, recipe) -> runs, oracles
    pooled: dict[tuple[str, float, str], list] = {}  # (dataset, rate, recipe) -> per split: (run-vs-oracle gaps, floor)
    rows: dict[tuple[str, float, str], list[str]] = {}  # (dataset, rate, recipe) -> markdown rows, one per split
    split_cells: dict[tuple[str, float, str], list] = {}  # (dataset, rate, recipe) -> per split: (runs after deletion, oracles)
    name = "strong.jsonl" if args.attack == "strong" else "results.jsonl"
    lines = [(folder, line) for folder in (ROOT, *args.also) for line in (Path(folder) / name).read_text().splitlines()]
    source: dict[tuple, str | Path] = {}  # model -> the folder its line came from
    asked = parse_set(args.oracle_set, "--oracle-set")
    oracle_set = effective_recipe({"recipe": asked})  # {} without --oracle-set
    if unchanged := sorted(set(asked) - set(oracle_set)):  # grouping drops base values: it cannot pair them
        raise SystemExit(f"--oracle-set {', '.join(repr(p) for p in args.oracle_set if p.partition('=')[0] in unchanged)}: "
                         "the cpu profile's base value, which this table's grouping drops from every recipe, so it "
                         "cannot pair runs with oracles trained with it (for digits, whose recipe sets other values, "
                         "that would be a real change it cannot show); name another value")
    if oracle_set:
        print(f"M-oracles: the runs' recipe with {', '.join(f'{k} {v}' for k, v in sorted(oracle_set.items()))} "
              f"(--oracle-set); runs and oracles trained otherwise are left out")
    for folder, line in lines:
        r = json.loads(line)
        if r["exclude"] not in ("none", "forget"):
            continue
        if args.offsets and r["train_seed"] - r["split_seed"] not in args.offsets:
            continue  # a comparison on the same training seeds: only S + offset on split S
        own = effective_recipe(r)  # the recipe, whatever the names say
        if oracle_set:  # runs of recipe R against oracles of R with the --oracle-set changes: both filed under R
            changed = {k: own[k] for k in oracle_set if k in own}
            if changed != (oracle_set if r["exclude"] == "forget" else {}):
                continue
            own = {k: v for k, v in own.items() if k not in oracle_set}
        recipe = json.dumps(own, sort_keys=True)
        cell = (r.get("dataset", "digits"), r.get("rate", RATE), r["split_seed"], recipe)
        g = groups.setdefault(cell, {"runs": {}, "oracles": {}})
        model = (*cell, r["exclude"], r["train_seed"])
        if source.setdefault(model, folder) != folder:  # within one folder a re-measure's later line replaces the earlier
            raise SystemExit(f"{name}: training seed {r['train_seed']} on split {r['split_seed']} (recipe {recipe}, exclude "
                             f"{r['exclude']}) is in {source[model]} and in {folder}: --also names folders of other models")
        if r["exclude"] == "forget":
            g["oracles"][r["train_seed"]] = r["as_trained"]
        else:
            g["runs"][r["train_seed"]] = (r["after_deletion"], r["as_trained"])
    print(f"{args.attack} attack")
    for (dataset, rate, split, recipe), g in sorted(groups.items()):
        orcs = sorted(g["oracles"].items())
        floor = [avg_gap(a, b) for i, (_, a) in enumerate(orcs) for _, b in orcs[i + 1:]]
        print(f"{dataset}, {100 * rate:g}% forget set, split {split}, recipe {recipe}{' (shipped)' if recipe == shipped(dataset) else ''}: M-oracles "
              + "; ".join(f"t{t} TA {o['TA']:.2f} FA {o['FA']:.2f} MIA {o['MIA']:.2f}" for t, o in orcs)
              + (f"; noise floor {' / '.join(f'{f:.2f}' for f in floor)}" if floor else ""))
        for t, (after, before) in sorted(g["runs"].items()):
            run_gaps = [avg_gap(after, o) for _, o in orcs]
            control = [avg_gap(before, o) for _, o in orcs]
            print(f"  run t{t}: TA {after['TA']:.2f} RA {after['RA']:.2f} FA {after['FA']:.2f} MIA {after['MIA']:.2f}"
                  f"{tprs(after)}; vs oracles {' / '.join(f'{x:.2f}' for x in run_gaps)}; "
                  f"no unlearning {' / '.join(f'{x:.2f}' for x in control)} (MIA {before['MIA']:.2f}{tprs(before)})")
        if any(TPR_KEYS[0] in o for _, o in orcs):
            print("  M-oracles' TPR at low FPR: " + "; ".join(f"t{t}{tprs(o)}" for t, o in orcs))
        runs = [run for _, run in sorted(g["runs"].items())]  # (after deletion, as trained), by training seed
        pairs = [(after, o) for after, _ in runs for _, o in orcs]
        if pairs:  # which metric the run-vs-oracle gap is made of (each |difference| / 4 adds to the Avg Gap)
            print("  mean |run - oracle|: " + ", ".join(
                f"{c} {np.mean([abs(a[c] - o[c]) for a, o in pairs]):.2f}" for c in ("TA", "RA", "FA", "MIA"))
                  + f"; run - oracle TA {np.mean([a['TA'] - o['TA'] for a, o in pairs]):+.2f}")
        run_gaps = [avg_gap(after, o) for after, _ in runs for _, o in orcs]  # in the order of the runs column
        pooled.setdefault((dataset, rate, recipe), []).append((run_gaps, floor))
        split_cells.setdefault((dataset, rate, recipe), []).append(([after for after, _ in runs], [o for _, o in orcs]))
        if args.markdown and run_gaps and floor:
            controls = [avg_gap(before, o) for _, before in runs for _, o in orcs]
            fmt = lambda m: f"{m['TA']:.2f} / {m['FA']:.2f} / {m['MIA']:.2f}"  # noqa: E731
            rows.setdefault((dataset, rate, recipe), []).append(
                f"| {split} | " + "; ".join(f"t{t}: {fmt(a)}" for t, (a, _) in sorted(g["runs"].items()))
                + " | " + "; ".join(f"t{t}: {fmt(o)}" for t, o in orcs)
                + f" | {' '.join(f'{x:.2f}' for x in run_gaps)} | **{np.mean(run_gaps):.2f}** | "
                f"{' '.join(f'{x:.2f}' for x in floor)} | {np.mean(floor):.2f} | {np.mean(controls):.2f} |")
    for (dataset, rate, recipe), lines in sorted(rows.items()):
        print(f"\n{dataset}, {100 * rate:g}%, recipe {recipe if recipe != '{}' else 'shipped'}:\n\n"
              "| split | runs (training seed: TA / FA / MIA after deletion) | M-oracles (training seed: TA / FA / MIA) "
              "| run vs oracle (each run x each oracle) | mean | noise floor (oracle pairs) | mean floor | "
              "no unlearning (mean) |\n|---|---|---|---|---|---|---|---|")
        print("\n".join(lines))
    print("\npooled over splits (the goal: run vs oracle within the noise floor + 0.3):")
    for (dataset, rate, recipe), cells in sorted(pooled.items()):
        gaps = [x for run_gaps, _ in cells for x in run_gaps]
        floors = [x for _, floor in cells for x in floor]
        if not gaps or not floors:
            continue
        within = sum(np.mean(r) <= np.mean(f) + 0.3 for r, f in cells if r and f)
        print(f"  {dataset}, {100 * rate:g}%, recipe {recipe if recipe != '{}' else 'shipped'}: run vs oracle "
              f"{np.mean(gaps):.2f} (n={len(gaps)}, {min(gaps):.2f}-{max(gaps):.2f}) against a floor of "
              f"{np.mean(floors):.2f} (n={len(floors)}, {min(floors):.2f}-{max(floors):.2f}): "
              f"{np.mean(gaps) - np.mean(floors):+.2f}; splits within floor + 0.3: {within} of "
              f"{sum(1 for r, f in cells if r and f)}")
        offsets = signed_offsets(split_cells[(dataset, rate, recipe)], ("TA", "FA", "MIA"))  # per split
        if len(offsets["TA"]) >= 2:  # a systematic offset shows as a signed mean away from 0 on every split
            print("    run - oracle, signed, mean over splits (standard error; per split): " + "; ".join(
                f"{m} {np.mean(v):+.2f} ({np.std(v, ddof=1) / np.sqrt(len(v)):.2f}; {' '.join(f'{x:+.2f}' for x in v)})"
                for m, v in offsets.items()))
        usable = [(r, o) for r, o in split_cells[(dataset, rate, recipe)] if r and len(o) >= 2]
        if not usable:  # the runs and the oracle pairs are on different splits: nothing to relabel
            continue
        test = relabelling_test(usable)
        print(f"    runs exchangeable with their oracles? relabelling p = {test['p']:.3f} "
              f"({'all' if test['exact'] else 'a sample of'} {test['relabellings']} relabellings within splits; "
              f"small p: the deletion is distinguishable from retraining)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("name")
    t.add_argument("--dataset", default="digits", help="digits (default), fashion-mnist or elpv: the cpu profile's recipe")
    t.add_argument("--split-seed", type=int, required=True)
    t.add_argument("--train-seed", type=int, required=True)
    t.add_argument("--exclude", default="none", help="none (a run), forget (an M-oracle) or randN")
    t.add_argument("--rate", type=float, default=RATE,
                   help="forget fraction (default the bench's 0.1): the oracle leaves it out, a run deletes it; a "
                        "run already trained is only re-measured, so one run serves every rate")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a change to the recipe (repeatable), e.g. --set augment_shift=0.3 --set drop_path_rate=0.1")
    c = sub.add_parser("compare")
    c.add_argument("names", nargs="+")
    s = sub.add_parser("strong")
    s.add_argument("oracle")
    s.add_argument("names", nargs="*")
    s.add_argument("--recipe", required=True, help="a run of this split trained with training seed = split seed")
    gp = sub.add_parser("gaps", help="the Avg Gaps of every run, oracle pair and undeleted run")
    gp.add_argument("--attack", choices=("cheap", "strong"), default="cheap",
                    help="cheap (results.jsonl, default) or strong (strong.jsonl, written by `strong`)")
    gp.add_argument("--offsets", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="only models of training seed S + offset on split S, e.g. 0,1000: recipes compared on the same seeds")
    gp.add_argument("--also", action="append", default=[], metavar="DIR",
                    help="pool the lines of this folder too (repeatable), e.g. a second draw of training seeds")
    gp.add_argument("--markdown", action="store_true", help="also print one markdown table per dataset, rate and recipe")
    gp.add_argument("--oracle-set", action="append", default=[], metavar="KEY=VALUE",
                    help="compare each recipe's runs with M-oracles trained with this change on top (repeatable), e.g. "
                         "epochs=89: as many images seen as a run that saw the 10%% forget set for 80 epochs")
    args = ap.parse_args()
    ROOT.mkdir(parents=True, exist_ok=True)
    {"train": train, "compare": compare, "strong": strong, "gaps": gap_table}[args.cmd](args)


if __name__ == "__main__":
    main()
