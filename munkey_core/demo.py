"""The workshop demo: train on the embedded digits data, predict with evidence, delete, re-evaluate.

Runs on a 2-core laptop in a few minutes (CPU profile). An existing run at `out` is reused only if it is a
digits run nothing was deleted from yet: the demo deletes for good.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.run.paths import RunPaths
from munkey_core.service import MunkeyRun, train_run
from munkey_core.data.sampling import random_ids
from munkey_core.eval.verdicts import class_matched_n, forgetting_verdicts
from munkey_core.model.predict import Predictions

EXAMPLE_POOL = 20  # test samples the demo's example is chosen from


def _row(name: str, before: dict, after: dict) -> str:
    def f(v):
        return "    -" if v is None else f"{v:6.2f}"
    return f"  {name:<4} {f(before.get(name))}  ->  {f(after.get(name))}"


def _receipt_verdicts(evidence: dict, n_test: int | None, target_n: float | None = None) -> list[str]:
    """The receipt's reading of the deleted samples, in words: their FA against unseen test samples of the
    same classes (`target_n`: how many samples that target is worth) and their MIA against 50, each with its
    verdict (eval/verdicts.py), and what it cannot show."""
    after = {"FA": evidence.get("request_FA_after"), "MIA": evidence.get("request_MIA"),
             "n_forget": evidence.get("ids_checked"), "n_test": n_test,
             "FA_remembered": evidence.get("FA_remembered"), "MIA_remembered": evidence.get("MIA_remembered"),
             "n_remembered": evidence.get("n_remembered")}
    found = forgetting_verdicts(after, fa_target=evidence.get("TA_same_classes"), fa_target_n=target_n,
                                fa_target_label="on unseen test samples of the same classes")
    lines = ["\nthe receipt's reading of the deleted samples:"]
    lines += [f"  {v['metric']}: {v['verdict']}. {v['reason']}" for v in found]
    lines.append("  (on average like unseen samples; whether the model matches one retrained without them is "
                 "what `munkey evaluate RUN --oracle` measures)")
    return lines


def example_sample(run: MunkeyRun, n: int = EXAMPLE_POOL) -> tuple[int, Predictions]:
    """The demo's example, and the test sample the dashboard's Evidence page opens on: the first of the first
    `n` test samples the model predicts correctly (a presenter explains evidence on a right answer; the demo's
    printed line says how many before it were wrong), else the first.
    Returns its index in the test split and the predictions of those `n` samples."""
    images = run.dataset.test.images[:n]
    pred = run.predict_images(list(images))
    right = np.flatnonzero(pred.labels == run.dataset.test.labels[:len(images)])
    return (int(right[0]) if len(right) else 0), pred


def _check_reusable(run: MunkeyRun, out: Path) -> None:
    """The demo deletes samples for good: it reuses only a digits run nothing was deleted from yet (the run
    `munkey train` or the installer leaves), never a user's other run or one an earlier demo already cut."""
    dataset, deleted = run.summary()["dataset"], len(run.forgotten_ids)
    if dataset != "digits" or deleted:
        what = f"a {dataset} run" if dataset != "digits" else f"a run {deleted} samples were already deleted from"
        raise MunkeyError(f"{out} holds {what}; the demo deletes a random share of a fresh digits run's training "
                          f"samples for good, so it leaves this one alone. Give --out a new folder (the demo then "
                          f"trains its own run there: a few minutes on 2 cores). Nothing was changed.")


def run_demo(out: Path, *, profile: str = "cpu", fraction: float = 0.1, device: str = "auto",
             print_fn=print) -> dict:
    """Run the demo end to end and return the before/after metrics and the deletion result."""
    if not 0 <= fraction < 1:
        raise MunkeyError(f"--fraction is the share of training samples the demo deletes: give a number from 0 "
                          f"(delete nothing) to below 1, e.g. 0.1 (got {fraction:g}).")
    if RunPaths(out).config.exists():
        run = MunkeyRun(out, device=device)
        if fraction > 0:
            _check_reusable(run, out)
        print_fn(f"reusing the run in {out}")
    else:
        print_fn(f"training MUNKEY on digits (profile {profile}) -> {out}")
        run = train_run("digits", out, profile=profile, device=device)
    s = run.summary()
    print_fn(f"model: {s['dataset']}, encoder {s['encoder']}, bank {s['bank_size']} samples, "
             f"trained in {s['train_seconds']} s")
    before = run.evaluate(max_samples=0)
    ds = run.dataset
    i, pred = example_sample(run)
    label, names = int(ds.test.labels[i]), run.class_names
    right = "right" if int(pred.labels[i]) == label else "wrong"
    why = ("the first test sample" if i == 0 else
           f"the first test sample it gets right; {'the one' if i == 1 else f'the {i}'} before it "
           f"{'is' if i == 1 else 'are'} predicted wrongly")
    print_fn(f"\ntest sample {int(ds.test.ids[i])} ({why}; true class {names[label]}): predicted "
             f"{names[int(pred.labels[i])]} ({right}) with confidence {pred.confidence[i]:.3f}; evidence:")
    for n in pred.neighbours(i):
        print_fn(f"  training case {n.id:>5}  label {names[n.label]:>3}  similarity {n.similarity:.3f}  "
                 f"weight {n.weight:.3f}  votes {names[n.predicted]}")
    res = None
    if fraction > 0:
        ids = random_ids(run.bank.ids, fraction, seed=0)
        before["FA"] = run.accuracy_on_ids(ids)  # the same samples, while still in the bank
        res = run.forget(ids, operator="munkey demo", subject="demo request", evaluate=True, max_samples=0)
        print_fn(f"\ndeleted {len(res.deleted)} training samples in {res.seconds * 1000:.1f} ms "
                 f"(bank now {res.bank_size}); FA before = their accuracy while still in the bank")
        print_fn(f"audit log entry #{res.entry_seq}, receipt {res.receipt} (readable: {res.receipt_html})")
    after = run.evaluate(max_samples=0)
    print_fn("\nmetrics (percent; MIA = " + after["MIA_attack"] + "):")
    for name in ("TA", "RA", "FA", "MIA"):
        print_fn(_row(name, before, after))
    print_fn(f"  Ps   {before['Ps']:6.3f}  ->  {after['Ps']:6.3f}")
    if res is not None:
        target_n = class_matched_n(ds.test.labels, ds.lookup(res.deleted).labels)  # the demo measures all test
        for line in _receipt_verdicts(res.entry.get("evidence") or {}, after.get("n_test"), target_n):
            print_fn(line)
    return {"before": before, "after": after, "deleted": [] if res is None else res.deleted}
