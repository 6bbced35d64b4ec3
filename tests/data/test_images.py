"""Image decoding for datasets, the CLI and uploads: formats, channels, bit depths, bad files."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from munkey_core.errors import MunkeyError
from munkey_core.data.images import as_hwc, decode_image, match_channels, resize_to


def _encode(arr: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def test_png_gray_jpeg_rgb_and_16_bit() -> None:
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8)
    assert np.array_equal(decode_image(_encode(gray, "PNG"), "a.png")[..., 0], gray)
    rgb = np.zeros((5, 7, 3), np.uint8)
    assert decode_image(_encode(rgb, "JPEG"), "a.jpg").shape == (5, 7, 3)
    deep = (np.arange(16, dtype=np.uint16).reshape(4, 4) * 4000)
    out = decode_image(_encode(deep, "PNG"), "deep.png")
    assert out.dtype == np.uint8 and out.max() == 255 and out.min() == 0


def test_npy_float_chw_and_alpha() -> None:
    buf = io.BytesIO()
    np.save(buf, np.full((3, 4, 5), 0.5, dtype=np.float32))  # CHW floats in [0, 1]
    out = decode_image(buf.getvalue(), "x.npy")
    assert out.shape == (4, 5, 3) and out[0, 0, 0] == 128
    assert as_hwc(np.zeros((2, 2, 4), np.uint8)).shape == (2, 2, 3)


@pytest.mark.parametrize("data, match", [(b"", "empty"), (b"not an image", "not a readable image"),
                                         (b"\x93NUMPY garbage", "not a readable image")])
def test_bad_bytes_give_clear_errors(data: bytes, match: str) -> None:
    with pytest.raises(MunkeyError, match=match):
        decode_image(data, "upload.png")


def test_decompression_bomb_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _encode(np.zeros((100, 100), np.uint8), "PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 10,000 pixels is then > 2x the limit
    with pytest.raises(MunkeyError, match="too large"):
        decode_image(data, "bomb.png")


def test_channel_matching_and_resize() -> None:
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[..., 0] = 255
    assert match_channels(rgb, 1)[0, 0, 0] == 76  # ITU-R 601 luma of pure red
    assert match_channels(np.zeros((4, 4, 1), np.uint8), 3).shape == (4, 4, 3)
    assert resize_to(np.zeros((4, 6, 1), np.uint8), (8, 8)).shape == (8, 8, 1)
