"""Fast ensemble paths give the same outputs as one plain forward per (image, neighbour) pair, and late
injection (ModelConfig.inject_at = L) is the late formula: blocks before L see the image tokens only."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from munkey_core.config import PROFILES
from munkey_core.errors import MunkeyError
from munkey_core.model.munkey_vit import MunkeyViT


def _pairs_forward(model: MunkeyViT, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, k, _ = v.shape
    return torch.stack([model(x, v[:, j]) for j in range(k)], dim=1)


@pytest.mark.parametrize("inject_at", [None, 0, 1])
def test_forward_multi_equals_per_pair_forwards(inject_at: int | None) -> None:
    cfg = PROFILES["tiny"].model
    torch.manual_seed(0)
    model = MunkeyViT(cfg if inject_at is None else replace(cfg, inject_at=inject_at))
    model.eval()
    x = torch.randn(3, cfg.in_chans, cfg.img_size, cfg.img_size)
    v = torch.randn(3, 5, cfg.exemplar_dim)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_multi(x, v), _pairs_forward(model, x, v), rtol=1e-4, atol=1e-5)


def test_late_injection_is_the_late_formula() -> None:
    """Written from the design, with the timm blocks directly: [CLS, patches] through blocks [0, L),
    then the exemplar token h(v) joins and blocks [L, depth) run on both, then the final norm and head."""
    cfg = replace(PROFILES["tiny"].model, inject_at=1)
    torch.manual_seed(0)
    model = MunkeyViT(cfg).eval()
    vit = model.vit
    x, v = torch.randn(2, cfg.in_chans, cfg.img_size, cfg.img_size), torch.randn(2, 3, cfg.exemplar_dim)
    with torch.no_grad():
        multi = model.forward_multi(x, v)
        for j in range(v.shape[1]):
            img = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))  # (B, 1+N, D)
            for block in vit.blocks[:1]:
                img = block(img)
            tokens = torch.cat([img, vit.norm_pre(model.adapter(v[:, j]))[:, None, :]], dim=1)  # (B, 2+N, D)
            for block in vit.blocks[1:]:
                tokens = block(tokens)
            expected = vit.head(vit.norm(tokens)[:, 0])
            torch.testing.assert_close(multi[:, j], expected, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(model(x, v[:, j]), expected, rtol=1e-4, atol=1e-5)


def test_bad_inject_layer_is_a_user_error() -> None:
    with pytest.raises(MunkeyError, match="inject_at"):
        MunkeyViT(replace(PROFILES["tiny"].model, inject_at=2))
