"""Two 2-D UMAP maps of what a run remembers, for the dashboard's Embeddings page (no Streamlit here).

- The [CLS] map: the model's [CLS] representation (pre-logits features) of each training sample,
  computed the way prediction does it: the sample's key retrieves its K nearest entries of the
  *current* bank, the image is run once with each neighbour's exemplar token, and the K [CLS]
  vectors are averaged with the ensemble weights softmax(sim / tau). A retained sample retrieves
  its own entry among them; a deleted one cannot (its exemplar is gone), but its image is still in
  the dataset, so its point is still computable: it is flagged `deleted`.
- The exemplar map: the bank's exemplar vectors (`values`), one per sample still in the bank.
  Deleted samples have no exemplar, so they are absent from this map.

Both maps show the same seeded subsample of at most `max_points` training samples (deleted ones
are kept first, so they stay visible). UMAP is the long part (numba compiles its kernels on the
first call in a process, ~10-30 s; then a few seconds per 1,000-3,000 points on 2 cores), hence
`EmbeddingJob`, which computes the maps off the UI thread and reports its stage.
Tests: tests/dashboard/test_embeddings.py.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from munkey_core.errors import MunkeyError
from munkey_core.dashboard.jobs import BackgroundJob
from munkey_core.model.munkey_vit import preprocess_images
from munkey_core.model.predict import neighbour_weights
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
    seconds: dict[str, float] = field(default_factory=dict)

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


def compute_maps(run: MunkeyRun, params: MapParams = MapParams(),
                 progress: Progress | None = None) -> EmbeddingMaps:
    """Both maps for the run's training split with its current bank. Cost: K forwards per shown
    sample, then two UMAP fits (the long part). Raises MunkeyError when the bank is empty."""
    report = progress or (lambda stage, frac: None)
    if len(run.bank) == 0:
        raise MunkeyError("The memory bank is empty: every training sample has been deleted, so there is "
                          "nothing to retrieve and no exemplar to map.")
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    report("loading the training data and its keys", 0.0)
    train = run.dataset.train
    deleted_all = ~np.isin(train.ids, run.bank.ids)
    pos = sample_positions(len(train), deleted_all, params.max_points, params.seed)
    order = np.argsort(train.ids[pos], kind="stable")
    pos = pos[order]  # ascending ids
    keys = run.split_keys("train")[pos]
    seconds["data"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    feats = cls_features(run, train.images[pos], keys,
                         progress=lambda s, f: report(f"[CLS] features of {len(pos)} samples", 0.05 + 0.2 * f))
    ids, labels, deleted = train.ids[pos].astype(np.int64), train.labels[pos].astype(np.int64), deleted_all[pos]
    values = exemplar_vectors(run, ids[~deleted])
    seconds["features"] = time.perf_counter() - t0

    note = "" if _umap_state["warm"] else " (the first map in this server also compiles UMAP's kernels: 10-30 s more)"
    report(f"UMAP of {len(ids)} [CLS] vectors{note}", 0.3)
    t0 = time.perf_counter()
    cls_xy = umap_2d(feats, params)
    _umap_state["warm"] = True
    seconds["umap_cls"] = time.perf_counter() - t0
    report(f"UMAP of {len(values)} exemplar vectors", 0.65)
    t0 = time.perf_counter()
    ex_xy = np.full((len(ids), 2), np.nan, np.float32)
    ex_xy[~deleted] = umap_2d(values, params, metric="cosine")
    seconds["umap_exemplar"] = time.perf_counter() - t0
    report("done", 1.0)
    return EmbeddingMaps(ids, labels, deleted, cls_xy, ex_xy, len(train), int(deleted_all.sum()), params, seconds)


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


def ids_csv(ids: Sequence[int]) -> str:
    """A CSV of ids with an `id` header: what the Deletion page's ids-file upload reads."""
    return "id\n" + "".join(f"{int(i)}\n" for i in ids)


# --------------------------------------------------------------------------- off the UI thread


class EmbeddingJob(BackgroundJob):
    """Computes `compute_maps` in a background thread so a UI can show progress and survive reruns."""

    name = "munkey-embeddings"
    what = "Computing the maps"

    def __init__(self, run: MunkeyRun, params: MapParams = MapParams(),
                 compute: Callable[..., EmbeddingMaps] = compute_maps) -> None:
        super().__init__()
        self.run, self.params, self._compute = run, params, compute
        self.result: EmbeddingMaps | None = None
        self.reset()

    def reset(self) -> None:
        self.stage, self.fraction = "waiting", 0.0

    def _report(self, stage: str, fraction: float) -> None:
        self.stage, self.fraction = stage, float(fraction)

    def task(self) -> None:
        self.result = self._compute(self.run, self.params, progress=self._report)
