"""`munkey bench duplicates`: near-duplicate recall@1 of copies of training images (data/duplicates.py).

For each dataset: a seeded draw of `n` training images; each is transformed (enlarged 2x, 4x, 8x
bicubic; JPEG quality 85 at native size; and, beyond the published goal, other interpolations,
non-integer and shrinking factors, light crops) and searched in the whole training split.
recall@1: the top match is the image the copy was made from. "found": recall@1 *and* the score
reaches the threshold calibrated on the validation split (the "exact match found" the dashboard
shows). False matches: `null` test-split images (never in training; their look-alikes of the same
class are) under the same transform, and the share of them reported as a copy of something. The
calibration's own figures (best score of known non-copies) are printed too: the noise floor the
thresholds sit above.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import numpy as np

HELP = "near-duplicate recall@1 of resized / JPEG / cropped copies of training images"
DEFAULT_TRANSFORMS = "bicubic2x,bicubic4x,bicubic8x,jpeg85"
EXTRA_TRANSFORMS = "bilinear3x,nearest4x,lanczos1.5x,bicubic0.5x,bilinear0.5x,box0.5x,bicubic0.75x,bicubic6x+jpeg85,crop4%,crop10%"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datasets", default="digits,fashion-mnist,elpv", help="(default digits,fashion-mnist,elpv)")
    p.add_argument("--transforms", default=DEFAULT_TRANSFORMS,
                   # argparse %-formats help strings: the crops' '%' must be doubled
                   help=f"comma-separated (default {DEFAULT_TRANSFORMS}; 'all' adds {EXTRA_TRANSFORMS})".replace("%", "%%"))
    p.add_argument("--n", type=int, default=200, help="training images per dataset (default 200)")
    p.add_argument("--null", type=int, default=100, help="test images per transform for false matches (default 100)")
    p.add_argument("--calibrate", type=int, default=100, help="validation images for the threshold (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the Markdown table to this file")


def transform(img: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """A copy of (H, W, C) uint8 `img`: '<interp><f>x' resizes by f, 'jpeg<q>' re-encodes, 'crop<p>%'
    trims 0 to p % (rounded, at least one pixel) off each side (random) and resizes the rest to 4x the
    original size, bicubic (the aspect ratio changes a little); '+' chains."""
    from PIL import Image

    from munkey_core.data.duplicates import _hwc, _pil

    for part in kind.split("+"):
        h, w = img.shape[:2]
        if part.startswith("jpeg"):
            buf = io.BytesIO()
            _pil(img).save(buf, format="JPEG", quality=int(part[4:]))
            img = _hwc(Image.open(io.BytesIO(buf.getvalue())))
        elif part.startswith("crop"):
            frac = float(part[4:].rstrip("%")) / 100
            t, l, b, r = rng.integers(0, max(1, round(frac * h)) + 1, 4)
            img = _hwc(_pil(img[t:h - b, l:w - r]).resize((4 * w, 4 * h), Image.Resampling.BICUBIC))
        else:
            name = part.rstrip("x").rstrip("0123456789.")
            f = float(part[len(name):].rstrip("x"))
            method = getattr(Image.Resampling, name.upper())
            img = _hwc(_pil(img).resize((max(1, round(w * f)), max(1, round(h * f))), method))
    return img


def run(args: argparse.Namespace) -> int:
    from munkey_core.data.datasets import load_dataset
    from munkey_core.data.duplicates import NearDuplicateIndex

    kinds = args.transforms.split(",") if args.transforms != "all" else \
        (DEFAULT_TRANSFORMS + "," + EXTRA_TRANSFORMS).split(",")
    lines = ["| dataset | train images | copy | recall@1 | found (>= threshold) | lowest own score | ms / search "
             "| false matches (test images) | ms / search |", "|---|---|---|---|---|---|---|---|---|"]
    calib = ["| dataset | threshold (plain / aligned / shrunk / native) | best non-copy score (plain / aligned / shrunk "
             "/ native) | non-copy searches | index build s | calibration s |", "|---|---|---|---|---|---|"]
    for name in args.datasets.split(","):
        ds = load_dataset(name, seed=0)
        train = ds.train
        t0 = time.perf_counter()
        index = NearDuplicateIndex(train.images, train.ids)
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        index.calibrate(ds.split("val").images, n=args.calibrate, seed=args.seed)
        t_cal = time.perf_counter() - t0
        c = index.calibration or {}
        native = (f" / {index.native_threshold:.4f}", f" / {c['native_null_max']:.4f}") if "native_null_max" in c \
            else (" / —", " / —")  # images up to POLISH_WORK px have no native step
        calib.append(f"| {name} | {index.threshold:.4f} / {index.align_threshold:.4f} / {index.small_threshold:.4f}"
                     f"{native[0]} | {c.get('null_max', float('nan')):.4f} / {c.get('align_null_max', float('nan')):.4f} / "
                     f"{c.get('small_null_max', float('nan')):.4f}{native[1]} | {c.get('queries', 0)} | {t_build:.1f} | "
                     f"{t_cal:.1f} |")
        print(calib[-1], flush=True)
        rng = np.random.default_rng(args.seed)
        pick = rng.choice(len(train), size=min(args.n, len(train)), replace=False)
        test = ds.test
        nulls = rng.choice(len(test), size=min(args.null, len(test)), replace=False)
        for kind in kinds:
            t0 = time.perf_counter()
            hits = [index.search(transform(train.images[i], kind, rng), top=1)[0] for i in pick]
            per = (time.perf_counter() - t0) / len(pick)
            ok = np.array([h.position == i for h, i in zip(hits, pick)])
            score = np.array([h.score for h in hits])
            found = ok & (score >= index.threshold)
            low = f"{score[ok].min():.4f}" if ok.any() else "—"
            t0 = time.perf_counter()
            false = sum(index.best(transform(test.images[i], kind, rng)) is not None for i in nulls)
            per_null = (time.perf_counter() - t0) / max(1, len(nulls))
            lines.append(f"| {name} | {len(train)} | {kind} | {ok.mean():.3f} ({ok.sum()}/{len(ok)}) | "
                         f"{found.mean():.3f} | {low} | {1000 * per:.0f} | {false}/{len(nulls)} | {1000 * per_null:.0f} |")
            print(lines[-1], flush=True)
    text = "\n".join(calib) + "\n\n" + "\n".join(lines) + "\n"
    print()
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0
