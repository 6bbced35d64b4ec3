"""The `munkey` command line: train, predict, forget, evaluate, audit, demo.

User errors (MunkeyError) print one clear message to stderr and exit with status 2; `--json`
makes a command print exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from munkey_core.errors import MunkeyError, non_negative_int

EXIT_USER_ERROR = 2


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a MUNKEY model and write a run directory")
    p.add_argument("--dataset", default="digits", help="registry name (digits, fashion-mnist, elpv, dermamnist, "
                   "bloodmnist, pathmnist, cifar10, cifar100, folder:PATH, ...); default: digits")
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument("--profile", default="auto", help="auto | cpu | vit-tiny | tiny (default auto: vit-tiny on "
                   "CUDA, cpu otherwise)")
    p.add_argument("--encoder", default=None, help="key encoder: efficientnet_lite0 (default, offline), "
                   "efficientnet_lite2, mobilenet_v2, or any timm model name (downloads)")
    p.add_argument("--data-root", default=None, help="folder holding the dataset's files")
    p.add_argument("--download", action="store_true", help="download the dataset if it is missing (needs internet)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--keep-checkpoints", type=int, default=10, help="per-epoch checkpoints kept (0 = all)")
    p.add_argument("--arch", default="munkey", choices=["munkey", "resnet18", "vit"],
                   help="munkey (default): the MUNKEY ViT with its memory bank; resnet18 / vit: a conventional "
                   "classifier (what UnAct, SSD and LFSSD edit; the plain ViT has the MUNKEY backbone's sizes)")
    p.add_argument("--exclude-class", type=int, action="append", default=[], metavar="C",
                   help="(resnet18/vit) leave class C out of training: a class oracle; repeatable")
    p.add_argument("--width", type=int, default=None, help="(resnet18) channels of the first stage (the last has 8x): "
                   "64 is the standard ResNet-18; default: the profile's (cpu 16, tiny 8)")
    g = p.add_argument_group("training options (defaults come from the profile)")
    for name, typ, text in [
        ("epochs", int, "training epochs"), ("batch-size", int, "batch size"), ("lr", float, "peak learning rate"),
        ("weight-decay", float, "AdamW weight decay"), ("k", int, "K: neighbours retrieved at inference"),
        ("k-train", int, "K': neighbours mixed by retrieval simulation"), ("tau", float, "similarity temperature"),
        ("p-retrieval", float, "p_r: probability of retrieval simulation"),
        ("p-drop-image", float, "probability of dropping the image pathway"),
        ("p-drop-token", float, "probability of dropping the exemplar token"),
        ("augment-shift", float, "random translation (fraction of the side)"),
        ("absent-target-mix", float, "on steps without the sample's own exemplar, mix this share of its neighbours' "
                                     "label distribution into the target (0 = hard labels; forgets better, lower TA)"),
        ("absent-skip-hardest", float, "on steps without the sample's own exemplar, this share of those samples in a "
                                       "batch with the highest loss gives no gradient (0 = off; the cpu profile trains digits with 0.15)"),
        ("ema-epochs", float, "ship an exponential moving average of the weights and exemplars over about this many "
                              "epochs (0 = off: the last step's)"),
        ("per-sample-clip", float, "experimental: clip each sample's gradient of the shared weights to this norm "
                                   "(DP-SGD style, about 2.4x the step time; 0 = off; docs/cli.md)"),
        ("per-sample-noise", float, "experimental: Gaussian noise on the clipped gradient sum, std = this x the clip "
                                    "(needs --per-sample-clip; 0 = clipping alone)"),
        ("max-train", int, "use a stratified subset of this many training images (0 = all)"),
        ("seed", int, "training seed (initialisation, batch order, augmentation)"),
        ("split-seed", int, "data split seed (the splits we carve, the --max-train subset); default: --seed"),
        ("exemplar-dim", int, "exemplar vector size"),
        ("drop-path-rate", float, "stochastic depth: the largest per-block probability of skipping a block's "
                                  "residual branch in training (the paper's ViT-Tiny: 0.1)"),
        ("inject-at", int, "block L (0 .. depth-1) the exemplar token joins at: 0 (default) is the paper's design; "
         "L > 0 is late injection, whose blocks before L run once per image instead of K times at inference "
         "(faster; docs/performance.md has its speed and Avg Gap)"),
    ]:
        g.add_argument(f"--{name}", type=typ, default=None, help=text)


def _add_search_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--search", default=None, choices=["auto", "exact", "ivf"],
                   help="how neighbours are found: exact (reads every key), ivf (an approximate index: recall@10 on "
                        "the run's validation keys in 'munkey bench search RUN'), auto (default, or $MUNKEY_SEARCH): "
                        "exact below 100,000 bank rows")


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="classify images and show the training cases behind each answer")
    p.add_argument("run")
    p.add_argument("images", nargs="+", help="PNG, JPEG, BMP, TIFF or NPY files")
    p.add_argument("--k", type=int, default=None, help="neighbours to retrieve (default: the run's K)")
    p.add_argument("--mode", default="ensemble", choices=["ensemble", "softmax_fusion", "rank_fusion"])
    p.add_argument("--device", default="auto")
    _add_search_option(p)
    p.add_argument("--json", action="store_true")


def _add_forget(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("forget", help="delete training samples from a run (key deletion: instant, physical)")
    p.add_argument("run")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", action="append", help="comma-separated sample ids, e.g. 12,40,41 (repeatable: the "
                     "lists are merged)")
    src.add_argument("--ids-file", help="text or CSV file of ids (one per line, or an 'id' column)")
    src.add_argument("--random-fraction", type=float, help="delete this random fraction of the bank")
    p.add_argument("--seed", type=int, default=0, help="seed for --random-fraction")
    p.add_argument("--operator", required=True, help="who files this deletion (recorded in the audit log)")
    p.add_argument("--subject", default=None, help="the data subject's reference, e.g. a case number; the log keeps "
                   "only a keyed hash of it")
    p.add_argument("--no-evaluate", action="store_true", help="skip measuring TA/RA/FA/MIA before and after "
                   "(faster; recorded as not evaluated)")
    p.add_argument("--max-samples", type=non_negative_int, default=2000, help="cap per evaluated set (0 = all)")
    p.add_argument("--audit-url", default=None, help="PostgreSQL URL of the audit log (default: $MUNKEY_AUDIT_URL, "
                   "else the run's own SQLite log)")
    p.add_argument("--device", default="auto")
    _add_search_option(p)
    p.add_argument("--json", action="store_true")


def _add_audit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="verify the audit log and receipts, list entries, re-issue a receipt")
    asub = p.add_subparsers(dest="audit_command", required=True)
    v = asub.add_parser("verify", help="re-compute the hash chain; name the first entry edited, removed, inserted "
                        "or reordered (exit status 1 when the log is not intact)")
    v.add_argument("run")
    r = asub.add_parser("verify-receipt", help="check a receipt's signature, and against the run's log when the run "
                        "is given (exit status 1 if invalid)")
    r.add_argument("receipt", help="the receipt's .json file")
    r.add_argument("run", nargs="?", default=None, help="the run folder (leave out to check with the public key only)")
    for q in (v, r):
        q.add_argument("--public-key", default=None, help="the operator's Ed25519 public key (64 hex digits, or a "
                       "file holding it) that must have signed; see 'munkey audit key'")
    k = asub.add_parser("key", help="print this machine's public signing key (the private key stays in the "
                        "config folder, outside every run)")
    k.add_argument("--json", action="store_true")
    s = asub.add_parser("show", help="list the log's entries")
    s.add_argument("run")
    i = asub.add_parser("receipt", help="(re-)issue the receipt of a logged request")
    i.add_argument("run")
    i.add_argument("request_id")
    for q in (v, r, s, i):
        q.add_argument("--audit-url", default=None, help="PostgreSQL URL (default: $MUNKEY_AUDIT_URL)")
        q.add_argument("--json", action="store_true")


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="TA, RA, FA, MIA (cheap attack) and Ps of a run")
    p.add_argument("run")
    p.add_argument("--max-samples", type=non_negative_int, default=2000, help="cap per evaluated set (0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--oracle", action="store_true", help="compare with the M-oracle (the run's recipe retrained "
                   "without the current forget set; trained and cached in RUN/oracles/ on first use): gaps, Avg Gap")
    p.add_argument("--noise-floor", type=non_negative_int, default=0,
                   help="with --oracle: retrain N more M-oracles with other training seeds (same split and forget "
                        "set) and print their Avg Gap to the M-oracle, the gap chance alone gives (default 0)")
    p.add_argument("--device", default="auto")
    _add_search_option(p)
    p.add_argument("--json", action="store_true")


def _add_select(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("select", help="pick the per-epoch checkpoint that forgets best (lowest Avg Gap on a "
                       "validation forget split among checkpoints with Ps <= 0.3)")
    p.add_argument("run")
    p.add_argument("--val-rate", type=float, default=0.05, help="size of the validation forget split (default 0.05)")
    p.add_argument("--max-ps", type=float, default=0.3, help="pathway-sensitivity bound (default 0.3)")
    p.add_argument("--max-samples", type=non_negative_int, default=1000, help="cap per evaluated set (0 = all; default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-train", action="store_true", help="fail instead of training the split's M-oracle")
    p.add_argument("--out", default=None, help="write the selected checkpoint as a new run directory here")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true")


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train on digits, predict with evidence, delete 10%%, re-evaluate")
    p.add_argument("--out", default="runs/demo", help="run directory: trained there if missing; an existing one is reused only if it is a digits run "
                        "nothing was deleted from yet (the demo deletes for good)")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--device", default="auto")


def _add_unact(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("unact", help="erase a whole class from a trained model (UnAct; SSD/LFSSD and, on a MUNKEY "
                       "run, class key deletion to compare); saves the edited model as a new run")
    p.add_argument("run", help="a resnet18 / vit run ('munkey train --arch') or a MUNKEY run")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="folder of images of the class to forget (no label needed)")
    src.add_argument("--class", dest="cls", type=int, help="take the images from this class of the training split")
    p.add_argument("--n", type=int, default=0, help="with --class: how many images (default 0 = all)")
    p.add_argument("--seed", type=int, default=0, help="with --class and --n: which images")
    p.add_argument("--method", default="unact", choices=["unact", "ssd", "lfssd", "keys", "keys+unact", "mask"],
                   help="unact (default); ssd / lfssd (classifier runs); keys = delete every key of the class, "
                   "keys+unact = both (MUNKEY runs; UnAct along the inference path); mask = the class's logit "
                   "forced down (the trivial suppression, for comparison)")
    p.add_argument("--p", type=float, default=None, help="percentile of units dampened each round (ResNet 99, ViT 85, MUNKEY backbone 90)")
    p.add_argument("--gamma", type=float, default=None, help="damping factor in (0, 1) (ResNet 0.01, ViT 0.1, MUNKEY 0.01)")
    p.add_argument("--rounds", "--k", dest="k", type=int, default=None,
                   help="rounds of damping, the paper's k (ResNet 20, ViT 5, MUNKEY 20); --k is the same option "
                   "(not predict's --k, which counts neighbours)")
    p.add_argument("--score", default=None, choices=["activation", "attribution"],
                   help="ResNet unit score: attribution (default: activation x the channel's weight towards the "
                   "class logit; measured best, see docs/results) or activation (the paper's mean post-ReLU "
                   "activation); ViTs always use attribution")
    p.add_argument("--no-retain-guard", action="store_true", help="MUNKEY runs: turn off the retain guard (which "
                   "undoes a round and stops once the kept classes' probe loses more than 2 points, or one kept class more "
                   "than one of its 10 probe images)")
    p.add_argument("--out", default=None, help="new run directory for the edited model (default RUN_unact_cC[_N])")
    p.add_argument("--no-save", action="store_true", help="only measure; write nothing")
    p.add_argument("--train-oracle", action="store_true", help="train the class oracle first if it is missing "
                   "(the same recipe without the class), so Delta can be reported")
    p.add_argument("--operator", default=None, help="who files the request (recorded in the new run's audit log "
                   "when keys are deleted)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true")


def _add_bench(sub: argparse._SubParsersAction, benchmarks: bool = True) -> None:
    p = sub.add_parser("bench", help="benchmarks that print tables of figures and same-run ratios")
    if not benchmarks:  # another command: its options are never parsed, and loading them costs ~0.1 s
        return
    from munkey_core import bench

    bsub = p.add_subparsers(dest="bench_command", required=True)
    for name in bench.BENCHMARKS:
        mod = bench.load(name)
        mod.add_arguments(bsub.add_parser(name, help=mod.HELP))


_ADDERS = {"train": _add_train, "predict": _add_predict, "forget": _add_forget, "evaluate": _add_evaluate,
           "select": _add_select, "audit": _add_audit, "demo": _add_demo, "unact": _add_unact}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the command `argv` (default: the command line) runs: when its first word names a
    command, that command's parser alone (its options, help and errors are the same; building every
    command's options was a few per cent of a `munkey forget --no-evaluate`), else every command's; the
    benchmarks' own options only when it runs one."""
    parser = argparse.ArgumentParser(prog="munkey", description="Unlearning by design: MUNKEY key deletion.")
    sub = parser.add_subparsers(dest="command", required=True)
    words = list(sys.argv[1:] if argv is None else argv)
    first = words[0] if words else None
    if first in _ADDERS:
        _ADDERS[first](sub)
        return parser
    for add in _ADDERS.values():
        add(sub)
    _add_bench(sub, benchmarks=first == "bench")
    return parser


def _emit(obj: Any, as_json: bool, text: str) -> None:
    print(json.dumps(obj, default=float) if as_json else text)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cmd_train(args: argparse.Namespace) -> int:
    from munkey_core import service
    from munkey_core.keys import encoders as keys
    from munkey_core.run.paths import check_new_run_dir

    check_new_run_dir(args.out)  # before anything else: never overwrite a user's folder or file
    overrides = {k: getattr(args, k) for k in ("epochs", "batch_size", "lr", "weight_decay", "k", "k_train", "tau",
                                                "p_retrieval", "p_drop_image", "p_drop_token", "augment_shift",
                                                "absent_target_mix", "seed", "split_seed", "exemplar_dim", "max_train", "inject_at",
                                                "drop_path_rate", "ema_epochs", "absent_skip_hardest", "per_sample_clip",
                                                "per_sample_noise")}
    if args.width is not None and (args.arch != "resnet18" or args.width < 1):
        raise MunkeyError("--width sets a ResNet-18's channels (a whole number >= 1, e.g. 64 for the standard model); "
                          "use it with --arch resnet18.")
    overrides["width"] = args.width
    if args.arch != "munkey" and args.inject_at is not None:
        raise MunkeyError("--inject-at is a MUNKEY option (where the exemplar token joins); a resnet18 / vit run has "
                          "no exemplar token. Drop --inject-at or use --arch munkey.")
    if args.arch != "munkey":
        from munkey_core.training.classifier import train_classifier_run

        crun = train_classifier_run(args.dataset, args.out, arch=args.arch, profile=args.profile,
                                    exclude_classes=args.exclude_class, data_root=args.data_root,
                                    download=args.download, device=args.device, overrides=overrides)
        last = crun.config
        hist = json.loads(crun.paths.history.read_text())[-1]
        print(f"trained {args.arch} on {last['dataset']} ({last['train_size']} images, profile {last['profile']}) in "
              f"{last['train_seconds']} s; final train acc {hist['train_acc']:.1f}%, val acc "
              f"{_fmt(hist.get('val_acc'), 1)}% -> {args.out}")
        return 0
    if args.exclude_class:
        raise MunkeyError("--exclude-class is for --arch resnet18 or vit; a MUNKEY run forgets by key deletion "
                          "('munkey forget') or by 'munkey unact'.")
    run = service.train_run(args.dataset, args.out, profile=args.profile, encoder=args.encoder or keys.DEFAULT_ENCODER,
                            data_root=args.data_root, download=args.download, device=args.device,
                            overrides=overrides, keep_checkpoints=args.keep_checkpoints)
    s = run.summary()
    last = run.history[-1]
    print(f"trained {s['dataset']} ({s['train_size']} images, profile {s['profile']}, {s['design']}) in "
          f"{s['train_seconds']} s; "
          f"final train acc {last['train_acc']:.1f}%, val acc {_fmt(last.get('val_acc'), 1)}% -> {args.out}")
    from munkey_core.config import forgetting_note, recipe_changes

    note = forgetting_note(s["profile"], s["dataset"], recipe_changes(run.config))
    if note:
        print(f"note: {note}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from munkey_core.service import MunkeyRun

    run = MunkeyRun(args.run, device=args.device, search=args.search)
    preds = run.predict_files(args.images, k=args.k, mode=args.mode)
    names = run.class_names
    items = []
    for i, path in enumerate(args.images):
        nbrs = preds.neighbours(i)
        items.append({
            "image": str(path), "prediction": int(preds.labels[i]), "class_name": names[int(preds.labels[i])],
            "confidence": float(preds.confidence[i]), "mode": preds.mode, "search": run.searcher.describe(),
            "neighbours": [{"id": n.id, "label": n.label, "class_name": names[n.label], "similarity": n.similarity,
                            "weight": n.weight, "predicted": n.predicted} for n in nbrs],
        })
    if args.json:
        _emit(items[0] if len(items) == 1 else {"predictions": items}, True, "")
        return 0
    how = run.searcher.describe()
    print(f"search: {how['mode']} over {how['bank_rows']:,} bank rows" + (
        f" (IVF: {how['nprobe']} of {how['nlist']} lists read, recall@10 {how['recall_at_10_validation']:.3f} "
        "against exact on the run's validation keys)" if how["mode"] == "ivf" else ""))
    for it in items:
        print(f"{it['image']}: {it['class_name']} (class {it['prediction']}, confidence {it['confidence']:.3f}, "
              f"{it['mode']})")
        print(f"  {'id':>8} {'label':>12} {'similarity':>10} {'weight':>8} {'votes for':>12}")
        for n in it["neighbours"]:
            votes = "-" if n["predicted"] is None else names[n["predicted"]]
            print(f"  {n['id']:>8} {n['class_name']:>12} {n['similarity']:>10.4f} {n['weight']:>8.4f} {votes:>12}")
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    """`munkey forget`. Without evaluation the cyclic collector is paused for the command (imports and
    request): it builds thousands of small objects that stay alive until it returns (modules, the
    run), and the ~60 young collections they triggered walked them for nothing (~10 ms of a ~0.5 s
    command); reference counting still frees everything else at once. On return what is still
    alive goes to the permanent generation (gc.freeze, as the exit hook does), so the first
    collection after re-enabling does not walk it all at once; the collector is re-enabled (tests
    call `main` many times in one process)."""
    import gc

    paused = bool(args.no_evaluate) and gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _forget(args)
    finally:
        if paused:
            gc.freeze()
            gc.enable()


def _forget(args: argparse.Namespace) -> int:
    from munkey_core.forget.request import RefusedRequest, UnfinishedRequest, forget_without_model, record_refusal
    from munkey_core.forget.ids import parse_ids, read_ids_file

    source = "ids" if args.ids is not None else "ids-file" if args.ids_file is not None else "random-fraction"
    ids = None
    opts = {"operator": args.operator, "subject": args.subject, "evaluate": not args.no_evaluate,
            "max_samples": args.max_samples, "source": source}
    try:
        if args.ids is not None:  # --ids given several times: one request naming every id
            ids = parse_ids(",".join(args.ids), source="--ids")
        elif args.ids_file is not None:
            ids = read_ids_file(args.ids_file)
        res = None
        if args.no_evaluate:  # key deletion needs no model: the run's files and numpy, no torch (~0.5 s, not ~13)
            res = forget_without_model(args.run, ids, audit_url=args.audit_url, search=args.search,
                                       fraction=args.random_fraction, seed=args.seed,
                                       **{k: v for k, v in opts.items() if k != "evaluate"})
        if res is None:  # evaluated, or a run that needs opening in full (forget/request.py says when)
            from munkey_core.service import MunkeyRun

            run = MunkeyRun(args.run, device=args.device, audit_url=args.audit_url, search=args.search)
            res = (run.forget(ids, **opts) if ids is not None
                   else run.forget_random(args.random_fraction, args.seed, **opts))
    except (RefusedRequest, UnfinishedRequest):  # logged already, or committed: never a refusal
        raise
    except MunkeyError as exc:  # refused before reaching the run: record it when the log is intact
        rid = record_refusal(args.run, reason=str(exc), operator=args.operator, subject=args.subject,
                             requested_ids=ids, source=source, url=args.audit_url)
        if rid is None:
            raise
        raise MunkeyError(f"{exc} (The refused request {rid} is recorded in the audit log.)") from None
    out = {"deleted": res.deleted, "already_deleted": res.already_deleted, "bank_size": res.bank_size,
           "seconds": res.seconds, "request_id": res.request_id, "receipt": res.receipt,
           "receipt_html": res.receipt_html, "log_entry": res.entry_seq, "entry_hash": res.entry_hash,
           "evidence_passed": res.evidence_passed, "metrics_after": res.entry.get("metrics", {}).get("after")}
    text = (f"deleted {len(res.deleted)} sample(s) in {res.seconds * 1000:.1f} ms; bank now holds {res.bank_size}\n"
            f"request {res.request_id} recorded as audit log entry #{res.entry_seq}; post-deletion checks "
            f"{'passed' if res.evidence_passed else 'FAILED'}\nreceipt: {res.receipt} (readable: {res.receipt_html})")
    if res.already_deleted:
        text += f"\nalready deleted earlier (nothing to do): {', '.join(map(str, res.already_deleted))}"
    _emit(out, args.json, text)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from munkey_core.service import MunkeyRun

    if args.noise_floor and not args.oracle:
        raise MunkeyError("--noise-floor N compares N more M-oracles with the M-oracle: add --oracle.")
    run = MunkeyRun(args.run, device=args.device, search=args.search)
    if args.oracle:
        from munkey_core.eval.oracles import evaluate_against_oracle

        r = evaluate_against_oracle(run, max_samples=args.max_samples, seed=args.seed, progress=not args.json,
                                    noise_floor=args.noise_floor)
        rows = [(name, r[key]) for name, key in (("run", "run"), ("M-oracle", "oracle"))]
        rows += [(f"seed {f['train_seed']}", f["metrics"]) for f in r["noise_floor"]["oracles"]]
        text = "\n".join(f"{name:<10} TA {_fmt(m['TA'])}  RA {_fmt(m['RA'])}  FA {_fmt(m['FA'])}  MIA {_fmt(m['MIA'])}  "
                         f"TPR@1%/0.1%FPR {_fmt(m.get('TPR@1%'))}/{_fmt(m.get('TPR@0.1%'))}" for name, m in rows)
        floor = r["noise_floor"]["AvgGap"]
        text += (f"\n{'gap':<10} TA {_fmt(r['gap_TA'])}  RA {_fmt(r['gap_RA'])}  FA {_fmt(r['gap_FA'])}  "
                 f"MIA {_fmt(r['gap_MIA'])}  -> Avg Gap {_fmt(r['AvgGap'])}"
                 + (f"  (noise floor, M-oracles of other training seeds vs the M-oracle: {_fmt(floor)})"
                    if floor is not None else "  (no noise floor: add --noise-floor N to retrain N more M-oracles)")
                 + f"\n(forget set {r['forget_set']}: {r['n_forget']} ids; oracle {r['oracle_path']}; "
                   f"MIA: {r['MIA_attack']})")
        from munkey_core.eval.floors import gap_verdict

        c = r["control"]
        text += (f"\n{'held':<10} FA {_fmt(c['FA'])}  MIA {_fmt(c['MIA'])}  -> Avg Gap {_fmt(c['AvgGap'])}  (the positive "
                 "control: the run had the deleted samples read like the samples it still holds)")
        v = gap_verdict(r["AvgGap"], floor, len(r["noise_floor"]["oracles"]), control_gap=c["AvgGap"],
                        needs_control=True)
        r["verdict"] = v
        text += f"\nverdict: {v['verdict']}. {v['reason']}"
        _emit(r, args.json, text)
        return 0
    m = run.evaluate(max_samples=args.max_samples, seed=args.seed)
    text = (f"TA {_fmt(m['TA'])}  RA {_fmt(m['RA'])}  FA {_fmt(m['FA'])}  MIA {_fmt(m['MIA'])}  Ps {_fmt(m['Ps'], 3)}"
            f"\n(n_test {m['n_test']}, n_retain {m['n_retain']}, n_forget {m['n_forget']}; bank {m['bank_size']}, "
            f"deleted {m['deleted']}; MIA: {m['MIA_attack']})")
    _emit(m, args.json, text)
    return 0


def cmd_select(args: argparse.Namespace) -> int:
    from munkey_core.eval.selection import check_target, select_checkpoint, write_selected
    from munkey_core.service import MunkeyRun

    run = MunkeyRun(args.run, device=args.device)
    if args.out:
        check_target(run, args.out)
    sel = select_checkpoint(run, val_rate=args.val_rate, seed=args.seed, max_ps=args.max_ps,
                            max_samples=args.max_samples, train_missing=not args.no_train,
                            oracle_progress=not args.json)
    o = sel.oracle
    lines = [f"validation forget split {sel.val_forget} ({sel.n_val_forget} ids); M-oracle {sel.oracle_path}",
             f"{'M-oracle':<15} TA {_fmt(o['TA'])}  RA {_fmt(o['RA'])}  FA {_fmt(o['FA'])}  MIA {_fmt(o['MIA'])}",
             f"{'checkpoint':<15} {'TA':>6} {'RA':>6} {'FA':>6} {'MIA':>6} {'AvgGap':>7} {'Ps':>6}"]
    for c in sel.scores:
        mark = "  <- selected" if c.name == sel.selected else ("" if c.eligible else f"  (Ps > {sel.max_ps:g})")
        lines.append(f"{c.name:<15} {_fmt(c.TA):>6} {_fmt(c.RA):>6} {_fmt(c.FA):>6} {_fmt(c.MIA):>6} "
                     f"{_fmt(c.AvgGap):>7} {_fmt(c.Ps, 3):>6}{mark}")
    lines.append("(TA on the validation split; MIA: cheap attack)" if sel.selected else
                 f"No checkpoint has Ps <= {sel.max_ps:g}: none selected.")
    result = sel.to_dict()
    if args.out:
        if not args.json:  # the scores first: they stay on screen when writing is refused
            print("\n".join(lines), flush=True)
            lines = []
        result["written"] = str(write_selected(run, sel, args.out))
        lines.append(f"wrote the selected checkpoint as a new run: {result['written']}")
    _emit(result, args.json, "\n".join(lines))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from munkey_core.audit import log as audit
    from munkey_core.audit import receipts

    if args.audit_command == "key":
        from munkey_core.audit import signing

        s = signing.signer()
        _emit({"public_key": s.public_key, "algorithm": signing.ALGORITHM, "key_file": str(s.path)}, args.json,
              f"{s.public_key}\n(Ed25519 public key; the private key is {s.path}: keep it outside every run)")
        return 0
    trusted = None
    if getattr(args, "public_key", None):
        from munkey_core.audit.signing import parse_public_key

        trusted = parse_public_key(args.public_key)
    if args.audit_command == "verify":
        v = audit.verify_run(args.run, args.audit_url, trusted)
        d = v.as_dict()
        text = ("log intact" if v.ok else f"log NOT intact: {v.problem}") + f" ({v.location}): {v.message}"
        text += "".join(f"\nnote: {n}" for n in v.notes)
        _emit(d, args.json, text)
        return 0 if v.ok else 1
    if args.audit_command == "verify-receipt":
        res = receipts.verify_receipt(receipts.load_receipt(args.receipt), args.run, args.audit_url, trusted)
        text = ("receipt VALID" if res["ok"] else "receipt INVALID") + f" ({res['request_id']}): {res['message']}"
        _emit(res, args.json, text)
        return 0 if res["ok"] else 1
    log = audit.open_log(args.run, args.audit_url)
    if log is None:
        raise MunkeyError(f"{args.run} has no audit log yet: no deletion request has been filed.")
    with log:
        entries = log.entries()
        if args.audit_command == "show":
            rows = [{"seq": e.seq, "kind": e.kind, "request_id": e.request_id, "operator": e.body.get("operator"),
                     "received": e.body.get("received"), "executed": e.body.get("executed"),
                     "deleted": [s["id"] for s in e.body.get("samples", [])],
                     "bank_size": (e.body.get("bank") or {}).get("after", {}).get("size"),
                     "evidence_passed": (e.body.get("evidence") or {}).get("passed"),
                     "reason": e.body.get("reason"), "entry_hash": e.entry_hash} for e in entries]
            text = "\n".join(f"#{r['seq']:<4} {r['kind']:<9} {r['request_id']}  {r['received']}  {audit.operator_label(r['operator'])}  "
                             + (f"deleted {len(r['deleted'])}" if r["kind"] == "deletion" else
                                "(derived from another run; its deletions inherited)" if r["kind"] == "lineage"
                                else f"({r['reason']})")
                             for r in rows) or "the log is empty"
            _emit({"entries": rows}, args.json, text)
            return 0
        entry = next((e for e in entries if e.request_id == args.request_id), None)
        if entry is None:
            raise MunkeyError(f"The log holds no request {args.request_id!r}; list them with 'munkey audit show RUN'.")
        js, page = receipts.issue(args.run, log, entry)
    _emit({"receipt": str(js), "receipt_html": str(page)}, args.json, f"receipt: {js}\nreadable: {page}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from munkey_core.demo import run_demo

    run_demo(Path(args.out), profile=args.profile, fraction=args.fraction, device=args.device)
    return 0


def _free_dir(base: Path) -> Path:
    out, i = base, 1
    while out.exists():
        i += 1
        out = base.with_name(f"{base.name}_{i}")
    return out


def cmd_unact(args: argparse.Namespace) -> int:
    from munkey_core.unlearn.classforget import ClassEditor, guard_limits, read_as_note, request_left
    from munkey_core.data.images import read_image_dir
    import dataclasses

    editor = ClassEditor(args.run, device=args.device)
    if args.images is not None:
        images = editor.prepare(read_image_dir(args.images))
        cls = None
    else:
        images, cls = editor.class_images(args.cls, args.n, seed=args.seed), args.cls
    base = editor.default_config()
    cfg = dataclasses.replace(base, p=base.p if args.p is None else args.p,
                              gamma=base.gamma if args.gamma is None else args.gamma,
                              k=base.k if args.k is None else args.k, score=args.score or base.score)
    if args.no_retain_guard:
        cfg = dataclasses.replace(cfg, guard=None, backoff=None)
    cfg.check()
    if args.train_oracle:
        editor.train_oracle(editor.pseudo_label(images) if cls is None else cls)
    req, model, _ = editor.request(args.method, images, cls=cls, cfg=cfg)
    row = req.as_row()
    out = None
    if not args.no_save:
        out = Path(args.out) if args.out else _free_dir(Path(f"{str(args.run).rstrip('/')}_{args.method.replace('+', '_')}_c{req.cls}"))
        editor.save(out, model, req, operator=args.operator)
        row["out"] = str(out)
    name = editor.class_names[req.cls]
    text = (f"{args.method} on class {req.cls} ({name}; pseudo-label {req.pseudo_label}) from {req.n_images} image(s) "
            f"in {req.seconds:.3f} s\n  Af {req.before.Af:.2f} -> {req.after.Af:.2f}   Ar {req.before.Ar:.2f} -> "
            f"{req.after.Ar:.2f}   Delta " + (f"{req.delta:.2f} (oracle Af {req.oracle.Af:.2f}, Ar {req.oracle.Ar:.2f})"
                                               if req.oracle else "- (no class oracle: add --train-oracle)"))
    note = read_as_note(req, editor.class_names)
    if note:
        text += f"\n  {note}"
    v = editor.af_verdict(req)
    row["verdict"] = v["verdict"]
    text += f"\n  verdict on the class: {v['verdict']}. {v['reason']}"
    if req.details.get("stop_reason") == "all rounds" and v["verdict"] != "forgotten":
        text += (f"\n  ran all its {req.details.get('rounds', 0)} round(s) without its stop rule finding the class forgotten; "
                 "a request with more of the class's images, or --k higher, may take it further")
    if req.details.get("stop_reason") == "retain guard":
        text += (f"\n  stopped by the retain guard after {req.details.get('rounds', 0)} round(s): one more would have cost "
                 f"the kept classes on their probe more than {guard_limits(req.details)}, so it was undone. The request's "
                 f"images on the result: {request_left(req)}. Test Af {req.after.Af:.2f} %: "
                 "removing more from this model would cost the classes you keep")
    text += f"\nsaved as a new run: {out} (the original is untouched)" if out else "\nnot saved (--no-save)"
    _emit(row, args.json, text)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from munkey_core import bench

    return bench.load(args.bench_command).run(args)


COMMANDS = {"unact": cmd_unact, "bench": cmd_bench, "train": cmd_train, "predict": cmd_predict, "forget": cmd_forget, "evaluate": cmd_evaluate, "select": cmd_select,
            "audit": cmd_audit, "demo": cmd_demo}


_EXIT_HOOK: list[bool] = []


def _no_collection_at_exit() -> None:
    """At interpreter exit, move every object to the collector's permanent generation (gc.freeze)
    before Python's final collections run, so they do not walk the whole heap again: ~0.05-0.15 s of
    a command that lives under a second (`munkey forget --no-evaluate`, docs/performance.md). Only
    cyclic garbage left at exit goes unfinalized, which Python never promises to finalize anyway;
    everything the CLI writes is closed and flushed (fsync) before its command returns. Registered
    once per process (the tests call `main` many times)."""
    if not _EXIT_HOOK:
        import atexit
        import gc

        atexit.register(gc.freeze)  # atexit runs last-in first-out: after the handlers registered later
        _EXIT_HOOK.append(True)


def main(argv: Sequence[str] | None = None) -> int:
    _no_collection_at_exit()
    args = build_parser(argv).parse_args(argv)
    if "MUNKEY_UMASK" not in os.environ:  # run folders, logs, receipts and keys: owner-only by default
        os.umask(0o077)
    try:
        return COMMANDS[args.command](args)
    except MunkeyError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, whatever the message holds
        return EXIT_USER_ERROR
    except (RecursionError, MemoryError) as exc:  # absurd input that slipped past the checks: still one line
        print(f"error: the input is too large or too deeply nested to process ({type(exc).__name__}); nothing "
              "was changed.", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted; the run directory is unchanged or complete (writes are atomic)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output stopped early (`munkey predict ... | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # else the interpreter's exit flush fails again on the closed pipe
        return 141  # 128 + SIGPIPE, as a shell tool ends in a pipe


if __name__ == "__main__":
    sys.exit(main())
