"""The MUNKEY vision transformer: a timm ViT whose input is [CLS, patches..., h_psi(v)].

`v` is an exemplar vector from the memory bank (the sample's own during training, retrieved
neighbours' at inference); `h_psi` is a linear adapter to the backbone width. Two learnable null
tokens stand in for a dropped pathway: `null_img` replaces every patch embedding (positions are
still added), `null_tok` replaces the exemplar token. Classification reads [CLS].

Late injection (`cfg.inject_at = L > 0`, a variant): the exemplar token joins the sequence before
block L, so blocks [0, L) see only [CLS, patches...] and the K-neighbour ensemble runs them once per
image. `inject_at = 0` (the default) is the paper's design. A late model is a different model,
trained with the same recipe (`munkey train --inject-at L`), not a way to run a trained paper-design
model (docs/performance.md has the speed and the Avg Gap of late@3 on the cpu profile).
Tests: tests/model/test_model.py, tests/model/test_late.py, tests/model/test_perf_late.py.

Cost: one forward is a plain ViT forward with one extra token (N+2 tokens instead of N+1); the
K-ensemble costs L + K * (depth - L) block passes per image instead of K * depth.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from munkey_core.config import ModelConfig


def preprocess_images(images_u8: torch.Tensor, img_size: int) -> torch.Tensor:
    """(B, H, W, C) uint8 -> (B, C, S, S) float in [-1, 1], resized to the backbone input size."""
    x = images_u8.permute(0, 3, 1, 2).float().div_(255.0)  # (B, C, H, W)
    if x.shape[-2:] != (img_size, img_size):
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False,
                          antialias=x.shape[-1] > img_size)
    return x.sub_(0.5).div_(0.5)


class MunkeyViT(nn.Module):
    """Backbone f_theta + adapter h_psi + null tokens. The exemplar bank lives outside (memory.py)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vit = VisionTransformer(
            img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
            num_classes=cfg.num_classes, embed_dim=cfg.embed_dim, depth=cfg.depth,
            num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, class_token=True,
            global_pool="token", drop_path_rate=cfg.drop_path_rate,
        )
        self.adapter = nn.Linear(cfg.exemplar_dim, cfg.embed_dim)  # h_psi
        self.null_img = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        self.null_tok = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        nn.init.trunc_normal_(self.null_img, std=0.02)
        nn.init.trunc_normal_(self.null_tok, std=0.02)

    def embed_image(self, x: torch.Tensor, drop_image: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, S, S) -> (B, 1+N, D): [CLS] + patch tokens with positions; null_img where dropped."""
        patches = self.vit.patch_embed(x)  # (B, N, D)
        if drop_image is not None:
            patches = torch.where(drop_image[:, None, None], self.null_img.to(patches.dtype), patches)
        return self.vit._pos_embed(patches)

    def exemplar_token(self, v: torch.Tensor, drop_token: torch.Tensor | None = None) -> torch.Tensor:
        """(B, Dv) exemplar vectors -> (B, 1, D) token; null_tok where dropped."""
        tok = self.adapter(v)[:, None, :]  # (B, 1, D)
        if drop_token is not None:
            tok = torch.where(drop_token[:, None, None], self.null_tok.to(tok.dtype), tok)
        return tok

    @property
    def inject_at(self) -> int:
        """The block the exemplar token joins at (0: the first, the paper's design)."""
        return self.cfg.inject_at

    def encode_image(self, img_tokens: torch.Tensor) -> torch.Tensor:
        """The image-only blocks [0, inject_at): (B, 1+N, D) -> (B, 1+N, D); no block when inject_at is 0."""
        return self.vit.blocks[:self.inject_at](self.vit.norm_pre(img_tokens))

    def encode_joint(self, shared: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """Blocks [inject_at, depth) on [shared, tok]: (B, 1+N, D), (B, 1, D) -> (B, 2+N, D), normed."""
        x = torch.cat([shared, self.vit.norm_pre(tok)], dim=1)
        return self.vit.norm(self.vit.blocks[self.inject_at:](x))

    def forward_tokens(self, img_tokens: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """Run the transformer on [img_tokens, tok]: (B, 1+N, D), (B, 1, D) -> (B, 2+N, D)."""
        return self.encode_joint(self.encode_image(img_tokens), tok)

    def forward_head(self, feats: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """[CLS] features -> logits (B, num_classes), or the pooled (B, D) features."""
        return self.vit.forward_head(feats, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor, v: torch.Tensor, drop_image: torch.Tensor | None = None,
                drop_token: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, C) for images x (B, C, S, S) with exemplar vectors v (B, Dv)."""
        feats = self.forward_tokens(self.embed_image(x, drop_image), self.exemplar_token(v, drop_token))
        return self.forward_head(feats)

    def forward_multi(self, x: torch.Tensor, v: torch.Tensor, drop_image: bool = False,
                      drop_token: bool = False, pre_logits: bool = False) -> torch.Tensor:
        """Each image with each of its K exemplars: x (B, C, S, S), v (B, K, Dv) -> (B, K, classes).

        The patch embedding and the image-only blocks [0, inject_at) are computed once per image and
        shared by its K forwards; only blocks [inject_at, depth) run K times.
        """
        b, k, _ = v.shape
        img = self.embed_image(x, torch.full((b,), drop_image, device=x.device) if drop_image else None)
        shared = self.encode_image(img).repeat_interleave(k, dim=0)  # (B*K, 1+N, D)
        tok = self.exemplar_token(v.reshape(b * k, -1),
                                  torch.full((b * k,), drop_token, device=x.device) if drop_token else None)
        out = self.forward_head(self.encode_joint(shared, tok), pre_logits=pre_logits)
        return out.reshape(b, k, -1)

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: no weight decay on biases, norms, positions and the special tokens."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if p.ndim <= 1 or name.endswith(("pos_embed", "cls_token")) or "null_" in name:
                no_decay.append(p)
            else:
                decay.append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
