"""Conventional classifiers for post-hoc unlearning: a ResNet-18 with the CIFAR stem and a plain ViT.

These are the models UnAct, SSD and LFSSD edit, and the plain ViT is the "T-oracle" backbone (the
MUNKEY ViT without its exemplar token). Both expose `forward_features(x)` and
`forward_head(feats, pre_logits=False)` like timm models.

- ResNet-18 (CIFAR stem: 3x3 conv, stride 1, no max-pool): four stages of two BasicBlocks with
  widths w, 2w, 4w, 8w (w = 64 is the standard network, 11M parameters; the CPU profile uses a
  narrower w, which costs about (w/64)^2 of the compute). `layer4[-1]` is the block whose 8w output
  channels UnAct scores; `fc` is the classifier.
- ViT: timm's VisionTransformer with the same sizes as the MUNKEY backbone (ModelConfig).
Tests: tests/unlearn/test_posthoc.py, tests/unlearn/test_unact.py, tests/unlearn/test_ssd.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from munkey_core.errors import MunkeyError
from munkey_core.model.munkey_vit import preprocess_images

ARCHS = ("resnet18", "vit")
_EVAL_BATCH = 512


@dataclass(frozen=True)
class ClassifierConfig:
    """Architecture and sizes of a conventional classifier."""

    arch: str = "resnet18"
    img_size: int = 28
    in_chans: int = 1
    num_classes: int = 10
    width: int = 64            # ResNet-18 base width (64 = the standard ResNet-18)
    patch_size: int = 7        # ViT only, from here on
    embed_dim: int = 128
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 2.0
    drop_path_rate: float = 0.0


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN, with a 1x1 projection shortcut when the shape changes; ReLU after the sum."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 with the CIFAR stem: (B, C, S, S) -> logits (B, classes)."""

    def __init__(self, cfg: ClassifierConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.conv1 = nn.Conv2d(cfg.in_chans, w, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        widths, cin, layers = (w, 2 * w, 4 * w, 8 * w), w, []
        for i, cout in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.num_features = cin
        self.fc = nn.Linear(cin, cfg.num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, S, S) -> the last block's post-ReLU map (B, 8w, S/8, S/8)."""
        x = F.relu(self.bn1(self.conv1(x)))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward_head(self, feats: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        pooled = feats.mean(dim=(2, 3))  # (B, 8w)
        return pooled if pre_logits else self.fc(pooled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def build_classifier(cfg: ClassifierConfig) -> nn.Module:
    """A freshly initialised classifier of `cfg.arch`."""
    if cfg.arch == "resnet18":
        return ResNet18(cfg)
    if cfg.arch == "vit":
        return VisionTransformer(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                                 num_classes=cfg.num_classes, embed_dim=cfg.embed_dim, depth=cfg.depth,
                                 num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, class_token=True,
                                 global_pool="token", drop_path_rate=cfg.drop_path_rate)
    raise MunkeyError(f"Unknown architecture '{cfg.arch}'. Choose one of: munkey, {', '.join(ARCHS)}.")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: no weight decay on biases, norms, positions and class tokens."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or name.endswith(("pos_embed", "cls_token")) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@torch.no_grad()
def logits_of(model: nn.Module, images: np.ndarray, img_size: int, batch_size: int = _EVAL_BATCH) -> np.ndarray:
    """Logits (N, classes) of uint8 images (N, H, W, C), in eval mode, batched."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(images), batch_size):
        x = torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size])).to(device)
        out.append(model(preprocess_images(x, img_size)).float().cpu())
    model.train(was_training)
    return torch.cat(out).numpy() if out else np.zeros((0, 0), dtype=np.float32)


def predict_labels(model: nn.Module, images: np.ndarray, img_size: int) -> np.ndarray:
    return logits_of(model, images, img_size).argmax(1)
