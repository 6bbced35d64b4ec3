"""Class unlearning end to end: classifier training and class oracles, `munkey unact` on ResNet, ViT
and MUNKEY runs (new run written, original untouched, Delta against the oracle), and error paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
import pytest
from PIL import Image

from munkey_core.unlearn.classforget import ClassEditor, class_metrics, read_as_note
from munkey_core.run.loaded import ClassifierRun
from munkey_core.cli import main
from _helpers import file_digests
from munkey_core.run.rows import load_bank


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def resnet_run(tiny_classifier_runs, tmp_path: Path) -> Path:
    dest = tmp_path / "r18"
    shutil.copytree(tiny_classifier_runs["resnet18"], dest)
    return dest


def test_class_metrics_on_a_hand_made_case() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    pred = np.array([0, 1, 1, 1, 2, 0, 0, 2])
    m = class_metrics(pred, labels, cls=2, num_classes=3)
    assert m.Af == 50.0 and m.Ar == 75.0 and m.per_class == [50.0, 100.0, 50.0]
    oracle = class_metrics(np.array([0, 0, 1, 1, 0, 0, 1, 1]), labels, cls=2, num_classes=3)
    assert oracle.Af == 0.0 and oracle.Ar == 100.0
    assert m.delta(oracle) == 25.0 + 50.0


def test_train_classifier_cli_and_class_oracle(tmp_path: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, "train", "--arch", "resnet18", "--dataset", "digits", "--profile", "tiny",
                           "--epochs", "3", "--exclude-class", "4", "--out", str(tmp_path / "o4"))
    assert code == 0 and "trained resnet18" in out
    run = ClassifierRun(tmp_path / "o4", device="cpu")
    assert run.config["kind"] == "classifier" and run.config["exclude_classes"] == [4]
    ds = run.dataset
    assert run.config["train_size"] == int((ds.train.labels != 4).sum())
    pred = run.predict_labels(ds.test.images)
    m = class_metrics(pred, ds.test.labels, 4, 10)
    assert m.Af < 5.0 and m.Ar > 80.0  # never saw a 4: (almost) never says 4
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--exclude-class", "4", "--out", str(tmp_path / "m"))
    assert code == 2 and "--arch resnet18 or vit" in err and not (tmp_path / "m").exists()


def test_train_resnet_width_option(tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "train", "--arch", "resnet18", "--dataset", "digits", "--profile", "tiny",
                             "--epochs", "1", "--width", "4", "--out", str(tmp_path / "w4"))
    assert code == 0, err
    run = ClassifierRun(tmp_path / "w4", device="cpu")
    assert run.model.fc.in_features == 32  # the last stage has 8 x width channels
    assert run.config["classifier"]["width"] == 4
    for argv in (["--dataset", "digits"], ["--arch", "resnet18", "--dataset", "digits"]):
        code, _, err = run_cli(capsys, "train", *argv, "--width", "0" if "--arch" in argv else "64",
                               "--out", str(tmp_path / "bad"))
        assert code == 2 and "--width" in err and not (tmp_path / "bad").exists()


def test_unact_cli_writes_a_new_run_with_delta_and_leaves_the_original(resnet_run: Path, capsys) -> None:
    before = file_digests(resnet_run, exclude=("oracles",))
    out = resnet_run.parent / "edited"
    code, text, err = run_cli(capsys, "unact", str(resnet_run), "--class", "3", "--n", "25", "--p", "90",
                              "--gamma", "0.1", "--k", "10", "--train-oracle", "--out", str(out), "--json")
    assert code == 0, err
    row = json.loads(text)
    assert row["class"] == 3 and row["pseudo_label"] == 3 and row["n"] == 25
    assert row["Af"] < row["Af_before"] - 30 and row["Delta"] is not None
    assert row["verdict"] in ("forgotten", "not yet", "cannot tell")
    assert row["Delta"] == pytest.approx(abs(row["Ar"] - row["Ar_oracle"]) + abs(row["Af"] - row["Af_oracle"]))
    assert file_digests(resnet_run, exclude=("oracles",)) == before  # original untouched (its oracle cache grew)
    edited = ClassifierRun(out, device="cpu")
    assert edited.config["edits"][-1]["method"] == "unact" and edited.config["edits"][-1]["class"] == 3
    again = ClassEditor(out, device="cpu").metrics(3)
    assert again.Af == pytest.approx(row["Af"]) and again.Ar == pytest.approx(row["Ar"])


def test_unact_cli_from_a_folder_of_images_uses_the_pseudo_label(resnet_run: Path, tmp_path: Path, capsys) -> None:
    ed = ClassEditor(resnet_run, device="cpu")
    folder = tmp_path / "sevens"
    folder.mkdir()
    for i, img in enumerate(ed.class_images(7, 6)):
        Image.fromarray(img[..., 0]).resize((40, 40)).save(folder / f"{i}.png")  # another size: resized
    code, text, err = run_cli(capsys, "unact", str(resnet_run), "--images", str(folder), "--no-save", "--json")
    assert code == 0, err
    row = json.loads(text)
    assert row["pseudo_label"] == 7 and row["class"] == 7 and "out" not in row
    assert sorted(p.name for p in resnet_run.parent.iterdir()) == ["r18", "sevens"]


@pytest.mark.parametrize("argv, message", [
    (["--class", "3", "--p", "150"], "p must be"),
    (["--class", "3", "--gamma", "1"], "gamma"),
    (["--class", "3", "--k", "0"], "rounds"),
    (["--class", "3", "--rounds", "0"], "rounds"),
    (["--class", "42"], "does not exist"),
    (["--class", "3", "--method", "keys"], "MUNKEY run"),
])
def test_unact_cli_bad_input_gives_a_clear_error_and_writes_nothing(resnet_run: Path, capsys, argv, message) -> None:
    before = sorted(p.name for p in resnet_run.parent.iterdir())
    code, out, err = run_cli(capsys, "unact", str(resnet_run), *argv)
    assert code == 2 and message in err and "Traceback" not in err
    assert sorted(p.name for p in resnet_run.parent.iterdir()) == before


def test_unact_cli_empty_folder(resnet_run: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "unact", str(resnet_run), "--images", str(tmp_path / "empty"))
    assert code == 2 and "holds no image" in err


def test_vit_run_unact(tiny_classifier_runs, capsys) -> None:
    code, text, err = run_cli(capsys, "unact", str(tiny_classifier_runs["vit"]), "--class", "0", "--no-save", "--json")
    assert code == 0, err
    row = json.loads(text)
    assert (row["p"], row["gamma"], row["k"]) == (85.0, 0.1, 5)  # the ViT working point
    assert row["Af"] < row["Af_before"]


def test_munkey_class_key_deletion_and_unact(tiny_run: Path, capsys) -> None:
    bank_before = load_bank(tiny_run).fingerprint()
    out = tiny_run.parent / "no_twos"
    code, text, err = run_cli(capsys, "unact", str(tiny_run), "--class", "2", "--n", "20", "--method", "keys+unact",
                              "--operator", "alice", "--out", str(out), "--json")
    assert code == 0, err
    row = json.loads(text)
    assert row["keys_deleted"] > 0 and row["Af"] < row["Af_before"]
    assert load_bank(tiny_run).fingerprint() == bank_before  # original untouched
    new_bank = load_bank(out)
    assert not np.any(new_bank.labels == 2) and len(new_bank) == len(load_bank(tiny_run)) - row["keys_deleted"]
    code, text, _ = run_cli(capsys, "audit", "verify", str(out), "--json")
    assert code == 0 and json.loads(text)["ok"]
    code, text, _ = run_cli(capsys, "audit", "show", str(out), "--json")
    entries = json.loads(text)["entries"]
    assert entries[-1]["operator"] == "alice" and len(entries[-1]["deleted"]) == row["keys_deleted"]
    ed = ClassEditor(tiny_run, device="cpu")
    keys_only, _, _ = ed.request("keys", ed.class_images(2, 20))
    assert keys_only.after.Af >= row["Af"]  # UnAct on the backbone adds to what key deletion alone does
    assert row["stop"] == "forgotten" and row["p"] == 90.0  # the MUNKEY working point


def test_a_class_whose_keys_are_already_gone(tiny_run: Path, tmp_path: Path, capsys) -> None:
    """Class 2's keys deleted by a first request: key deletion alone then has nothing to remove (refused,
    no folder made), and keys+unact saves its UnAct edit with nothing more deleted (was: a refused
    'names no sample id' deletion after the work was done)."""
    first = tmp_path / "no_twos"
    code, _, err = run_cli(capsys, "unact", str(tiny_run), "--class", "2", "--method", "keys", "--operator", "a",
                           "--out", str(first))
    assert code == 0, err
    code, _, err = run_cli(capsys, "unact", str(first), "--class", "2", "--method", "keys", "--operator", "a",
                           "--out", str(tmp_path / "again"))
    assert code == 2 and "has no training sample left" in err and not (tmp_path / "again").exists()
    code, text, err = run_cli(capsys, "unact", str(first), "--class", "2", "--method", "keys+unact", "--operator",
                              "a", "--out", str(tmp_path / "edited"), "--json")
    assert code == 0, err
    assert json.loads(text)["keys_deleted"] == 0 and len(load_bank(tmp_path / "edited")) == len(load_bank(first))
    code, text, _ = run_cli(capsys, "audit", "verify", str(tmp_path / "edited"), "--json")
    assert code == 0 and json.loads(text)["ok"]


def test_munkey_guard_stop_says_what_it_measured(tiny_run: Path, capsys) -> None:
    """Every image of class 0 on the tiny run: the retain guard stops the request. The CLI says what the
    request's own images still show against the stop rule (the numbers of the request's details) and the
    test split's Af, and asserts nothing it did not measure ("partly removed")."""
    code, text, err = run_cli(capsys, "unact", str(tiny_run), "--class", "0", "--n", "0", "--method", "keys+unact",
                              "--no-save")
    assert code == 0, err
    assert "stopped by the retain guard after" in text and "partly removed" not in text
    ed = ClassEditor(tiny_run, device="cpu")
    n = len(ed.class_images(0))
    line = next(x for x in text.splitlines() if "stopped by the retain guard" in x)
    assert f" of {n} image(s) still predicted as " in line and "(below 20.0 %)" in line  # the tail: 2 x chance
    af = float(text.split("Af ")[1].split(" -> ")[1].split()[0])
    assert f"Test Af {af:.2f} %" in line
    # the verdict: with no class oracle the target is 0, so any test image still given the class reads "not yet"
    verdict_line = next(x for x in text.splitlines() if "verdict on the class:" in x)
    if af > 0:
        assert "verdict on the class: not yet." in verdict_line and "The class is not gone." in verdict_line
    else:
        assert "not yet" not in verdict_line


@pytest.mark.parametrize("which", ["munkey", "resnet"])
def test_unact_suppresses_the_class_named_not_the_images_pseudo_label(tiny_run: Path, resnet_run: Path,
                                                                       which: str) -> None:
    """Images the model reads as class 3, filed as a request to remove class 5 (as when class 5 is already
    gone and its images now read as another class): UnAct must suppress class 5, never class 3, which nobody
    asked to remove. On the ResNet, following the pseudo-label instead drops class 3's Af like a removal."""
    ed = ClassEditor(tiny_run if which == "munkey" else resnet_run, device="cpu")
    images = ed.class_images(3, 25)
    assert ed.pseudo_label(images) == 3  # the model does read them as 3
    before = ed.metrics(3).Af
    req, model, bank = ed.request("unact", images, cls=5)
    assert req.cls == 5 and req.pseudo_label == 3 and req.details["read_as"] == 3
    assert req.details["target"] == 5  # the class UnAct scored units against and dampened
    control, removal, removal_bank = ed.request("unact", images)  # no class named: the pseudo-label is the target
    assert control.details["target"] == 3 and "read_as" not in control.details
    if which == "resnet":  # (the tiny MUNKEY run's retain guard stops both at round 0: no power there)
        assert ed.metrics(3, model, bank).Af >= before - 10  # class 3 kept
        assert ed.metrics(3, removal, removal_bank).Af <= before - 15  # where the pseudo-label is followed
    assert "read these images as class 3" in read_as_note(req, ed.class_names)


def test_a_request_that_runs_out_of_rounds_says_the_class_is_not_gone(resnet_run: Path, capsys) -> None:
    """One round of UnAct on the ResNet leaves most of class 3: the CLI says the rounds ran out, and its
    verdict is "not yet" (Af above 0 on the class's test images)."""
    code, text, err = run_cli(capsys, "unact", str(resnet_run), "--class", "3", "--n", "25", "--k", "1",
                              "--no-save", "--json")
    assert code == 0, err
    row = json.loads(text)
    assert row["stop_reason"] == "all rounds" and row["rounds"] == 1 and row["Af"] > 20
    assert row["verdict"] == "not yet"
    # --rounds is the same option as --k (the paper's name; predict's --k counts neighbours)
    code, text, err = run_cli(capsys, "unact", str(resnet_run), "--class", "3", "--n", "25", "--rounds", "1", "--no-save")
    assert "verdict on the class: not yet." in text and "The class is not gone." in text
    assert "ran all its 1 round(s) without its stop rule finding the class forgotten" in text


def test_mask_suppresses_the_output_and_changes_nothing_else(tiny_run: Path, tiny_classifier_runs) -> None:
    for path in (tiny_run, tiny_classifier_runs["resnet18"]):
        ed = ClassEditor(path, device="cpu")
        req, model, bank = ed.request("mask", ed.class_images(6, 5), cls=6)
        assert req.after.Af == 0.0 and bank is None
        changed = [k for k, v in model.state_dict().items() if not torch.equal(v, ed.model.state_dict()[k])]
        assert sorted(changed) == sorted(k for k in changed if k.endswith(("head.weight", "head.bias", "fc.weight",
                                                                            "fc.bias"))) and len(changed) == 2
        if ed.kind == "classifier":  # one forward: an image not predicted 6 keeps its prediction
            before = ed.predict_test(ed.model, bank)
            after = ed.predict_test(model, bank)
            assert np.all(after[before != 6] == before[before != 6])


def test_munkey_class_oracle_is_trained_without_the_class(cache_dir, tmp_path: Path) -> None:
    from munkey_core.service import MunkeyRun, train_run

    run = train_run("digits", tmp_path / "o", profile="tiny", device="cpu", progress=False,
                    overrides={"epochs": 1}, exclude_classes=[2])
    assert run.config["exclude_classes"] == [2]
    assert len(run.bank) and not np.any(run.bank.labels == 2)
    full = run.split_keys("train")  # the keys of the whole split, from the same cache
    rows = np.searchsorted(run.dataset.train.ids, run.bank.ids)
    np.testing.assert_allclose(run.bank.keys.numpy(), full[rows], rtol=0, atol=0)
    assert isinstance(MunkeyRun(tmp_path / "o", device="cpu").bank.ids, np.ndarray)
