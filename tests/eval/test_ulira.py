"""The per-example unlearning attack (U-LiRA style): its likelihood-ratio statistics on hand-made
observations, checked against the standard library's normal density, and `munkey bench ulira` end to end on digits
(tiny profile), with the test accuracy each attacked model keeps."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from munkey_core.cli import main
from munkey_core.data.datasets import load_dataset
from munkey_core.errors import MunkeyError
from munkey_core.eval.mia import half_splits
from munkey_core.eval.ulira import logit_confidence, ulira_report, ulira_scores


def _design(shadows: int, targets: int, seed: int) -> np.ndarray:
    """(S, T) membership: complementary pairs of random halves, so each target is in half the shadows."""
    rng = np.random.default_rng(seed)
    first = rng.random((shadows // 2, targets)) < 0.5
    return np.repeat(first, 2, axis=0) ^ np.tile([False, True], shadows // 2)[:, None]


def test_scores_are_the_leave_one_out_gaussian_likelihood_ratio() -> None:
    unl = _design(8, 5, seed=0)
    obs = np.random.default_rng(1).normal(0, 1, unl.shape) + 2.0 * unl
    scores = ulira_scores(obs, unl, variance="per-example")
    for s, t in [(0, 0), (3, 2), (7, 4)]:
        keep = np.arange(8) != s
        a, b = obs[keep & unl[:, t], t], obs[keep & ~unl[:, t], t]
        expect = (math.log(NormalDist(a.mean(), a.std(ddof=1)).pdf(obs[s, t]))
                  - math.log(NormalDist(b.mean(), b.std(ddof=1)).pdf(obs[s, t])))
        assert scores[s, t] == pytest.approx(expect)


def test_attack_sees_a_trace_and_is_at_chance_without_one() -> None:
    unl = _design(16, 200, seed=2)
    rng = np.random.default_rng(3)
    level = rng.normal(0, 2, 200)  # per-example difficulty: what a population attack cannot separate
    leaky = level + rng.normal(0, 0.5, unl.shape) + 1.0 * unl
    clean = level + rng.normal(0, 0.5, unl.shape)
    hit = ulira_report("leaky", ulira_scores(leaky, unl), unl, n_boot=200)
    null = ulira_report("clean", ulira_scores(clean, unl), unl, n_boot=200)
    assert hit.values["accuracy"] > 75 and hit.ci["accuracy"][0] > 60 and hit.values["TPR@1%"] > 5
    assert null.ci["AUC"][0] < 50 < null.ci["AUC"][1] and abs(null.values["accuracy"] - 50) < 5
    for rep in (hit, null):
        assert all(lo <= rep.values[k] <= hi for k, (lo, hi) in rep.ci.items())


def test_logit_confidence_and_refusals() -> None:
    p = np.array([[0.8, 0.2], [0.5, 0.5]])
    np.testing.assert_allclose(logit_confidence(p, np.array([0, 1])), [np.log(4.0), 0.0], atol=1e-9)
    with pytest.raises(MunkeyError, match="at least 3"):
        ulira_scores(np.zeros((4, 3)), _design(4, 3, seed=0))


def test_bench_ulira_runs_end_to_end_and_resumes(cache_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    argv = ["bench", "ulira", "--dataset", "digits", "--profile", "tiny", "--epochs", "3", "--vit-epochs", "3",
            "--shadows", "8", "--targets", "12", "--methods", "neggrad+", "--work", str(tmp_path / "w"),
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    assert "16 shadow model(s) trained" in capsys.readouterr().out
    rows = list(csv.DictReader(open(tmp_path / "out" / "ulira_digits.csv")))
    pathway_rows = [("MUNKEY", "no unlearning, token pathway only (the bank)"),
                    ("MUNKEY", "key deletion, token pathway only (the bank)"),
                    ("MUNKEY", "image pathway only (the backbone, as trained and after deletion)")]
    assert [(r["family"], r["method"]) for r in rows] == [
        ("MUNKEY", "no unlearning (positive control)"), ("MUNKEY", "MUNKEY key deletion"), *pathway_rows,
        ("plain ViT", "no unlearning (positive control)"), ("plain ViT", "neggrad+")]
    for r in rows:
        assert int(r["shadows"]) == 8 and int(r["pairs_unlearned"]) + int(r["pairs_retrained"]) == 8 * 12
        for k in ("accuracy", "AUC", "TPR@1%", "TPR@0.1%"):
            assert 0 <= float(r[f"{k}_lo"]) <= float(r[k]) <= float(r[f"{k}_hi"]) <= 100
    # utility beside each row: the test accuracy of the models the row attacked, a mean over the 8 shadows
    test_acc = {(r["family"], r["method"]): float(r["test_accuracy"]) for r in rows}
    files = {fam: sorted((tmp_path / "w" / "digits_tiny_seed0_t12").glob(f"{fam}_*/shadow_*.json"))
             for fam in ("munkey", "vit")}
    as_trained = [json.loads(f.read_text())["accuracy"]["test"] for f in files["vit"]]  # recorded when trained
    assert test_acc[("plain ViT", "no unlearning (positive control)")] == pytest.approx(np.mean(as_trained))
    assert all(0 < v <= 100 for v in test_acc.values())
    # deleting the few target keys a shadow holds (about 6 of its 629 entries) leaves test accuracy almost as is
    assert abs(test_acc[("MUNKEY", "MUNKEY key deletion")] - test_acc[("MUNKEY", "no unlearning (positive control)")]) < 3
    # each pathway row scores its own pathway: per shadow the three differ from the full inference and from each other
    for f in files["munkey"]:
        shadow = json.loads(f.read_text())
        p = {k: np.asarray(v) for k, v in shadow["probs"].items()}
        names = ["MUNKEY key deletion"] + [m for _, m in pathway_rows]
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                assert not np.allclose(p[a], p[b]), (a, b)
    assert main(argv) == 0  # a re-run reads every shadow from --work
    assert "0 shadow model(s) trained" in capsys.readouterr().out
    assert "Pathway rows (MUNKEY)" in (tmp_path / "out" / "ulira_digits.md").read_text()
    # shadows cached before the pathway rows existed: those rows are left out, the others still measured
    for f in files["munkey"][:1]:
        old = json.loads(f.read_text())
        for _, m in pathway_rows:
            del old["probs"][m], old["test_accuracy"][m]
        f.write_text(json.dumps(old))
    assert main(argv) == 0
    assert "0 shadow model(s) trained" in capsys.readouterr().out
    rows = list(csv.DictReader(open(tmp_path / "out" / "ulira_digits.csv")))
    assert [(r["family"], r["method"]) for r in rows][:2] == [
        ("MUNKEY", "no unlearning (positive control)"), ("MUNKEY", "MUNKEY key deletion")] and len(rows) == 4
    assert "Pathway rows (MUNKEY)" not in (tmp_path / "out" / "ulira_digits.md").read_text()
    # shadows cached before the bench recorded test accuracy: that family's rows say so (no average over a subset)
    old = json.loads(files["munkey"][3].read_text())
    del old["test_accuracy"]
    files["munkey"][3].write_text(json.dumps(old))
    assert main(argv) == 0
    assert "0 shadow model(s) trained" in capsys.readouterr().out
    rows = list(csv.DictReader(open(tmp_path / "out" / "ulira_digits.csv")))
    assert [r["test_accuracy"] == "" for r in rows] == [True, True, False, False]
    md = (tmp_path / "out" / "ulira_digits.md").read_text()
    assert md.count("| not measured |") == 2 and "nan" not in md and "None" not in md
    assert main(argv[:-2] + ["--shadows", "6"]) == 2
    assert "--shadows" in capsys.readouterr().err
    # another MUNKEY recipe (--munkey-set): its shadows train into their own folder, the ViT's are read; bad
    # settings are refused before anything is trained
    for bad, says in (("absent_skip_hardest=1.5", "absent_skip_hardest"), ("epochs=5", "numeric training setting"),
                      ("k_train=0.5", "whole number"), ("p_retrieval", "NAME=VALUE")):
        assert main(argv + ["--munkey-set", bad]) == 2
        assert says in capsys.readouterr().err
    assert main(argv + ["--munkey-set", "absent_skip_hardest=0.5"]) == 0
    out = capsys.readouterr().out
    assert "8 shadow model(s) trained" in out and "absent_skip_hardest 0.5 (--munkey-set)" in out
    skipped = sorted((tmp_path / "w" / "digits_tiny_seed0_t12").glob("munkey_e3_absent_skip_hardest0.5/shadow_*.json"))
    assert len(skipped) == 8
    as_default = json.loads(files["munkey"][1].read_text())["probs"]["MUNKEY key deletion"]
    assert not np.allclose(json.loads(skipped[1].read_text())["probs"]["MUNKEY key deletion"], as_default)


def test_bench_ulira_runs_post_hoc_methods_with_given_settings(cache_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    """--settings reaches the ViT shadows' unlearning: the same shadows unlearned with a much stronger NegGrad+
    (25x the learning rate, 3 epochs, half the weight on the retain loss) keep far less confidence on the
    targets they unlearned; the table and CSV name the settings; changing them re-runs only the ViT shadows."""
    work, out = tmp_path / "w", tmp_path / "out"
    argv = ["bench", "ulira", "--dataset", "digits", "--profile", "tiny", "--epochs", "3", "--vit-epochs", "20",
            "--shadows", "8", "--targets", "12", "--methods", "neggrad+", "--work", str(work), "--out", str(out)]

    def unlearned_confidence() -> tuple[float, float]:
        """Mean true-class probability of the unlearned (shadow, target) pairs: as trained, after NegGrad+."""
        files = sorted((work / "digits_tiny_seed0_t12").glob("vit_*/shadow_*.json"))
        assert len(files) == 8
        shadows = [json.loads(f.read_text())["probs"] for f in files]
        ds = load_dataset("digits", seed=0)
        targets = np.sort(np.random.default_rng([0, 1]).choice(len(ds.train), size=12, replace=False))
        halves = half_splits(np.arange(len(ds.train)), 8, seed=0)
        labels = ds.train.labels[targets]
        member = np.stack([np.isin(targets, h) for h in halves])  # (S, T) the pairs each shadow unlearned
        true = {k: np.stack([np.asarray(s[k])[np.arange(12), labels] for s in shadows])[member].mean()
                for k in ("no unlearning (positive control)", "neggrad+")}
        return true["no unlearning (positive control)"], true["neggrad+"]

    assert main(argv) == 0
    assert "16 shadow model(s) trained" in capsys.readouterr().out
    before_default, after_default = unlearned_confidence()
    rows = {r["method"]: r for r in csv.DictReader(open(out / "ulira_digits.csv"))}
    assert rows["neggrad+"]["settings"] == "epochs=1 lr=0.0001 beta=0.95"  # the defaults, named
    assert rows["MUNKEY key deletion"]["settings"] == ""

    assert main(argv + ["--settings", "neggrad+:epochs=3 lr=0.0025,beta=0.5"]) == 0
    assert "8 shadow model(s) trained" in capsys.readouterr().out  # the MUNKEY shadows are read from --work
    before_given, after_given = unlearned_confidence()
    rows = {r["method"]: r for r in csv.DictReader(open(out / "ulira_digits.csv"))}
    assert rows["neggrad+"]["settings"] == "epochs=3 lr=0.0025 beta=0.5"
    assert "epochs=3 lr=0.0025 beta=0.5 (--settings)" in (out / "ulira_digits.md").read_text()
    assert before_given == pytest.approx(before_default, abs=0.02)  # the same shadows (seeded training)
    assert after_default > before_default - 0.1  # the default NegGrad+ barely moves these shadows
    assert after_given < after_default - 0.2  # the given settings were the ones run
    # and the test-accuracy column sees what they cost: the strong NegGrad+ damages the shadows' test accuracy
    # (measured: 66 -> 33 percent), where the defaults leave it as trained
    assert float(rows["neggrad+"]["test_accuracy"]) < float(rows["no unlearning (positive control)"]["test_accuracy"]) - 10

    assert main(argv + ["--settings", "scrub:epochs=3"]) == 2
    assert "not among --methods" in capsys.readouterr().err
    assert main(argv + ["--settings", "neggrad+:epochs=2.5"]) == 2
    assert "whole number" in capsys.readouterr().err


def test_bench_ulira_pools_target_draws(cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--draws 2: the draws of seeds 0 and 1, each with its own shadows (a draw cached by an earlier --seed
    run is read, not retrained), pooled into one table of 2 x T targets; the pooled AUC is that of every
    draw's leave-one-out scores put together (checked with scikit-learn), and each draw's own AUC is the
    one a run of that seed alone reports."""
    from sklearn.metrics import roc_auc_score

    base = ["bench", "ulira", "--dataset", "digits", "--profile", "tiny", "--epochs", "2", "--shadows", "8",
            "--targets", "10", "--methods=", "--work", str(tmp_path / "w")]
    assert main(base + ["--seed", "1", "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    alone = {r["method"]: float(r["AUC"]) for r in csv.DictReader(open(tmp_path / "one" / "ulira_digits.csv"))}
    assert main(base + ["--draws", "2", "--out", str(tmp_path / "two")]) == 0
    out = capsys.readouterr().out
    assert "8 shadow model(s) trained" in out and "AUC by draw" in out  # only the draw of seed 0 trained
    rows = list(csv.DictReader(open(tmp_path / "two" / "ulira_digits.csv")))
    method = "MUNKEY key deletion"
    pooled = next(r for r in rows if r["method"] == method)
    assert int(pooled["targets"]) == 20 and int(pooled["pairs_unlearned"]) + int(pooled["pairs_retrained"]) == 8 * 20
    assert all(float(r["AUC_by_draw"].split(" / ")[1]) == pytest.approx(alone[r["method"]], abs=0.051) for r in rows)
    scores, member = [], []
    for seed in (0, 1):
        ds = load_dataset("digits", seed=seed)
        shadows = [json.loads(f.read_text()) for f in
                   sorted((tmp_path / "w" / f"digits_tiny_seed{seed}_t10").glob("munkey_e2/shadow_*.json"))]
        targets = np.asarray(shadows[0]["tag"]["targets"])
        unl = np.stack([np.isin(targets, h) for h in half_splits(np.arange(len(ds.train)), 8, seed=seed)])
        obs = np.stack([logit_confidence(np.asarray(s["probs"][method]), ds.train.labels[targets]) for s in shadows])
        scores.append(ulira_scores(obs, unl))
        member.append(unl)
    s, m = np.concatenate(scores, axis=1).ravel(), np.concatenate(member, axis=1).ravel()
    assert float(pooled["AUC"]) == pytest.approx(100 * roc_auc_score(m, s), abs=1e-6)
    assert main(base + ["--draws", "0"]) == 2
    assert "--draws" in capsys.readouterr().err
