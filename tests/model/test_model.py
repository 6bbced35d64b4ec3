"""MUNKEY ViT forward, pathway null tokens, the three aggregation modes and their evidence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from munkey_core.config import ModelConfig
from munkey_core.errors import MunkeyError
from munkey_core.bank.memory import MemoryBank
from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
from munkey_core.model.predict import predict

CFG = ModelConfig(img_size=16, patch_size=4, in_chans=1, num_classes=3, embed_dim=32, depth=2, num_heads=2,
                  exemplar_dim=8)


@pytest.fixture
def model() -> MunkeyViT:
    torch.manual_seed(0)
    return MunkeyViT(CFG).eval()


@pytest.fixture
def bank() -> MemoryBank:
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(20, 6)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    return MemoryBank(np.arange(100, 120), np.arange(20) % 3, keys, rng.normal(size=(20, 8)).astype(np.float32))


def test_preprocess_resizes_and_scales() -> None:
    imgs = torch.full((2, 8, 8, 1), 255, dtype=torch.uint8)
    x = preprocess_images(imgs, 16)
    assert x.shape == (2, 1, 16, 16) and torch.allclose(x, torch.ones_like(x))


def test_forward_shapes_and_null_pathways(model: MunkeyViT) -> None:
    x, x2 = torch.randn(4, 1, 16, 16), torch.randn(4, 1, 16, 16)
    v, v2 = torch.randn(4, 8), torch.randn(4, 8)
    assert model(x, v).shape == (4, 3)
    on = torch.ones(4, dtype=torch.bool)
    # image dropped: the output no longer depends on the pixels
    torch.testing.assert_close(model(x, v, drop_image=on), model(x2, v, drop_image=on))
    # token dropped: the output no longer depends on the exemplar
    torch.testing.assert_close(model(x, v, drop_token=on), model(x, v2, drop_token=on))
    # and both pathways matter when on
    assert not torch.allclose(model(x, v), model(x2, v))
    assert not torch.allclose(model(x, v), model(x, v2))


def test_forward_multi_matches_single_forwards(model: MunkeyViT) -> None:
    x, v = torch.randn(3, 1, 16, 16), torch.randn(3, 5, 8)
    multi = model.forward_multi(x, v)
    for j in range(5):
        torch.testing.assert_close(multi[:, j], model(x, v[:, j]), rtol=1e-4, atol=1e-5)


def test_ensemble_is_the_weighted_mean_of_neighbour_forwards(model: MunkeyViT, bank: MemoryBank) -> None:
    x = torch.randn(2, 1, 16, 16)
    q = bank.keys[[3, 7]]
    p = predict(model, bank, x, q, k=4, tau=0.1)
    assert p.neighbour_ids[0, 0] == 103 and p.neighbour_ids[1, 0] == 107  # own key is nearest
    sims, rows = bank.search(q, 4)
    w = torch.softmax(sims / 0.1, dim=1)
    per = torch.softmax(model.forward_multi(x, bank.values[rows]), dim=-1)
    np.testing.assert_allclose(p.probs, (w[..., None] * per).sum(1).detach().numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(p.weights.sum(1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(p.neighbour_preds, per.argmax(-1).numpy())
    n = p.neighbours(0)
    assert len(n) == 4 and n[0].id == 103 and n[0].label == 3 % 3 and n[0].similarity == pytest.approx(1.0)


@pytest.mark.parametrize("mode", ["softmax_fusion", "rank_fusion"])
def test_fusion_modes_use_one_forward_with_the_fused_token(model: MunkeyViT, bank: MemoryBank, mode: str) -> None:
    x = torch.randn(2, 1, 16, 16)
    q = bank.keys[[1, 2]]
    p = predict(model, bank, x, q, k=5, tau=0.1, mode=mode)
    # the expectation from the definitions (predict.py docstring), not from the code's weight function:
    # top-5 by cosine similarity, then softmax(sim / tau) or reciprocal-rank weights 1 / (rank + 1)
    keys, values = bank.keys.numpy(), bank.values.numpy()
    sims = q.numpy() @ keys.T  # (2, 20): unit keys
    top = np.argsort(-sims, axis=1)[:, :5]  # (2, 5)
    if mode == "softmax_fusion":
        e = np.exp((np.take_along_axis(sims, top, 1) - sims.max(1, keepdims=True)) / 0.1)
        w = e / e.sum(1, keepdims=True)
    else:
        w = np.tile(np.array([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5]) / (137 / 60), (2, 1))
    fused = torch.from_numpy((w[..., None] * values[top]).sum(1).astype(np.float32))  # (2, Dv)
    np.testing.assert_allclose(p.weights, w, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(p.neighbour_ids, bank.ids[top])
    np.testing.assert_allclose(p.probs, torch.softmax(model(x, fused), -1).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_pathway_ablations_and_exclusion(model: MunkeyViT, bank: MemoryBank) -> None:
    x = torch.randn(2, 1, 16, 16)
    q = bank.keys[[0, 1]]
    img_only = predict(model, bank, x, q, k=3, tau=0.1, pathway="image")
    expected = torch.softmax(model(x, torch.zeros(2, 8), drop_token=torch.ones(2, dtype=torch.bool)), -1)
    np.testing.assert_allclose(img_only.probs, expected.detach().numpy(), rtol=1e-4, atol=1e-6)
    ex = predict(model, bank, x, q, k=3, tau=0.1, exclude=[[100], [101]])
    assert 100 not in ex.neighbour_ids[0] and 101 not in ex.neighbour_ids[1]


def test_deleted_ids_never_appear_as_evidence(model: MunkeyViT, bank: MemoryBank) -> None:
    q = bank.keys.clone()
    bank.delete(range(100, 110))
    p = predict(model, bank, torch.randn(20, 1, 16, 16), q, k=10, tau=0.1)
    assert not set(p.neighbour_ids.ravel()) & set(range(100, 110))


def test_bad_mode_pathway_or_k(model: MunkeyViT, bank: MemoryBank) -> None:
    x, q = torch.randn(1, 1, 16, 16), bank.keys[:1]
    for kwargs in ({"mode": "vote"}, {"pathway": "neither"}, {"k": 0}):
        with pytest.raises(MunkeyError):
            predict(model, bank, x, q, **{"k": 3, "tau": 0.1, **kwargs})
