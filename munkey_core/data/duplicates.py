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
3. Plain score of a candidate: the best normalised cross-correlation (NCC, in [-1, 1]; invariant to
   brightness and contrast) between the whole upload and the whole candidate: at native resolution
   (area-reduced to at most `SCORE_MAX` px a side), the candidate as is and slightly blurred (sigma
   0.45 and 0.55 px: what enlarging with bilinear/bicubic/Lanczos and area-shrinking back leaves), and
   for uploads larger than native and at most `RENDER_MAX` px a side, the candidate enlarged to the
   upload's exact size with nearest, bilinear and bicubic interpolation.
4. Alignment score (light crops, shrunk uploads), when no plain score reaches the threshold: which box
   of a training image is the upload? Coarse: every training image against the upload under 81 crop
   boxes (0, 5 or 10 % off each side) at a <= 14 px grid, in one matrix product (resampling is
   linear, so the upload is projected back instead of rendering every image; the renders' norms are
   precomputed). Fine: for the `ALIGN_M` best, a pattern search of the four sides (a 2.5 % step for
   all, then 1.2 % and 0.6 % for the best ten), the box rendered at the upload's size (<= 32 px), then
   for the best five at <= 64 px.
   An upload smaller than the training images also gets every image rendered whole at its size.
5. Thresholds (`calibrate`, from held-out images: known non-copies, searched whole, enlarged, cropped
   and halved): one per kind of evidence, just above the best score any non-copy reached; the
   alignment and shrunk-upload scores are mapped linearly onto the plain threshold's scale, so one
   score and one `threshold` decide "exact match found". Calibration takes minutes on large images:
   it is made with the run and kept in it (run/copycache.py); its per-query records let it be brought
   up to date after a deletion by searching again only the queries a deleted image had scored.

Costs: building the index is one pass over the training images (thumbnails, coarse images and their
81 rendered norms; Fashion-MNIST's 54,000 in ~20 s); a search whose plain score settles it is ~10-100
ms, one that needs the alignment ~0.1-1 s. Recall and false matches: docs/results/near_duplicates.md
(`munkey bench duplicates`). Tests: tests/data/test_duplicates.py.
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
PLAIN_TOP = 8  # candidates (best plain score first) that also get the upload-size renders
DEFAULT_THRESHOLD = 0.995  # before calibration
SAFETY = {"plain": 0.25, "align": 0.25, "small": 0.75, "native": 0.25}  # threshold: best non-copy score moved this far to 1
METHOD = "align-2"  # changes whenever the scores change meaning (cached calibrations are keyed on it)
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


# ----- alignment search (light crops, shrunk copies) --------------------------------------
ALIGN_FRACS = (0.0, 0.05, 0.10)  # coarse crop hypotheses: this fraction off each side (3^4 = 81 boxes)
ALIGN_COARSE = 32  # side (at most) of the training images the coarse alignment scores every image at
ALIGN_GRID = 14  # side (at most) of the coarse comparison grid
ALIGN_WORK = 64  # side (at most) of the training images the fine alignment renders from
ALIGN_FINE = 32  # side (at most) of the fine comparison grid
ALIGN_STEPS = (0.025, 0.0125, 0.00625)  # fine search: each side moved by -step, 0, +step (81 boxes a step)
ALIGN_MAX = 0.15  # no side is cut by more than this fraction
ALIGN_M = 50  # candidates (best coarse alignment first) that get the fine alignment
ALIGN_KEEP = 10  # of those, the best after the first fine step get the finer steps
ALIGN_POLISH = 5  # best fine alignments polished at a finer grid
POLISH_WORK, POLISH_FINE, POLISH_STEPS = 128, 64, (0.005, 0.0025)
NATIVE_TOP, NATIVE_ROUNDS = 2, 4  # images larger than POLISH_WORK: the best two get the native score (_native)
_CHUNK = 1024
# what each calibration query (`_null_queries`: native, cropped 2x, 2x, 3x, halved bicubic, halved area) calibrates
# ("native" only where the index has a native step: images larger than POLISH_WORK)
NULL_KINDS = (("plain", "align", "native"), ("align", "native"), ("plain", "align", "native"), ("plain",), ("small",),
              ("small",))
SMALL_KINDS = ("auto", "linear", "cubic")  # an upload smaller than the training images: shrunk by any of these


def _kernel(x: np.ndarray, kind: str) -> np.ndarray:
    """Resampling kernels: 'box' (area averaging), 'linear' (triangle), 'cubic' (Keys, a = -0.5), as PIL's."""
    if kind == "box":
        return ((x >= -0.5) & (x < 0.5)).astype(x.dtype)
    ax = np.abs(x)
    if kind == "linear":
        return np.maximum(0.0, 1.0 - ax)
    a = -0.5  # (a + 2)|x|^3 - (a + 3)|x|^2 + 1 inside 1; a|x|^3 - 5a|x|^2 + 8a|x| - 4a inside 2
    inner = ((a + 2) * ax - (a + 3)) * ax * ax + 1
    outer = ((a * ax - 5 * a) * ax + 8 * a) * ax - 4 * a
    return np.where(ax < 1, inner, np.where(ax < 2, outer, 0.0)).astype(x.dtype, copy=False)


def _rmat(start: np.ndarray, end: np.ndarray, n: int, g: int, kind: str = "auto") -> np.ndarray:
    """Resampling matrices (..., g, n): the span [start, end) of an axis of n pixels (pixel i covers
    [i, i + 1)) sampled at g evenly spaced points, antialiased as PIL does (the kernel widened by the
    scale when shrinking). kind 'auto': area averaging when shrinking, bicubic when enlarging."""
    start = np.asarray(start, np.float32)[..., None, None]
    end = np.asarray(end, np.float32)[..., None, None]
    scale = (end - start) / g  # (..., 1, 1)
    ss = np.maximum(scale, 1.0)
    centre = start + (np.arange(g, dtype=np.float32)[:, None] + 0.5) * scale  # (..., g, 1)
    j = np.arange(n, dtype=np.float32)[None, :]
    x = (j + 0.5 - centre) / ss  # (..., g, n)
    if kind == "auto":
        shrink = scale >= 1.0
        if shrink.all() or not shrink.any():
            w = _kernel(x, "box" if shrink.all() else "cubic")
        else:
            w = np.where(shrink, _kernel(x, "box"), _kernel(x, "cubic"))
    else:
        w = _kernel(x, kind)
    # pixels outside the span are not there in a cropped copy: weigh each by how much of it is inside
    # (an integer crop then renders exactly as resizing the cropped image does)
    w = w * np.clip(np.minimum(j + 1, end) - np.maximum(j, start), 0.0, 1.0)
    total = w.sum(-1, keepdims=True)
    w = w / np.where(np.abs(total) < 1e-12, 1.0, total)
    return w.astype(np.float32, copy=False)


def _render(imgs: np.ndarray, ry: np.ndarray, rx: np.ndarray, *, clip: bool = False) -> np.ndarray:
    """imgs (M, C, H, W) float32, ry (M, S, g, H), rx (M, T, k, W) -> (M, S, T, C*g*k): every image
    resampled under every (row span, column span) pair, flattened; ry and rx may be shared (leading 1).
    Columns first, then rows; `clip`: to [0, 255] after each pass, as PIL does for 8-bit images (a
    bicubic overshoot at a sharp edge is cut there, and a copy made by PIL carries the cut)."""
    m, c = imgs.shape[:2]
    s, g, t, k = ry.shape[1], ry.shape[2], rx.shape[1], rx.shape[2]
    y = imgs @ rx.reshape(len(rx), 1, t * k, -1).transpose(0, 1, 3, 2)  # (M, C, H, T*k)
    if clip:
        np.clip(y, 0.0, 255.0, out=y)
    z = ry.reshape(len(ry), 1, s * g, -1) @ y  # (M, C, S*g, T*k)
    if clip:
        np.clip(z, 0.0, 255.0, out=z)
    z = z.reshape(m, c, s, g, t, k).transpose(0, 2, 4, 1, 3, 5)
    return z.reshape(m, s, t, c * g * k)


def _ncc_grid(imgs: np.ndarray, ry: np.ndarray, rx: np.ndarray, q: np.ndarray) -> np.ndarray:
    """NCC of a zero-mean, unit-norm q (C, g, k) with every render of `_render(imgs, ry, rx, clip=True)`:
    (M, S, T). The renders are laid out once as contiguous rows (M, S, T, C*g*k), so that the three sums
    (against q, plain, squared) run along the last axis (2-3x faster than summing over strided axes)."""
    z = _render(imgs, ry, rx, clip=True)  # (M, S, T, D), contiguous
    dot = z @ q.reshape(-1)
    total = z.sum(axis=-1)
    sq = np.einsum("mstd,mstd->mst", z, z)
    var = np.maximum(sq - total * total / z.shape[-1], 1e-12)
    return dot / np.sqrt(var)


def _spans(fracs: Sequence[float], n: int) -> np.ndarray:
    """(S, 2) [start, end) pixel spans: every (first cut, last cut) pair of fractions of n."""
    return np.array([(a * n, n - b * n) for a in fracs for b in fracs], np.float64)


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
        # the alignment score and shrunk uploads have their own thresholds (calibrate), mapped onto this one
        self.align_threshold = 1.0
        self.small_threshold = 1.0
        self.native_threshold = 1.0
        self.calibration: dict | None = None
        self._thumbs = _unit(self._reduced(self.thumb_shape)).reshape(len(images), -1)  # (N, t*t*C)
        # large native images (ELPV's 300 px) are scored area-reduced: ~10x less work, same ranking
        self.score_shape = (min(self.shape[0], SCORE_MAX), min(self.shape[1], SCORE_MAX))
        self._simgs = self._reduced(self.score_shape, np.uint8)  # (N, s, s, C)
        self._pos = {int(i): p for p, i in enumerate(self.ids)}
        self._build_alignment()

    def _reduced(self, hw: tuple[int, int], dtype=np.float32) -> np.ndarray:
        """All training images area-reduced to hw: (N, hw[0], hw[1], C)."""
        if tuple(hw) == self.shape:
            return self.images.astype(dtype, copy=False)
        if len(self.images) == 0:
            return np.zeros((0, *hw, self.channels), dtype)
        return np.stack([_resize(im, hw, _R.BOX) for im in self.images]).astype(dtype, copy=False)

    def _build_alignment(self) -> None:
        """Coarse images, the coarse crop hypotheses' resampling matrices and every image's rendered
        norm under each (needed to turn the projections of `_coarse_scores` into correlations)."""
        h, w = self.shape
        hc, wc = min(h, ALIGN_COARSE), min(w, ALIGN_COARSE)
        self._grid = (min(h, ALIGN_GRID), min(w, ALIGN_GRID))
        sy, sx = _spans(ALIGN_FRACS, hc), _spans(ALIGN_FRACS, wc)
        self._span_fracs = np.array([(a, b) for a in ALIGN_FRACS for b in ALIGN_FRACS])  # (S, 2) cut fractions
        self._ry = _rmat(sy[:, 0], sy[:, 1], hc, self._grid[0])  # (S, g, hc)
        self._rx = _rmat(sx[:, 0], sx[:, 1], wc, self._grid[1])  # (S, k, wc)
        coarse = self._reduced((hc, wc)).transpose(0, 3, 1, 2)  # (N, C, hc, wc)
        norms = []
        for c in range(0, len(coarse), _CHUNK):
            z = _render(coarse[c:c + _CHUNK], self._ry[None], self._rx[None])  # (n, S, S, D)
            z = z.reshape(len(z), -1, z.shape[-1])
            norms.append(np.linalg.norm(z - z.mean(-1, keepdims=True), axis=-1))
        self._norms = np.concatenate(norms) if norms else np.zeros((0, len(sy) ** 2), np.float32)  # (N, S*S)
        self._coarse = np.ascontiguousarray(coarse.reshape(len(coarse), -1))  # (N, C*hc*wc)
        self._work_shape = (min(h, ALIGN_WORK), min(w, ALIGN_WORK))
        self._work = self._reduced(self._work_shape, np.uint8)  # (N, hw, ww, C)
        self._polish_shape = (min(h, POLISH_WORK), min(w, POLISH_WORK))
        self._polish = self._reduced(self._polish_shape, np.uint8)  # (N, hp, wp, C)
        self.has_native = self._polish_shape != self.shape  # smaller images are polished at native size already

    def __len__(self) -> int:
        return len(self.ids)

    def positions(self, ids: Sequence[int]) -> list[int]:
        """Rows of the given ids (ids not in the index are skipped)."""
        return [self._pos[int(i)] for i in ids if int(i) in self._pos]

    def is_small(self, image: np.ndarray) -> bool:
        """Whether an upload has fewer pixels than the training images on some axis (a shrunk copy
        carries less evidence: it is judged against `small_threshold`)."""
        return image.shape[0] < self.shape[0] or image.shape[1] < self.shape[1]

    # ----- plain search: thumbnails, then the upload against each candidate as is ----------
    def candidates(self, native: np.ndarray, m: int) -> np.ndarray:
        """Rows of the m training images whose thumbnails correlate best with a native-size upload."""
        q = _unit(_resize(native, self.thumb_shape, _R.BOX)[None])[0]
        s = self._thumbs @ q  # (N,)
        m = min(m, len(s))
        top = np.argpartition(-s, m - 1)[:m]
        return top[np.argsort(-s[top])]

    def score(self, image: np.ndarray, rows: Sequence[int], *, stop: float | None = None) -> np.ndarray:
        """Plain near-duplicate score (best NCC over the whole-image hypotheses in the module
        docstring) of an upload (H, W, C) against each training row in `rows`; the upload-size renders
        are skipped once a candidate reaches `stop`."""
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            return np.zeros(0, np.float32)
        img = match_channels(np.asarray(image), self.channels)
        native = _resize(to_native(img, self.shape, self.channels), self.score_shape, _R.BOX)
        cands = self._simgs[rows].astype(np.float32)  # (M, s, s, C)
        qn = _unit(native[None])[0]
        best = np.max(np.stack([_unit(_blur(cands, s)) @ qn for s in BLURS]), axis=0)  # (M,)
        if stop is not None and best.max() >= stop:
            return best
        h, w = img.shape[:2]
        if (h > self.shape[0] or w > self.shape[1]) and max(h, w) <= RENDER_MAX and self.score_shape == self.shape:
            qr = _unit(img[None])[0]
            for j in np.argsort(-best)[:PLAIN_TOP]:
                views = [_resize(self.images[rows[j]], (h, w), f) for f in _RENDER]
                best[j] = max(best[j], float((_unit(np.stack(views)) @ qr).max()))
        return best

    # ----- alignment search: which box of a training image is the upload? -----------------
    def _coarse_scores(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every training image's best NCC with the upload over the coarse crop boxes, at the coarse
        grid, and the index of that box: (N,), (N,). One (N x D) @ (D x 81) product: resampling is
        linear, so <render(x), q> = <x, render^T(q)>, and the renders' norms are precomputed."""
        g, k = self._grid
        q = to_native(match_channels(np.asarray(image), self.channels), (g, k), self.channels)
        q = _unit(q.transpose(2, 0, 1)[None])[0].reshape(self.channels, g, k)  # (C, g, k)
        proj = np.einsum("sgh,cgk,tkw->stchw", self._ry, q, self._rx, optimize=True)
        s = (self._coarse @ proj.reshape(-1, self._coarse.shape[1]).T) / np.maximum(self._norms, 1e-6)  # (N, 81)
        box = s.argmax(axis=1)
        return s[np.arange(len(s)), box], box

    def align(self, image: np.ndarray, rows: Sequence[int],
              boxes: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Alignment score of an upload against training rows: the best NCC over crop boxes of each
        training image (every side cut by 0 to ALIGN_MAX), found coarse to fine from the coarse box
        (`boxes`, from `_coarse_scores`; the whole image when None): a pattern search at the upload's
        size (at most ALIGN_FINE px a side), then, for the ALIGN_POLISH best, at POLISH_FINE px.
        Also the native score (`_native`) of the NATIVE_TOP best, -1 elsewhere: (M,), (M,)."""
        rows = np.asarray(rows, np.int64)
        native = np.full(len(rows), -1.0, np.float32)
        if len(rows) == 0:
            return np.zeros(0, np.float32), native
        img = match_channels(np.asarray(image), self.channels)
        cut = np.zeros((len(rows), 4))  # (M, 4): fraction cut off top, bottom, left, right
        if boxes is not None:
            nb = len(self._span_fracs)
            boxes = np.asarray(boxes)
            cut[:, :2], cut[:, 2:] = self._span_fracs[boxes // nb], self._span_fracs[boxes % nb]
        best, cut = self._pattern(img, self._work[rows], cut, ALIGN_FINE, ALIGN_STEPS[:1])
        if self.is_small(img) and boxes is not None:  # a shrunk copy is most often whole: search from there too
            whole, wcut = self._pattern(img, self._work[rows], np.zeros_like(cut), ALIGN_FINE, ALIGN_STEPS[:1])
            cut = np.where((whole > best)[:, None], wcut, cut)
            best = np.maximum(best, whole)
        keep = np.argsort(-best)[:ALIGN_KEEP]  # the finer steps for the best few only
        finer, cut[keep] = self._pattern(img, self._work[rows[keep]], cut[keep], ALIGN_FINE, ALIGN_STEPS[1:])
        best[keep] = np.maximum(best[keep], finer)
        top = np.argsort(-best)[:ALIGN_POLISH]
        if self._polish_shape != self._work_shape or POLISH_FINE > ALIGN_FINE:
            polished, cut[top] = self._pattern(img, self._polish[rows[top]], cut[top], POLISH_FINE, POLISH_STEPS)
            best[top] = polished  # at the finer grid the score of a copy rises and a look-alike's falls
        if self.has_native and not self.is_small(img):
            for j in top[np.argsort(-best[top])][:NATIVE_TOP]:
                native[j] = self._native(img, int(rows[j]), cut[j])
        return best.astype(np.float32), native

    def _native(self, img: np.ndarray, row: int, cut: np.ndarray) -> float:
        """Native score of an upload (H, W, C) against one training image: the best NCC over crop boxes
        on whole training pixels, near `cut` (fractions, from the polished alignment), of the training
        image's own pixels and the upload area-reduced to the box's size. A copy cropped on whole pixels
        and resized matches its source here up to the resampling (~0.9999 on ELPV), where two distinct
        near-identical cells stay ~0.995 apart: the sensor's own grain is in the native pixels, not at
        the 64 px grid of the alignment. Coordinate descent, one pixel per side at a time."""
        (H, W), src = self.shape, self.images[row]
        limit = (int(ALIGN_MAX * H) + 1, int(ALIGN_MAX * W) + 1)
        box = [int(round(c * n)) for c, n in zip(cut, (H, H, W, W))]  # top, bottom, left, right in pixels
        reduced: dict[tuple[int, int], np.ndarray] = {}

        def score(b: list[int]) -> float:
            if min(b) < 0 or max(b[:2]) > limit[0] or max(b[2:]) > limit[1]:
                return -1.0
            size = (H - b[0] - b[1], W - b[2] - b[3])
            if size not in reduced:
                reduced[size] = _unit(to_native(img, size, self.channels)[None])[0]
            return float(_unit(src[b[0]:H - b[1], b[2]:W - b[3]][None])[0] @ reduced[size])

        best = score(box)
        for _ in range(NATIVE_ROUNDS):
            moved = False
            for side in range(4):
                for d in (-1, 1):
                    trial = list(box)
                    trial[side] += d
                    s = score(trial)
                    if s > best:
                        best, box, moved = s, trial, True
            if not moved:
                break
        return best

    def _pattern(self, img: np.ndarray, cands: np.ndarray, cut: np.ndarray, fine: int,
                 steps: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        """Pattern search of the crop box of each candidate (M, h, w, C) uint8 from `cut` (M, 4): at each
        step every side moves by -step, 0 or +step (81 boxes), the box rendered at the upload's size (at
        most `fine` px a side; area-averaged when shrinking, bicubic when enlarging, and for uploads
        smaller than the training images also antialiased bilinear and bicubic, as PIL shrinks) and correlated with the
        upload. Returns the best NCC (M,) and its cut (M, 4)."""
        (h, w), (H, W) = img.shape[:2], self.shape
        gf = (min(h, fine), min(w, fine))
        q = _unit(to_native(img, gf, self.channels).transpose(2, 0, 1)[None])[0].reshape(-1, *gf)  # (C, g, k)
        work = cands.astype(np.float32).transpose(0, 3, 1, 2)  # (M, C, hw, ww)
        hw, ww = work.shape[2:]
        m = len(work)
        cut = np.array(cut, np.float64)
        kinds = SMALL_KINDS if self.is_small(img) else ("auto",)
        d = np.array([(a, b) for a in (-1, 0, 1) for b in (-1, 0, 1)], np.float64)  # (9, 2) moves
        best = np.full(m, -1.0)
        for step in steps:  # the moves include staying: the start box is scored in the first step
            ty = np.clip(cut[:, None, :2] + step * d[None], 0.0, ALIGN_MAX)  # (M, 9, 2)
            tx = np.clip(cut[:, None, 2:] + step * d[None], 0.0, ALIGN_MAX)
            s = np.full((m, 9, 9), -1.0)
            for kind in kinds:
                ry = _rmat(ty[..., 0] * hw, hw - ty[..., 1] * hw, hw, gf[0], kind)  # (M, 9, g, hw)
                rx = _rmat(tx[..., 0] * ww, ww - tx[..., 1] * ww, ww, gf[1], kind)
                s = np.maximum(s, _ncc_grid(work, ry, rx, q))  # (M, 9, 9)
            s = s.reshape(m, -1)
            flat = s.argmax(axis=1)
            got = s[np.arange(m), flat]
            better = got > best
            best = np.where(better, got, best)
            cut[better, :2] = ty[better, flat[better] // 9]
            cut[better, 2:] = tx[better, flat[better] % 9]
        return best, cut

    # ----- both, combined -------------------------------------------------------------------
    def _whole_scores(self, image: np.ndarray) -> np.ndarray:
        """Every training image's NCC with an upload smaller than them, each rendered whole at the
        upload's size (area-averaged, antialiased bilinear and bicubic, as PIL shrinks; the best): (N,). The coarse
        grid is too fine for a 4x4 upload; at its own size the right image stands out."""
        img = match_channels(np.asarray(image), self.channels)
        hw, ww = self._work_shape
        gf = (min(img.shape[0], ALIGN_FINE), min(img.shape[1], ALIGN_FINE))
        q = _unit(to_native(img, gf, self.channels).transpose(2, 0, 1)[None])[0]
        out = []
        for c in range(0, len(self), _CHUNK):
            work = self._work[c:c + _CHUNK].astype(np.float32).transpose(0, 3, 1, 2)  # (n, C, hw, ww)
            best = np.full(len(work), -1.0, np.float32)
            for kind in SMALL_KINDS:
                z = _render(work, _rmat(0.0, hw, hw, gf[0], kind)[None, None],
                            _rmat(0.0, ww, ww, gf[1], kind)[None, None], clip=True)[:, 0, 0]  # (n, D)
                best = np.maximum(best, _unit(z) @ q)
            out.append(best)
        return np.concatenate(out)

    def _raw(self, image: np.ndarray, m: int, extra_rows: Sequence[int], stop: float | None, *, align: bool = True):
        """Candidate rows with their plain, alignment and native scores (-1 where not computed). With
        `stop`, a plain score reaching it ends the search before the alignment; `align=False` skips it."""
        native = to_native(image, self.shape, self.channels)
        extra = np.asarray(list(extra_rows), np.int64)
        rows = np.unique(np.concatenate([self.candidates(native, m), extra]))
        plain = self.score(image, rows, stop=stop)
        if not align or (stop is not None and plain.max() >= stop):
            return rows, plain, np.full(len(rows), -1.0, np.float32), np.full(len(rows), -1.0, np.float32)
        coarse, box = self._coarse_scores(image)
        k = min(ALIGN_M, len(coarse))
        shortlist = [np.argpartition(-coarse, k - 1)[:k]]
        if self.is_small(image):
            whole = self._whole_scores(image)
            shortlist.append(np.argpartition(-whole, k - 1)[:k])
        shortlist = np.concatenate(shortlist)
        more = np.setdiff1d(shortlist, rows)  # scored by the alignment only (its moves include the whole image)
        rows = np.concatenate([rows, more])
        plain = np.concatenate([plain, np.full(len(more), -1.0, np.float32)])
        order = np.argsort(rows)
        rows, plain = rows[order], plain[order]
        aligned = np.full(len(rows), -1.0, np.float32)
        native = np.full(len(rows), -1.0, np.float32)
        todo = np.isin(rows, np.concatenate([shortlist, extra])) | (plain >= np.sort(plain)[-min(5, len(plain))])
        aligned[todo], native[todo] = self.align(image, rows[todo], box[rows[todo]])
        return rows, plain, aligned, native

    def _combine(self, image: np.ndarray, plain: np.ndarray, aligned: np.ndarray, native: np.ndarray) -> np.ndarray:
        """One score on the plain threshold's scale: each kind of evidence mapped linearly so that its
        own calibrated threshold lands on `threshold` (and 1.0 stays 1.0)."""
        def onto(x: np.ndarray, t: float) -> np.ndarray:
            if t >= 1.0 - 1e-6:
                return np.where(x >= 1.0 - 1e-6, 1.0, np.minimum(x, self.threshold - 1e-3))
            return self.threshold + (x - t) * (1.0 - self.threshold) / (1.0 - t)
        if self.is_small(np.asarray(image)):
            return onto(np.maximum(plain, aligned), self.small_threshold)
        return np.maximum.reduce([plain, onto(aligned, self.align_threshold), onto(native, self.native_threshold)])

    def search(self, image: np.ndarray, *, top: int = 10, m: int = 60,
               extra_rows: Sequence[int] = ()) -> list[Match]:
        """The `top` best-scoring training images for one upload, best first (candidates: the m best
        thumbnails, the ALIGN_M best coarse alignments, plus `extra_rows`)."""
        if len(self) == 0:
            return []
        image = np.asarray(image)
        stop = None if self.is_small(image) else self.threshold
        rows, plain, aligned, native = self._raw(image, m, extra_rows, stop)
        scores = self._combine(image, plain, aligned, native)
        order = np.lexsort((self.ids[rows], -scores))[:top]
        return [Match(int(self.ids[rows[j]]), float(scores[j]), int(rows[j])) for j in order]

    def best(self, image: np.ndarray, **kwargs) -> Match | None:
        """The best match when it reaches the threshold (a copy of that training image), else None."""
        hits = self.search(image, top=1, **kwargs)
        return hits[0] if hits and hits[0].score >= self.threshold else None

    # ----- calibration ----------------------------------------------------------------------
    def _null_queries(self, held_out: np.ndarray, n: int, seed: int) -> list[tuple[np.ndarray, tuple[str, ...]]]:
        """The calibration's known non-copies, in a fixed order (a query's number is its position, the
        same for the same held-out images, n and seed): each of n held-out images at native size, lightly
        cropped (0-10 % off each side) and enlarged 2x, enlarged 2x and 3x (bicubic), halved (bicubic
        and area); with the kinds of evidence (`NULL_KINDS`) each query calibrates."""
        rng = np.random.default_rng(seed)
        out = []
        for i in rng.permutation(len(held_out))[:n]:
            im = held_out[i]
            h, w = im.shape[:2]
            half = (max(1, round(h / 2)), max(1, round(w / 2)))
            t, b = (rng.uniform(0, 0.1, 2) * h).round().astype(int)
            l, r = (rng.uniform(0, 0.1, 2) * w).round().astype(int)
            crop = _resize(im[t:h - b, l:w - r], (2 * h, 2 * w), _R.BICUBIC)  # a light crop, enlarged 2x
            views = (im, crop, _resize(im, (2 * h, 2 * w), _R.BICUBIC), _resize(im, (3 * h, 3 * w), _R.BICUBIC),
                     _resize(im, half, _R.BICUBIC), _resize(im, half, _R.BOX))
            out.extend((v, tuple(k for k in kinds if k != "native" or self.has_native))
                       for v, kinds in zip(views, NULL_KINDS))
        return out

    def calibrate(self, held_out: np.ndarray, *, n: int = 100, seed: int = 0, floor: float = 0.98,
                  exclude: Sequence[int] = (), records: Sequence[Sequence] | None = None) -> float:
        """Set the thresholds from held-out images (known non-copies, e.g. the validation split; the
        queries of `_null_queries`): `threshold` from the best plain score of the whole ones,
        `align_threshold` from the best alignment score at native size, cropped and 2x,
        `small_threshold` from the halved ones' best score of either kind, `native_threshold` (images
        larger than POLISH_WORK) from the best native score at native size, cropped and 2x; each the best null score
        moved SAFETY of the way towards 1 (three quarters for shrunk uploads, whose few pixels leave
        look-alikes close), and at least `floor`. Returns `threshold`.

        Training ids in `exclude` (deleted samples) take no part. `calibration` keeps the figures and
        `records`: per query and kind, its best non-excluded score and that training image's id
        ([query, kind, score, id]). A calibration is the maximum of its records, so given the records of
        an earlier calibration of the same images (`records`), only the queries whose record is missing
        or names an excluded id are searched again: the thresholds are those a calibration from scratch
        with the same `exclude` gives (`calibration["searched"]`: queries searched this time)."""
        held_out = np.asarray(held_out)
        if len(held_out) == 0 or len(self) == 0:
            return self.threshold
        queries = self._null_queries(held_out, n, seed)
        gone = {int(i) for i in exclude}
        skip = np.isin(self.ids, np.asarray(sorted(gone), np.int64))  # (N,)
        known: dict[tuple[int, str], tuple] = {}
        for q, kind, score, sid in records or ():
            if 0 <= int(q) < len(queries) and kind in queries[int(q)][1] and (sid is None or int(sid) not in gone):
                known[(int(q), kind)] = (score, sid)
        searched = 0
        for q, (img, kinds) in enumerate(queries):
            if all((q, kind) in known for kind in kinds):
                continue
            searched += 1
            rows, p, a, nat = self._raw(img, 60, (), None, align=kinds != ("plain",))
            for kind in kinds:
                scores = np.where(skip[rows], -np.inf, {"plain": p, "align": a, "native": nat}.get(kind, np.maximum(p, a)))
                j = int(np.argmax(scores))
                known[(q, kind)] = ((float(scores[j]), int(self.ids[rows[j]])) if np.isfinite(scores[j])
                                    else (None, None))  # every candidate deleted: no evidence from this query
        figures: dict = {"n_images": len(queries) // len(NULL_KINDS), "queries": len(queries), "searched": searched}
        set_by = set()
        kinds = (("plain", "threshold"), ("align", "align_threshold"), ("small", "small_threshold"))
        for kind, name in kinds + ((("native", "native_threshold"),) if self.has_native else ()):
            found = [(s, sid) for (_, k), (s, sid) in known.items() if k == kind and s is not None]
            prefix = "" if kind == "plain" else kind + "_"
            if not found:
                figures[f"{prefix}null_max"] = figures[f"{prefix}null_p99"] = figures[name] = float(floor)
                continue
            scores = np.array([s for s, _ in found])
            j = int(np.argmax(scores))
            set_by.add(int(found[j][1]))
            figures[f"{prefix}null_max"] = float(scores[j])
            figures[f"{prefix}null_p99"] = float(np.quantile(scores, 0.99))
            figures[name] = float(max(floor, scores[j] + SAFETY[kind] * (1.0 - scores[j])))
        figures["set_by"] = sorted(set_by)  # the training ids whose look-alikes set the thresholds
        figures["records"] = [[q, kind, s, sid] for (q, kind), (s, sid) in sorted(known.items())]
        self.set_calibration(figures)
        return self.threshold

    def set_calibration(self, calibration: dict) -> None:
        """Restore thresholds saved from `calibration` (a cached calibration of the same images)."""
        self.threshold = float(calibration["threshold"])
        self.align_threshold = float(calibration["align_threshold"])
        self.small_threshold = float(calibration["small_threshold"])
        self.native_threshold = float(calibration.get("native_threshold", 1.0))
        self.calibration = dict(calibration)
