"""munkey_core.dashboard.embeddings: the two UMAP maps, tested without Streamlit on the tiny digits run.

UMAP is kept small (150 points, 8 neighbours, 50 epochs); the first fit in the process still pays
numba's compilation (~10-20 s), shared with tests/app/test_app_embeddings.py when run together.
"""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from munkey_core.cli import main
from munkey_core.dashboard import embeddings as emb
from munkey_core.errors import MunkeyError
from munkey_core.run.mapcache import cache_dir, cache_path, read_maps, write_maps
from munkey_core.service import MunkeyRun
from munkey_core.dashboard.views import ids_from_bytes

PARAMS = emb.MapParams(max_points=150, seed=3, n_neighbors=8, n_epochs=50)
N_DELETED = 20


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One torch thread: when other processes share the 2 cores, torch's 2 OpenMP threads stall at
    every barrier (see munkey_core/keys.py; measured here: 447 s instead of 16 s for this file's
    fixtures). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def deleted_run(tiny_run_template: Path, tmp_path_factory: pytest.TempPathFactory) -> MunkeyRun:
    """A copy of the tiny run with N_DELETED training samples deleted (shared by this module)."""
    dest = tmp_path_factory.mktemp("emb") / "run"
    shutil.copytree(tiny_run_template, dest)
    run = MunkeyRun(dest, device="cpu")
    run.forget([int(i) for i in run.bank.ids[::37][:N_DELETED]])
    return run


@pytest.fixture(scope="module")
def maps(deleted_run: MunkeyRun) -> emb.EmbeddingMaps:
    return emb.compute_maps(deleted_run, PARAMS)


def test_sample_positions_caps_keeps_deleted_and_is_seeded() -> None:
    deleted = np.zeros(1000, bool)
    deleted[[3, 500, 999]] = True
    pos = emb.sample_positions(1000, deleted, 50, seed=1)
    assert len(pos) == 50 and len(set(pos)) == 50 and list(pos) == sorted(pos)
    assert {3, 500, 999} <= set(pos.tolist())
    assert np.array_equal(pos, emb.sample_positions(1000, deleted, 50, seed=1))
    assert not np.array_equal(pos, emb.sample_positions(1000, deleted, 50, seed=2))
    assert np.array_equal(emb.sample_positions(40, deleted[:40], 50), np.arange(40))  # under the cap: all
    assert np.array_equal(emb.sample_positions(1000, deleted, 0), np.arange(1000))  # 0: no cap
    many = np.ones(100, bool)
    assert len(emb.sample_positions(100, many, 10)) == 10  # more deleted than the cap


def test_maps_shapes_flags_and_cap(maps: emb.EmbeddingMaps, deleted_run: MunkeyRun) -> None:
    n = PARAMS.max_points + N_DELETED  # the fit's cap of samples in the bank, plus every deleted one
    assert maps.ids.shape == maps.labels.shape == maps.deleted.shape == (n,)
    assert maps.cls_xy.shape == maps.exemplar_xy.shape == (n, 2)
    assert list(maps.ids) == sorted(set(maps.ids.tolist())) and maps.subsampled
    assert maps.n_train == len(deleted_run.dataset.train) and maps.n_deleted == N_DELETED
    gone = set(deleted_run.forgotten_ids)
    assert set(maps.ids[maps.deleted].tolist()) == gone  # every deleted sample is shown and flagged
    assert not set(maps.ids[~maps.deleted].tolist()) & gone
    assert np.isfinite(maps.cls_xy).all()  # deleted samples still have a [CLS] point ...
    assert np.isnan(maps.exemplar_xy[maps.deleted]).all()  # ... but no exemplar
    assert np.isfinite(maps.exemplar_xy[~maps.deleted]).all()
    train = deleted_run.dataset.train
    lab = dict(zip(train.ids.tolist(), train.labels.tolist()))
    assert [lab[i] for i in maps.ids.tolist()] == maps.labels.tolist()


def test_maps_are_deterministic_given_the_seed(maps: emb.EmbeddingMaps, deleted_run: MunkeyRun) -> None:
    again = emb.compute_maps(deleted_run, PARAMS, refit=True)  # a second fit, not the cached one
    assert not again.from_cache
    assert np.array_equal(again.ids, maps.ids)
    np.testing.assert_allclose(again.cls_xy, maps.cls_xy, atol=1e-5)
    np.testing.assert_allclose(again.exemplar_xy, maps.exemplar_xy, atol=1e-5)


def test_cls_features_are_what_prediction_uses(deleted_run: MunkeyRun) -> None:
    run = deleted_run
    train = run.dataset.train
    imgs, keys = train.images[:12], run.split_keys("train")[:12]
    feats = emb.cls_features(run, imgs, keys, batch_size=5)
    assert feats.shape == (12, run.model_cfg.embed_dim) and feats.dtype == np.float32
    # with K=1 the [CLS] vector is that of the one forward, so the head reproduces the prediction
    one = emb.cls_features(run, imgs, keys, k=1)
    with torch.inference_mode():
        logits = run.model.vit.head(torch.from_numpy(one)).numpy()
    preds = run.predict_prepared(imgs, keys, k=1, neighbour_predictions=False)
    assert np.array_equal(logits.argmax(1), preds.labels)


def test_exemplar_vectors_come_from_the_bank(deleted_run: MunkeyRun) -> None:
    ids = [int(i) for i in deleted_run.bank.ids[:3]]
    vals = emb.exemplar_vectors(deleted_run, ids)
    assert np.array_equal(vals, deleted_run.bank.values[deleted_run.bank.rows_of(ids)].numpy())
    with pytest.raises(MunkeyError, match="not in the memory bank"):
        emb.exemplar_vectors(deleted_run, [deleted_run.forgotten_ids[0]])


def test_umap_2d_handles_tiny_inputs() -> None:
    assert emb.umap_2d(np.zeros((0, 4), np.float32), PARAMS).shape == (0, 2)
    assert emb.umap_2d(np.ones((2, 4), np.float32), PARAMS).shape == (2, 2)
    x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    assert emb.umap_2d(x, PARAMS).shape == (6, 2)  # fewer points than n_neighbors


def test_empty_bank_is_a_user_error() -> None:
    with pytest.raises(MunkeyError, match="memory bank is empty"):
        emb.compute_maps(types.SimpleNamespace(bank=[]), PARAMS)  # type: ignore[arg-type]


def test_trace_groups_and_selected_points_give_ids(maps: emb.EmbeddingMaps) -> None:
    names = [str(i) for i in range(10)]
    cls_groups = emb.trace_groups(maps, "cls", names)
    ex_groups = emb.trace_groups(maps, "exemplar", names)
    assert cls_groups[-1].deleted and set(maps.ids[cls_groups[-1].rows].tolist()) == set(
        maps.ids[maps.deleted].tolist())
    assert not any(g.deleted for g in ex_groups)
    rows = np.concatenate([g.rows for g in cls_groups])
    assert sorted(rows.tolist()) == list(range(len(maps.ids)))  # every point drawn once
    # a lasso over points 0 and 2 of the first trace and point 1 of the deleted trace
    g0, gd = cls_groups[0], cls_groups[-1]
    want = sorted({int(maps.ids[g0.rows[0]]), int(maps.ids[g0.rows[2]]), int(maps.ids[gd.rows[1]])})
    by_index = [{"curve_number": 0, "point_index": 0}, {"curve_number": 0, "point_index": 2},
                {"curve_number": len(cls_groups) - 1, "point_index": 1}]
    assert emb.ids_from_points(by_index, maps, cls_groups) == want
    by_customdata = [{"customdata": [i, 0]} for i in reversed(want)] + [{"customdata": want[0]}]
    assert emb.ids_from_points(by_customdata) == want
    with pytest.raises(MunkeyError, match="not on the current map"):
        emb.ids_from_points([{"curve_number": 99, "point_index": 0}], maps, cls_groups)
    with pytest.raises(MunkeyError, match="Unknown map"):
        emb.trace_groups(maps, "keys", names)


def test_ids_csv_is_what_the_deletion_page_reads() -> None:
    text = emb.ids_csv([4, 17, 230])
    assert text.splitlines()[0] == "id"
    assert ids_from_bytes(text.encode(), "selected_ids.csv") == [4, 17, 230]


def test_embedding_job_runs_off_thread_and_reports_errors() -> None:
    fake = emb.EmbeddingMaps(np.arange(3), np.zeros(3, np.int64), np.zeros(3, bool), np.zeros((3, 2), np.float32),
                             np.zeros((3, 2), np.float32), 3, 0, PARAMS)

    def ok(run, params, progress):
        progress("halfway", 0.5)
        return fake

    job = emb.EmbeddingJob(None, PARAMS, compute=ok)  # type: ignore[arg-type]
    assert job.state == "idle" and job.start()
    assert job.wait(10) == "done" and job.result is fake and job.fraction == 0.5
    assert not job.start()  # done: not started again

    def bad(run, params, progress):
        raise MunkeyError("no data here")

    job = emb.EmbeddingJob(None, PARAMS, compute=bad)  # type: ignore[arg-type]
    job.start()
    assert job.wait(10) == "failed" and job.error == "no data here"
    assert job.start()  # a failed job may be started again
    job.wait(10)


# --------------------------------------------------------------------------- the map cache inside the run


def _tripwire(*args, **kwargs):
    raise AssertionError("UMAP was fitted again: the cached maps were not used")


def _raw_cache(run: MunkeyRun) -> bytes:
    """Every byte of the run's map cache folder (temporary files included)."""
    return b"".join(f.read_bytes() for f in sorted(cache_dir(run.paths.root).iterdir()))


def test_a_deletion_removes_points_from_the_cache_and_keeps_the_others_in_place(
        tiny_run: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    first = emb.compute_maps(run, PARAMS)
    assert not first.from_cache and not first.deleted.any() and len(first.ids) == PARAMS.max_points
    fitted = read_maps(cache_path(tiny_run, emb.cache_key(run, PARAMS)))
    assert fitted is not None and np.array_equal(fitted.ids, first.ids)
    victims = [int(i) for i in first.ids[[0, 7, 70, len(first.ids) - 1]]]
    rows = np.flatnonzero(np.isin(fitted.ids, victims))
    secrets = [fitted.cls_features[r].tobytes() for r in rows] + [fitted.cls_xy[r].tobytes() for r in rows] + [
        fitted.exemplar_xy[r].tobytes() for r in rows]
    assert all(s in _raw_cache(run) for s in secrets)  # the byte scan below does see them

    run.forget(victims[:2], operator="o")                     # the service, in this process
    capsys.readouterr()
    assert main(["forget", str(tiny_run), "--ids", ",".join(map(str, victims[2:])), "--operator", "o",
                 "--no-evaluate"]) == 0                       # the CLI, as another process would
    capsys.readouterr()

    on_disk = read_maps(cache_path(tiny_run, emb.cache_key(run, PARAMS)))
    assert on_disk is not None and not set(victims) & set(on_disk.ids.tolist())
    assert on_disk.meta["purged"] == len(victims) and len(on_disk.ids) == len(first.ids) - len(victims)
    raw = _raw_cache(run)
    assert not [s for s in secrets if s in raw]  # no coordinate or feature row of a deleted sample is left

    monkeypatch.setattr(emb, "umap_2d", _tripwire)
    fresh = MunkeyRun(tiny_run, device="cpu")  # a restart: nothing in memory
    after = emb.compute_maps(fresh, PARAMS)
    assert after.from_cache and after.removed_since_fit == len(victims)
    kept = ~after.deleted
    assert set(after.ids[after.deleted].tolist()) == set(victims)
    before_rows = np.searchsorted(first.ids, after.ids[kept])
    assert np.array_equal(after.cls_xy[kept], first.cls_xy[before_rows])  # the same coordinates, bit for bit
    assert np.array_equal(after.exemplar_xy[kept], first.exemplar_xy[before_rows])
    assert np.isnan(after.exemplar_xy[after.deleted]).all() and np.isfinite(after.cls_xy).all()


def test_a_fit_that_ends_after_a_deletion_does_not_write_the_deleted_rows(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    fitted = emb.fit_maps(run, PARAMS)  # the bank before the deletion ...
    victims = [int(i) for i in fitted.ids[:3]]
    run.forget(victims, operator="o", evaluate=False)  # ... a deletion while the fit was running ...
    written = write_maps(tiny_run, "k", fitted)       # ... and the fit's write afterwards
    on_disk = read_maps(cache_path(tiny_run, "k"))
    assert on_disk is not None and np.array_equal(on_disk.ids, written.ids)
    assert np.array_equal(on_disk.ids, fitted.ids[3:])
    assert np.array_equal(on_disk.cls_xy, fitted.cls_xy[3:])


def test_a_damaged_cache_file_is_refitted_and_purged(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    path = cache_path(tiny_run, emb.cache_key(run, PARAMS))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a map")
    (path.parent / "maps-other.npz").write_bytes(b"\x00" * 10)
    maps = emb.compute_maps(run, PARAMS)
    assert not maps.from_cache and read_maps(path) is not None  # rewritten by the fit
    run.forget([int(run.bank.ids[0])], operator="o", evaluate=False)
    assert not (path.parent / "maps-other.npz").exists()  # a deletion removes what it cannot read


def test_place_by_neighbours_is_the_mean_place_of_the_nearest_fitted_points() -> None:
    ref = np.array([[0, 0], [1, 0], [10, 0], [11, 0], [50, 50]], np.float32)
    ref_xy = np.array([[0, 0], [2, 0], [0, 8], [4, 8], [9, 9]], np.float32)
    x = np.array([[0.4, 0], [10.6, 0], [49, 49]], np.float32)
    got = emb.place_by_neighbours(x, ref, ref_xy, n=2)
    np.testing.assert_allclose(got, [[1, 0], [2, 8], [6.5, 8.5]])  # [49, 49]: nearest 50/50 then 11/0
    np.testing.assert_allclose(emb.place_by_neighbours(x[:1], ref, ref_xy, n=1), [[0, 0]])
    assert emb.place_by_neighbours(x[:0], ref, ref_xy).shape == (0, 2)


def test_thumbnail_urls_are_small_pngs_of_the_images() -> None:
    import base64
    import io

    from PIL import Image

    from sklearn.datasets import load_digits

    digits = np.rint(load_digits().images[:20] * 255 / 16).astype(np.uint8)[..., None]  # (20, 8, 8, 1)
    rgb = np.random.default_rng(0).integers(0, 255, (2, 96, 64, 3), dtype=np.uint8)

    def decode(url: str) -> Image.Image:
        assert url.startswith("data:image/png;base64,")
        return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))

    urls = emb.thumbnail_urls(digits)
    assert len(urls) == 20 and max(len(u) for u in urls) < 600  # light: a few hundred bytes each
    for url, img in zip(urls, digits):
        png = decode(url)  # 8x8 enlarged 4x by repeating pixels (gray stays gray)
        assert png.mode == "L" and np.array_equal(np.asarray(png), img[..., 0].repeat(4, 0).repeat(4, 1))
    big = [decode(u) for u in emb.thumbnail_urls(rgb)]
    assert all(p.mode == "RGB" and max(p.size) == 32 and p.size == (21, 32) for p in big)  # shrunk to fit, aspect kept
