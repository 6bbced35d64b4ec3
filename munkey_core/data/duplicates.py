"""Near-duplicate search: is this upload a resized, re-encoded or lightly cropped copy of a training image?

The key encoder answers "which training cases look alike"; it does not answer "is this the same
picture", and a data subject sends their own photo at whatever size their phone gives. This module
answers the second question in pixel space, at the dataset's own (native) resolution:

1. `to_native` brings an upload to the dataset's image shape and channels: area averaging (BOX) when
   shrinking, which undoes an enlargement by any interpolation up to a slight blur, bicubic when
   enlarging a smaller upload.
2. Candidates: the `m` training images whose small thumbnails (<= 16 px a side, area-averaged,
   zero-mean, unit-norm) correlate best with the upload's; a caller may add its own candidates (the
   dashboard adds the key encoder's nearest neighbours, which survive crops better).
3. Score of a candidate: the best normalised cross-correlation (NCC, in [-1, 1]; invariant to
   brightness and contrast) between the upload and the candidate under a few hypotheses:
   - at native resolution (area-reduced to at most `SCORE_MAX` px a side), the candidate as is and slightly blurred (sigma 0.45 and 0.55 px: what
     enlarging with bilinear/bicubic/Lanczos and area-shrinking back leaves), and
   - when the upload is larger than native and at most `RENDER_MAX` px a side, the candidate
     enlarged to the upload's exact size with nearest, bilinear and bicubic interpolation (exact
     for non-integer scale factors, where area-shrinking misaligns), and
   - for the best few candidates, light crops of the candidate (0 or ~4 % off each side).
4. `threshold`: an upload is a copy of its best candidate when the score reaches it. `calibrate`
   sets it from held-out images (validation split: known non-copies) pushed through the same search
   at native size and enlarged 2x and 3x: just above the best score any of them reached.

Costs: building the index is one pass over the training images (thumbnails; Fashion-MNIST's 54,000
in ~5 s); a search is one (N x <=256) matrix-vector product plus a few hundred small resizes,
~10-100 ms per upload. Recall: docs/results/near_duplicates.md (`munkey bench duplicates`).
Tests: tests/data/test_duplicates.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image

from munkey_core.data.images import match_channels

THUMB = 16  # side of the first-stage thumbnails (at most; smaller native images are used as they are)
RENDER_MAX = 128  # largest upload side for which candidates are rendered at the upload's own size
SCORE_MAX = 96  # scores are computed at native resolution, area-reduced to at most this many px a side
BLURS = (0.0, 0.45, 0.55)  # Gaussian sigmas (native px) tried on each candidate
CROP = 0.04  # light-crop hypotheses: this fraction (at least 1 px) off any subset of the four sides
CROP_TOP = 8  # candidates (best first) that also get the crop hypotheses
DEFAULT_THRESHOLD = 0.995  # before calibration
_R = Image.Resampling
_RENDER = (_R.NEAREST, _R.BILINEAR, _R.BICUBIC)


@dataclass(frozen=True)
class Match:
    """One training image and how closely an upload copies it (NCC score; 1.0 = the same picture)."""

    id: int
    score: float
    position: int  # row of the image in the index


def _pil(img: np.ndarray) -> Image.Image:
    return Image.fromarray(img[..., 0] if img.shape[-1] == 1 else img)


def _hwc(im: Image.Image) -> np.ndarray:
    a = np.asarray(im)
    return a[..., None] if a.ndim == 2 else a


def _resize(img: np.ndarray, hw: tuple[int, int], method: Image.Resampling) -> np.ndarray:
    """(H, W, C) uint8 -> (hw[0], hw[1], C) uint8."""
    if img.shape[:2] == tuple(hw):
        return img
    return _hwc(_pil(img).resize((int(hw[1]), int(hw[0])), method))


def to_native(image: np.ndarray, shape: Sequence[int], channels: int) -> np.ndarray:
    """An upload (H, W, C) uint8 of any size -> (shape[0], shape[1], channels) uint8: area averaging
    when shrinking (undoes an enlargement by any interpolation up to a slight blur), bicubic when
    enlarging, mixed per axis as needed."""
    img = match_channels(np.asarray(image), channels)
    h, w = img.shape[:2]
    th, tw = int(shape[0]), int(shape[1])
    if (h, w) == (th, tw):
        return img
    if h >= th and w >= tw:
        return _resize(img, (th, tw), _R.BOX)
    if h <= th and w <= tw:
        return _resize(img, (th, tw), _R.BICUBIC)
    mid = (min(h, th), min(w, tw))  # shrink the large axis by area first, then enlarge the other
    return _resize(_resize(img, mid, _R.BOX), (th, tw), _R.BICUBIC)


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows of (N, ...) -> (N, D) float32, zero-mean and unit-norm (a constant row stays 0)."""
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    x = x - x.mean(axis=1, keepdims=True)
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(n, 1e-6)


def _blur(imgs: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of (N, H, W, C) float32 over H and W (edges repeated)."""
    if sigma <= 0:
        return imgs
    r = max(1, int(np.ceil(3 * sigma)))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k = (k / k.sum()).astype(np.float32)
    out = imgs
    for axis in (1, 2):
        pad = [(0, 0)] * 4
        pad[axis] = (r, r)
        p = np.pad(out, pad, mode="edge")
        n = out.shape[axis]
        out = sum(k[j] * np.take(p, np.arange(j, j + n), axis=axis) for j in range(2 * r + 1))
    return out


def _crop_boxes(h: int, w: int) -> list[tuple[int, int, int, int]]:
    """(top, left, bottom, right) boxes: each side kept or trimmed by CROP (at least 1 px); full box excluded."""
    dh, dw = max(1, round(CROP * h)), max(1, round(CROP * w))
    out = []
    for t in (0, dh):
        for l in (0, dw):
            for b in (0, dh):
                for r in (0, dw):
                    if t or l or b or r:
                        out.append((t, l, h - b, w - r))
    return out


class NearDuplicateIndex:
    """Training images (N, H, W, C) uint8 with their ids, searchable for near-duplicate copies."""

    def __init__(self, images: np.ndarray, ids: np.ndarray, *, threshold: float = DEFAULT_THRESHOLD) -> None:
        images = np.asarray(images)
        if images.ndim != 4 or len(images) != len(ids):
            raise ValueError(f"expected (N, H, W, C) images and N ids, got {images.shape} and {len(ids)}")
        self.images = images
        self.ids = np.asarray(ids, np.int64)
        self.shape = tuple(int(s) for s in images.shape[1:3])
        self.channels = int(images.shape[3])
        self.thumb_shape = (min(self.shape[0], THUMB), min(self.shape[1], THUMB))
        self.threshold = float(threshold)
        self.calibration: dict | None = None
        self._thumbs = _unit(np.stack([_resize(im, self.thumb_shape, _R.BOX) for im in images])
                             if len(images) else np.zeros((0, *self.thumb_shape, self.channels)))  # (N, t*t*C)
        # large native images (ELPV's 300 px) are scored area-reduced: ~10x less work, same ranking
        self.score_shape = (min(self.shape[0], SCORE_MAX), min(self.shape[1], SCORE_MAX))
        self._simgs = images if self.score_shape == self.shape else \
            np.stack([_resize(im, self.score_shape, _R.BOX) for im in images])  # (N, s, s, C)
        self._crops = _crop_boxes(*self.score_shape)
        self._pos = {int(i): p for p, i in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def positions(self, ids: Sequence[int]) -> list[int]:
        """Rows of the given ids (ids not in the index are skipped)."""
        return [self._pos[int(i)] for i in ids if int(i) in self._pos]

    # ----- the two stages -----------------------------------------------------------------
    def candidates(self, native: np.ndarray, m: int) -> np.ndarray:
        """Rows of the m training images whose thumbnails correlate best with a native-size upload."""
        q = _unit(_resize(native, self.thumb_shape, _R.BOX)[None])[0]
        s = self._thumbs @ q  # (N,)
        m = min(m, len(s))
        top = np.argpartition(-s, m - 1)[:m]
        return top[np.argsort(-s[top])]

    def score(self, image: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        """Near-duplicate score (best NCC over the hypotheses in the module docstring) of an upload
        (H, W, C) against each training row in `rows`."""
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            return np.zeros(0, np.float32)
        img = match_channels(np.asarray(image), self.channels)
        native = _resize(to_native(img, self.shape, self.channels), self.score_shape, _R.BOX)
        cands = self._simgs[rows].astype(np.float32)  # (M, s, s, C)
        qn = _unit(native[None])[0]
        best = np.max(np.stack([_unit(_blur(cands, s)) @ qn for s in BLURS]), axis=0)  # (M,)
        # the cheaper hypotheses first; stop as soon as one candidate reaches the threshold
        if best.max() >= self.threshold:
            return best
        order = np.argsort(-best)[:CROP_TOP]
        h, w = img.shape[:2]
        if (h > self.shape[0] or w > self.shape[1]) and max(h, w) <= RENDER_MAX and self.score_shape == self.shape:
            qr = _unit(img[None])[0]
            for j in order:
                views = [_resize(self.images[rows[j]], (h, w), f) for f in _RENDER]
                best[j] = max(best[j], float((_unit(np.stack(views)) @ qr).max()))
            if best.max() >= self.threshold:
                return best
        for j in order:
            im = self._simgs[rows[j]]
            crops = np.stack([_resize(im[t:b, l:r], self.score_shape, _R.BICUBIC) for t, l, b, r in self._crops])
            crops = crops.astype(np.float32)
            best[j] = max(best[j], max(float((_unit(_blur(crops, sg)) @ qn).max()) for sg in BLURS))
        return best

    def search(self, image: np.ndarray, *, top: int = 10, m: int = 60,
               extra_rows: Sequence[int] = ()) -> list[Match]:
        """The `top` best-scoring training images for one upload, best first (candidates: the m best
        thumbnails plus `extra_rows`)."""
        if len(self) == 0:
            return []
        native = to_native(image, self.shape, self.channels)
        rows = np.unique(np.concatenate([self.candidates(native, m), np.asarray(list(extra_rows), np.int64)]))
        scores = self.score(image, rows)
        order = np.lexsort((self.ids[rows], -scores))[:top]
        return [Match(int(self.ids[rows[j]]), float(scores[j]), int(rows[j])) for j in order]

    def best(self, image: np.ndarray, **kwargs) -> Match | None:
        """The best match when it reaches the threshold (a copy of that training image), else None."""
        hits = self.search(image, top=1, **kwargs)
        return hits[0] if hits and hits[0].score >= self.threshold else None

    # ----- calibration ----------------------------------------------------------------------
    def calibrate(self, held_out: np.ndarray, *, n: int = 100, seed: int = 0, floor: float = 0.98) -> float:
        """Set `threshold` from held-out images (known non-copies, e.g. the validation split): the best
        score any of `n` of them reaches at native size or enlarged 2x or 3x (bicubic), moved a quarter
        of the way towards 1, and at least `floor`. Returns it; `calibration` keeps the figures."""
        held_out = np.asarray(held_out)
        if len(held_out) == 0 or len(self) == 0:
            return self.threshold
        pick = np.random.default_rng(seed).permutation(len(held_out))[:n]
        best = []
        for i in pick:
            im = held_out[i]
            for f in (1, 2, 3):
                q = im if f == 1 else _resize(im, (im.shape[0] * f, im.shape[1] * f), _R.BICUBIC)
                hit = self.search(q, top=1)
                best.append(hit[0].score if hit else -1.0)
        null = np.asarray(best)
        self.threshold = float(max(floor, null.max() + 0.25 * (1.0 - null.max())))
        self.calibration = {"n_images": int(len(pick)), "queries": int(len(null)),
                            "null_max": float(null.max()), "null_p99": float(np.quantile(null, 0.99)),
                            "threshold": self.threshold}
        return self.threshold
