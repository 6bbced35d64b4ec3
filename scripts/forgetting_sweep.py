"""Forgetting at the defaults: train a MUNKEY run and its M-oracle(s) in one process and compare them.

Used for docs/results/forgetting_at_defaults.md. What it does is what `munkey train`, `munkey forget
--random-fraction F --seed S` and `munkey evaluate --oracle` do (the same training function, forget
draw, evaluation samples and cheap attack), with the data split fixed (seed 0) and the training seed
free, so oracles that differ only in their training seed give the noise floor:

    OMP_NUM_THREADS=1 python scripts/forgetting_sweep.py --tag base                      # defaults
    OMP_NUM_THREADS=1 python scripts/forgetting_sweep.py --tag mix05 --set absent_target_mix=0.5
    OMP_NUM_THREADS=1 python scripts/forgetting_sweep.py --tag base --oracle-tseeds 0,1,2   # noise floor
    OMP_NUM_THREADS=1 python scripts/forgetting_sweep.py --tag base --curve --curve-epochs 15,25,40,55,70

Models are cached under $SWEEP_DIR (default runs/sweep); one JSON line per forget set is appended
to $SWEEP_DIR/results.jsonl: the run after deletion, the undeleted run (positive control), the
oracle, Avg Gap, oracle-vs-oracle gaps, per-pathway accuracies and the optional checkpoint curve.
"""
import argparse, json, os, time
from pathlib import Path
import numpy as np, torch

from munkey_core.data import datasets as data_mod
from munkey_core.keys import encoders as keys_mod
from munkey_core.config import PROFILES, with_overrides
from munkey_core.training.train import train_munkey, TrainData
from munkey_core.bank.memory import MemoryBank
from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
from munkey_core.model.predict import predict
from munkey_core.eval.oracles import eval_sets, measure, munkey_scorer, gaps, forget_tag
from munkey_core.data.sampling import random_ids
from munkey_core.eval.metrics import accuracy, pathway_sensitivity
from munkey_core.run import rows as runstore

ROOT = Path(os.environ.get("SWEEP_DIR", "runs/sweep"))


def parse_val(v):
    for f in (int, float):
        try:
            return f(v)
        except ValueError:
            pass
    return {"None": None, "True": True, "False": False}.get(v, v)


ap = argparse.ArgumentParser()
ap.add_argument("--tag", required=True)
ap.add_argument("--dataset", default="digits")
ap.add_argument("--set", nargs="*", default=[])
ap.add_argument("--frac", type=float, default=0.1)
ap.add_argument("--fseeds", default="0")
ap.add_argument("--tseed", type=int, default=0)
ap.add_argument("--oracle-tseeds", default="0")
ap.add_argument("--curve", action="store_true")
ap.add_argument("--curve-every", type=int, default=5)
ap.add_argument("--curve-pathways", action="store_true")
ap.add_argument("--curve-epochs", default="")
ap.add_argument("--no-oracle", action="store_true")
args = ap.parse_args()

over = {k: parse_val(v) for k, v in (s.split("=", 1) for s in args.set)}
prof = PROFILES["cpu"]
cfg = with_overrides(prof.train, over)  # the profile's base recipe: digits ships it with augment_shift=0.2 (config.py)
ds = data_mod.load_dataset(args.dataset, None, seed=0, max_train=cfg.max_train or None)
enc = keys_mod.load_encoder(keys_mod.DEFAULT_ENCODER, device="cpu")
tk = keys_mod.cached_keys(enc, ds.train.images, ds.train.ids, dataset=ds.name, split="train", progress=False)
vk = keys_mod.cached_keys(enc, ds.val.images, ds.val.ids, dataset=ds.name, split="val", progress=False)
sk = keys_mod.cached_keys(enc, ds.test.images, ds.test.ids, dataset=ds.name, split="test", progress=False)
KEYS = {"train": tk, "val": vk, "test": sk}
split_keys = lambda name: KEYS[name]
mcfg = with_overrides(prof.model, {**over, "in_chans": ds.channels, "num_classes": ds.num_classes})


def train(tseed, exclude=(), ckdir=None):
    c = with_overrides(cfg, {"seed": tseed})
    keep = np.ones(len(ds.train.ids), bool)
    if len(exclude):
        keep = ~np.isin(ds.train.ids, np.asarray(exclude))
    tr = ds.train.subset(keep)
    t0 = time.perf_counter()
    res = train_munkey(mcfg, c, TrainData(tr.images, tr.labels, tr.ids, tk[keep]),
                       val=TrainData(ds.val.images, ds.val.labels, ds.val.ids, vk),
                       checkpoint_dir=ckdir, keep_checkpoints=0, progress=False)
    return res, time.perf_counter() - t0


def cached_train(name, tseed, exclude=(), curve=False):
    d = ROOT / name
    f = d / "final.pt"
    if f.exists():
        s = torch.load(f, weights_only=False)
        model = MunkeyViT(mcfg); model.load_state_dict(s["model"]); model.eval()
        bank = MemoryBank(s["ids"], s["labels"], s["keys"], s["values"])
        return model, bank, s["seconds"], s["history"]
    d.mkdir(parents=True, exist_ok=True)
    res, sec = train(tseed, exclude, d / "ck" if curve else None)
    b = res.bank
    torch.save({"model": res.model.state_dict(), "ids": b.ids, "labels": b.labels, "keys": b.keys,
                "values": b.values, "seconds": sec, "history": res.history}, f)
    return res.model, b, sec, res.history


def bank_copy(bank):
    return MemoryBank(bank.ids.copy(), bank.labels.copy(), bank.keys.clone(), bank.values.clone())


def pathways(model, bank, split, index, own=True):
    """Accuracy (percent) with the image pathway alone, the token alone, both; training rows never
    retrieve themselves (their own exemplar is excluded, or already deleted when own=False)."""
    s = ds.split(split)
    x = preprocess_images(torch.from_numpy(np.ascontiguousarray(s.images[index])), mcfg.img_size)
    y = s.labels[index]
    out = {}
    for p in ("image", "token", "both"):
        ex = [[int(i)] for i in s.ids[index]] if split == "train" and own else None
        out[p] = accuracy(predict(model, bank, x, KEYS[split][index], k=cfg.k, tau=cfg.tau, pathway=p,
                                  exclude=ex, neighbour_predictions=False).labels, y)
    return out


def run_metrics(model, bank, sets):
    return measure(munkey_scorer(model, bank, ds, split_keys, cfg.k, cfg.tau), ds, sets)


def rnd(d):
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in d.items() if k != "MIA_attack"}


ROOT.mkdir(parents=True, exist_ok=True)
out_f = open(ROOT / "results.jsonl", "a")
name = f"{args.dataset}_{args.tag}_t{args.tseed}"
model, bank, sec, hist = cached_train(name, args.tseed, curve=args.curve)
print(f"[{name}] trained in {sec:.0f}s; last val_acc {hist[-1].get('val_acc')} train_acc {hist[-1]['train_acc']:.1f}", flush=True)
# pathway diagnosis on held-out-own-exemplar train (exclude self) and test
tr_idx = np.random.default_rng(0).choice(len(ds.train.ids), size=min(1000, len(ds.train.ids)), replace=False)
te_idx = np.arange(min(1000, len(ds.test.ids)))
pw = {"train_noself": pathways(model, bank, "train", tr_idx), "test": pathways(model, bank, "test", te_idx)}
print("pathways", json.dumps(pw), flush=True)
for fseed in [int(s) for s in args.fseeds.split(",")]:
    fids = random_ids(ds.train.ids, args.frac, fseed)
    sets = eval_sets(ds, fids, max_samples=2000, seed=0)
    before = run_metrics(model, bank, sets)
    b2 = bank_copy(bank); b2.delete(fids); b2.compact()
    after = run_metrics(model, b2, sets)
    rec = {"tag": args.tag, "dataset": args.dataset, "set": over, "tseed": args.tseed, "frac": args.frac,
           "fseed": fseed, "train_s": round(sec), "run": rnd(after), "undeleted": rnd(before), "pathways": pw}
    if args.no_oracle:
        print(json.dumps(rec), flush=True); out_f.write(json.dumps(rec) + "\n"); out_f.flush(); continue
    oracles = []
    for ots in [int(s) for s in args.oracle_tseeds.split(",")]:
        om, ob, osec, _ = cached_train(f"{name.rsplit('_t', 1)[0]}_orc{forget_tag(fids)}_t{ots}", ots, exclude=fids)
        oracles.append((ots, run_metrics(om, ob, sets)))
    o0 = oracles[0][1]
    fi = np.flatnonzero(np.isin(ds.train.ids, fids))
    om0, ob0, _, _ = cached_train(f"{name.rsplit('_t', 1)[0]}_orc{forget_tag(fids)}_t{oracles[0][0]}", oracles[0][0], exclude=fids)
    rec["forget_pathways"] = {"run_after_deletion": pathways(model, b2, "train", fi, own=False),
                              "oracle": pathways(om0, ob0, "train", fi, own=False)}
    rec["oracle"] = rnd(o0)
    rec["gap"] = round(gaps(after, o0)["AvgGap"], 3)
    rec["gap_parts"] = {k: round(v, 2) for k, v in gaps(after, o0).items()}
    rec["gap_undeleted"] = round(gaps(before, o0)["AvgGap"], 3)
    if len(oracles) > 1:
        rec["oracle_vs_oracle"] = [round(gaps(m, o0)["AvgGap"], 3) for _, m in oracles[1:]]
        rec["run_vs_other_oracles"] = [round(gaps(after, m)["AvgGap"], 3) for _, m in oracles[1:]]
        rec["oracles_all"] = {str(t): rnd(m) for t, m in oracles}
    print(json.dumps(rec), flush=True)
    if args.curve:
        curve = []
        for ck in runstore.checkpoints(ROOT / name / "ck"):
            c = runstore.load_checkpoint(ck)
            ep = int(c["epoch"])
            wanted = [int(e) for e in args.curve_epochs.split(",") if e]
            if (ep not in wanted) if wanted else (ep % args.curve_every and ep != cfg.epochs):
                continue
            m = MunkeyViT(mcfg); m.load_state_dict(c["model"]); m.eval()
            cb = MemoryBank(bank.ids, bank.labels, bank.keys, c["values"])
            cb.delete(fids); cb.compact()
            mm = run_metrics(m, cb, sets)
            g = gaps(mm, o0)
            row = {"epoch": ep, **rnd(mm), "gap": round(g["AvgGap"], 3)}
            if args.curve_pathways:
                pwt = pathways(m, MemoryBank(bank.ids, bank.labels, bank.keys, c["values"]), "test", te_idx)
                row.update({"img_test": round(pwt["image"], 1), "tok_test": round(pwt["token"], 1),
                            "Ps": round(pathway_sensitivity(pwt["image"], pwt["token"], pwt["both"]), 3)})
            curve.append(row)
            print("curve", json.dumps(row), flush=True)
        rec["curve"] = curve
    print(json.dumps(rec), flush=True)
    out_f.write(json.dumps(rec) + "\n"); out_f.flush()
