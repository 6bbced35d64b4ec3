"""Random-forgetting oracles on a real tiny digits run: retrained without the forget set, cached, compared."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from munkey_core.data import datasets as data_mod
from munkey_core.cli import main
from munkey_core.errors import MunkeyError
from munkey_core.eval.oracles import eval_sets, forget_tag, gaps, oracle_path
from munkey_core.run.rows import bank_ids


def test_forget_tag_names_the_set_not_its_order() -> None:
    assert forget_tag([3, 1, 2]) == forget_tag([1, 2, 3])
    assert forget_tag([1, 2, 3]) != forget_tag([1, 2, 4])
    p = oracle_path("RUN", [1, 2], "munkey")
    assert p.parent == Path("RUN/oracles") and p.name.startswith("random_") and p.name.endswith("_munkey")
    assert oracle_path("RUN", [1, 2], "vit").name.endswith("_vit")
    with pytest.raises(MunkeyError):
        oracle_path("RUN", [1], "resnet")


def test_eval_sets_split_retain_and_forget() -> None:
    ds = data_mod.load_dataset("digits", seed=0)
    forget = ds.train.ids[:50]
    s = eval_sets(ds, forget, max_samples=0, also_deleted=ds.train.ids[50:60])
    assert np.array_equal(ds.train.ids[s.forget], forget)
    assert len(s.retain) == len(ds.train) - 60 and not np.isin(ds.train.ids[s.retain], ds.train.ids[:60]).any()
    assert len(s.test) == len(ds.test)
    capped = eval_sets(ds, forget, max_samples=20, seed=1)
    assert len(capped.retain) == len(capped.forget) == len(capped.test) == 20


def test_gaps_hand_case() -> None:
    g = gaps({"TA": 90, "RA": 99, "FA": 80, "MIA": 55}, {"TA": 91, "RA": 99, "FA": 84, "MIA": 50})
    assert g["gap_TA"] == 1 and g["gap_FA"] == 4 and g["AvgGap"] == pytest.approx(2.5)
    assert gaps({"TA": 1, "RA": 1, "FA": None, "MIA": None}, {"TA": 1, "RA": 1, "FA": 1, "MIA": 50})["AvgGap"] is None


def test_evaluate_oracle_trains_once_and_reports_gaps(tiny_run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["evaluate", str(tiny_run), "--oracle", "--json"]) == 2  # nothing deleted yet
    assert "Nothing has been deleted" in capsys.readouterr().err
    assert main(["forget", str(tiny_run), "--random-fraction", "0.1", "--seed", "0", "--operator", "t",
                 "--no-evaluate", "--json"]) == 0
    deleted = json.loads(capsys.readouterr().out)["deleted"]
    assert main(["evaluate", str(tiny_run), "--oracle", "--json", "--max-samples", "0"]) == 0
    first = json.loads(capsys.readouterr().out)
    oracle = Path(first["oracle_path"])
    assert first["oracle_trained"] and oracle == oracle_path(tiny_run, deleted, "munkey")
    cfg = json.loads((oracle / "config.json").read_text())
    assert cfg["excluded_ids"] == len(deleted) and cfg["train_size"] == first["n_retain"]
    assert not np.isin(bank_ids(oracle), deleted).any()  # the oracle never saw a forget-set sample
    assert first["n_forget_evaluated"] == len(deleted)
    g = [first[f"gap_{k}"] for k in ("TA", "RA", "FA", "MIA")]
    assert first["AvgGap"] == pytest.approx(sum(g) / 4)
    assert first["gap_TA"] == pytest.approx(abs(first["run"]["TA"] - first["oracle"]["TA"]))
    # the same forget set again: the cached oracle, the same numbers
    assert main(["evaluate", str(tiny_run), "--oracle", "--json", "--max-samples", "0"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert not second["oracle_trained"] and second["oracle"] == first["oracle"] and second["run"] == first["run"]
    # the noise floor: one more M-oracle, another training seed, the same split and forget set
    assert main(["evaluate", str(tiny_run), "--oracle", "--json", "--max-samples", "0", "--noise-floor", "1"]) == 0
    third = json.loads(capsys.readouterr().out)
    (twin,) = third["noise_floor"]["oracles"]
    assert twin["trained"] and twin["train_seed"] == 1000
    assert Path(twin["path"]) == oracle_path(tiny_run, deleted, "munkey", 1000) != oracle
    twin_cfg = json.loads((Path(twin["path"]) / "config.json").read_text())
    assert twin_cfg["train"]["seed"] == 1000 and twin_cfg["train"]["split_seed"] == cfg["train"]["seed"] == 0
    assert sorted(bank_ids(Path(twin["path"]))) == sorted(bank_ids(oracle))  # the same retain set
    assert (Path(twin["path"]) / "model.pt").read_bytes() != (oracle / "model.pt").read_bytes()
    expect = sum(abs(twin["metrics"][k] - third["oracle"][k]) for k in ("TA", "RA", "FA", "MIA")) / 4
    assert twin["AvgGap"] == pytest.approx(expect) == third["noise_floor"]["AvgGap"]
    assert third["oracle"] == first["oracle"] and not third["oracle_trained"]
    # the verdict: within floor + 0.3 or not, from the numbers printed beside it; within it, "forgotten" only
    # where the positive control (the run had the deleted samples read like the ones it holds) is not
    bar = third["noise_floor"]["AvgGap"] + 0.3
    want = "not yet" if third["AvgGap"] > bar else "cannot tell" if third["control"]["AvgGap"] <= bar else "forgotten"
    assert third["verdict"]["verdict"] == want and first["verdict"]["verdict"] == "cannot tell"
    # what a screen reads: the stored oracles only (the M-oracle and its one twin), nothing trained
    from munkey_core.eval.oracles import stored_oracle_comparison
    from munkey_core.service import MunkeyRun

    before = sorted(p.name for p in oracle.parent.iterdir())
    stored = stored_oracle_comparison(MunkeyRun(tiny_run, device="cpu"), max_samples=0)
    assert sorted(p.name for p in oracle.parent.iterdir()) == before
    assert stored["oracle"] == third["oracle"] and stored["AvgGap"] == pytest.approx(third["AvgGap"])
    assert [f["train_seed"] for f in stored["noise_floor"]["oracles"]] == [1000]
    assert not any(f["trained"] for f in stored["noise_floor"]["oracles"]) and not stored["oracle_trained"]
    # one more deletion: no oracle holds exactly these deletions, so there is nothing to compare with
    more = [int(i) for i in bank_ids(tiny_run)[:1]]
    assert main(["forget", str(tiny_run), "--ids", str(more[0]), "--operator", "t", "--no-evaluate", "--json"]) == 0
    capsys.readouterr()
    assert stored_oracle_comparison(MunkeyRun(tiny_run, device="cpu"), max_samples=0) is None


def test_split_seed_fixes_the_data_while_the_training_seed_varies(cache_dir: Path, tmp_path: Path) -> None:
    from munkey_core.config import TrainConfig
    from munkey_core.service import MunkeyRun, train_run

    assert TrainConfig(seed=3).data_seed == 3 and TrainConfig(seed=3, split_seed=0).data_seed == 0
    runs = {}
    for name, over in {"a": {"seed": 0}, "b": {"seed": 7, "split_seed": 0}, "c": {"seed": 7}}.items():
        train_run("digits", tmp_path / name, profile="tiny", device="cpu", progress=False,
                  overrides={"epochs": 1, **over})
        runs[name] = MunkeyRun(tmp_path / name, device="cpu")
    ids = {k: sorted(bank_ids(tmp_path / k)) for k in runs}
    assert ids["a"] == ids["b"] != ids["c"]  # the split follows split_seed, else seed (as before)
    assert np.array_equal(runs["b"].dataset.train.ids, data_mod.load_dataset("digits", seed=0).train.ids)
    assert runs["a"].model_fingerprint != runs["b"].model_fingerprint  # trained differently
