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


def _crop_enlarged(img: np.ndarray, cut: tuple[int, int, int, int], side: int) -> np.ndarray:
    """(top, bottom, left, right) whole pixels cut off, the rest resized to side x side, bicubic."""
    t, b, l, r = cut
    h, w = img.shape[:2]
    return np.asarray(Image.fromarray(img[t:h - b, l:w - r, 0]).resize((side, side), Image.Resampling.BICUBIC))[..., None]


def test_elpv_crops_are_confirmed_where_near_identical_distinct_cells_are_not() -> None:
    """ELPV holds neighbouring cells of one module that correlate ~0.997 at the alignment's grid (a
    validation cell against a training cell), above what an aligned crop reaches there. The native
    score (whole training pixels) confirms the crop and keeps the distinct cell out."""
    ds = load_dataset("elpv", seed=0)
    train, val = ds.train, ds.split("val")
    keep = np.flatnonzero(((train.ids >= 1100) & (train.ids < 1260)) | ((train.ids >= 1500) & (train.ids < 1600)))
    index = NearDuplicateIndex(train.images[keep], train.ids[keep])
    assert index.has_native
    val_row = {int(i): j for j, i in enumerate(val.ids)}
    # calibrated on two validation cells with a near-identical training neighbour (1156 ~ 1157, 1194 ~ 1193)
    # and two others; tested on two more such pairs it never saw (1583 ~ 1582, 1579 ~ 1578)
    held = val.images[[val_row[1156], val_row[1194], val_row[int(val.ids[0])], val_row[int(val.ids[1])]]]
    index.calibrate(held, n=4)
    assert index.native_threshold < 1.0 and index.calibration["native_null_max"] >= 0.99
    rng = np.random.default_rng(0)
    confirmed = []
    for sid in (1157, 1582, 1578, 1193, int(train.ids[keep[7]])):
        img = train.images[int(np.flatnonzero(train.ids == sid)[0])]
        cut = tuple(int(c) for c in rng.integers(0, 31, 4))  # up to 10 % off each side
        hit = index.search(_crop_enlarged(img, cut, 1200), top=1)[0]
        if hit.score >= index.threshold:
            assert hit.id == sid, (sid, cut, hit)  # a confirmed match is always the right cell
            confirmed.append(sid)
    # 4 of 5 (measured; the fifth, 1578 cut by 25-28 px on two sides, is not even ranked first: the 32 px
    # alignment stalls among its look-alikes, and the page says "no match"; docs/results/near_duplicates.md)
    assert len(confirmed) >= 4, confirmed
    for vid in (1583, 1579):
        img = val.images[val_row[vid]]
        assert index.best(img) is None
        assert index.best(_crop_enlarged(img, (12, 9, 20, 3), 1200)) is None
