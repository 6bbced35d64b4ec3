"""Two 2-D UMAP maps of what a run remembers, for the dashboard's Embeddings page (no Streamlit here).

- The [CLS] map: the model's [CLS] representation (pre-logits features) of each training sample,
  computed the way prediction does it: the sample's key retrieves its K nearest entries of the
  bank, the image is run once with each neighbour's exemplar token, and the K [CLS] vectors are
  averaged with the ensemble weights softmax(sim / tau).
- The exemplar map: the bank's exemplar vectors (`values`), one per sample still in the bank.

The fit (`fit_maps`) covers a seeded subsample of at most `max_points` samples still in the bank
and is cached inside the run (run/mapcache.py: `<run>/embeddings/`, derived data). A deletion
purges the deleted ids' rows from that cache (forget/request.py), so afterwards, and after a
restart, `compute_maps` reads the cache instead of refitting: the kept points keep their
coordinates (a kept sample whose retrieved neighbours were deleted would move a little in a fresh
fit; `refit` makes one). Deleted samples have no exemplar, so they are absent from the exemplar
map; their images are still in the dataset, so `compute_maps` computes their [CLS] vectors with the
current bank, in memory only, and places them as crosses among the fitted points
(`place_by_neighbours`: the mean position of their nearest fitted [CLS] vectors).
UMAP is the long part (numba compiles its kernels on the first call in a process, ~10-30 s; then a
few seconds per 1,000-3,000 points on 2 cores), hence `EmbeddingJob`, which computes the maps off
the UI thread and reports its stage.
`thumbnail_urls` / `hover_table`: small PNG data URLs of the points' images, for the page's "Images on
hover" mode (a Vega-Lite tooltip shows a field named `image` as a picture).
Tests: tests/dashboard/test_embeddings.py, tests/app/test_app_embeddings.py, tests/e2e/test_e2e.py (hover).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from munkey_core.errors import MunkeyError
from munkey_core.dashboard.jobs import BackgroundJob
from munkey_core.model.munkey_vit import preprocess_images
from munkey_core.model.predict import neighbour_weights
from munkey_core.run.mapcache import CachedMaps, cache_path, read_maps, write_maps
from munkey_core.run.paths import utc_now
from munkey_core.service import MunkeyRun, Progress

MAX_POINTS = 3000
MAPS = ("cls", "exemplar")
_umap_state = {"warm": False}  # numba compiles UMAP's kernels once per process


@dataclass(frozen=True)
class MapParams:
    """What a pair of maps depends on besides the run (all part of the cache key)."""

    max_points: int = MAX_POINTS
    seed: int = 0
    n_neighbors: int = 15
    min_dist: float = 0.5  # spreads each class's island so that a lasso can pick within it
    n_epochs: int | None = None  # None: UMAP's default (500 below 10,000 points)


@dataclass
class EmbeddingMaps:
    """The shown samples and their 2-D coordinates in both maps; rows align with `ids`."""

    ids: np.ndarray  # (N,) int64 training sample ids, ascending
    labels: np.ndarray  # (N,) int64
    deleted: np.ndarray  # (N,) bool: deleted from the bank (no exemplar any more)
    cls_xy: np.ndarray  # (N, 2) float32
    exemplar_xy: np.ndarray  # (N, 2) float32, NaN where deleted
    n_train: int  # training samples in the run (before the subsample)
    n_deleted: int  # deleted samples in the run (before the subsample)
    params: MapParams
    seconds: dict[str, float] = field(default_factory=dict)  # this call's stages
    from_cache: bool = False  # the fit was read from the run's map cache (no UMAP in this call)
    fitted_at: str = ""  # when the fit was made (UTC)
    fit_seconds: float = 0.0  # what the fit took then
    removed_since_fit: int = 0  # points the deletions since the fit removed from the cache
    cache_file: str = ""

    @property
    def subsampled(self) -> bool:
        return len(self.ids) < self.n_train


# --------------------------------------------------------------------------- the pieces


def sample_positions(n: int, deleted: np.ndarray, max_points: int, seed: int = 0) -> np.ndarray:
    """Positions (ascending) of at most `max_points` of `n` samples, seeded; deleted ones first.

    Deleted samples are the point of the picture, so all of them are kept (up to the cap) and the
    rest of the budget is a uniform draw from the retained ones. `max_points` <= 0 means all.
    """
    deleted = np.asarray(deleted, bool)
    if max_points <= 0 or n <= max_points:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    gone, kept = np.flatnonzero(deleted), np.flatnonzero(~deleted)
    if len(gone) >= max_points:
        return np.sort(rng.choice(gone, size=max_points, replace=False))
    rest = rng.choice(kept, size=max_points - len(gone), replace=False)
    return np.sort(np.concatenate([gone, rest]))


@torch.inference_mode()
def cls_features(run: MunkeyRun, images: np.ndarray, keys: np.ndarray, *, k: int | None = None,
                 batch_size: int = 256, progress: Progress | None = None) -> np.ndarray:
    """[CLS] features (N, D) of dataset-shaped uint8 images with known keys, as prediction sees them:
    the ensemble-weighted mean over the K retrieved neighbours' forwards (K from the run's config)."""
    k = int(k or run.train_cfg.k)
    model, device = run.model, run.device
    out = []
    for start in range(0, len(images), batch_size):
        x = preprocess_images(torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size])).to(device),
                              run.model_cfg.img_size)
        q = torch.as_tensor(keys[start:start + batch_size], dtype=torch.float32)
        hits = run.search(q, k, values=True)  # rows read under the run's lock: a deletion cannot move them
        v = hits.values.to(device)  # (B, K, Dv)
        w = neighbour_weights(hits.similarities.to(device), run.train_cfg.tau, "ensemble")  # (B, K)
        feats = model.forward_multi(x, v, pre_logits=True)  # (B, K, D)
        out.append((w[..., None] * feats).sum(dim=1).float().cpu().numpy())
        if progress is not None:
            progress("[CLS] features", min(1.0, (start + batch_size) / len(images)))
    return np.concatenate(out) if out else np.zeros((0, run.model_cfg.embed_dim), np.float32)


def exemplar_vectors(run: MunkeyRun, ids: Sequence[int]) -> np.ndarray:
    """The bank's exemplar vectors (N, Dv) of `ids`, all of which must be in the bank."""
    return run.exemplars(ids)


def umap_2d(x: np.ndarray, params: MapParams, metric: str = "euclidean") -> np.ndarray:
    """UMAP of `x` (N, D) to (N, 2) float32, deterministic for a seed (UMAP then runs single-threaded).

    Degenerate sizes are handled without UMAP: no point -> (0, 2); one or two points -> on a line.
    """
    n = len(x)
    if n <= 2:
        return np.stack([np.arange(n, dtype=np.float32), np.zeros(n, np.float32)], axis=1)
    import umap  # imports numba: ~2 s, so only when a map is asked for

    # UMAP needs n_neighbors < n; spectral init needs more points than dimensions plus one.
    nn = max(2, min(params.n_neighbors, n - 1))
    init = "spectral" if n > nn + 2 else "random"
    reducer = umap.UMAP(n_components=2, n_neighbors=nn, min_dist=params.min_dist, metric=metric,
                        random_state=params.seed, n_jobs=1, n_epochs=params.n_epochs, init=init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seeded UMAP warns that it runs single-threaded; small-n warnings
        xy = reducer.fit_transform(np.asarray(x, np.float32))
    return np.asarray(xy, np.float32)


def cache_key(run: MunkeyRun, params: MapParams) -> str:
    """What a cached pair of maps depends on: the model's weights, the retrieval settings and the
    map parameters (not the bank: deletions are applied to the cache, run/mapcache.py)."""
    tag = {"model": run.model_fingerprint, "k": int(run.train_cfg.k), "tau": float(run.train_cfg.tau),
           "params": asdict(params)}
    return hashlib.sha256(json.dumps(tag, sort_keys=True).encode()).hexdigest()[:20]


def place_by_neighbours(x: np.ndarray, ref: np.ndarray, ref_xy: np.ndarray, n: int = 15) -> np.ndarray:
    """2-D positions (M, 2) of points `x` (M, D) that were not in a fit: the mean map position of
    their `n` nearest fitted points `ref` (N, D) (Euclidean), the initial placement UMAP's own
    `transform` starts from. Points with no reference stay at the origin."""
    if len(x) == 0 or len(ref) == 0:
        return np.zeros((len(x), 2), np.float32)
    n = max(1, min(int(n), len(ref)))
    xy = np.empty((len(x), 2), np.float32)
    sq = (ref.astype(np.float64) ** 2).sum(1)
    for s in range(0, len(x), 1024):  # (B, N) distances at a time
        q = x[s:s + 1024].astype(np.float64)
        d = sq[None, :] - 2.0 * q @ ref.T.astype(np.float64)
        near = np.argpartition(d, n - 1, axis=1)[:, :n]  # (B, n)
        xy[s:s + 1024] = ref_xy[near].mean(axis=1)
    return xy


def _require_bank(run: MunkeyRun) -> None:
    if len(run.bank) == 0:
        raise MunkeyError("The memory bank is empty: every training sample has been deleted, so there is "
                          "nothing to retrieve and no exemplar to map.")


def fit_maps(run: MunkeyRun, params: MapParams = MapParams(), progress: Progress | None = None) -> CachedMaps:
    """Fit both maps on a seeded subsample of at most `max_points` samples still in the bank. Cost: K
    forwards per sample, then two UMAP fits (the long part). Raises MunkeyError when the bank is empty."""
    report = progress or (lambda stage, frac: None)
    _require_bank(run)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    report("loading the training data and its keys", 0.0)
    train = run.dataset.train
    kept_all = np.flatnonzero(np.isin(train.ids, run.bank.ids))
    pos = kept_all[sample_positions(len(kept_all), np.zeros(len(kept_all), bool), params.max_points, params.seed)]
    pos = pos[np.argsort(train.ids[pos], kind="stable")]  # ascending ids
    keys = run.split_keys("train")[pos]
    seconds["data"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    feats = cls_features(run, train.images[pos], keys,
                         progress=lambda s, f: report(f"[CLS] features of {len(pos)} samples", 0.05 + 0.2 * f))
    ids, labels = train.ids[pos].astype(np.int64), train.labels[pos].astype(np.int64)
    values = exemplar_vectors(run, ids)
    seconds["features"] = time.perf_counter() - t0

    note = "" if _umap_state["warm"] else " (the first map in this server also compiles UMAP's kernels: 10-30 s more)"
    report(f"UMAP of {len(ids)} [CLS] vectors{note}", 0.3)
    t0 = time.perf_counter()
    cls_xy = umap_2d(feats, params)
    _umap_state["warm"] = True
    seconds["umap_cls"] = time.perf_counter() - t0
    report(f"UMAP of {len(values)} exemplar vectors", 0.65)
    t0 = time.perf_counter()
    ex_xy = umap_2d(values, params, metric="cosine")
    seconds["umap_exemplar"] = time.perf_counter() - t0
    meta = {"fitted_at": utc_now(), "fit_seconds": seconds, "params": asdict(params), "bank_size": len(run.bank),
            "purged": 0}
    return CachedMaps(ids, labels, cls_xy, ex_xy, np.asarray(feats, np.float32), meta=meta)


def _store(run: MunkeyRun, key: str, maps: CachedMaps) -> CachedMaps:
    """Write the maps to the run's cache (rows of samples no longer in the bank dropped); a read-only
    run directory keeps them in memory only."""
    try:
        return write_maps(run.paths.root, key, maps, run.runlock)
    except OSError:
        return maps.without(maps.ids[~np.isin(maps.ids, run.bank.ids)].tolist())[0]


def compute_maps(run: MunkeyRun, params: MapParams = MapParams(), progress: Progress | None = None, *,
                 refit: bool = False) -> EmbeddingMaps:
    """Both maps for the run's training split with its current bank.

    The fit (`fit_maps`: K forwards per sample and two UMAP fits) is kept in the run's map cache
    (run/mapcache.py) and reused after restarts; a deletion removes the deleted ids' rows from it, so
    the points still in the bank keep their coordinates and nothing is refitted. `refit` fits anew.
    The deleted samples are then computed in memory only (never cached): their [CLS] vectors with the
    current bank, placed by `place_by_neighbours` among the fitted points (at most `max_points` of
    them, seeded). Raises MunkeyError when the bank is empty."""
    report = progress or (lambda stage, frac: None)
    _require_bank(run)
    seconds: dict[str, float] = {}
    key = cache_key(run, params)
    path = cache_path(run.paths.root, key)
    t0 = time.perf_counter()
    report("reading the maps cached in the run", 0.0)
    cached = None if refit else read_maps(path)
    bank_ids = run.bank.ids
    if cached is not None:
        stale = cached.ids[~np.isin(cached.ids, bank_ids)]
        if len(stale):  # deleted by a path that did not purge the cache: drop them on disk too
            cached = _store(run, key, cached.without(stale.tolist())[0])
        from_cache = True
        seconds["cache"] = time.perf_counter() - t0
    else:
        cached = fit_maps(run, params, progress=lambda s, f: report(s, 0.9 * f))
        cached = _store(run, key, cached)
        from_cache = False
        seconds.update(cached.meta["fit_seconds"])

    t0 = time.perf_counter()
    train = run.dataset.train
    gone_all = ~np.isin(train.ids, bank_ids)
    gone = np.flatnonzero(gone_all)
    if params.max_points > 0 and len(gone) > params.max_points:
        gone = np.sort(np.random.default_rng(params.seed).choice(gone, size=params.max_points, replace=False))
    report(f"[CLS] features of {len(gone)} deleted samples", 0.92)
    gone_xy = np.zeros((0, 2), np.float32)
    if len(gone):
        feats = cls_features(run, train.images[gone], run.split_keys("train")[gone])
        gone_xy = place_by_neighbours(feats, cached.cls_features, cached.cls_xy, params.n_neighbors)
    seconds["deleted"] = time.perf_counter() - t0

    ids = np.concatenate([cached.ids, train.ids[gone].astype(np.int64)])
    order = np.argsort(ids, kind="stable")
    deleted = np.concatenate([np.zeros(len(cached.ids), bool), np.ones(len(gone), bool)])[order]
    labels = np.concatenate([cached.labels, train.labels[gone].astype(np.int64)])[order]
    cls_xy = np.concatenate([cached.cls_xy, gone_xy])[order].astype(np.float32)
    ex_xy = np.concatenate([cached.exemplar_xy, np.full((len(gone), 2), np.nan, np.float32)])[order]
    report("done", 1.0)
    return EmbeddingMaps(ids[order], labels, deleted, cls_xy, ex_xy.astype(np.float32), len(train),
                         int(gone_all.sum()), params, seconds, from_cache=from_cache,
                         fitted_at=str(cached.meta.get("fitted_at", "")),
                         fit_seconds=float(sum(cached.meta.get("fit_seconds", {}).values())),
                         removed_since_fit=int(cached.meta.get("purged", 0)), cache_file=str(path))


# --------------------------------------------------------------------------- what the page draws and reads back


@dataclass(frozen=True)
class TraceGroup:
    """One scatter trace: its legend name, the map rows it draws (in trace order), and whether it
    is the deleted samples' trace (drawn as crosses)."""

    name: str
    rows: np.ndarray
    deleted: bool = False


def trace_groups(maps: EmbeddingMaps, which: str, class_names: Sequence[str]) -> list[TraceGroup]:
    """The traces of map `which` ("cls" or "exemplar"), in drawing order: one per class of samples
    still in the bank, then (in the [CLS] map only) one trace of all deleted samples."""
    if which not in MAPS:
        raise MunkeyError(f"Unknown map '{which}'; choose one of {', '.join(MAPS)}.")
    groups = [TraceGroup(str(name), np.flatnonzero((maps.labels == c) & ~maps.deleted))
              for c, name in enumerate(class_names)]
    groups = [g for g in groups if len(g.rows)]
    if which == "cls" and maps.deleted.any():
        groups.append(TraceGroup("deleted", np.flatnonzero(maps.deleted), deleted=True))
    return groups


def ids_from_points(points: Sequence[Mapping[str, Any]], maps: EmbeddingMaps | None = None,
                    groups: Sequence[TraceGroup] | None = None) -> list[int]:
    """Sample ids (unique, ascending) of the points of a plotly selection event.

    Each point's `customdata` carries its id (the page puts it there); without it, the id is found
    from (`curve_number`, `point_index`) through `groups` and `maps`.
    """
    out: set[int] = set()
    for p in points:
        cd = p.get("customdata")
        if cd is not None:
            out.add(int(cd[0] if isinstance(cd, (list, tuple, np.ndarray)) else cd))
            continue
        if maps is None or groups is None:
            raise MunkeyError("A selected point carries no sample id; reload the page and select again.")
        curve, idx = int(p.get("curve_number", -1)), int(p.get("point_index", p.get("point_number", -1)))
        if not (0 <= curve < len(groups) and 0 <= idx < len(groups[curve].rows)):
            raise MunkeyError("A selected point is not on the current map; reload the page and select again.")
        out.add(int(maps.ids[groups[curve].rows[idx]]))
    return sorted(out)


def thumbnail_urls(images: np.ndarray, side: int = 32) -> list[str]:
    """Small PNG data URLs of images (N, H, W, C) uint8, for hover tooltips: an image whose longer side is
    below `side` is enlarged by an integer factor (nearest neighbour: 8x8 digits stay crisp), a larger one
    shrunk to fit `side`; gray stays one channel. About 100-300 bytes each at 8x8 -> 32x32."""
    import base64
    import io

    from PIL import Image

    out = []
    for img in np.asarray(images):
        a = img[..., 0] if img.ndim == 3 and img.shape[-1] == 1 else img
        h, w = a.shape[:2]
        pic = Image.fromarray(np.ascontiguousarray(a))
        if max(h, w) < side:
            f = max(1, side // max(h, w))
            pic = pic.resize((w * f, h * f), Image.NEAREST)
        elif max(h, w) > side:
            pic.thumbnail((side, side), Image.BOX)
        buf = io.BytesIO()
        pic.save(buf, format="PNG", optimize=True)
        out.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


def hover_table(maps: EmbeddingMaps, images: np.ndarray, class_names: Sequence[str], side: int = 32) -> list[dict]:
    """One record per map point, for a chart with image tooltips: id, label name, whether deleted, both
    maps' coordinates (exemplar ones None where deleted) and `image`, a thumbnail data URL (`thumbnail_urls`).
    `images` (N, H, W, C) align with `maps.ids`."""
    urls = thumbnail_urls(images, side)
    rows = []
    for r, (i, lab, gone) in enumerate(zip(maps.ids.tolist(), maps.labels.tolist(), maps.deleted.tolist())):
        ex = maps.exemplar_xy[r]
        rows.append({"id": int(i), "label": str(class_names[int(lab)]), "status": "deleted" if gone else "in the bank",
                     "cls_x": float(maps.cls_xy[r, 0]), "cls_y": float(maps.cls_xy[r, 1]),
                     "ex_x": None if gone or not np.isfinite(ex).all() else float(ex[0]),
                     "ex_y": None if gone or not np.isfinite(ex).all() else float(ex[1]),
                     "image": urls[r]})
    return rows


def ids_csv(ids: Sequence[int]) -> str:
    """A CSV of ids with an `id` header: what the Deletion page's ids-file upload reads."""
    return "id\n" + "".join(f"{int(i)}\n" for i in ids)


# --------------------------------------------------------------------------- off the UI thread


class EmbeddingJob(BackgroundJob):
    """Computes `compute_maps` in a background thread so a UI can show progress and survive reruns."""

    name = "munkey-embeddings"
    what = "Computing the maps"

    def __init__(self, run: MunkeyRun, params: MapParams = MapParams(),
                 compute: Callable[..., EmbeddingMaps] = compute_maps, refit: bool = False) -> None:
        super().__init__()
        self.run, self.params, self._compute, self.refit = run, params, compute, refit
        self.result: EmbeddingMaps | None = None
        self.reset()

    def reset(self) -> None:
        self.stage, self.fraction = "waiting", 0.0

    def _report(self, stage: str, fraction: float) -> None:
        self.stage, self.fraction = stage, float(fraction)

    def task(self) -> None:
        extra = {"refit": True} if self.refit else {}
        self.result = self._compute(self.run, self.params, progress=self._report, **extra)
