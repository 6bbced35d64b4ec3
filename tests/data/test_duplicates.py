"""data/duplicates.py: copies of real digits training images are found first, at any size, after JPEG
and after a light crop; non-copies (test images, whole, cropped or shrunk) are not called copies."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from munkey_core.data.datasets import load_dataset
from munkey_core.data.duplicates import NearDuplicateIndex, to_native


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


@pytest.fixture(scope="module")
def index(digits) -> NearDuplicateIndex:
    ix = NearDuplicateIndex(digits.train.images, digits.train.ids)
    ix.calibrate(digits.val.images, n=40)
    return ix


def _resized(img: np.ndarray, f: float, method) -> np.ndarray:
    h, w = img.shape[:2]
    return np.asarray(Image.fromarray(img[..., 0]).resize((round(w * f), round(h * f)), method))[..., None]


def _jpeg(img: np.ndarray, q: int = 85) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(img[..., 0]).save(buf, format="JPEG", quality=q)
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())))[..., None]


def test_to_native_undoes_a_nearest_enlargement_exactly_and_matches_channels(digits) -> None:
    img = digits.train.images[5]  # (8, 8, 1)
    big = np.repeat(np.repeat(img, 8, axis=0), 8, axis=1)  # 64x64, each pixel an 8x8 block
    assert np.array_equal(to_native(big, (8, 8), 1), img)
    rgb = np.repeat(big, 3, axis=-1)
    assert to_native(rgb, (8, 8), 1).shape == (8, 8, 1)
    assert to_native(img, (16, 16), 3).shape == (16, 16, 3)
    assert to_native(np.zeros((40, 4, 1), np.uint8), (8, 8), 1).shape == (8, 8, 1)  # one axis shrinks, one grows


@pytest.mark.parametrize("copy", ["bicubic2x", "bicubic8x", "bilinear4x", "lanczos1.5x", "jpeg85"])
def test_copies_of_training_images_are_found_first_above_the_threshold(digits, index, copy) -> None:
    rows = np.random.default_rng(1).choice(len(digits.train), 25, replace=False)
    for r in rows:
        img = digits.train.images[r]
        if copy == "jpeg85":
            q = _jpeg(img)
        else:
            method = getattr(Image.Resampling, copy.rstrip("x0123456789.").upper())
            q = _resized(img, float(copy.rstrip("x").lstrip("abcdefghijklmnopqrstuvwxyz")), method)
        hit = index.best(q)
        assert hit is not None and hit.id == int(digits.train.ids[r]), (copy, r)


def test_unseen_images_are_not_reported_as_copies(digits, index) -> None:
    test = digits.test
    found = [index.best(_resized(test.images[i], 4, Image.Resampling.BICUBIC)) for i in range(40)]
    assert sum(f is not None for f in found) <= 1  # the threshold sits above 300 validation searches' best
    assert 0.98 <= index.threshold < 1.0
    assert index.calibration["null_max"] < index.threshold


def test_search_orders_by_score_and_takes_extra_candidates(digits, index) -> None:
    img = digits.train.images[3]
    hits = index.search(img, top=5, m=5, extra_rows=[100, 200])
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and hits[0].id == int(digits.train.ids[3])
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    # an extra candidate outside the thumbnail shortlist is scored too
    far = NearDuplicateIndex(digits.train.images, digits.train.ids)
    row = 700
    assert any(h.position == row for h in far.search(digits.train.images[row], top=10, m=1, extra_rows=[row]))


def _cropped(img: np.ndarray, rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """Up to one pixel (12 %) cut off each side of an 8x8 digit, then resized to `size` (w, h), bicubic."""
    h, w = img.shape[:2]
    t, l, b, r = rng.integers(0, 2, 4)
    return np.asarray(Image.fromarray(img[t:h - b, l:w - r, 0]).resize(size, Image.Resampling.BICUBIC))[..., None]


def test_cropped_and_resized_copies_are_found_first_above_the_threshold(digits, index) -> None:
    rng = np.random.default_rng(3)
    rows = rng.choice(len(digits.train), 25, replace=False)
    found = 0
    for r, size in zip(rows, [(40, 37), (32, 32), (23, 29), (64, 64), (17, 17)] * 5):
        hits = index.search(_cropped(digits.train.images[r], rng, size), top=1)
        assert hits[0].id == int(digits.train.ids[r]), (r, size)
        found += hits[0].score >= index.threshold
    assert found >= 23  # above the threshold calibrated on 40 validation images (measured: 25 of 25)


def test_a_halved_copy_is_never_called_a_copy_of_another_image(digits, index) -> None:
    # 8x8 -> 4x4 leaves 16 pixels: the right image is found or nothing is, never someone else's
    found = 0
    for r in np.random.default_rng(4).choice(len(digits.train), 30, replace=False):
        q = _resized(digits.train.images[r], 0.5, Image.Resampling.BICUBIC if r % 2 else Image.Resampling.BOX)
        hit = index.best(q)
        assert hit is None or hit.id == int(digits.train.ids[r]), r
        found += hit is not None
    assert found >= 20  # rendered as PIL shrinks, a halved copy is usually found (measured: 50 of 50)


def test_cropped_and_shrunk_non_copies_are_not_called_copies(digits, index) -> None:
    rng = np.random.default_rng(5)
    test = digits.test
    queries = [_cropped(test.images[i], rng, (32, 32)) for i in range(40)]
    queries += [_resized(test.images[i], 0.5, Image.Resampling.BICUBIC) for i in range(40)]
    assert sum(index.best(q) is not None for q in queries) == 0
    assert index.calibration["align_null_max"] < index.align_threshold < 1.0
    assert index.calibration["small_null_max"] < index.small_threshold < 1.0


def test_a_calibration_brought_up_to_date_after_a_deletion_equals_one_from_scratch(digits) -> None:
    """Records of an earlier calibration, less those naming deleted ids: only those queries are searched
    again, and every figure equals a calibration from scratch that excludes the deleted ids."""
    first = NearDuplicateIndex(digits.train.images, digits.train.ids)
    first.calibrate(digits.val.images, n=12)
    cal = first.calibration
    assert cal["searched"] == cal["queries"] == 72 and len(cal["records"]) == 12 * 8
    deleted = list(cal["set_by"])
    kept = [r for r in cal["records"] if r[3] not in deleted]
    assert len(kept) < len(cal["records"])
    updated = NearDuplicateIndex(digits.train.images, digits.train.ids)
    updated.calibrate(digits.val.images, n=12, exclude=deleted, records=kept)
    scratch = NearDuplicateIndex(digits.train.images, digits.train.ids)
    scratch.calibrate(digits.val.images, n=12, exclude=deleted)
    new = updated.calibration
    assert 0 < new["searched"] <= len(cal["records"]) - len(kept) < 72
    assert {k: v for k, v in new.items() if k != "searched"} == {k: v for k, v in scratch.calibration.items()
                                                                 if k != "searched"}
    assert not set(deleted) & {r[3] for r in new["records"]} and not set(deleted) & set(new["set_by"])
    # a deleted image cannot raise a threshold: each is at most what it was
    assert updated.threshold <= first.threshold and updated.align_threshold <= first.align_threshold
    assert updated.small_threshold <= first.small_threshold
    # records that name an id deleted since they were made are searched again too
    again = NearDuplicateIndex(digits.train.images, digits.train.ids)
    again.calibrate(digits.val.images, n=12, exclude=deleted, records=cal["records"])
    assert again.calibration["records"] == new["records"]
