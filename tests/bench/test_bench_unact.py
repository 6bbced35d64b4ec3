"""`munkey bench unact` on tiny real runs: every section produces rows, tables and files."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from munkey_core.cli import main
from munkey_core.model.classifiers import predict_labels
from munkey_core.run.loaded import ClassifierRun


def test_bench_unact_writes_tables(tiny_classifier_runs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "results"
    code = main(["bench", "unact", str(tiny_classifier_runs["resnet18"]), "--classes", "1,6", "--shots", "5,all",
                 "--p", "90", "--gamma", "0.1", "--k", "5", "--ssd-tune", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "Full class" in text and "Few-shot" in text and "Sequential" in text and "SSD cold / one-round UnAct" in text
    rows = list(csv.DictReader(open(out / "unact_digits.csv")))
    methods = {(r["section"], r["method"]) for r in rows}
    assert ("full class", "ssd") in methods and ("full class", "unact (attribution)") in methods
    assert ("few-shot", "lfssd") in methods and ("full class", "mask (logit)") in methods
    assert ("sequential", "unact (activation), stop: rounds") in methods
    assert ("sequential", "unact (activation), stop: forgotten") in methods
    assert "SSD / LFSSD working points" in text and "(chosen)" in text
    full = [r for r in rows if r["section"] == "full class" and r["method"] == "unact (attribution)"]
    assert {r["class"] for r in full} == {"1", "6"}
    assert all(float(r["Af"]) < float(r["Af_before"]) for r in full)
    assert all(float(r["seconds_cold"]) > float(r["seconds"]) for r in rows if r["method"] == "ssd"
               and r["section"] == "full class")  # a cold request computes I_D; a warm one reads it
    assert (out / "unact_digits.md").read_text().startswith("## UnAct on digits")
    # positive control: the unedited model's own test accuracy on the class, predicted here directly
    run = ClassifierRun(tiny_classifier_runs["resnet18"], device="cpu")
    test = run.dataset.test
    pred = predict_labels(run.model, test.images, run.cfg.img_size)
    control = {r["class"]: r for r in rows if r["section"] == "full class" and r["method"] == "none (unedited)"}
    assert set(control) == {"1", "6"}
    for c, r in control.items():
        mine = test.labels == int(c)
        assert float(r["Af"]) == pytest.approx(100 * np.mean(pred[mine] == int(c)))
        assert float(r["Ar"]) == pytest.approx(100 * np.mean(pred[~mine] == test.labels[~mine]))
    assert "full class: unact, none per class" in text


def test_bench_unact_on_a_munkey_run_alone(tiny_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "results"
    assert main(["bench", "unact", str(tiny_run), "--classes", "2,5", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MUNKEY run: full class" in text and "MUNKEY run, one model" in text
    rows = list(csv.DictReader(open(out / "unact_digits.csv")))
    methods = {(r["section"], r["method"]) for r in rows}
    for m in ("keys", "mask (logit)", "unact (inference path)", "keys+unact (inference path)",
              "keys+unact (image pathway, earlier design)"):
        assert ("munkey full class", m) in methods
    assert ("munkey few-shot", "keys+unact (inference path)") in methods
    seq = [r for r in rows if r["section"] == "munkey sequential"]
    rules = list(dict.fromkeys(r["method"] for r in seq))  # the default, the unguarded rule, the paper's
    assert len(rules) == 3 and rules[0] == "keys+unact (inference path)"
    for rule in rules:
        assert [r["requests"] for r in seq if r["method"] == rule] == ["1", "2"]


def test_bench_unact_munkey_controls_only(tiny_run: Path, tmp_path: Path, capsys) -> None:
    """`--munkey-rows controls`: keys+unact and its controls (keys, mask, UnAct alone), the product's rule
    alone in the sequential section; no earlier design; the unedited model's Ar beside every row."""
    out = tmp_path / "results"
    assert main(["bench", "unact", str(tiny_run), "--classes", "2,5", "--munkey-rows", "controls",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = list(csv.DictReader(open(out / "unact_digits.csv")))
    full = {r["method"] for r in rows if r["section"] == "munkey full class"}
    assert full == {"keys", "mask (logit)", "unact (inference path)", "keys+unact (inference path)"}
    few = {r["method"] for r in rows if r["section"] == "munkey few-shot"}
    assert few == {"unact (inference path)", "keys+unact (inference path)"}
    seq = [r for r in rows if r["section"] == "munkey sequential"]
    assert [(r["method"], r["requests"]) for r in seq] == [("keys+unact (inference path)", "1"),
                                                          ("keys+unact (inference path)", "2")]
    assert "(image pathway, earlier design)" not in text and "paper's rule: all k rounds" not in text
    # every UnAct row of the class sections says which rule stopped it (the keys and mask rows have none)
    stops = {r["method"]: r["stop_reason"] for r in rows if r["section"] == "munkey full class"}
    assert stops["keys+unact (inference path)"] and stops["unact (inference path)"] and not stops["keys"]
    # the unedited model's Ar does not depend on the method: one value per class, shown in the tables
    for c in ("2", "5"):
        assert len({r["Ar_before"] for r in rows if r["class"] == c and r["section"] != "munkey sequential"}) == 1
    assert "| Ar unedited |" in text


def test_bench_unact_no_ssd(tiny_classifier_runs, tmp_path: Path, capsys) -> None:
    """`--no-ssd`: both UnAct rules, the mask and the unedited control, and no SSD/LFSSD row; with --ssd-tune
    it is refused (there would be nothing to tune for)."""
    out = tmp_path / "results"
    run = str(tiny_classifier_runs["resnet18"])
    assert main(["bench", "unact", run, "--classes", "1", "--shots", "5,all", "--scores", "attribution,activation",
                 "--k", "3", "--no-ssd", "--no-sequential", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = list(csv.DictReader(open(out / "unact_digits.csv")))
    methods = {(r["section"], r["method"]) for r in rows}
    assert not {m for _, m in methods} & {"ssd", "lfssd"}
    for m in ("unact (attribution)", "unact (activation)", "mask (logit)", "none (unedited)"):
        assert ("full class", m) in methods
    assert ("few-shot", "unact (activation)") in methods and ("few-shot", "unact (attribution)") in methods
    assert "SSD / LFSSD rows not run (--no-ssd)." in text and "SSD cold / one-round" not in text
    assert main(["bench", "unact", run, "--classes", "1", "--no-ssd", "--ssd-tune"]) != 0
