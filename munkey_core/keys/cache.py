"""The on-disk key cache, in numpy alone: where an encoder's keys of a split are stored and how they
are read back (keys/encoders.py `cached_keys` computes and writes them on a miss).

Cache layout: `<cache_dir>/keys/<dataset>-<split>-<encoder>-r<res>-<sha>.npy` plus a `.json`
descriptor; `sha` = sha256 over (dataset, split, encoder.describe(), sha256 of the image bytes + id
bytes), so changed data or preprocessing never returns stale keys. Kept apart from the encoders
(torch, timm) so that reading cached keys loads neither: a deletion without evaluation reads the
test keys for its evidence (run/bankonly.py).
Tests: tests/keys/test_keys.py, tests/run/test_bankonly.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Protocol

import numpy as np


class CacheEncoder(Protocol):
    """What the cache reads of an encoder: its name, input side, key width and description."""

    name: str
    resolution: int
    dim: int

    def describe(self) -> dict: ...


def default_cache_dir() -> Path:
    """$MUNKEY_CACHE, else ~/.cache/munkey. Keys go in its `keys/` subfolder."""
    env = os.environ.get("MUNKEY_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "munkey"


_CHUNK = 64 << 20


def _hash_array(h: "hashlib._Hash", arr: np.ndarray) -> None:
    """Feed dtype, shape and the C-order bytes of `arr` to `h`, in chunks (no full copy)."""
    h.update(f"{arr.dtype.str}|{arr.shape}|".encode())
    if arr.size == 0:
        return
    flat_rows = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(-1, 1)
    rows = max(1, _CHUNK // max(1, flat_rows[0].nbytes))
    for s in range(0, len(flat_rows), rows):
        h.update(memoryview(np.ascontiguousarray(flat_rows[s:s + rows])).cast("B"))


def content_digest(images: np.ndarray, ids: np.ndarray) -> str:
    """sha256 over the image bytes and the id bytes (with dtypes and shapes)."""
    ids = np.asarray(ids)
    if ids.dtype == object:
        ids = ids.astype(str)
    h = hashlib.sha256()
    _hash_array(h, np.asarray(images))
    _hash_array(h, ids)
    return h.hexdigest()


def cache_key(encoder: "CacheEncoder", digest: str, dataset: str, split: str) -> str:
    blob = json.dumps({"dataset": dataset, "split": split, "encoder": encoder.describe(), "content": digest},
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(s)).strip("._")[:48] or "x"


def _read_cached(npy: Path, meta_path: Path, key: str, n: int, dim: int) -> np.ndarray | None:
    """The cached keys, or None when absent; a damaged entry is deleted with a warning."""
    if not npy.exists() and not meta_path.exists():
        return None
    problem = None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        keys = np.load(npy, allow_pickle=False)
        if meta.get("key") != key:
            problem = "descriptor does not match"
        elif list(keys.shape) != list(meta.get("shape", [])) or list(keys.shape) != [n, dim]:
            problem = f"shape {keys.shape}, expected {(n, dim)}"
        elif keys.dtype != np.float32 or meta.get("dtype") != "float32":
            problem = f"dtype {keys.dtype}, expected float32"
        elif not np.isfinite(keys).all():
            problem = "non-finite values"
    except (OSError, ValueError, EOFError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem is None:
        return keys
    warnings.warn(f"Key cache entry {npy} is damaged ({problem}); deleting it and recomputing.",
                  RuntimeWarning, stacklevel=3)
    for p in (npy, meta_path):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    return None


def _entry(encoder: "CacheEncoder", digest: str, dataset: str, split: str,
           cache_dir: str | Path | None) -> tuple[Path, Path, str]:
    key = cache_key(encoder, digest, dataset, split)
    root = (Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()) / "keys"
    stem = f"{_slug(dataset)}-{_slug(split)}-{_slug(encoder.name)}-r{encoder.resolution}-{key[:24]}"
    return root / f"{stem}.npy", root / f"{stem}.json", key


def cache_paths(encoder: "CacheEncoder", images: np.ndarray, ids: np.ndarray, *, dataset: str, split: str,
                cache_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(npy path, json path) of the cache entry for this encoder + data (they may not exist yet)."""
    npy, meta, _ = _entry(encoder, content_digest(images, ids), dataset, split, cache_dir)
    return npy, meta


def read_cached_keys(encoder: CacheEncoder, images: np.ndarray, ids: np.ndarray, *, dataset: str, split: str,
                     cache_dir: str | Path | None = None) -> np.ndarray | None:
    """(N, dim) float32 keys of `images` from the cache, or None when they are not there (nothing is
    computed; a damaged entry is deleted with a warning, as `cached_keys` does)."""
    npy, meta_path, key = _entry(encoder, content_digest(images, np.asarray(ids)), dataset, split, cache_dir)
    return _read_cached(npy, meta_path, key, len(images), encoder.dim)
