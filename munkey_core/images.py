"""Decode user images (PNG, JPEG, BMP, TIFF, NPY; gray or RGB; any size) into uint8 (H, W, C) arrays.

Uploaded images are decoded from bytes in memory and never written to disk.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from munkey_core.errors import MunkeyError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".npy")


def array_to_uint8(arr: np.ndarray, name: str = "array") -> np.ndarray:
    """Any 2-D or 3-D numeric array -> (H, W, C) uint8 with C in {1, 3}."""
    a = np.asarray(arr)
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[-1] not in (1, 3, 4):
        a = np.moveaxis(a, 0, -1)  # CHW -> HWC
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or a.shape[-1] not in (1, 3, 4) or min(a.shape[:2]) < 1:
        raise MunkeyError(f"{name}: expected a 2-D gray or 3-D RGB image array, got shape {tuple(a.shape)}.")
    if a.shape[-1] == 4:
        a = a[..., :3]
    if not np.issubdtype(a.dtype, np.number) or not np.all(np.isfinite(a)):
        raise MunkeyError(f"{name}: the image array must be numeric and finite.")
    if a.dtype != np.uint8:
        a = a.astype(np.float64)
        if a.max(initial=0) <= 1.0 and a.min(initial=0) >= 0.0:
            a = a * 255.0
        a = np.clip(np.rint(a), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(a)


def decode_image(data: bytes, name: str = "upload") -> np.ndarray:
    """Bytes of an image file -> (H, W, C) uint8; a damaged file raises MunkeyError."""
    if not data:
        raise MunkeyError(f"{name} is empty; upload a PNG, JPEG or NPY image.")
    if name.lower().endswith(".npy") or data[:6] == b"\x93NUMPY":
        try:
            return array_to_uint8(np.load(io.BytesIO(data), allow_pickle=False), name)
        except MunkeyError:
            raise
        except Exception:
            raise MunkeyError(f"{name} is not a readable .npy image array.") from None
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            mode = "L" if img.mode in ("1", "L", "I;16", "I", "F", "LA") else "RGB"
            return array_to_uint8(np.asarray(img.convert(mode)), name)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise MunkeyError(f"{name} is not a readable image; use PNG, JPEG, BMP, TIFF or NPY.") from None


def read_image_file(path: str | Path) -> np.ndarray:
    """Read an image file from disk -> (H, W, C) uint8."""
    path = Path(path)
    if not path.is_file():
        raise MunkeyError(f"Image file {path} does not exist.")
    return decode_image(path.read_bytes(), path.name)


def match_channels(image: np.ndarray, channels: int) -> np.ndarray:
    """Convert (H, W, C) uint8 to the model's channel count (gray <-> RGB)."""
    if image.shape[-1] == channels:
        return image
    if channels == 1:
        gray = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
        return np.clip(np.rint(gray), 0, 255).astype(np.uint8)[..., None]
    return np.repeat(image, 3, axis=-1)


def resize_to(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Resize (H, W, C) uint8 to (shape[0], shape[1], C) with bilinear filtering."""
    if image.shape[:2] == tuple(shape):
        return image
    c = image.shape[-1]
    pil = Image.fromarray(image[..., 0] if c == 1 else image)
    out = np.asarray(pil.resize((shape[1], shape[0]), Image.BILINEAR))
    return out[..., None] if c == 1 else out
