"""Training on tiny real data: learning happens, stop-grad on retrieval simulation, checkpoints, seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from munkey_core.config import ModelConfig, TrainConfig
from munkey_core.bank.memory import MemoryBank
from munkey_core.run.rows import load_checkpoint
from munkey_core.training.train import TrainData, _sample_tokens, cosine_schedule, neighbour_table, train_munkey

MODEL = ModelConfig(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=2,
                    exemplar_dim=16)


@pytest.fixture(scope="module")
def digits() -> TrainData:
    d = load_digits()
    images = np.rint(d.images * 255 / 16).astype(np.uint8)[..., None]
    keys = d.data.astype(np.float32) - d.data.mean(0)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    return TrainData(images, d.target.astype(np.int64), np.arange(len(d.target), dtype=np.int64), keys)


def _subset(d: TrainData, idx: np.ndarray) -> TrainData:
    return TrainData(d.images[idx], d.labels[idx], d.ids[idx], d.keys[idx])


def test_training_learns_and_writes_checkpoints(digits: TrainData, tmp_path) -> None:
    train, val = _subset(digits, np.arange(0, 600)), _subset(digits, np.arange(1500, 1700))
    cfg = TrainConfig(epochs=8, batch_size=16, lr=2e-3, warmup_epochs=0.5, k=4, k_train=4, seed=0)
    res = train_munkey(MODEL, cfg, train, val=val, checkpoint_dir=tmp_path / "ck", keep_checkpoints=3, progress=False)
    assert [h["epoch"] for h in res.history] == list(range(1, 9))
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    assert res.history[-1]["val_acc"] > 60  # chance is 10
    assert sorted(p.name for p in (tmp_path / "ck").glob("*.pt")) == ["epoch_006.pt", "epoch_007.pt", "epoch_008.pt"]
    assert sorted(p.name for p in (tmp_path / "ck").glob("*.rows")) == ["epoch_006.rows", "epoch_007.rows",
                                                                        "epoch_008.rows"]
    ck = load_checkpoint(tmp_path / "ck" / "epoch_008.pt")
    assert torch.equal(ck["values"], res.bank.values) and set(ck["ids"].tolist()) == set(range(600))
    assert set(res.bank.moments) == {"exp_avg", "exp_avg_sq"}
    assert res.bank.moments["exp_avg_sq"].shape == res.bank.values.shape


def test_training_is_deterministic_given_the_seed(digits: TrainData) -> None:
    train = _subset(digits, np.arange(0, 200))
    cfg = TrainConfig(epochs=1, batch_size=32, k=4, k_train=4, seed=3)
    a = train_munkey(MODEL, cfg, train, progress=False)
    b = train_munkey(MODEL, cfg, train, progress=False)
    assert torch.equal(a.bank.values, b.bank.values)
    for (n, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(p, q), n


def test_neighbour_table_excludes_self(digits: TrainData) -> None:
    bank = MemoryBank.create(digits.ids[:100], digits.labels[:100], digits.keys[:100], 4)
    rows, w = neighbour_table(bank, 5, 0.05)
    assert rows.shape == (100, 5)
    assert not (rows == torch.arange(100)[:, None]).any()
    torch.testing.assert_close(w.sum(1), torch.ones(100))


def test_retrieval_simulation_stops_gradients_into_neighbours() -> None:
    values = torch.nn.Parameter(torch.randn(10, 4))
    nbr_rows = torch.tensor([[(i + 1) % 10, (i + 2) % 10] for i in range(10)])
    nbr_w = torch.full((10, 2), 0.5)
    idx = torch.tensor([0, 5])
    gen = torch.Generator().manual_seed(0)
    always = TrainConfig(p_retrieval=1.0, p_drop_image=0.0, p_drop_token=0.0)
    token, _, _ = _sample_tokens(values, idx, nbr_rows, nbr_w, always, gen)
    torch.testing.assert_close(token, 0.5 * (values[[1, 6]] + values[[2, 7]]).detach())
    token.sum().backward()
    assert values.grad is None or not values.grad.any()  # neighbours receive no gradient
    values.grad = None
    never = TrainConfig(p_retrieval=0.0, p_drop_image=0.0, p_drop_token=0.0)
    token, _, _ = _sample_tokens(values, idx, nbr_rows, nbr_w, never, gen)
    token.sum().backward()
    assert set(torch.nonzero(values.grad.abs().sum(1)).ravel().tolist()) == {0, 5}  # only its own rows


def test_pathway_dropout_rates() -> None:
    values = torch.zeros(10, 4)
    cfg = TrainConfig(p_retrieval=0.0, p_drop_image=0.3, p_drop_token=0.2)
    idx = torch.zeros(20000, dtype=torch.long)
    _, di, dt = _sample_tokens(values, idx, torch.zeros(10, 1, dtype=torch.long), torch.ones(10, 1), cfg,
                               torch.Generator().manual_seed(0))
    assert not (di & dt).any()
    assert di.float().mean().item() == pytest.approx(0.3, abs=0.015)
    assert dt.float().mean().item() == pytest.approx(0.2, abs=0.015)


def test_cosine_schedule_warms_up_then_decays() -> None:
    f = cosine_schedule(100, 10)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.5, abs=0.01) and f(100) == pytest.approx(0.0, abs=1e-9)
