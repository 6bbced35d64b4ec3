"""Late injection as a run option (ModelConfig.inject_at) on real tiny digits runs: inject_at 0 is the
paper's formula bit for bit, a late run trains, saves, reloads and predicts the same, its M-oracle and
the fidelity bench keep the design, the pathway ablations use the shared path, bad values are refused."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from munkey_core.cli import main
from munkey_core.config import PROFILES, ModelConfig, with_overrides
from munkey_core.errors import MunkeyError
from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
from munkey_core.model.predict import predict
from munkey_core.service import MunkeyRun
from munkey_core.training.train import TrainData, train_munkey

TINY = PROFILES["tiny"]  # depth 2: inject_at 1 is the only late design


@pytest.fixture(scope="module")
def late_run(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny digits run with the exemplar token joining at block 1, trained through the CLI (do not modify)."""
    out = tmp_path_factory.mktemp("late") / "run"
    assert main(["train", "--dataset", "digits", "--profile", "tiny", "--device", "cpu", "--epochs", "15",
                 "--inject-at", "1", "--out", str(out)]) == 0
    return out


def test_inject_at_zero_is_the_paper_formula_bit_for_bit() -> None:
    torch.manual_seed(0)
    model = MunkeyViT(TINY.model).eval()
    assert model.inject_at == 0 and TINY.model.inject_at == 0
    x = torch.randn(3, 1, 16, 16)
    v = torch.randn(3, 4, TINY.model.exemplar_dim)
    vit = model.vit
    with torch.no_grad():
        for j in range(4):  # the paper: every block on [CLS, patches, h(v)]
            tokens = torch.cat([model.embed_image(x), model.exemplar_token(v[:, j])], dim=1)
            paper = model.forward_head(vit.norm(vit.blocks(vit.norm_pre(tokens))))
            assert torch.equal(model(x, v[:, j]), paper)
            # forward_multi runs all K neighbours as one (B*K) batch: the same formula, but BLAS may
            # block a batch of another shape differently, so equal up to float32 rounding only.
            assert torch.allclose(model.forward_multi(x, v)[:, j], paper, rtol=0, atol=1e-6)


def test_late_model_is_not_the_paper_model_with_the_same_weights() -> None:
    torch.manual_seed(0)
    paper = MunkeyViT(TINY.model).eval()
    late = MunkeyViT(replace(TINY.model, inject_at=1)).eval()
    late.load_state_dict(paper.state_dict())  # same parameters: the design is not in the weights
    x, v = torch.randn(2, 1, 16, 16), torch.randn(2, 3, TINY.model.exemplar_dim)
    with torch.no_grad():
        assert not torch.allclose(late.forward_multi(x, v), paper.forward_multi(x, v))


def test_late_run_trains_saves_reloads_and_predicts_the_same(late_run: Path) -> None:
    run = MunkeyRun(late_run, device="cpu")
    assert run.config["model"]["inject_at"] == 1 and run.model.inject_at == 1
    assert run.summary()["design"].startswith("late injection")
    ds = run.dataset
    # the same recipe trained in memory (validation does not touch the random stream) gives the saved run
    mem = train_munkey(run.model_cfg, run.train_cfg, TrainData(ds.train.images, ds.train.labels, ds.train.ids,
                                                                run.split_keys("train")), progress=False)
    for name, tensor in mem.model.state_dict().items():
        torch.testing.assert_close(run.model.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    idx = np.arange(64)
    keys = run.split_keys("test")[idx]
    loaded = run.predict_prepared(ds.test.images[idx], keys)
    x = preprocess_images(torch.from_numpy(ds.test.images[idx]), run.model_cfg.img_size)
    fresh = predict(mem.model, mem.bank, x, keys, k=run.train_cfg.k, tau=run.train_cfg.tau)
    np.testing.assert_array_equal(loaded.probs, fresh.probs)
    np.testing.assert_array_equal(loaded.neighbour_preds, fresh.neighbour_preds)
    assert (loaded.labels == ds.test.labels[idx]).mean() > 0.3  # it learned (chance: 0.1)


def test_old_run_without_the_field_loads_as_the_paper_design(tiny_run: Path) -> None:
    before = MunkeyRun(tiny_run, device="cpu")
    ds = before.dataset
    idx = np.arange(32)
    want = before.predict_prepared(ds.test.images[idx], before.split_keys("test")[idx]).probs
    cfg_path = tiny_run / "config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["model"]["inject_at"]
    cfg_path.write_text(json.dumps(cfg))
    old = MunkeyRun(tiny_run, device="cpu")
    assert old.model_cfg.inject_at == 0
    np.testing.assert_array_equal(old.predict_prepared(ds.test.images[idx], old.split_keys("test")[idx]).probs, want)


def test_pathway_ablations_of_a_late_model_equal_plain_forwards(late_run: Path) -> None:
    """Ps's ablations: null_img must replace the patches *before* the shared blocks, null_tok the token."""
    run = MunkeyRun(late_run, device="cpu")
    ds, m, k, tau = run.dataset, run.model, run.train_cfg.k, run.train_cfg.tau
    idx = np.arange(40)
    keys = run.split_keys("test")[idx]
    x = preprocess_images(torch.from_numpy(ds.test.images[idx]), run.model_cfg.img_size)
    sims, rows = run.bank.search(torch.as_tensor(keys), k)
    w = torch.softmax(sims / tau, dim=1)
    v = run.bank.values[rows]  # (B, K, Dv)
    ones = torch.ones(len(idx), dtype=torch.bool)
    with torch.no_grad():
        token_only = sum(w[:, j, None] * torch.softmax(m(x, v[:, j], drop_image=ones), -1) for j in range(k))
        image_only = torch.softmax(m(x, (w[..., None] * v).sum(1), drop_token=ones), -1)
    got_tok = run.predict_prepared(ds.test.images[idx], keys, pathway="token", neighbour_predictions=False).probs
    got_img = run.predict_prepared(ds.test.images[idx], keys, pathway="image", neighbour_predictions=False).probs
    np.testing.assert_allclose(got_tok, token_only.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_img, image_only.numpy(), rtol=1e-4, atol=1e-5)
    result = run.evaluate(max_samples=200, record=False)
    assert result["Ps"] is not None and 0 <= result["A_img"] <= 100 and 0 <= result["A_tok"] <= 100


def test_the_m_oracle_of_a_late_run_is_late(late_run: Path) -> None:
    from munkey_core.eval.oracles import train_oracle

    run = MunkeyRun(late_run, device="cpu")
    ids = run.bank.ids[:30].tolist()
    root = late_run.parent / "oracle_owner"  # oracles are written inside a run folder: use a scratch one
    path, trained = train_oracle(run.config, root, ids, "munkey", device="cpu", progress=False)
    oracle = MunkeyRun(path, device="cpu")
    assert trained and oracle.model.inject_at == 1 and oracle.config["model"] == {**run.config["model"]}
    assert not np.isin(oracle.bank.ids, ids).any()


def test_bad_inject_at_is_a_clear_user_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for bad in ("2", "-1"):  # tiny has depth 2: valid values are 0 and 1
        assert main(["train", "--dataset", "digits", "--profile", "tiny", "--inject-at", bad,
                     "--out", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert "--inject-at" in err and "between 0 and 1" in err and "depth 2" in err
        assert not (tmp_path / bad).exists()
    assert main(["train", "--arch", "vit", "--profile", "tiny", "--inject-at", "1", "--out", str(tmp_path / "v")]) == 2
    assert "MUNKEY option" in capsys.readouterr().err
    assert main(["bench", "fidelity", "--profile", "tiny", "--inject-at", "3", "--work", str(tmp_path / "w")]) == 2
    assert "--inject-at" in capsys.readouterr().err
    with pytest.raises(MunkeyError, match="inject_at"):
        ModelConfig(depth=4, inject_at=4)
    with pytest.raises(MunkeyError, match="inject_at"):
        with_overrides(TINY.model, {"inject_at": 2})


def test_distributed_launcher_honours_inject_at(late_run: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    """One process (no torchrun): the launcher writes a late run; keys come from the session's cache."""
    from munkey_core.training.distributed import main as ddp_main

    out = tmp_path / "ddp"
    assert ddp_main(["--dataset", "digits", "--profile", "tiny", "--epochs", "1", "--device", "cpu",
                     "--inject-at", "1", "--out", str(out)]) == 0
    assert MunkeyRun(out, device="cpu").model.inject_at == 1
    assert ddp_main(["--dataset", "digits", "--profile", "tiny", "--inject-at", "2", "--out",
                     str(tmp_path / "bad")]) == 2
    assert "--inject-at" in capsys.readouterr().out


def test_bench_fidelity_late_variant_munkey_rows_only(cache_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    argv = ["bench", "fidelity", "--dataset", "digits", "--profile", "tiny", "--seed-list", "0", "--rates", "0.1",
            "--epochs", "3", "--mia", "cheap", "--methods", "", "--floor-oracles", "0", "--inject-at", "1", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "trained 2 model(s)" in out  # the late MUNKEY and its M-oracle; no ViT, T-oracle or references
    assert "--methods is empty" in out and "late injection at block 1" in out
    root = tmp_path / "work" / "digits_tiny_late1" / "seed_0"
    names = {p.name for p in root.iterdir()}
    assert {"munkey", "rate_0.1.json"} <= names and not names & {"vit", "refs"}
    assert not (tmp_path / "work" / "digits_tiny").exists()  # never the paper design's folder
    (oracle,) = (root / "munkey" / "oracles").iterdir()
    assert json.loads((oracle / "config.json").read_text())["model"]["inject_at"] == 1
    rows = list(csv.DictReader(open(tmp_path / "out" / "fidelity_digits.csv")))
    assert [r["method"] for r in rows] == ["Retrain (M-oracle, late@1)", "MUNKEY, no unlearning (positive control)",
                                           "MUNKEY (key deletion, late@1)"]
    assert float(rows[0]["AvgGap"]) == 0.0 and rows[2]["AvgGap"] != ""
    assert "late injection at block 1" in (tmp_path / "out" / "fidelity_digits.md").read_text()
