"""Decode images (PNG, JPEG, BMP, TIFF, NPY; gray or RGB; any size or bit depth) into uint8 (H, W, C).

One place for every image the product reads: dataset folders, CLI arguments and dashboard
uploads. Uploads are decoded from bytes in memory and never written to disk. `display_image`
enlarges small images for showing them (nearest neighbour: 8x8 digits stay crisp).
Pillow is imported by the functions that decode or resize, not with the module: reading a dataset
held as arrays (a deletion without evaluation hashes the digits images) never loads it.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from munkey_core.errors import MunkeyError

if TYPE_CHECKING:
    from PIL import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".npy")
MAX_PIXELS = 40_000_000  # width x height of one image (e.g. 6300 x 6300): larger ones are refused before decoding
MAX_IMAGE_BYTES = 64 * 1024 * 1024  # an image file larger than this is refused before it is read


def _npy_array(data: bytes, name: str) -> np.ndarray:
    """An NPY file's array, its header checked first: a header that claims more pixels than
    MAX_PIXELS, a non-numeric dtype or more bytes than the file holds is refused before allocating."""
    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(buf, max_header_size=10_000)
    except (ValueError, SyntaxError, TypeError, EOFError) as exc:
        raise MunkeyError(f"{name} is not a readable image (NPY header: {exc}); use PNG, JPEG, BMP, TIFF or "
                          "NPY.") from None
    if dtype.hasobject or dtype.kind not in "biuf":
        raise MunkeyError(f"{name} holds {dtype} values, not pixels; an NPY image holds numbers.")
    count = int(np.prod(shape, dtype=object)) if shape else 1
    channels = shape[-1] if len(shape) == 3 and shape[-1] in (1, 2, 3, 4) else (shape[0] if len(shape) == 3 else 1)
    if len(shape) not in (2, 3) or count // max(int(channels), 1) > MAX_PIXELS:
        raise MunkeyError(f"{name} declares an array of shape {tuple(shape)}: not an (H, W) or (H, W, C) image of "
                          f"at most {MAX_PIXELS} pixels. Use a smaller image.")
    if count * dtype.itemsize > len(data) - buf.tell():
        raise MunkeyError(f"{name} is truncated: its header declares {tuple(shape)} {dtype} values but the file is "
                          "shorter. Use an intact file.")
    buf.seek(0)
    return np.load(buf, allow_pickle=False)


def to_uint8(arr: np.ndarray) -> np.ndarray:
    """uint8 pixels: bool -> 0/255, floats in [0, 1] -> x255, 0..255 kept, else min-max scaled."""
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == bool:
        return arr.astype(np.uint8) * 255
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"unsupported pixel type {arr.dtype}")
    x = arr.astype(np.float64)
    if not np.isfinite(x).all():
        raise ValueError("pixels contain NaN or infinity")
    lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if arr.dtype.kind == "f" and lo >= 0 and hi <= 1:
        x = x * 255
    elif lo < 0 or hi > 255:
        x = (x - lo) * (255 / max(hi - lo, 1e-12))
    return np.rint(x).astype(np.uint8)


def as_hwc(arr: np.ndarray) -> np.ndarray:
    """An image array (H, W), (H, W, C) or (C, H, W) as (H, W, C) uint8 with C in {1, 3} (alpha dropped)."""
    if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[2] not in (1, 2, 3, 4):
        arr = np.moveaxis(arr, 0, -1)  # CHW -> HWC
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 2, 3, 4) or 0 in arr.shape:
        raise ValueError(f"expected an (H, W) or (H, W, C) image, got shape {arr.shape}")
    if arr.shape[2] in (2, 4):  # gray+alpha, RGB+alpha
        arr = arr[..., : arr.shape[2] - 1]
    return np.ascontiguousarray(to_uint8(arr))


def pil_to_array(im: Image.Image) -> np.ndarray:
    """Pixels of a PIL image as gray (H, W) or RGB (H, W, 3), any bit depth."""
    if im.mode in ("L", "RGB"):
        return np.asarray(im)
    if im.mode in ("1", "LA"):
        return np.asarray(im.convert("L"))
    if im.mode.startswith("I") or im.mode == "F":
        return to_uint8(np.asarray(im))
    return np.asarray(im.convert("RGB"))


def decode_image(data: bytes, name: str = "upload") -> np.ndarray:
    """Bytes of an image file -> (H, W, C) uint8; an empty or damaged file raises MunkeyError."""
    if not data:
        raise MunkeyError(f"{name} is empty; use a PNG, JPEG, BMP, TIFF or NPY image.")
    if len(data) > MAX_IMAGE_BYTES:
        raise MunkeyError(f"{name} is larger than an image may be ({MAX_IMAGE_BYTES // (1024 * 1024)} MB).")
    from PIL import Image, UnidentifiedImageError

    try:
        if data[:6] == b"\x93NUMPY":
            return as_hwc(_npy_array(data, name))
        if name.lower().endswith(".npy"):
            raise MunkeyError(f"{name} is not an NPY file (no NPY header); use PNG, JPEG, BMP, TIFF or NPY.")
        with warnings.catch_warnings():  # our own limit below speaks instead of PIL's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))  # reads the header only: the pixel limit comes before decoding
        with im:
            w, h = im.size
            if w * h > MAX_PIXELS:
                raise MunkeyError(f"{name} is {w} x {h} pixels, more than an image may have ({MAX_PIXELS} pixels); "
                                  "use a smaller image. It was not decoded.")
            return as_hwc(pil_to_array(im))
    except Image.DecompressionBombError:
        raise MunkeyError(f"{name} declares an image too large to decode safely; use a smaller image.") from None
    except (UnidentifiedImageError, OSError, EOFError, ValueError, SyntaxError, TypeError) as exc:
        detail = "" if isinstance(exc, UnidentifiedImageError) else f" ({exc})"
        raise MunkeyError(f"{name} is not a readable image{detail}; use PNG, JPEG, BMP, TIFF or NPY.") from None


def read_image_file(path: str | Path) -> np.ndarray:
    """Read an image file from disk -> (H, W, C) uint8."""
    path = Path(path)
    if path.is_dir():
        raise MunkeyError(f"{path} is a folder, not an image file; name the images in it (for example {path}/*.png).")
    if not path.is_file():
        raise MunkeyError(f"Image file {path} does not exist.")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise MunkeyError(f"{path} is {size / 1e6:.0f} MB, larger than an image may be "
                          f"({MAX_IMAGE_BYTES // (1024 * 1024)} MB); use a smaller image.")
    return decode_image(path.read_bytes(), str(path))


def read_image_dir(path: str | Path) -> list[np.ndarray]:
    """Every image file directly inside folder `path` (sorted by name) -> list of (H, W, C) uint8."""
    folder = Path(path)
    if not folder.is_dir():
        raise MunkeyError(f"{folder} is not a folder; pass a folder of PNG, JPEG or NPY images.")
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise MunkeyError(f"{folder} holds no image ({', '.join(IMAGE_SUFFIXES)}); put the images of the class there.")
    return [read_image_file(f) for f in files]


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
    from PIL import Image

    c = image.shape[-1]
    pil = Image.fromarray(image[..., 0] if c == 1 else image)
    out = np.asarray(pil.resize((shape[1], shape[0]), Image.Resampling.BILINEAR))
    return out.reshape(shape[0], shape[1], c)


def display_image(image: np.ndarray, min_side: int = 96) -> np.ndarray:
    """(H, W, C) uint8 -> an image to show: gray as (H, W), small images enlarged by an integer
    factor with nearest-neighbour sampling so that 8x8 digits stay crisp instead of blurred."""
    img = np.asarray(image)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    side = min(img.shape[:2])
    factor = max(1, int(np.ceil(min_side / max(side, 1))))
    if factor > 1:
        img = np.repeat(np.repeat(img, factor, axis=0), factor, axis=1)
    return np.ascontiguousarray(img)
