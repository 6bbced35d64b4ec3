"""Tests for munkey_core.data.datasets: each loader on small files in the real layout; real digits, elpv.

Each test writes the source's real file format into tmp_path (idx, labels.csv + PNGs, npz,
CIFAR pickles, class folders) and loads it through the public API. No network, no mocks.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from munkey_core.data import datasets as data
from munkey_core.data.datasets import Dataset, Split, available_datasets, load_dataset
from munkey_core.errors import MunkeyError

FASHION_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
ELPV_PROBS = ("0.0", "0.3333333333333333", "0.6666666666666666", "1.0")


@pytest.fixture(autouse=True)
def isolated_defaults(tmp_path, monkeypatch):
    """Point the default search locations at empty folders, so the machine's own data
    (Debian's fashion-mnist, ~/.medmnist, ~/.cache/munkey) cannot leak into a test."""
    monkeypatch.setattr(data, "DEFAULT_DATA_ROOT", tmp_path / "default-root")
    monkeypatch.setattr(data, "MEDMNIST_DEFAULT_ROOT", tmp_path / "medmnist-default")
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST", tmp_path / "debian-fashion-mnist")


# ----------------------------------------------------------------------------- writers


def balanced_labels(n: int, num_classes: int, seed: int = 0) -> np.ndarray:
    """n labels, as balanced as possible over num_classes, in shuffled order."""
    return np.random.default_rng(seed).permutation(np.arange(n) % num_classes).astype(np.uint8)


def write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    """An idx file: 0x0000, dtype 0x08 (uint8), ndim, big-endian dims, then the bytes."""
    raw = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += np.ascontiguousarray(array, np.uint8).tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)


def write_fashion(folder: Path, gz: bool, n_train: int = 200, n_test: int = 50) -> dict:
    """The four Fashion-MNIST idx files with random 28x28 images; returns what was written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": balanced_labels(n_train, 10, 1),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": balanced_labels(n_test, 10, 2),
    }
    for name, array in arrays.items():
        write_idx(folder / name, array, gz)
    return arrays


def write_elpv(folder: Path, per_class: tuple[int, ...] = (12, 8, 6, 10), size: int = 12) -> list:
    """An ELPV-layout folder: labels.csv (`path probability type`) plus gray PNGs in images/."""
    (folder / "images").mkdir(parents=True)
    rng = np.random.default_rng(3)
    classes = np.sort(np.concatenate([np.full(n, c) for c, n in enumerate(per_class)]))
    classes = rng.permutation(classes)
    lines = []
    for i, c in enumerate(classes):
        rel = f"images/cell{i + 1:04d}.png"
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(folder / rel)
        lines.append(f"{rel}  {ELPV_PROBS[c]:<19} {'mono' if i % 2 else 'poly'}")
    (folder / "labels.csv").write_text("\n".join(lines) + "\n")
    return list(classes)


def write_medmnist(folder: Path, flag: str, size: int = 28, rgb: bool = True,
                   counts=(70, 14, 21), num_classes: int = 7) -> dict:
    """A MedMNIST npz: {split}_images (N, H, W[, 3]) uint8, {split}_labels (N, 1) uint8."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(4)
    arrays = {}
    for split, n in zip(("train", "val", "test"), counts):
        shape = (n, size, size, 3) if rgb else (n, size, size)
        arrays[f"{split}_images"] = rng.integers(0, 256, shape, dtype=np.uint8)
        arrays[f"{split}_labels"] = balanced_labels(n, num_classes, n)[:, None]
    name = f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"
    np.savez_compressed(folder / name, **arrays)
    return arrays


def cifar_batch(n: int, num_classes: int, label_key: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"batch_label": f"batch {seed}",
            label_key: balanced_labels(n, num_classes, seed).tolist(),
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            "filenames": [f"img_{seed}_{i}.png" for i in range(n)]}


def dump(path: Path, obj: object, protocol: int) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def write_cifar10(root: Path, per_batch: int = 20, n_test: int = 30) -> list[dict]:
    """cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}; returns the 6 batches."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
             "truck"]
    dump(folder / "batches.meta", {"label_names": names, "num_cases_per_batch": per_batch}, 2)
    batches = []
    for i in range(1, 6):
        batches.append(cifar_batch(per_batch, 10, "labels", i))
        dump(folder / f"data_batch_{i}", batches[-1], 2 if i % 2 else pickle.HIGHEST_PROTOCOL)
    batches.append(cifar_batch(n_test, 10, "labels", 9))
    dump(folder / "test_batch", batches[-1], 2)
    return batches


def write_cifar100(root: Path, n_train: int = 300, n_test: int = 100) -> list[dict]:
    """cifar-100-python/{train,test,meta} with fine and coarse labels; returns train, test."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    fine = [f"fine{i:02d}" for i in range(100)]
    dump(folder / "meta", {"fine_label_names": fine,
                           "coarse_label_names": [f"coarse{i}" for i in range(20)]}, 2)
    parts = []
    for name, n, seed in (("train", n_train, 5), ("test", n_test, 6)):
        batch = cifar_batch(n, 100, "fine_labels", seed)
        batch["coarse_labels"] = [label // 5 for label in batch["fine_labels"]]
        dump(folder / name, batch, 2)
        parts.append(batch)
    return parts


def write_class_folder(root: Path) -> None:
    """Classes: ants (gray PNG, one 12x12 among 10x10), bees (RGB JPEG), cats (gray NPY float),
    dogs (a single BMP: too few to stratify)."""
    rng = np.random.default_rng(5)
    for cls in ("ants", "bees", "cats", "dogs"):
        (root / cls).mkdir(parents=True)
    for i in range(12):
        size = 12 if i == 0 else 10
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(
            root / "ants" / f"{i:03d}.png")
        Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(
            root / "bees" / f"{i:03d}.jpg", quality=95)
        np.save(root / "cats" / f"{i:03d}.npy", rng.random((10, 10)).astype(np.float32))
    Image.fromarray(rng.integers(0, 256, (10, 10), dtype=np.uint8)).save(root / "dogs" / "x.bmp")
    (root / "README.txt").write_text("not an image, not in a class folder")
    (root / "ants" / "notes.txt").write_text("ignored: not an image suffix")


# ----------------------------------------------------------------------------- checks


def check_dataset(ds: Dataset, num_classes: int, image_shape: tuple[int, int],
                  channels: int) -> None:
    """The Dataset contract: shapes, dtypes, label range, ids unique across splits."""
    assert ds.num_classes == num_classes == len(ds.class_names)
    assert ds.image_shape == image_shape and ds.channels == channels
    for name in ("train", "val", "test"):
        split = ds.split(name)
        assert isinstance(split, Split)
        assert split.images.dtype == np.uint8 and split.images.shape[1:] == (*image_shape, channels)
        assert split.labels.dtype == np.int64 and split.ids.dtype == np.int64
        assert len(split) == len(split.images) == len(split.labels) == len(split.ids)
        assert split.labels.min() >= 0 and split.labels.max() < num_classes
    all_ids = all_ids_of(ds)
    assert len(np.unique(all_ids)) == len(all_ids)


def all_ids_of(ds: Dataset) -> np.ndarray:
    return np.concatenate([ds.train.ids, ds.val.ids, ds.test.ids])


def same_dataset(a: Dataset, b: Dataset) -> bool:
    return a.class_names == b.class_names and all(
        np.array_equal(getattr(a.split(s), f), getattr(b.split(s), f))
        for s in ("train", "val", "test") for f in ("images", "labels", "ids"))


def assert_stratified(ds: Dataset, fractions: dict[str, float]) -> None:
    """Each class's count in each split is its total times the split fraction: within 1 for
    train and test, within 2 for val in a 3-way carve (rounded as test+val minus test)."""
    labels = np.concatenate([ds.split(s).labels for s in fractions])
    for c in range(ds.num_classes):
        total = int((labels == c).sum())
        for name, frac in fractions.items():
            got = int((ds.split(name).labels == c).sum())
            tolerance = 2 if name == "val" and len(fractions) == 3 else 1
            assert abs(got - total * frac) < tolerance, (c, name, got, total * frac)


# ----------------------------------------------------------------------------- registry


def test_available_datasets_lists_every_source():
    names = available_datasets()
    for expected in ("digits", "fashion-mnist", "elpv", "cifar10", "cifar100", "dermamnist",
                     "bloodmnist", "pathmnist", "organamnist", "folder:PATH"):
        assert expected in names
    assert not any(n.endswith("3d") for n in names)
    assert "chestmnist" not in names  # multi-label: no single class per image


def test_unknown_name_lists_available_names():
    with pytest.raises(MunkeyError) as err:
        load_dataset("mnist-but-typoed")
    assert "mnist-but-typoed" in str(err.value)
    assert "digits" in str(err.value) and "folder:PATH" in str(err.value)


def test_multi_label_medmnist_is_refused_with_reason():
    with pytest.raises(MunkeyError, match="multi-label"):
        load_dataset("chestmnist")


# ----------------------------------------------------------------------------- digits


def test_digits_real_data_shapes_split_and_speed():
    load_dataset("digits")  # first load pays for imports
    start = time.perf_counter()
    ds = load_dataset("digits", seed=0)
    assert time.perf_counter() - start < 0.5
    check_dataset(ds, 10, (8, 8), 1)
    assert ds.name == "digits" and ds.class_names == [str(d) for d in range(10)]
    assert (len(ds.train), len(ds.val), len(ds.test)) == (1258, 180, 359)
    assert sorted(all_ids_of(ds).tolist()) == list(range(1797))
    assert ds.train.images.max() == 255 and ds.train.images.min() == 0
    assert_stratified(ds, {"train": 0.7, "val": 0.1, "test": 0.2})


def test_digits_ids_follow_sklearn_order():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    ds = load_dataset("digits")
    rows = ds.lookup([0, 1, 1000, 1796])
    assert rows.labels.tolist() == bunch.target[[0, 1, 1000, 1796]].tolist()
    expected = np.rint(bunch.images[[0, 1, 1000, 1796]] * 255 / 16).astype(np.uint8)
    assert np.array_equal(rows.images[..., 0], expected)


def test_seed_changes_carved_split_but_never_ids():
    a, b = load_dataset("digits", seed=0), load_dataset("digits", seed=0)
    c = load_dataset("digits", seed=1)
    assert same_dataset(a, b)
    assert not np.array_equal(a.test.ids, c.test.ids)
    assert np.array_equal(np.sort(all_ids_of(a)), np.sort(all_ids_of(c)))
    # the same id names the same image whatever the seed
    ids = c.test.ids[:20]
    assert np.array_equal(a.lookup(ids).images, c.lookup(ids).images)


# ----------------------------------------------------------------------------- split, lookup


def test_split_by_name_and_bad_name():
    ds = load_dataset("digits")
    assert ds.split("val") is ds.val
    with pytest.raises(MunkeyError, match="train, val, test"):
        ds.split("validation")


def test_subset_by_mask_and_index():
    split = load_dataset("digits").test
    mask = split.labels == 3
    by_mask = split.subset(mask)
    assert len(by_mask) == mask.sum() and (by_mask.labels == 3).all()
    by_index = split.subset([4, 0, 4])
    assert by_index.ids.tolist() == [split.ids[4], split.ids[0], split.ids[4]]
    assert np.array_equal(by_index.images[1], split.images[0])
    with pytest.raises(ValueError):
        split.subset(np.ones(3, bool))


def test_lookup_across_splits_in_request_order():
    ds = load_dataset("digits")
    ids = [int(ds.test.ids[2]), int(ds.train.ids[5]), int(ds.val.ids[0])]
    rows = ds.lookup(ids)
    assert rows.ids.tolist() == ids
    assert rows.labels.tolist() == [ds.test.labels[2], ds.train.labels[5], ds.val.labels[0]]
    assert np.array_equal(rows.images[1], ds.train.images[5])
    assert len(ds.lookup([])) == 0 and ds.lookup(ids[0]).ids.tolist() == ids[:1]
    assert ds.lookup(np.array([float(ids[0])])).ids.tolist() == ids[:1]


def test_lookup_unknown_ids_are_named():
    ds = load_dataset("digits")
    with pytest.raises(MunkeyError) as err:
        ds.lookup([0, 5000, -1])
    assert "5000" in str(err.value) and "-1" in str(err.value)
    with pytest.raises(MunkeyError, match="integers"):
        ds.lookup([1.5])


# ----------------------------------------------------------------------------- max_train


def test_max_train_is_stratified_seeded_and_keeps_ids():
    full = load_dataset("digits")
    small = load_dataset("digits", max_train=100)
    assert len(small.train) == 100
    assert set(small.train.ids) <= set(full.train.ids)
    assert np.array_equal(small.val.ids, full.val.ids)
    assert np.array_equal(small.test.ids, full.test.ids)
    counts = np.bincount(small.train.labels, minlength=10)
    assert counts.min() >= 9 and counts.max() <= 11
    assert np.array_equal(small.train.ids, load_dataset("digits", max_train=100).train.ids)
    assert np.array_equal(small.lookup(small.train.ids[:3]).labels, small.train.labels[:3])
    # ids the subset dropped are unknown to it, and the message says why
    dropped = sorted(set(full.train.ids) - set(small.train.ids))[0]
    with pytest.raises(MunkeyError, match="max-train"):
        small.lookup([dropped])


def test_max_train_edge_values():
    assert len(load_dataset("digits", max_train=10**6).train) == 1258
    few = load_dataset("digits", max_train=5)
    assert len(few.train) == 5 and len(set(few.train.labels)) == 5
    for bad in (0, -3, 2.5):
        with pytest.raises(MunkeyError, match="max_train"):
            load_dataset("digits", max_train=bad)


# ----------------------------------------------------------------------------- fashion-mnist


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "plain"])
def test_fashion_mnist_idx_files(tmp_path, gz):
    written = write_fashion(tmp_path / "fm", gz)
    ds = load_dataset("fashion-mnist", tmp_path / "fm")
    check_dataset(ds, 10, (28, 28), 1)
    assert ds.class_names[0] == "T-shirt/top" and ds.class_names[9] == "Ankle boot"
    assert (len(ds.train), len(ds.val), len(ds.test)) == (180, 20, 50)
    assert ds.test.ids.tolist() == list(range(200, 250))  # test i -> n_train + i
    assert sorted(np.concatenate([ds.train.ids, ds.val.ids]).tolist()) == list(range(200))
    assert_stratified(ds, {"train": 0.9, "val": 0.1})
    row = ds.lookup([7, 203])
    assert np.array_equal(row.images[0, ..., 0], written["train-images-idx3-ubyte"][7])
    assert np.array_equal(row.images[1, ..., 0], written["t10k-images-idx3-ubyte"][3])
    assert row.labels.tolist() == [written["train-labels-idx1-ubyte"][7],
                                   written["t10k-labels-idx1-ubyte"][3]]
    assert same_dataset(ds, load_dataset("fashion-mnist", tmp_path / "fm"))


def test_fashion_mnist_torchvision_and_debian_layouts(tmp_path):
    write_fashion(tmp_path / "root" / "FashionMNIST" / "raw", gz=False)
    assert len(load_dataset("fashion-mnist", tmp_path / "root").test) == 50
    write_fashion(data.DEBIAN_FASHION_MNIST, gz=True, n_test=40)
    assert len(load_dataset("fashion-mnist").test) == 40  # no data_root: Debian's folder


def test_fashion_mnist_missing_says_how_to_get_it(tmp_path):
    with pytest.raises(MunkeyError) as err:
        load_dataset("fashion-mnist", tmp_path / "nothing-here")
    msg = str(err.value)
    assert "--data-root" in msg and "apt-get install dataset-fashion-mnist" in msg
    assert "--download" in msg and str(tmp_path / "nothing-here") in msg


def test_fashion_mnist_corrupt_files(tmp_path):
    write_fashion(tmp_path / "fm", gz=True)
    target = tmp_path / "fm" / "train-images-idx3-ubyte.gz"
    target.write_bytes(target.read_bytes()[:100])  # truncated gzip
    with pytest.raises(MunkeyError, match="train-images"):
        load_dataset("fashion-mnist", tmp_path / "fm")
    write_fashion(tmp_path / "plain", gz=False)
    (tmp_path / "plain" / "t10k-labels-idx1-ubyte").write_bytes(b"\x12\x34garbage")
    with pytest.raises(MunkeyError, match="t10k-labels"):
        load_dataset("fashion-mnist", tmp_path / "plain")
    write_fashion(tmp_path / "short", gz=False)
    raw = (tmp_path / "short" / "train-images-idx3-ubyte").read_bytes()
    (tmp_path / "short" / "train-images-idx3-ubyte").write_bytes(raw[:-5])  # too few pixels
    with pytest.raises(MunkeyError, match="corrupt"):
        load_dataset("fashion-mnist", tmp_path / "short")


def test_fashion_mnist_label_out_of_range(tmp_path):
    write_fashion(tmp_path / "fm", gz=False)
    write_idx(tmp_path / "fm" / "t10k-labels-idx1-ubyte", np.full(50, 12, np.uint8), gz=False)
    with pytest.raises(MunkeyError, match="labels outside"):
        load_dataset("fashion-mnist", tmp_path / "fm")


# ----------------------------------------------------------------------------- elpv


def test_elpv_layout_in_data_root(tmp_path):
    classes = write_elpv(tmp_path / "elpv")
    ds = load_dataset("elpv", tmp_path / "elpv")
    check_dataset(ds, 4, (12, 12), 1)
    assert ds.class_names == ["functional", "possibly defective", "likely defective", "defective"]
    assert sorted(all_ids_of(ds).tolist()) == list(range(36))
    assert ds.lookup(range(36)).labels.tolist() == [int(c) for c in classes]
    png = np.asarray(Image.open(tmp_path / "elpv" / "images" / "cell0006.png"))
    assert np.array_equal(ds.lookup([5]).images[0, ..., 0], png)  # id = row in labels.csv
    assert all(len(ds.split(s)) > 0 for s in ("train", "val", "test"))
    assert same_dataset(ds, load_dataset("elpv", tmp_path / "elpv"))


def test_elpv_corrupt_probability_and_image(tmp_path):
    write_elpv(tmp_path / "bad-csv")
    csv = tmp_path / "bad-csv" / "labels.csv"
    csv.write_text(csv.read_text().replace("1.0 ", "0.5 ", 1))
    with pytest.raises(MunkeyError, match="labels.csv"):
        load_dataset("elpv", tmp_path / "bad-csv")
    write_elpv(tmp_path / "bad-png")
    (tmp_path / "bad-png" / "images" / "cell0003.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    with pytest.raises(MunkeyError, match="cell0003.png"):
        load_dataset("elpv", tmp_path / "bad-png")


@pytest.fixture(scope="module")
def real_elpv() -> Dataset:
    return load_dataset("elpv")  # the installed elpv-dataset package, ~6 s


def test_elpv_real_package_data(real_elpv):
    ds = real_elpv
    check_dataset(ds, 4, (300, 300), 1)
    assert len(all_ids_of(ds)) == 2624 and sorted(all_ids_of(ds).tolist()) == list(range(2624))
    counts = sum(np.bincount(ds.split(s).labels, minlength=4) for s in ("train", "val", "test"))
    assert counts.tolist() == [1508, 295, 106, 715]
    assert_stratified(ds, {"train": 0.7, "val": 0.1, "test": 0.2})


# ----------------------------------------------------------------------------- medmnist


def test_medmnist_rgb_official_splits(tmp_path):
    written = write_medmnist(tmp_path, "dermamnist")
    ds = load_dataset("dermamnist", tmp_path, seed=3)
    check_dataset(ds, 7, (28, 28), 3)
    assert ds.class_names[1] == "basal cell carcinoma" and len(ds.class_names) == 7
    assert (len(ds.train), len(ds.val), len(ds.test)) == (70, 14, 21)
    assert ds.train.ids.tolist() == list(range(70))
    assert ds.val.ids.tolist() == list(range(70, 84))
    assert ds.test.ids.tolist() == list(range(84, 105))
    assert np.array_equal(ds.test.labels, written["test_labels"][:, 0])
    assert np.array_equal(ds.lookup([85]).images[0], written["test_images"][1])
    assert same_dataset(ds, load_dataset("dermamnist", tmp_path, seed=0))  # seed: official split


def test_medmnist_gray_and_size_suffix(tmp_path):
    write_medmnist(tmp_path, "pneumoniamnist", rgb=False, num_classes=2)
    ds = load_dataset("pneumoniamnist", tmp_path)
    check_dataset(ds, 2, (28, 28), 1)
    write_medmnist(tmp_path, "bloodmnist", size=64, num_classes=8, counts=(16, 8, 8))
    big = load_dataset("bloodmnist_64", tmp_path)
    check_dataset(big, 8, (64, 64), 3)
    assert big.name == "bloodmnist_64"
    with pytest.raises(MunkeyError, match="28, 64, 128, 224"):
        load_dataset("bloodmnist_100", tmp_path)


def test_medmnist_default_root_and_missing_message(tmp_path):
    write_medmnist(data.MEDMNIST_DEFAULT_ROOT, "pathmnist", num_classes=9, counts=(18, 9, 9))
    assert len(load_dataset("pathmnist").train) == 18  # found in ~/.medmnist without data_root
    with pytest.raises(MunkeyError) as err:
        load_dataset("dermamnist_128", tmp_path / "empty")
    msg = str(err.value)
    assert "dermamnist_128.npz" in msg and "--data-root" in msg and "zenodo" in msg


def test_medmnist_corrupt_npz(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "dermamnist.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(MunkeyError, match="dermamnist.npz"):
        load_dataset("dermamnist", tmp_path / "bad")
    (tmp_path / "nokey").mkdir()
    np.savez(tmp_path / "nokey" / "dermamnist.npz", train_images=np.zeros((2, 28, 28, 3), np.uint8))
    with pytest.raises(MunkeyError, match="dermamnist.npz"):
        load_dataset("dermamnist", tmp_path / "nokey")
    arrays = write_medmnist(tmp_path / "range", "dermamnist")
    arrays["val_labels"][0] = 9
    np.savez(tmp_path / "range" / "dermamnist.npz", **arrays)
    with pytest.raises(MunkeyError, match="labels outside"):
        load_dataset("dermamnist", tmp_path / "range")


# ----------------------------------------------------------------------------- cifar


def test_cifar10_pickles(tmp_path):
    batches = write_cifar10(tmp_path)
    ds = load_dataset("cifar10", tmp_path)
    check_dataset(ds, 10, (32, 32), 3)
    assert ds.class_names[0] == "airplane" and ds.class_names[9] == "truck"
    assert (len(ds.train), len(ds.val), len(ds.test)) == (90, 10, 30)
    assert ds.test.ids.tolist() == list(range(100, 130))
    assert_stratified(ds, {"train": 0.9, "val": 0.1})
    # id 45 = data_batch_3 row 5; pixel (row 2, col 7) is data[1024*c + 32*2 + 7] per channel
    sample = ds.lookup([45])
    flat = batches[2]["data"][5]
    assert sample.images[0, 2, 7].tolist() == [flat[c * 1024 + 2 * 32 + 7] for c in range(3)]
    assert sample.labels[0] == batches[2]["labels"][5]
    assert same_dataset(ds, load_dataset("cifar10", tmp_path))


def test_cifar100_fine_labels(tmp_path):
    train, test = write_cifar100(tmp_path)
    ds = load_dataset("cifar100", tmp_path)
    check_dataset(ds, 100, (32, 32), 3)
    assert ds.class_names[:2] == ["fine00", "fine01"]
    assert (len(ds.train), len(ds.val), len(ds.test)) == (270, 30, 100)
    assert ds.test.labels.tolist() == test["fine_labels"]
    assert ds.test.ids.tolist() == list(range(300, 400))


def test_cifar_missing_and_corrupt(tmp_path):
    with pytest.raises(MunkeyError) as err:
        load_dataset("cifar10", tmp_path / "none")
    assert "--data-root" in str(err.value) and "cifar-10-python.tar.gz" in str(err.value)
    write_cifar10(tmp_path / "trunc")
    batch = tmp_path / "trunc" / "cifar-10-batches-py" / "data_batch_2"
    batch.write_bytes(batch.read_bytes()[:500])
    with pytest.raises(MunkeyError, match="data_batch_2"):
        load_dataset("cifar10", tmp_path / "trunc")
    write_cifar10(tmp_path / "gone")
    (tmp_path / "gone" / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(MunkeyError, match="data_batch_4"):
        load_dataset("cifar10", tmp_path / "gone")


class _RunsCode:
    """A pickle payload that would create a file when unpickled by a plain pickle.load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_cifar_pickle_cannot_run_code(tmp_path):
    write_cifar100(tmp_path)
    marker = tmp_path / "pwned"
    dump(tmp_path / "cifar-100-python" / "test", {"data": _RunsCode(marker)}, 2)
    with pytest.raises(MunkeyError, match="refusing"):
        load_dataset("cifar100", tmp_path)
    assert not marker.exists()


# ----------------------------------------------------------------------------- folder:PATH


def test_class_folder_mixed_formats(tmp_path):
    write_class_folder(tmp_path / "imgs")
    name = f"folder:{tmp_path / 'imgs'}"
    ds = load_dataset(name)
    assert ds.name == name
    check_dataset(ds, 4, (10, 10), 3)  # a JPEG is RGB -> all RGB; the 12x12 PNG resized
    assert ds.class_names == ["ants", "bees", "cats", "dogs"]
    assert sorted(all_ids_of(ds).tolist()) == list(range(37))
    # ids = position in sorted relative-path order: ants/000..011, bees/..., cats/..., dogs/x.bmp
    rows = ds.lookup([0, 12, 24, 36])
    assert rows.labels.tolist() == [0, 1, 2, 3]
    gray = rows.images[2]
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    npy = np.load(tmp_path / "imgs" / "cats" / "000.npy")
    assert np.abs(gray[..., 0].astype(int) - np.rint(npy * 255)).max() <= 1  # floats in [0, 1]
    assert np.array_equal(ds.lookup([36]).labels, [3])  # the one-image class is in train
    assert 36 in ds.train.ids
    assert same_dataset(ds, load_dataset(name))
    assert_stratified(load_dataset(name, seed=7), {"train": 0.7, "val": 0.1, "test": 0.2})


def test_class_folder_all_gray_stays_gray(tmp_path):
    rng = np.random.default_rng(6)
    for cls in ("b", "a"):
        (tmp_path / cls / "nested").mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 256, (6, 9), dtype=np.uint8)).save(
                tmp_path / cls / "nested" / f"{i}.tiff")
    ds = load_dataset(f"folder:{tmp_path}")
    check_dataset(ds, 2, (6, 9), 1)
    assert ds.class_names == ["a", "b"]
    assert sum(len(ds.split(s)) for s in ("train", "val", "test")) == 10


def test_class_folder_tiny_classes_still_load(tmp_path):
    for cls, n in (("one", 1), ("two", 2), ("three", 3)):
        (tmp_path / cls).mkdir()
        for i in range(n):
            Image.fromarray(np.full((4, 4), 10 * i, np.uint8)).save(tmp_path / cls / f"{i}.png")
    ds = load_dataset(f"folder:{tmp_path}")
    check_dataset(ds, 3, (4, 4), 1)
    assert set(ds.train.labels.tolist()) == {0, 1, 2}  # every class keeps a train sample
    assert sum(len(ds.split(s)) for s in ("train", "val", "test")) == 6


def test_class_folder_errors(tmp_path):
    with pytest.raises(MunkeyError, match="does not exist"):
        load_dataset(f"folder:{tmp_path / 'missing'}")
    with pytest.raises(MunkeyError, match="folder:PATH"):
        load_dataset("folder:")
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    (tmp_path / "empty" / "top.png").write_bytes(b"")  # not inside a class folder
    with pytest.raises(MunkeyError, match="one sub-folder per class"):
        load_dataset(f"folder:{tmp_path / 'empty'}")
    write_class_folder(tmp_path / "bad")
    (tmp_path / "bad" / "bees" / "005.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(MunkeyError, match="005.jpg"):
        load_dataset(f"folder:{tmp_path / 'bad'}")
    write_class_folder(tmp_path / "badnpy")
    np.save(tmp_path / "badnpy" / "cats" / "003.npy", np.zeros((2, 3, 4, 5)))
    with pytest.raises(MunkeyError, match="003.npy"):
        load_dataset(f"folder:{tmp_path / 'badnpy'}")


def test_the_digits_table_is_what_np_loadtxt_reads(tmp_path):
    """datasets._small_int_csv parses the digits CSV with numpy alone; np.loadtxt is the oracle, on the
    real file and on small tables; any other text goes back to np.loadtxt (None)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is not None and path.is_file():
        assert np.array_equal(data._digits_table(), np.loadtxt(path, delimiter=","))
        assert np.array_equal(data._small_int_csv(gzip.decompress(path.read_bytes()), 65),
                              np.loadtxt(path, delimiter=","))
    rng = np.random.default_rng(0)
    table = rng.integers(0, 100, size=(7, 5))
    for text in ("\n".join(",".join(map(str, r)) for r in table) + "\n",
                 "\r\n".join(",".join(map(str, r)) for r in table),
                 "\n\n" + "\n\n".join(",".join(map(str, r)) for r in table) + "\n\n"):
        f = tmp_path / "t.csv"
        f.write_text(text, newline="")
        got = data._small_int_csv(text.encode(), 5)
        assert got is not None and got.dtype == np.float64 and np.array_equal(got, np.loadtxt(f, delimiter=","))
    for bad in ("1,2,3,4,100\n", "1,2,3,4,-5\n", "1,2,3,4,5.0\n", "1,2,,4,5\n", "1,2,3,4,5,\n",
                "1,2,3,4\n1,2,3,4,5,6\n", "# c\n1,2,3,4,5\n", "1 2 3 4 5\n", ""):
        assert data._small_int_csv(bad.encode(), 5) is None, bad
