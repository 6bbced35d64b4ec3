"""The work behind `munkey bench ulira` (see bench/ulira.py for what it measures)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from munkey_core.bench._common import munkey_settings, settings_phrases, settings_suffix, write_tables
from munkey_core.errors import MunkeyError
from munkey_core.atomic import atomic_write_json, read_json

NONE = "no unlearning (positive control)"
KEY_DELETION = "MUNKEY key deletion"
# Where a residual trace of a deleted target lives, one pathway at a time (predict.py's ablations): the image
# pathway alone is the backbone (null token; deleting keys cannot change it), the token pathway alone is
# what the bank's neighbours carry (null image). Recorded by shadows trained since these rows exist; the
# rows are left out when any shadow was cached before.
IMAGE_ONLY = "image pathway only (the backbone, as trained and after deletion)"
TOKEN_ONLY_NONE = "no unlearning, token pathway only (the bank)"
TOKEN_ONLY_DELETION = "key deletion, token pathway only (the bank)"
PATHWAY_ROWS = (TOKEN_ONLY_NONE, TOKEN_ONLY_DELETION, IMAGE_ONLY)
COLUMNS = ("family", "method", "settings", "accuracy", "accuracy_lo", "accuracy_hi", "AUC", "AUC_lo", "AUC_hi",
           "TPR@1%", "TPR@1%_lo", "TPR@1%_hi", "TPR@0.1%", "TPR@0.1%_lo", "TPR@0.1%_hi", "shadows", "targets",
           "pairs_unlearned", "pairs_retrained", "test_accuracy", "AUC_by_draw")


def mean_test_accuracy(per_shadow: list[dict | None], method: str) -> float | None:
    """Mean over the shadows of `method`'s test-split accuracy (percent); None when any shadow lacks it
    (cached before the bench recorded it), so a row never averages a subset of its shadows."""
    values = [acc.get(method) if acc else None for acc in per_shadow]
    return None if not values or any(v is None for v in values) else float(np.mean(values))


class UliraBench:
    """Trains the shadow models that are missing, unlearns, scores, writes the table."""

    def __init__(self, args: argparse.Namespace) -> None:
        from munkey_core.unlearn.posthoc import METHODS

        self.args = args
        if args.shadows < 8 or args.shadows % 2:
            raise MunkeyError(f"--shadows must be an even number >= 8 (each target needs >= 3 shadows of each kind "
                              f"besides the one attacked); got {args.shadows}.")
        if args.targets < 2:
            raise MunkeyError(f"--targets must be at least 2; got {args.targets}.")
        self.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise MunkeyError(f"Unknown method(s) {bad}; choose from: {', '.join(METHODS)}.")
        from munkey_core.unlearn.tuning import parse_settings

        self.settings: dict[str, dict] = {}  # method -> settings given with --settings (over its defaults)
        for text in getattr(args, "settings", None) or []:
            method, given = parse_settings(text)
            if method not in self.methods:
                raise MunkeyError(f"--settings names {method}, which is not among --methods ({args.methods!r}); "
                                  "add it there or drop its settings.")
            self.settings[method] = {**self.settings.get(method, {}), **given}
        n_draws = getattr(args, "draws", 1)
        if n_draws < 1:
            raise MunkeyError(f"--draws must be at least 1 (one target draw per seed from --seed on); got {n_draws}.")
        self.seeds = list(range(args.seed, args.seed + n_draws))  # one draw per seed, pooled in the table
        self.munkey_over = munkey_settings(args.profile, args.dataset, getattr(args, "munkey_set", None) or [])
        self.trained = 0
        self.accuracy: dict[str, list[dict]] = {}  # family -> per shadow {"train", "test"} accuracy (percent)
        # family -> per shadow {method: test-split accuracy (percent) of that model}, None for a shadow cached before
        # it was recorded: the utility each row's forgetting costs
        self.test_accuracy: dict[str, list[dict | None]] = {}
        self._acc: dict | None = None

    # ----- data -----------------------------------------------------------------------------
    def _folders(self, seed: int) -> dict[str, Path]:
        """Cache folder of each family's shadows for the draw of `seed`; each family under its own recipe,
        so changing one family's options keeps the other's shadows."""
        a = self.args
        work = Path(a.work) / f"{a.dataset.replace(':', '_').replace('/', '_')}_{a.profile}_seed{seed}_t{a.targets}"
        recipe = settings_suffix(self.munkey_over)
        return {"munkey": work / f"munkey_e{a.epochs}{recipe}",
                "vit": work / f"vit_e{a.vit_epochs}_shift{a.vit_shift:g}"}

    def _setup(self, seed: int):
        """The draw of `seed`: (dataset (its split carved with the seed where the dataset carves one), targets
        (T,) row indices into the training split, halves: member row sets per shadow)."""
        from munkey_core.data import datasets as data_mod
        from munkey_core.eval.mia import half_splits

        a = self.args
        ds = data_mod.load_dataset(a.dataset, a.data_root, seed=seed, max_train=a.max_train or None)
        n = len(ds.train)
        if a.targets > n // 2:
            raise MunkeyError(f"--targets {a.targets} is more than half the training split ({n}); ask for fewer.")
        targets = np.sort(np.random.default_rng([seed, 1]).choice(n, size=a.targets, replace=False))
        halves = half_splits(np.arange(n), a.shadows, seed=seed)  # row indices, complementary pairs
        return ds, targets, halves

    # ----- one shadow -----------------------------------------------------------------------
    def _munkey_shadow(self, ds, keys: np.ndarray, test_keys: np.ndarray, rows: np.ndarray, targets: np.ndarray,
                       seed: int) -> tuple[dict, dict]:
        """Probabilities (T, C) on the targets of a MUNKEY trained on `rows`, before and after deleting
        the keys of the targets it trained on, and its test-split accuracy (percent) before and after;
        the same for each pathway alone (PATHWAY_ROWS)."""
        import copy

        from munkey_core.config import resolve_device, resolve_profile, with_overrides
        from munkey_core.model.munkey_vit import preprocess_images
        from munkey_core.model.predict import predict
        from munkey_core.training.train import TrainData, train_munkey

        a = self.args
        prof = resolve_profile(a.profile)
        over = {"epochs": a.epochs, "seed": seed, **self.munkey_over}
        cfg = with_overrides(prof.train_for(a.dataset), over)
        mcfg = with_overrides(prof.model_for(a.dataset), {"in_chans": ds.channels, "num_classes": ds.num_classes})
        tr = ds.train
        res = train_munkey(mcfg, cfg, TrainData(tr.images[rows], tr.labels[rows], tr.ids[rows], keys[rows]),
                           device=resolve_device(a.device), progress=False)
        model, bank = res.model, res.bank
        dev = next(model.parameters()).device
        x = preprocess_images(torch.from_numpy(np.ascontiguousarray(tr.images[targets])).to(dev), mcfg.img_size)

        x_test = preprocess_images(torch.from_numpy(np.ascontiguousarray(ds.test.images)).to(dev), mcfg.img_size)

        def probs(b, images: torch.Tensor, query_keys: np.ndarray, pathway: str = "both") -> np.ndarray:
            return predict(model, b, images, query_keys, k=cfg.k, tau=cfg.tau, pathway=pathway,
                           neighbour_predictions=False).probs

        def test_accuracy(b, pathway: str = "both") -> float:
            return float((probs(b, x_test, test_keys, pathway).argmax(1) == ds.test.labels).mean() * 100)

        gone = copy.deepcopy(bank)
        gone.delete([int(i) for i in tr.ids[np.intersect1d(rows, targets)]])
        gone.compact()
        out, acc = {}, {}
        for name, b, pathway in ((NONE, bank, "both"), (KEY_DELETION, gone, "both"), (TOKEN_ONLY_NONE, bank, "token"),
                                 (TOKEN_ONLY_DELETION, gone, "token"), (IMAGE_ONLY, gone, "image")):
            out[name], acc[name] = probs(b, x, keys[targets], pathway), test_accuracy(b, pathway)
        return out, acc

    def _vit_shadow(self, ds, rows: np.ndarray, targets: np.ndarray, seed: int) -> tuple[dict, dict]:
        """Probabilities (T, C) on the targets of a plain ViT trained on `rows`, as trained and after each
        post-hoc method unlearned the targets it trained on (its retain set: the other rows), and the
        test-split accuracy (percent) of each of those models."""
        from munkey_core.config import resolve_device
        from munkey_core.eval.mia import classifier_probs
        from munkey_core.training.classifier import classifier_recipe, train_classifier
        from munkey_core.model.munkey_vit import preprocess_images
        from munkey_core.unlearn.posthoc import run_posthoc

        a = self.args
        tr = ds.train
        cfg, tcfg, _ = classifier_recipe("vit", a.profile, ds.num_classes, ds.channels,
                                         {"epochs": a.vit_epochs, "augment_shift": a.vit_shift, "seed": seed})
        dev = resolve_device(a.device)
        model, _ = train_classifier(cfg, tcfg, tr.images[rows], tr.labels[rows], device=dev, progress=False)
        def test_accuracy(m) -> float:
            return float((classifier_probs(m, ds.test.images, cfg.img_size).argmax(1) == ds.test.labels).mean() * 100)

        out, acc = {NONE: classifier_probs(model, tr.images[targets], cfg.img_size)}, {NONE: test_accuracy(model)}
        # how much this shadow memorised: accuracy on its own training rows and on the test split
        self._acc = {"train": float((classifier_probs(model, tr.images[rows], cfg.img_size).argmax(1)
                                     == tr.labels[rows]).mean() * 100), "test": acc[NONE]}
        forget_rows = np.intersect1d(rows, targets)
        retain_rows = np.setdiff1d(rows, targets)

        def to_input(u8: np.ndarray) -> torch.Tensor:
            return preprocess_images(torch.from_numpy(np.ascontiguousarray(u8)).to(dev), cfg.img_size)

        for method in self.methods:
            r = run_posthoc(method, model, to_input, (tr.images[forget_rows], tr.labels[forget_rows]),
                            (tr.images[retain_rows], tr.labels[retain_rows]), num_classes=ds.num_classes, seed=seed,
                            settings=self.settings.get(method))
            out[method] = classifier_probs(r.model, tr.images[targets], cfg.img_size)
            acc[method] = test_accuracy(r.model)
        return out, acc

    def _shadow(self, family: str, draw: int, s: int, ds, keys, test_keys, rows, targets) -> dict:
        """Cached outputs of shadow `s` of `family` in the draw of seed `draw`: method -> probabilities (T, C)."""
        path = self._folders(draw)[family] / f"shadow_{s:03d}.json"
        tag = {"methods": self.methods if family == "vit" else [], "targets": targets.tolist(), "rows": len(rows),
               # given settings change what the ViT shadows hold (no key without them: earlier caches stay valid)
               **({"settings": self.settings} if family == "vit" and self.settings else {})}
        if path.exists() and read_json(path).get("tag") == tag:
            cached = read_json(path)
            if cached.get("accuracy"):
                self.accuracy.setdefault(family, []).append(cached["accuracy"])
            self.test_accuracy.setdefault(family, []).append(cached.get("test_accuracy"))
            return {k: np.asarray(v) for k, v in cached["probs"].items()}
        seed = 1000 * (draw + 1) + s  # every shadow its own training seed
        self._acc = None
        out, test_acc = (self._munkey_shadow(ds, keys, test_keys, rows, targets, seed) if family == "munkey"
                         else self._vit_shadow(ds, rows, targets, seed))
        self.trained += 1
        if self._acc:
            self.accuracy.setdefault(family, []).append(self._acc)
        self.test_accuracy.setdefault(family, []).append(test_acc)
        atomic_write_json(path, {"tag": tag, "probs": {k: v.tolist() for k, v in out.items()}, "accuracy": self._acc,
                                 "test_accuracy": test_acc})
        return out

    # ----- the attack ---------------------------------------------------------------------------
    def measure(self) -> list[dict]:
        from munkey_core.keys import encoders as keys_mod
        from munkey_core.config import resolve_device
        from munkey_core.eval.ulira import logit_confidence, ulira_metrics, ulira_report, ulira_scores

        a = self.args
        families = ["munkey"] + (["vit"] if self.methods else [])
        enc = keys_mod.load_encoder(a.encoder or keys_mod.DEFAULT_ENCODER, device=resolve_device(a.device))
        # per family, per draw: (shadow outputs, (S, T) membership, (T,) labels)
        draws: dict[str, list[tuple[list[dict], np.ndarray, np.ndarray]]] = {f: [] for f in families}
        for seed in self.seeds:
            ds, targets, halves = self._setup(seed)
            keys = keys_mod.cached_keys(enc, ds.train.images, ds.train.ids, dataset=ds.name, split="train",
                                        progress=False)
            test_keys = keys_mod.cached_keys(enc, ds.test.images, ds.test.ids, dataset=ds.name, split="test",
                                             progress=False)
            unlearned = np.stack([np.isin(targets, h) for h in halves])  # (S, T)
            for family in families:
                desc = f"{family} shadows" + (f", draw {seed}" if len(self.seeds) > 1 else "")
                outs = [self._shadow(family, seed, s, ds, keys, test_keys, h, targets)
                        for s, h in enumerate(tqdm(halves, desc=desc, unit="model", dynamic_ncols=True))]
                draws[family].append((outs, unlearned, ds.train.labels[targets]))
        rows: list[dict] = []
        for family in families:
            every = [o for outs, _, _ in draws[family] for o in outs]
            methods = [NONE] + ([KEY_DELETION] + [p for p in PATHWAY_ROWS if all(p in o for o in every)]
                                if family == "munkey" else self.methods)  # control first
            for method in methods:
                # each draw scored with its own shadows; the draws' (shadow, target) pairs pooled: (S, sum of T)
                per_draw = [(ulira_scores(np.stack([logit_confidence(o[method], labels) for o in outs]), unl,
                                          variance=a.variance), unl) for outs, unl, labels in draws[family]]
                scores = np.concatenate([sc for sc, _ in per_draw], axis=1)
                unlearned = np.concatenate([u for _, u in per_draw], axis=1)
                rep = ulira_report(method, scores, unlearned, seed=a.seed)
                row = {"family": "MUNKEY" if family == "munkey" else "plain ViT", "method": method,
                       "settings": self._settings_text(method),
                       "shadows": rep.n_shadows, "targets": rep.n_targets,
                       "pairs_unlearned": rep.n_pairs_unlearned, "pairs_retrained": rep.n_pairs_retrained,
                       "test_accuracy": mean_test_accuracy(self.test_accuracy[family], method),
                       "AUC_by_draw": " / ".join(f"{ulira_metrics(sc, u)['AUC']:.1f}"
                                                 for sc, u in per_draw)}
                for k, v in rep.values.items():
                    row[k], (row[f"{k}_lo"], row[f"{k}_hi"]) = v, rep.ci[k]
                rows.append(row)
        return rows

    def _draws_text(self) -> str:
        """How the table's header names its targets' draw: one seed, or the pooled draws."""
        a = self.args
        if len(self.seeds) == 1:
            return f"seed {a.seed}"
        return (f"per draw; {len(self.seeds)} draws, seeds {', '.join(map(str, self.seeds))}, each with its own data "
                f"split where the dataset carves one, targets, halves and shadows, {len(self.seeds) * a.targets} "
                "targets pooled: each draw's pairs scored with its own shadows, the intervals over all targets; "
                "the AUC of each draw alone in the last column")

    def _settings_text(self, method: str) -> str:
        """The settings a post-hoc method ran with ('' for the control and MUNKEY's key deletion)."""
        from munkey_core.unlearn.posthoc import method_settings
        from munkey_core.unlearn.tuning import settings_text

        if method not in self.methods:
            return ""
        return settings_text(method_settings(method, self.settings.get(method)))

    def table(self, rows: list[dict], wall: float) -> str:
        a = self.args

        def cell(r: dict, k: str) -> str:
            return f"{r[k]:.1f} [{r[k + '_lo']:.1f}, {r[k + '_hi']:.1f}]"

        n_neg = rows[0]["pairs_retrained"] if rows else 0
        by_draw = len(self.seeds) > 1
        lines = [f"## Per-example unlearning attack (U-LiRA style): {a.dataset}, profile {a.profile}", "",
                 f"MUNKEY shadows: the profile's recipe, {a.epochs} epochs"
                 + "".join(f", {p} (--munkey-set)" for p in settings_phrases(self.munkey_over))
                 + ". Plain ViT shadows: the same backbone and "
                 f"recipe, {a.vit_epochs} epochs, random shift {a.vit_shift:g} (trained to memorise, so the post-hoc "
                 "methods have something to forget).", "",
                 f"{a.shadows} shadow models per family on complementary random halves of the training split, "
                 f"{a.targets} target examples ({self._draws_text()}), each unlearned from the {a.shadows // 2} shadows that "
                 "trained on it; per (shadow, target) a likelihood-ratio test, leaving that shadow out, of whether it "
                 f"looks unlearned or retrained ({a.variance} variance). Values in percent with 95% bootstrap intervals "
                 "over targets; 50 = indistinguishable from retraining. 'No unlearning' is the positive control "
                 f"(the attack's power). TPR at 0.1% FPR rests on {n_neg} retrained pairs: below "
                 f"1/{n_neg} = {100 / max(n_neg, 1):.2f}% FPR it counts only unlearned pairs scored above every "
                 "retrained one.", "",
                 f"Wall time of this invocation: {wall:.0f} s ({self.trained} shadow model(s) trained by it)."
                 + "".join(f" Plain ViT shadows as trained: training-half accuracy "
                           f"{np.mean([x['train'] for x in acc]):.1f}%, test accuracy {np.mean([x['test'] for x in acc]):.1f}% "
                           f"(mean of {len(acc)})." for fam, acc in self.accuracy.items() if fam == "vit" and acc), "",
                 "Command: `munkey " + " ".join(shlex.quote(x) for x in sys.argv[1:]) + "`", "",
                 "Test accuracy: the mean over the shadows of each model's accuracy on the test split (after its "
                 "unlearning), the utility the row's forgetting leaves; 'not measured' where the shadows were cached "
                 "before the bench recorded it (a fresh --work measures it).", "",
                 *(["Pathway rows (MUNKEY): the same shadows and targets, each scored through one pathway alone "
                    "(the other replaced by its learned null): the image pathway alone is the backbone, which "
                    "deleting keys leaves as trained, so its row asks whether the backbone itself still tells the "
                    "shadows that trained on a target from those that never saw it; the token pathway alone asks "
                    "it of what the bank's neighbours carry, before and after deletion. A trace in the key-deletion "
                    "row lives where a pathway row is above 50.", ""]
                   if any(r["method"] in PATHWAY_ROWS for r in rows) else []),
                 "| family | method | settings | accuracy | AUC | TPR@1% FPR | TPR@0.1% FPR | test accuracy |"
                 + (" AUC by draw |" if by_draw else ""),
                 "|---|---|---|---|---|---|---|---|" + ("---|" if by_draw else "")]
        for r in rows:
            settings = (r["settings"] + (" (--settings)" if r["method"] in self.settings else " (defaults)")
                        if r["settings"] else "")
            lines.append(f"| {r['family']} | {r['method']} | {settings} | " + " | ".join(
                cell(r, k) for k in ("accuracy", "AUC", "TPR@1%", "TPR@0.1%"))
                + (f" | {r['test_accuracy']:.1f} |" if r["test_accuracy"] is not None else " | not measured |")
                + (f" {r['AUC_by_draw']} |" if by_draw else ""))
        return "\n".join(lines) + "\n"

    def run(self) -> int:
        t0 = time.perf_counter()
        rows = self.measure()
        text = self.table(rows, time.perf_counter() - t0)
        print(text)
        if self.args.out:
            write_tables(self.args.out, f"ulira_{self.args.dataset.replace(':', '_').replace('/', '_')}", text, rows,
                         COLUMNS)
        return 0
