"""Dataset registry: every dataset as uint8 images, int labels, class names and stable sample ids.

A sample id is the integer a deletion request names. It is the sample's position in its source's
canonical order, offset per source file so ids never collide across splits (Fashion-MNIST train
i -> i, test i -> 60000 + i), so it is the same on every load, on every machine, for any `seed`
or `max_train`. Each loader's docstring states its scheme.

    ds = load_dataset("digits", seed=0)          # Dataset(train/val/test Splits, class_names)
    ds.train.images                              # (N, H, W, C) uint8, C in {1, 3}
    ds.lookup([17, 4]).labels                    # rows by id, across all splits

Registry names: digits, fashion-mnist, elpv, cifar10, cifar100, every single-label 2D MedMNIST
flag (dermamnist, bloodmnist, pathmnist, ...; `dermamnist_64` etc. for the larger sizes) and
`folder:PATH`. Every loader reads local files (`data_root`) and says how to get missing data;
`download=True` fetches with torchvision / medmnist where the source allows it.

Costs: everything is held in RAM as uint8 (digits 0.1 MB, Fashion-MNIST 55 MB, CIFAR 184 MB,
ELPV 236 MB, PathMNIST-28 252 MB); nothing is cached on disk. Load times on a 2-core box: digits
~30 ms (it reads scikit-learn's data file directly: importing sklearn alone takes ~2 s),
Fashion-MNIST .gz 0.25 s, PathMNIST-28 npz 0.45 s, image folders at the PNG decoder's pace (ELPV:
~6 s for 2,624 300x300 PNGs). `lookup` builds a sorted id index once per Dataset (O(N log N)),
then costs O(k log N) for k ids. Splits we carve (val from train, or 70/10/20 where the source has
none) are stratified and depend only on `seed`. Covered by tests/data/test_data.py.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import pickle
import re
import struct
import sys
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.data.images import IMAGE_SUFFIXES, read_image_file, resize_to
from munkey_core.data.sampling import apportion, stratified_sample

SPLIT_NAMES = ("train", "val", "test")
CARVE_ALL = (0.7, 0.1, 0.2)  # train/val/test fractions where the source has no split
CARVE_VAL = (0.9, 0.1)  # train/val fractions where the source has only train/test

# Searched after data_root (if any); download=True writes to DEFAULT_DATA_ROOT without one.
# Module attributes (not default arguments) so tests can point them at a temporary folder.
DEFAULT_DATA_ROOT = Path.home() / ".cache" / "munkey" / "data"
MEDMNIST_DEFAULT_ROOT = Path.home() / ".medmnist"  # medmnist's own default root
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def _read_errors() -> tuple[type[BaseException], ...]:
    """Everything a damaged or foreign file can raise while being decoded (gzip, zip, pickle, PIL);
    a function so that Pillow is imported only when an error is being matched."""
    from PIL import Image

    return (OSError, EOFError, ValueError, SyntaxError, KeyError, IndexError, TypeError, AttributeError, ImportError,
            struct.error, zlib.error, zipfile.BadZipFile, pickle.UnpicklingError, Image.DecompressionBombError)


# --------------------------------------------------------------------------- containers


@dataclass(frozen=True, eq=False)
class Split:
    """One split: images (N, H, W, C) uint8, labels (N,) int64, ids (N,) int64."""

    images: np.ndarray  # (N, H, W, C) uint8
    labels: np.ndarray  # (N,) int64 in [0, num_classes)
    ids: np.ndarray  # (N,) int64, stable, unique across the dataset's splits

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or not (len(self.images) == len(self.labels) == len(self.ids)):
            raise ValueError(f"inconsistent split: images {self.images.shape}, "
                             f"labels {self.labels.shape}, ids {self.ids.shape}")

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Split(n={len(self)}, image={tuple(self.images.shape[1:])})"

    def subset(self, mask_or_index: np.ndarray | Sequence[int] | Sequence[bool]) -> Split:
        """Rows selected by a bool mask of length N or an integer index array."""
        index = np.asarray(mask_or_index)
        if index.dtype == bool and index.shape != (len(self),):
            raise ValueError(f"mask has shape {index.shape}, split has {len(self)} rows")
        if index.dtype != bool:
            index = index.astype(np.int64, copy=False).reshape(-1)
        return Split(self.images[index], self.labels[index], self.ids[index])


@dataclass(frozen=True, eq=False)
class Dataset:
    """A named dataset: class names and its train/val/test splits."""

    name: str  # registry name as the user typed it, e.g. "digits", "folder:/x/y"
    class_names: list[str]
    train: Split
    val: Split
    test: Split

    def __repr__(self) -> str:
        sizes = "/".join(str(len(self.split(s))) for s in SPLIT_NAMES)
        return f"Dataset({self.name!r}, {self.num_classes} classes, train/val/test {sizes})"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def channels(self) -> int:
        return int(self.train.images.shape[3])

    @property
    def image_shape(self) -> tuple[int, int]:
        return int(self.train.images.shape[1]), int(self.train.images.shape[2])

    def split(self, name: str) -> Split:
        """The split called "train", "val" or "test"."""
        if name not in SPLIT_NAMES:
            raise MunkeyError(f"unknown split {name!r}: use one of {', '.join(SPLIT_NAMES)}")
        return getattr(self, name)

    def lookup(self, ids: int | Sequence[int] | np.ndarray) -> Split:
        """Rows by sample id across all splits, in the order asked; unknown ids: MunkeyError."""
        wanted = _as_ids(ids)
        sorted_ids, where = self._id_index
        pos = np.searchsorted(sorted_ids, wanted).clip(max=max(len(sorted_ids) - 1, 0))
        found = sorted_ids[pos] == wanted if len(sorted_ids) else np.zeros(len(wanted), bool)
        if not found.all():
            raise MunkeyError(self._unknown_ids_message(wanted[~found]))
        split_no, rows = where[0][pos], where[1][pos]
        images = np.empty((len(wanted), *self.train.images.shape[1:]), np.uint8)
        labels = np.empty(len(wanted), np.int64)
        for k, split in enumerate(self.split(s) for s in SPLIT_NAMES):
            sel = split_no == k
            images[sel], labels[sel] = split.images[rows[sel]], split.labels[rows[sel]]
        return Split(images, labels, wanted)

    @functools.cached_property
    def _id_index(self) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Sorted ids and, aligned with them, (split number, row) - built once per Dataset."""
        splits = [self.split(s) for s in SPLIT_NAMES]
        ids = np.concatenate([s.ids for s in splits])
        split_no = np.concatenate([np.full(len(s), k) for k, s in enumerate(splits)])
        rows = np.concatenate([np.arange(len(s)) for s in splits])
        order = np.argsort(ids, kind="stable")
        return ids[order], (split_no[order], rows[order])

    def _unknown_ids_message(self, missing: np.ndarray) -> str:
        shown = ", ".join(str(i) for i in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        return (f"sample id(s) not in dataset {self.name!r}: {shown}{more}. Use ids from this "
                "dataset's splits (a run loaded with --max-train holds only the train ids it "
                "kept).")


def _as_ids(ids: int | Sequence[int] | np.ndarray) -> np.ndarray:
    """Ids as a flat int64 array; non-integer values raise MunkeyError."""
    arr = np.atleast_1d(np.asarray(ids)).reshape(-1)
    if arr.dtype.kind in "iu" or len(arr) == 0:
        return arr.astype(np.int64)
    try:
        as_int = arr.astype(np.int64)
        if np.array_equal(as_int, arr.astype(np.float64)):
            return as_int
    except (TypeError, ValueError, OverflowError):
        pass
    raise MunkeyError(f"sample ids must be integers, got {list(arr[:5])}")


# --------------------------------------------------------------------------- splitting


def _carve(labels: np.ndarray, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Stratified, seeded split of row indices into parts (first = train), each part sorted.

    Held-out parts are apportioned cumulatively from the last (test) back, so per class train and
    test are within 1 of their exact share and val within 2. Every class keeps at least one sample
    in train, so classes too small to reach every part still work: they fill train first (this
    replaces the usual fall-back to an unstratified split, which can leave a class out of train).
    """
    if len(labels) == 0:
        return [np.zeros(0, np.int64) for _ in fractions]
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    n = len(labels)
    allocs = [np.zeros_like(counts) for _ in fractions]
    held, want = np.zeros_like(counts), 0  # per class / in total, held out of train so far
    for k in range(len(fractions) - 1, 0, -1):
        want += max(int(n * fractions[k] + 0.5), 1 if n >= len(fractions) else 0)
        cum = apportion(counts, want, held, counts - 1)  # (C,) one per class stays in train
        allocs[k], held = cum - held, cum
    allocs[0] = counts - held
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in fractions]
    for c in range(len(classes)):
        rows = rng.permutation(np.flatnonzero(inverse == c))
        for k, piece in enumerate(np.split(rows, np.cumsum([a[c] for a in allocs[:-1]]))):
            parts[k].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]


def _carve_splits(pool: Split, fractions: Sequence[float], seed: int) -> list[Split]:
    """`_carve` applied to a Split."""
    return [pool.subset(index) for index in _carve(pool.labels, fractions, seed)]


def _limit_train(ds: Dataset, max_train: int, seed: int) -> Dataset:
    """`ds` with train cut to a stratified, seeded subset of max_train rows (ids unchanged)."""
    if max_train >= len(ds.train):
        return ds
    keep = stratified_sample(ds.train.labels, int(max_train), seed)
    return replace(ds, train=ds.train.subset(keep))


# --------------------------------------------------------------------------- building blocks


def _make_split(images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> Split:
    """A Split with canonical dtypes; gray (N, H, W) images get a channel axis."""
    images = np.asarray(images, dtype=np.uint8)
    if images.ndim == 3:
        images = images[..., None]
    return Split(np.ascontiguousarray(images), np.asarray(labels, np.int64).reshape(-1),
                 np.asarray(ids, np.int64))


def _check_labels(labels: np.ndarray, num_classes: int, source: Path | str) -> None:
    """Corrupt-file error when labels fall outside [0, num_classes)."""
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise MunkeyError(f"{source} holds labels outside 0..{num_classes - 1}; the file is "
                          "corrupt or from another dataset: replace it")


def _corrupt(path: Path | str, exc: BaseException | str) -> MunkeyError:
    """The error for a file we cannot decode."""
    return MunkeyError(f"cannot read {path} ({exc}): the file is corrupt or not the expected "
                       "format. Delete it and fetch it again, or pass another --data-root.")


def _first_existing(candidates: Sequence[Path]) -> Path | None:
    return next((p for p in candidates if p.exists()), None)


def _search_roots(root: Path | None, *defaults: Path) -> list[Path]:
    """data_root (if given) first, then the default locations."""
    return ([root] if root is not None else []) + [DEFAULT_DATA_ROOT, *defaults]


def _download_with(what: str, root: Path, fetch: Callable[[Path], object]) -> None:
    """Run a third-party downloader into root; any failure becomes a MunkeyError."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fetch(root)
    except Exception as exc:  # network, HTTP, checksum, disk: the downloaders raise anything
        raise MunkeyError(f"downloading {what} into {root} failed ({exc}). Check the internet "
                          "connection, or fetch the files on another machine and pass "
                          "--data-root DIR.") from exc


def _where(roots: Sequence[Path]) -> str:
    return ", ".join(str(r) for r in roots)


def _put_hint(what: str, root: Path | None) -> str:
    """How to hand local files over: into the given data_root, or a DIR passed as --data-root."""
    if root is not None:
        return f"put {what} in {root} (the --data-root given)"
    return (f"put {what} in a folder DIR and pass --data-root DIR (or in {DEFAULT_DATA_ROOT}, "
            "which munkey searches by default)")


# --------------------------------------------------------------------------- images


def _stack_images(images: Sequence[np.ndarray]) -> np.ndarray:
    """(N, H, W, C) uint8: RGB if any image is RGB, all resized to the most common size."""
    channels = 3 if any(im.shape[2] == 3 for im in images) else 1
    size = Counter(im.shape[:2] for im in images).most_common(1)[0][0]
    out = np.empty((len(images), *size, channels), np.uint8)
    for i, im in enumerate(images):
        out[i] = im if im.shape[:2] == size else resize_to(im, size)  # (H, W, 1) broadcasts to 3
    return out


# --------------------------------------------------------------------------- digits


DIGITS_CLASSES = [str(d) for d in range(10)]


def _load_digits(name: str, root: Path | None, download: bool, seed: int) -> Dataset:
    """scikit-learn's 8x8 digits, 1,797 images, 10 classes; 70/10/20 stratified split by `seed`.

    Ids: row i of `load_digits()` -> i. Pixel values 0..16 are scaled to 0..255.
    """
    data = _digits_table()  # (1797, 65): 64 pixels, then the digit
    images = np.rint(data[:, :64] * (255 / 16)).astype(np.uint8).reshape(-1, 8, 8, 1)
    pool = _make_split(images, data[:, 64].astype(np.int64), np.arange(len(data)))
    train, val, test = _carve_splits(pool, CARVE_ALL, seed)
    return Dataset(name, list(DIGITS_CLASSES), train, val, test)


def _digits_table() -> np.ndarray:
    """The digits table, read from scikit-learn's data file without importing sklearn (~2 s)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            table = _small_int_csv(gzip.decompress(path.read_bytes()), 65)
            return table if table is not None else np.loadtxt(path, delimiter=",")
    from sklearn.datasets import load_digits  # layout changed: take the slow, documented way

    bunch = load_digits()
    return np.column_stack([bunch.data, bunch.target])


def _small_int_csv(raw: bytes, columns: int) -> np.ndarray | None:
    """np.loadtxt(delimiter=",") of a CSV of integers 0..99, `columns` per line, parsed with numpy
    alone (float64 (rows, columns)): a quarter of np.loadtxt's time on the digits table (~20 ms of a
    deletion without evaluation). None for any other text (the caller reads it with np.loadtxt)."""
    b = np.frombuffer(raw, dtype=np.uint8)  # (n,) bytes
    digit = (b >= ord("0")) & (b <= ord("9"))
    newline = b == ord("\n")
    if not (digit | newline | (b == ord(",")) | (b == ord("\r"))).all():
        return None
    before = np.zeros_like(digit)
    before[1:] = digit[:-1]
    after = np.zeros_like(digit)
    after[:-1] = digit[1:]
    if (digit & before & after).any():
        return None  # a number of three digits or more
    start = np.flatnonzero(digit & ~before)  # (tokens,) first digit of each number
    if len(start) == 0:
        return None
    ends = np.flatnonzero(newline)  # (lines,) offset of each new line: a byte's line is how many come before it
    numbers = np.bincount(np.searchsorted(ends, start), minlength=len(ends) + 1)  # per line
    commas = np.bincount(np.searchsorted(ends, np.flatnonzero(b == ord(","))), minlength=len(numbers))
    used = numbers > 0  # blank lines are skipped, as np.loadtxt skips them
    if not ((numbers[used] == columns).all() and (commas[used] == columns - 1).all() and (commas[~used] == 0).all()):
        return None  # a line with another number of fields, or an empty field
    value = b[start].astype(np.int64) - ord("0")
    two = after[start]
    value[two] = value[two] * 10 + b[start[two] + 1] - ord("0")
    return value.reshape(-1, columns).astype(np.float64)


# --------------------------------------------------------------------------- Fashion-MNIST


FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot"]
_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _load_fashion_mnist(name: str, root: Path | None, download: bool, seed: int) -> Dataset:
    """Fashion-MNIST from its four idx files (.gz or plain); val = 10% of train, stratified.

    Looked for in data_root, data_root/FashionMNIST/raw (torchvision's layout), the same under
    DEFAULT_DATA_ROOT, then Debian's /usr/share/datasets/fashion-mnist.
    Ids: train i -> i, test i -> 60000 + i (60000 = the train file's length).
    """
    folder = _find_idx_folder(root)
    if folder is None and download:
        from torchvision.datasets import FashionMNIST

        target = root or DEFAULT_DATA_ROOT
        _download_with("fashion-mnist", target, lambda r: FashionMNIST(str(r), download=True))
        folder = _find_idx_folder(root)
    if folder is None:
        raise MunkeyError(_fashion_missing_message(root))
    files = [_idx_path(folder, stem) for stem in _IDX_FILES]
    x_train, y_train, x_test, y_test = (_read_idx(f) for f in files)
    train = _idx_split(x_train, y_train, 0, files[0])
    test = _idx_split(x_test, y_test, len(train), files[2])
    train, val = _carve_splits(train, CARVE_VAL, seed)
    return Dataset(name, list(FASHION_MNIST_CLASSES), train, val, test)


def _fashion_folders(root: Path | None) -> list[Path]:
    base = _search_roots(root)
    return [p for r in base for p in (r, r / "FashionMNIST" / "raw")] + [DEBIAN_FASHION_MNIST]


def _idx_path(folder: Path, stem: str) -> Path | None:
    return _first_existing([folder / stem, folder / f"{stem}.gz"])


def _find_idx_folder(root: Path | None) -> Path | None:
    """The first folder holding all four idx files."""
    return next((f for f in _fashion_folders(root)
                 if all(_idx_path(f, s) is not None for s in _IDX_FILES)), None)


def _fashion_missing_message(root: Path | None) -> str:
    files = f"the four idx files ({', '.join(_IDX_FILES)}, .gz or not)"
    return (f"fashion-mnist not found in {_where(_fashion_folders(root))}. Install Debian's "
            "dataset-fashion-mnist package (apt-get install dataset-fashion-mnist), or "
            f"{_put_hint(files, root)}, or pass --download on a machine with internet.")


def _read_idx(path: Path) -> np.ndarray:
    """An idx file (the MNIST format: magic, big-endian dims, uint8 data) as an array."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
        zero, dtype_code, ndim = struct.unpack_from(">HBB", raw, 0)
        if zero != 0 or dtype_code != 0x08 or ndim not in (1, 3):
            raise ValueError(f"not a uint8 idx file (magic {raw[:4].hex()})")
        dims = struct.unpack_from(f">{ndim}I", raw, 4)
        data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
        return data.reshape(dims)
    except _read_errors() as exc:
        raise _corrupt(path, exc) from exc


def _idx_split(images: np.ndarray, labels: np.ndarray, offset: int, source: Path) -> Split:
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise _corrupt(source, f"{len(images)} images but {len(labels)} labels")
    _check_labels(labels, len(FASHION_MNIST_CLASSES), source)
    return _make_split(images, labels, offset + np.arange(len(labels)))


# --------------------------------------------------------------------------- ELPV


ELPV_CLASSES = ["functional", "possibly defective", "likely defective", "defective"]


def _load_elpv(name: str, root: Path | None, download: bool, seed: int) -> Dataset:
    """ELPV solar cells: labels.csv (`path probability type`) + gray images; 70/10/20 stratified.

    Read from data_root when it holds labels.csv, else from the installed `elpv-dataset` package.
    Defect probability {0, 1/3, 2/3, 1} -> class 0..3; the mono/poly type column is not used.
    Ids: row i of labels.csv -> i.
    """
    csv = _elpv_labels_csv(root)
    rows = _read_elpv_csv(csv)
    images = _stack_images([read_image_file(csv.parent / path) for path, _ in rows])
    labels = np.array([label for _, label in rows], np.int64)
    pool = _make_split(images, labels, np.arange(len(rows)))
    train, val, test = _carve_splits(pool, CARVE_ALL, seed)
    return Dataset(name, list(ELPV_CLASSES), train, val, test)


def _elpv_labels_csv(root: Path | None) -> Path:
    """labels.csv in data_root, else the elpv_dataset package's, else a MunkeyError."""
    candidates = [root / "labels.csv"] if root is not None else []
    spec = importlib.util.find_spec("elpv_dataset")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(list(spec.submodule_search_locations)[0]) / "data" / "labels.csv")
    found = _first_existing(candidates)
    if found is None:
        where = root or "DIR"
        raise MunkeyError(f"elpv not found{f' in {root}' if root else ''}. Install it with "
                          "pip install elpv-dataset (or pip install 'munkey-core[elpv]'), or put "
                          f"its labels.csv and images/ folder in {where} and pass "
                          f"--data-root {where}. --download cannot fetch it: it comes from pip.")
    return found


def _read_elpv_csv(path: Path) -> list[tuple[str, int]]:
    """(relative image path, class) per row of an ELPV labels.csv."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise _corrupt(path, exc) from exc
    rows = []
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        try:
            prob = float(fields[1])
            label = round(prob * 3)
            if not 0 <= label <= 3 or abs(prob * 3 - label) > 1e-3:
                raise ValueError(f"probability {fields[1]} is not one of 0, 1/3, 2/3, 1")
        except (IndexError, ValueError, OverflowError) as exc:
            raise _corrupt(path, f"line {number}: {exc}") from exc
        rows.append((fields[0], label))
    if not rows:
        raise _corrupt(path, "no rows")
    return rows


# --------------------------------------------------------------------------- MedMNIST


def _load_medmnist(name: str, root: Path | None, download: bool, seed: int) -> Dataset:
    """A 2D MedMNIST set from ROOT/<flag>.npz (size 28) or ROOT/<flag>_<size>.npz; official splits.

    Looked for in data_root, DEFAULT_DATA_ROOT, then medmnist's ~/.medmnist.
    Ids: train i -> i, val i -> n_train + i, test i -> n_train + n_val + i (the same at every
    size: e.g. dermamnist 7,007 / 1,003 / 2,005 -> test starts at 8010).
    """
    flag, size = _medmnist_flag_size(name)
    filename = f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"
    roots = _search_roots(root, MEDMNIST_DEFAULT_ROOT)
    path = _first_existing([r / filename for r in roots])
    if path is None and download:
        _download_with(filename, root or DEFAULT_DATA_ROOT,
                       lambda r: _medmnist_fetch(flag, size, r))
        path = _first_existing([r / filename for r in roots])
    if path is None:
        raise MunkeyError(_medmnist_missing_message(flag, size, filename, roots, root))
    info = _medmnist_info()[flag]
    class_names = [info["label"][k] for k in sorted(info["label"], key=int)]
    train, val, test = _read_medmnist_npz(path, len(class_names))
    return Dataset(name, class_names, train, val, test)


def _read_medmnist_npz(path: Path, num_classes: int) -> list[Split]:
    """The three official splits of a MedMNIST npz, ids offset by the preceding splits' sizes."""
    try:
        with open(path, "rb") as f:  # our own handle: np.load leaks it on a broken zip
            npz = np.load(f, allow_pickle=False)
            if not hasattr(npz, "files"):
                raise ValueError("a single .npy array, not an .npz archive")
            arrays = {k: npz[k] for k in (f"{s}_{part}" for s in SPLIT_NAMES
                                           for part in ("images", "labels"))}
    except _read_errors() as exc:
        raise _corrupt(path, exc) from exc
    splits, offset = [], 0
    for s in SPLIT_NAMES:
        images, labels = arrays[f"{s}_images"], arrays[f"{s}_labels"]
        if images.ndim not in (3, 4) or images.shape[3:] not in ((), (1,), (3,)) \
                or labels.ndim not in (1, 2) or len(images) != len(labels) \
                or labels.reshape(len(labels), -1).shape[1] != 1:
            raise _corrupt(path, f"{s}: images {images.shape}, labels {labels.shape}")
        labels = labels.reshape(-1).astype(np.int64)  # (N, 1) -> (N,)
        _check_labels(labels, num_classes, path)
        splits.append(_make_split(images, labels, offset + np.arange(len(labels))))
        offset += len(labels)
    return splits


@functools.lru_cache(maxsize=1)
def _medmnist_info() -> dict[str, dict]:
    """medmnist's INFO table, read from medmnist/info.py alone: `import medmnist` pulls in torch
    (~4 s), far too slow for a help text. Empty when medmnist is not installed."""
    if "medmnist.info" in sys.modules:
        return sys.modules["medmnist.info"].INFO
    spec = importlib.util.find_spec("medmnist")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "info.py"
    module_spec = importlib.util.spec_from_file_location("_munkey_medmnist_info", path)
    if module_spec is None or module_spec.loader is None:
        return {}
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.INFO


def _medmnist_sizes(flag: str) -> list[int]:
    """Image sizes medmnist offers for a flag (28 plus every `url_<size>` it lists)."""
    info = _medmnist_info()[flag]
    return [28] + sorted(int(k[4:]) for k in info if re.fullmatch(r"url_\d+", k))


def _medmnist_flags(*, multi_label: bool = False) -> list[str]:
    """2D MedMNIST flags: single-label ones (we need one label per image), or the multi-label."""
    return [flag for flag, info in _medmnist_info().items()
            if not flag.endswith("3d") and ("multi-label" in info["task"]) == multi_label]


def _medmnist_flag_size(name: str) -> tuple[str, int]:
    """("dermamnist", 64) from "dermamnist_64"; size 28 without a suffix."""
    match = re.fullmatch(r"(.+?)(?:_(\d+))?", name.strip().lower())
    flag, size = match.group(1), int(match.group(2) or 28)
    if size not in _medmnist_sizes(flag):
        sizes = ", ".join(str(s) for s in _medmnist_sizes(flag))
        raise MunkeyError(f"{flag} comes in sizes {sizes}, not {size}: use e.g. {flag}_64")
    return flag, size


def _medmnist_fetch(flag: str, size: int, root: Path) -> None:
    import medmnist

    cls = getattr(medmnist, _medmnist_info()[flag]["python_class"])
    cls(split="train", root=str(root), download=True, size=size)


def _medmnist_missing_message(flag: str, size: int, filename: str, roots: list[Path],
                              root: Path | None) -> str:
    info = _medmnist_info()[flag]
    suffix = "" if size == 28 else f"_{size}"
    return (f"{flag} (size {size}) not found: looked for {filename} in {_where(roots)}. Download "
            f"{info['url' + suffix]} (MD5 {info['MD5' + suffix]}), "
            f"{_put_hint(f'it as {filename}', root)}, or pass --download on a machine with "
            "internet.")


# --------------------------------------------------------------------------- CIFAR


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles CIFAR batches: plain containers and numpy arrays only, so no file can run code."""

    _CORE = "numpy._core" if hasattr(np, "_core") else "numpy.core"
    _ALLOWED = {("multiarray", "_reconstruct"), ("multiarray", "scalar"),
                ("numeric", "_frombuffer")}

    def find_class(self, module: str, name: str):
        core = re.fullmatch(r"numpy\._?core\.(\w+)", module)
        if core and (core.group(1), name) in self._ALLOWED:
            return super().find_class(f"{self._CORE}.{core.group(1)}", name)
        if (module, name) in {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_cifar_pickle(path: Path) -> dict[str, object]:
    """A CIFAR python-version pickle (written by Python 2) as a dict with str keys."""
    try:
        with open(path, "rb") as f:
            obj = _ArrayUnpickler(f, encoding="latin1").load()
        if not isinstance(obj, dict):
            raise ValueError(f"expected a dict, got {type(obj).__name__}")
    except _read_errors() as exc:
        raise _corrupt(path, exc) from exc
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _cifar_batch(path: Path, label_key: str, num_classes: int, offset: int) -> Split:
    """One CIFAR batch file: data (N, 3072) as channel planes -> (N, 32, 32, 3) images."""
    batch = _read_cifar_pickle(path)
    try:
        data = np.asarray(batch["data"], np.uint8)
        labels = np.asarray(batch[label_key], np.int64).reshape(-1)
        images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
    except _read_errors() as exc:
        raise _corrupt(path, exc) from exc
    _check_labels(labels, num_classes, path)
    return _make_split(images, labels, offset + np.arange(len(labels)))


def _cifar_class_names(path: Path, key: str) -> list[str]:
    names = _read_cifar_pickle(path).get(key)
    if not isinstance(names, list) or not names:
        raise _corrupt(path, f"no {key}")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def _cifar_folder(root: Path | None, download: bool, spec: dict) -> Path:
    """The folder holding a CIFAR variant's files, downloading it if asked."""
    roots = _search_roots(root)
    meta = _first_existing([r / spec["folder"] / spec["meta"] for r in roots])
    if meta is None and download:
        import torchvision.datasets

        fetch = getattr(torchvision.datasets, spec["torchvision"])
        _download_with(spec["name"], root or DEFAULT_DATA_ROOT,
                       lambda r: fetch(str(r), download=True))
        meta = _first_existing([r / spec["folder"] / spec["meta"] for r in roots])
    if meta is None:
        folder = f"its {spec['folder']}/ folder"
        raise MunkeyError(f"{spec['name']} not found: looked for {spec['folder']}/ in "
                          f"{_where(roots)}. Download {spec['url']} (python version), extract "
                          f"it and {_put_hint(folder, root)}, or pass --download on a machine "
                          "with internet.")
    return meta.parent


_CIFAR = {
    "cifar10": dict(name="cifar10", folder="cifar-10-batches-py", meta="batches.meta",
                    train=[f"data_batch_{i}" for i in range(1, 6)], test="test_batch",
                    names_key="label_names", label_key="labels", torchvision="CIFAR10",
                    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    "cifar100": dict(name="cifar100", folder="cifar-100-python", meta="meta", train=["train"],
                     test="test", names_key="fine_label_names", label_key="fine_labels",
                     torchvision="CIFAR100",
                     url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
}


def _load_cifar(variant: str, name: str, root: Path | None, download: bool, seed: int) -> Dataset:
    """CIFAR-10 / CIFAR-100 (fine labels) from the python pickles; val = 10% of train, stratified.

    Ids: train rows in file order (cifar10: data_batch_1..5 concatenated) i -> i; test i -> 50000
    + i (50000 = the train files' total length).
    """
    spec = _CIFAR[variant]
    folder = _cifar_folder(root, download, spec)
    class_names = _cifar_class_names(folder / spec["meta"], spec["names_key"])
    parts, offset = [], 0
    for filename in [*spec["train"], spec["test"]]:
        path = folder / filename
        if not path.is_file():
            raise MunkeyError(f"{path} is missing: extract the whole {spec['url']} archive again")
        parts.append(_cifar_batch(path, spec["label_key"], len(class_names), offset))
        offset += len(parts[-1])
    train = _concat_splits(parts[:-1])
    train, val = _carve_splits(train, CARVE_VAL, seed)
    return Dataset(name, class_names, train, val, parts[-1])


def _concat_splits(parts: Sequence[Split]) -> Split:
    return Split(*(np.concatenate([getattr(p, f) for p in parts])
                   for f in ("images", "labels", "ids")))


# --------------------------------------------------------------------------- folder:PATH


def _load_folder(name: str, root: Path | None, download: bool, seed: int) -> Dataset:
    """folder:PATH - one sub-folder per class (sorted names), PNG/JPEG/BMP/TIFF/NPY images inside.

    Sub-folders without images are not classes. Images are resized to the most common size and
    made RGB if any image is RGB (else kept gray). 70/10/20 stratified split by `seed`.
    Ids: position in the sorted list of image paths relative to PATH (e.g. "cat/001.png").
    """
    given = name.split(":", 1)[1].strip()
    path = Path(given).expanduser()
    if not given or not path.is_dir():
        raise MunkeyError(f"folder {given!r} does not exist: give folder:PATH with PATH a folder "
                          "holding one sub-folder of images per class")
    files = _class_folder_files(path)
    class_names = sorted({rel.split("/", 1)[0] for rel, _ in files})
    class_of = {c: k for k, c in enumerate(class_names)}
    labels = np.array([class_of[rel.split("/", 1)[0]] for rel, _ in files], np.int64)
    images = _stack_images([read_image_file(f) for _, f in files])
    pool = _make_split(images, labels, np.arange(len(files)))
    train, val, test = _carve_splits(pool, CARVE_ALL, seed)
    return Dataset(name, class_names, train, val, test)


def _class_folder_files(path: Path) -> list[tuple[str, Path]]:
    """(relative posix path, file) of every image below a class sub-folder, sorted by path."""
    files = sorted((f.relative_to(path).as_posix(), f) for f in path.glob("*/**/*")
                   if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES
                   and not any(part.startswith(".") for part in f.relative_to(path).parts))
    if not files:
        raise MunkeyError(f"no images found in {path}: expected one sub-folder per class holding "
                          f"{'/'.join(s[1:].upper() for s in IMAGE_SUFFIXES)} files, e.g. "
                          f"{path / 'cat' / '001.png'}")
    return files


# --------------------------------------------------------------------------- registry


Loader = Callable[[str, "Path | None", bool, int], Dataset]  # (name, data_root, download, seed)

_FIXED_LOADERS: dict[str, Loader] = {
    "digits": _load_digits,
    "fashion-mnist": _load_fashion_mnist,
    "elpv": _load_elpv,
    "cifar10": functools.partial(_load_cifar, "cifar10"),
    "cifar100": functools.partial(_load_cifar, "cifar100"),
}


def _registry() -> dict[str, Loader]:
    """Registry name -> loader (MedMNIST flags come from the installed medmnist); `folder:PATH`
    is matched by its prefix in `_resolve`."""
    return {**_FIXED_LOADERS, **{flag: _load_medmnist for flag in _medmnist_flags()}}


def available_datasets() -> list[str]:
    """Registry names, for help texts (`folder:PATH` stands for any class folder)."""
    return [*_registry(), "folder:PATH"]


def _resolve(name: str) -> Loader:
    """The loader for a registry name (case-insensitive; `flag_<size>` for MedMNIST sizes)."""
    if name.startswith("folder:"):
        return _load_folder
    key = name.strip().lower()
    registry = _registry()
    base = re.sub(r"_\d+$", "", key)
    if key in registry:
        return registry[key]
    if base in _medmnist_flags():
        return _load_medmnist
    if base in _medmnist_flags(multi_label=True):
        raise MunkeyError(f"{base} is multi-label; munkey needs one class per image. Pick another "
                          f"dataset: {', '.join(available_datasets())}")
    raise MunkeyError(f"unknown dataset {name!r}. Available: {', '.join(available_datasets())} "
                      "(MedMNIST sets also as e.g. dermamnist_64 for 64x64 images).")


def load_dataset(name: str, data_root: str | Path | None = None, *, download: bool = False,
                 seed: int = 0, max_train: int | None = None) -> Dataset:
    """Load a registry dataset with train/val/test splits and stable sample ids.

    `seed` only affects splits we carve; `max_train` keeps a stratified, seeded train subset
    (ids unchanged). Missing or corrupt data raises MunkeyError saying what to do.
    """
    if max_train is not None and (isinstance(max_train, bool) or max_train < 1
                                  or not isinstance(max_train, (int, np.integer))):
        raise MunkeyError(f"max_train must be a positive integer, got {max_train!r}")
    loader = _resolve(name)
    root = Path(data_root).expanduser() if data_root is not None else None
    ds = loader(name if name.startswith("folder:") else name.strip(), root, download, seed)
    return ds if max_train is None else _limit_train(ds, max_train, seed)
