"""A late-injection MUNKEY variant: the exemplar token joins the sequence only at block `inject_at`.

Why: in the paper's design (MunkeyViT) the token enters at the first block, so the K-ensemble runs
the whole transformer K times per image. Here blocks [0, inject_at) see only the image tokens, so
they run once per image and are shared by its K neighbours; only the last depth - inject_at
blocks run K times. Cost per image: inject_at + K * (depth - inject_at) block passes instead of
K * depth. It is a different model (trained with the same recipe through
`distributed.train_distributed(..., model_factory=...)`), not a way to run a trained MunkeyViT.
`inject_at = 0` is exactly MunkeyViT.
"""

from __future__ import annotations

from functools import partial

import torch

from munkey_core.config import ModelConfig
from munkey_core.errors import MunkeyError
from munkey_core.model import MunkeyViT


class LateInjectionViT(MunkeyViT):
    """MunkeyViT whose exemplar token is appended before block `inject_at` (0 <= inject_at < depth)."""

    def __init__(self, cfg: ModelConfig, inject_at: int) -> None:
        if not 0 <= inject_at < cfg.depth:
            raise MunkeyError(f"inject_at must be in [0, {cfg.depth - 1}] for depth {cfg.depth} (got {inject_at}).")
        super().__init__(cfg)
        self.inject_at = inject_at

    def encode_image(self, img_tokens: torch.Tensor) -> torch.Tensor:
        """The shared part: blocks [0, inject_at) on [CLS] + patches, (B, 1+N, D) -> (B, 1+N, D)."""
        return self.vit.blocks[:self.inject_at](self.vit.norm_pre(img_tokens))

    def forward_tokens(self, img_tokens: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.encode_image(img_tokens), self.vit.norm_pre(tok)], dim=1)
        return self.vit.norm(self.vit.blocks[self.inject_at:](x))

    def forward_multi(self, x: torch.Tensor, v: torch.Tensor, drop_image: bool = False,
                      drop_token: bool = False, pre_logits: bool = False) -> torch.Tensor:
        """As MunkeyViT.forward_multi, with the first inject_at blocks computed once per image."""
        b, k, _ = v.shape
        img = self.embed_image(x, torch.full((b,), drop_image, device=x.device) if drop_image else None)
        shared = self.encode_image(img).repeat_interleave(k, dim=0)  # (B*K, 1+N, D)
        tok = self.exemplar_token(v.reshape(b * k, -1),
                                  torch.full((b * k,), drop_token, device=x.device) if drop_token else None)
        h = self.vit.blocks[self.inject_at:](torch.cat([shared, self.vit.norm_pre(tok)], dim=1))
        return self.forward_head(self.vit.norm(h), pre_logits=pre_logits).reshape(b, k, -1)


def factory(inject_at: int):
    """A model_factory for distributed.train_distributed."""
    return partial(LateInjectionViT, inject_at=inject_at)
