"""Fast ensemble paths give the same outputs as one plain forward per (image, neighbour) pair."""

from __future__ import annotations

import pytest
import torch

from munkey_core.config import PROFILES
from munkey_core.errors import MunkeyError
from munkey_core.model.late import LateInjectionViT
from munkey_core.model.munkey_vit import MunkeyViT


def _pairs_forward(model: MunkeyViT, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, k, _ = v.shape
    return torch.stack([model(x, v[:, j]) for j in range(k)], dim=1)


@pytest.mark.parametrize("inject_at", [None, 0, 1])
def test_forward_multi_equals_per_pair_forwards(inject_at: int | None) -> None:
    cfg = PROFILES["tiny"].model
    torch.manual_seed(0)
    model = MunkeyViT(cfg) if inject_at is None else LateInjectionViT(cfg, inject_at)
    model.eval()
    x = torch.randn(3, cfg.in_chans, cfg.img_size, cfg.img_size)
    v = torch.randn(3, 5, cfg.exemplar_dim)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_multi(x, v), _pairs_forward(model, x, v), rtol=1e-4, atol=1e-5)


def test_inject_at_zero_is_the_paper_model() -> None:
    cfg = PROFILES["tiny"].model
    torch.manual_seed(0)
    paper = MunkeyViT(cfg).eval()
    late = LateInjectionViT(cfg, 0).eval()
    late.load_state_dict(paper.state_dict())
    x, v = torch.randn(2, cfg.in_chans, cfg.img_size, cfg.img_size), torch.randn(2, 3, cfg.exemplar_dim)
    with torch.no_grad():
        torch.testing.assert_close(late.forward_multi(x, v), paper.forward_multi(x, v))


def test_bad_inject_layer_is_a_user_error() -> None:
    with pytest.raises(MunkeyError, match="inject_at"):
        LateInjectionViT(PROFILES["tiny"].model, 2)
