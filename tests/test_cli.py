"""The `munkey` CLI end to end on a tiny digits run: train, predict, forget, evaluate, and error paths."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from munkey_core.cli import main
from munkey_core.run.rows import load_bank, load_checkpoint


OP = ("--operator", "tester", "--no-evaluate")  # forget needs a named operator; evaluation is tested elsewhere


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _bank_fingerprint(run: Path) -> str:
    return load_bank(run).fingerprint()


@pytest.fixture
def digit_png(tmp_path: Path) -> Path:
    from sklearn.datasets import load_digits

    img = np.rint(load_digits().images[1700] * 255 / 16).astype(np.uint8)
    path = tmp_path / "digit.png"
    Image.fromarray(img).resize((32, 32)).save(path)  # another size than the training data
    return path


def test_predict_json_has_prediction_and_evidence(tiny_run: Path, digit_png: Path, tmp_path: Path,
                                                  capsys) -> None:
    rgb = tmp_path / "digit_rgb.jpg"
    Image.open(digit_png).convert("RGB").save(rgb)
    npy = tmp_path / "digit.npy"
    np.save(npy, np.asarray(Image.open(digit_png)).astype(np.float32) / 255.0)
    for image in (digit_png, rgb, npy):
        code, out, _ = run_cli(capsys, "predict", str(tiny_run), str(image), "--json")
        assert code == 0
        obj = json.loads(out)
        assert 0 <= obj["prediction"] < 10
        assert len(obj["neighbours"]) == 4  # the tiny profile's K
        n = obj["neighbours"][0]
        assert {"id", "label", "similarity", "weight"} <= set(n)
        sims = [x["similarity"] for x in obj["neighbours"]]
        assert sims == sorted(sims, reverse=True)
        assert sum(x["weight"] for x in obj["neighbours"]) == pytest.approx(1.0, abs=1e-4)
    for mode in ("softmax_fusion", "rank_fusion"):
        code, out, _ = run_cli(capsys, "predict", str(tiny_run), str(digit_png), "--mode", mode, "--json")
        assert code == 0 and json.loads(out)["mode"] == mode
    code, out, _ = run_cli(capsys, "predict", str(tiny_run), str(digit_png))
    assert code == 0 and "similarity" in out


def test_predict_says_how_it_searched_and_search_ivf_is_honoured(tiny_run: Path, digit_png: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, "predict", str(tiny_run), str(digit_png), "--json")
    assert code == 0 and json.loads(out)["search"]["mode"] == "exact"  # a small bank: auto is exact
    code, out, _ = run_cli(capsys, "predict", str(tiny_run), str(digit_png), "--search", "ivf", "--json")
    how = json.loads(out)["search"]
    assert code == 0 and how["mode"] == "ivf" and how["nprobe"] < how["nlist"]
    assert how["recall_at_10_validation"] >= 0.95
    code, out, _ = run_cli(capsys, "predict", str(tiny_run), str(digit_png), "--search", "ivf")
    assert code == 0 and "search: ivf" in out and "recall@10" in out
    with pytest.raises(SystemExit):  # argparse refuses a mode it does not know
        run_cli(capsys, "predict", str(tiny_run), str(digit_png), "--search", "fast")


def test_forget_then_evaluate_and_deleted_ids_never_retrieved(tiny_run: Path, digit_png: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, "evaluate", str(tiny_run), "--json")
    assert code == 0
    before = json.loads(out)
    assert before["FA"] is None and before["MIA"] is None and 0 <= before["TA"] <= 100
    assert {"TA", "RA", "FA", "MIA", "Ps", "MIA_attack"} <= set(before)
    size = before["bank_size"]
    code, out, _ = run_cli(capsys, "forget", str(tiny_run), *OP, "--random-fraction", "0.1", "--seed", "1", "--json")
    assert code == 0
    res = json.loads(out)
    assert len(res["deleted"]) == round(0.1 * size) and res["bank_size"] == size - len(res["deleted"])
    code, out, _ = run_cli(capsys, "evaluate", str(tiny_run), "--json")
    after = json.loads(out)
    assert after["FA"] is not None and after["MIA"] is not None and after["n_forget"] == len(res["deleted"])
    code, out, _ = run_cli(capsys, "predict", str(tiny_run), str(digit_png), "--k", "200", "--json")
    assert not {n["id"] for n in json.loads(out)["neighbours"]} & set(res["deleted"])
    for ck in (tiny_run / "checkpoints").glob("*.pt"):
        assert not set(load_checkpoint(ck)["ids"].tolist()) & set(res["deleted"])
    # deleting again is reported, not an error
    code, out, _ = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids", ",".join(map(str, res["deleted"][:2])), "--json")
    assert code == 0 and json.loads(out)["deleted"] == [] and len(json.loads(out)["already_deleted"]) == 2
    assert json.loads(out)["request_id"] and Path(json.loads(out)["receipt"]).is_file()


def test_forget_by_ids_and_ids_file(tiny_run: Path, tmp_path: Path, capsys) -> None:
    ids = load_bank(tiny_run).ids[:5].tolist()
    code, out, _ = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids", f"{ids[0]},{ids[1]}", "--json")
    assert code == 0 and json.loads(out)["deleted"] == ids[:2]
    f = tmp_path / "ids.csv"
    f.write_text("id\n" + "\n".join(map(str, ids[2:])) + "\n")
    code, out, _ = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids-file", str(f), "--json")
    assert code == 0 and json.loads(out)["deleted"] == ids[2:]
    forgotten = json.loads((tiny_run / "forgotten.json").read_text())
    assert forgotten["ids"] == ids and len(forgotten["requests"]) == 2


@pytest.mark.parametrize("args, message", [
    (["--ids", "999999"], "not training samples"),
    (["--ids", "1,banana"], "malformed"),
    (["--ids", ""], "names no sample id"),
    (["--random-fraction", "1.5"], "between 0 and 1"),
])
def test_bad_forget_requests_change_nothing(tiny_run: Path, capsys, args: list[str], message: str) -> None:
    before = _bank_fingerprint(tiny_run)
    code, out, err = run_cli(capsys, "forget", str(tiny_run), *OP, *args)
    assert code == 2 and message in err and "Traceback" not in err and out == ""
    assert _bank_fingerprint(tiny_run) == before
    assert not (tiny_run / "forgotten.json").exists()


def test_unknown_id_among_good_ones_refuses_the_whole_request(tiny_run: Path, capsys) -> None:
    good = int(load_bank(tiny_run).ids[0])
    code, _, err = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids", f"{good},424242")
    assert code == 2 and "424242" in err
    assert good in load_bank(tiny_run)


def test_binary_ids_file_is_refused(tiny_run: Path, tmp_path: Path, capsys) -> None:
    f = tmp_path / "ids.bin"
    f.write_bytes(bytes(range(256)))
    code, _, err = run_cli(capsys, "forget", str(tiny_run), *OP, "--ids-file", str(f))
    assert code == 2 and "not a text file" in err


def test_forget_requires_a_named_operator(tiny_run: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["forget", str(tiny_run), "--ids", "1"])
    assert exc.value.code == 2 and "--operator" in capsys.readouterr().err
    code, _, err = run_cli(capsys, "forget", str(tiny_run), "--operator", "  ", "--ids", "1")
    assert code == 2 and "Name the operator" in err


def test_errors_for_missing_run_bad_image_and_damaged_bank(tiny_run: Path, tmp_path: Path, digit_png: Path,
                                                           capsys) -> None:
    code, _, err = run_cli(capsys, "evaluate", str(tmp_path / "nowhere"))
    assert code == 2 and "does not exist" in err
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"definitely not a png")
    code, _, err = run_cli(capsys, "predict", str(tiny_run), str(bad))
    assert code == 2 and "not a readable image" in err
    code, _, err = run_cli(capsys, "predict", str(tiny_run), str(tmp_path / "missing.png"))
    assert code == 2 and "does not exist" in err
    data = (tiny_run / "bank.store").read_bytes()
    (tiny_run / "bank.store").write_bytes(data[:100])
    code, _, err = run_cli(capsys, "predict", str(tiny_run), str(digit_png))
    assert code == 2 and "damaged" in err and "Traceback" not in err


def test_train_errors(tmp_path: Path, tiny_run: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "train", "--dataset", "no-such-set", "--out", str(tmp_path / "r"))
    assert code == 2 and "digits" in err  # lists the available datasets
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--profile", "huge", "--out", str(tmp_path / "r"))
    assert code == 2 and "Unknown profile" in err
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--out", str(tiny_run))
    assert code == 2 and "already holds a run" in err


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "munkey"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "forget" in out.stdout


@pytest.mark.parametrize("command", [["evaluate"], ["select"], ["forget", "--ids", "1", *OP]])
def test_negative_max_samples_is_a_usage_error_not_a_traceback(tiny_run: Path, capsys, command: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command[0], str(tiny_run), *command[1:], "--max-samples", "-1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--max-samples: must be a whole number of 0 or more" in err and "Traceback" not in err
    assert not (tiny_run / "forgotten.json").exists()


def test_every_help_page_formats() -> None:
    """`munkey CMD --help` and `munkey bench NAME --help` print help, never a traceback (argparse
    %-formats help strings: a literal '%' in one crashed `munkey bench duplicates --help`)."""
    from munkey_core.bench import BENCHMARKS
    from munkey_core.cli import build_parser

    def sub_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(actions[0].choices) if actions else {}

    top = build_parser(["bench"])
    commands = sub_parsers(top)
    assert {"train", "forget", "evaluate", "bench"} <= set(commands)
    for name, parser in commands.items():
        assert parser.format_help().startswith("usage:"), name
    benches = sub_parsers(commands["bench"])
    assert set(benches) == set(BENCHMARKS)
    for name, parser in benches.items():
        assert parser.format_help().startswith("usage:"), name


def test_a_command_parses_and_helps_the_same_with_its_parser_alone() -> None:
    """build_parser builds only the parser of the command the command line names: the same namespace
    and the same help as the parser of every command."""
    from munkey_core.cli import build_parser

    full = build_parser([])
    lines = [["forget", "runs/x", "--ids", "1,2", "--ids", "3", "--no-evaluate", "--operator", "dana", "--json"],
             ["forget", "runs/x", "--random-fraction", "0.1", "--seed", "3", "--max-samples", "50", "--operator", "a"],
             ["train", "--dataset", "digits", "--out", "runs/y", "--epochs", "2"],
             ["audit", "verify", "runs/x"], ["evaluate", "runs/x", "--max-samples", "10"],
             ["unact", "runs/x", "--class", "2", "--method", "keys"]]
    for argv in lines:
        assert build_parser(argv).parse_args(argv) == full.parse_args(argv), argv
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("forget", "train", "audit", "predict", "select", "demo", "unact", "evaluate"):
        alone = next(a for a in build_parser([name])._actions if isinstance(a, argparse._SubParsersAction)).choices
        assert list(alone) == [name] and alone[name].format_help() == sub[name].format_help(), name


def test_output_piped_into_a_reader_that_stops_early_ends_quietly(tiny_run: Path, digit_png: Path) -> None:
    """`munkey predict RUN *.png | head -1`: the reader closes the pipe after one line; the command stops
    with 141 (128 + SIGPIPE) and no traceback (it was a BrokenPipeError traceback and exit 1)."""
    exe = Path(sys.executable).parent / "munkey"
    proc = subprocess.Popen([str(exe), "predict", str(tiny_run), *[str(digit_png)] * 400],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"search:")
    proc.stdout.close()  # what `head -1` does: 400 images' evidence (~400 KB) cannot fit the pipe's buffer
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141 and b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_train_says_when_forgetting_was_not_measured_for_its_profile(tmp_path: Path, capsys) -> None:
    """A run of a profile and dataset never measured against retraining (here the test profile; on a GPU the
    auto profile, vit-tiny) ends with a note saying so and naming the command that measures it; the
    measured pairs (the cpu profile on digits, Fashion-MNIST, ELPV) get none."""
    from munkey_core.config import forgetting_note

    code, out, _ = run_cli(capsys, "train", "--dataset", "digits", "--profile", "tiny", "--epochs", "1",
                           "--out", str(tmp_path / "r"))
    assert code == 0 and "not been measured for the tiny profile on digits" in out
    assert "munkey evaluate RUN --oracle --noise-floor 2" in out
    assert "vit-tiny profile on digits" in forgetting_note("vit-tiny", "digits")
    assert [forgetting_note("cpu", d) for d in ("digits", "fashion-mnist", "elpv")] == [None] * 3
    assert forgetting_note("cpu", "cifar10") is not None
    # a measured pair with the recipe changed: the run's config against the profile's recipe, seeds aside
    from munkey_core.config import PROFILES, asdict, recipe_changes

    prof = PROFILES["cpu"]
    config = {"profile": "cpu", "dataset": "digits", "model": {**asdict(prof.model_for("digits")), "num_classes": 10},
              "train": {**asdict(prof.train_for("digits")), "seed": 7}}
    assert recipe_changes(config) == {}  # the shipped recipe (shift 0.2, skip 0.15) with another seed
    config["train"]["absent_skip_hardest"], config["train"]["epochs"] = 0.0, 5
    assert recipe_changes(config) == {"absent_skip_hardest": 0.0, "epochs": 5}
    said = forgetting_note("cpu", "digits", recipe_changes(config))
    assert "not with this run's changes (absent_skip_hardest 0.0, epochs 5)" in said
    # a training-set cap that selects the same images is no change: digits' 1,258 images under any cap above
    config = {**config, "train": {**asdict(prof.train_for("digits"))}, "train_size": 1258, "excluded_ids": 0}
    for cap in (0, 1259, 20000):  # (a cap of exactly 1,258 reads as a change: the config cannot say it did not bind)
        assert recipe_changes({**config, "train": {**config["train"], "max_train": cap}}) == {}, cap
    assert recipe_changes({**config, "train": {**config["train"], "max_train": 600}, "train_size": 600}) == {
        "max_train": 600}  # a cap that bound: other images
    fashion = {"profile": "cpu", "dataset": "fashion-mnist", "train_size": 54000, "excluded_ids": 0,
               "model": asdict(prof.model_for("fashion-mnist")),
               "train": {**asdict(prof.train_for("fashion-mnist")), "max_train": 0}}
    assert recipe_changes(fashion) == {"max_train": 0}  # the whole split, where the profile takes 10,000
    assert "max_train 0 (every training image)" in forgetting_note("cpu", "fashion-mnist", {"max_train": 0})
