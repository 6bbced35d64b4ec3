"""Shared UI plumbing for the dashboard pages: which run, opening it once, training it if absent,
showing user errors. Layout helpers only; what is shown comes from munkey_core."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import streamlit as st

from typing import TYPE_CHECKING, Callable, Sequence

from munkey_core.dashboard.firststart import TrainingJob
from munkey_core.data.images import display_image
from munkey_core.errors import MunkeyError

if TYPE_CHECKING:  # the model code (torch: ~10 s of imports on a busy 2-core machine) loads where a run is
    from munkey_core.service import MunkeyRun  # opened, so a first start's Overview draws without it

ROOT = Path(__file__).resolve().parents[1]
if "MUNKEY_UMASK" not in os.environ:  # runs, logs and receipts the dashboard writes: owner-only
    os.umask(0o077)
DEFAULT_RUN = ROOT / "runs" / "demo"


def run_dir() -> Path:
    """The run directory: $MUNKEY_RUN (relative to the working directory), else runs/demo here."""
    env = os.environ.get("MUNKEY_RUN")
    return Path(env).expanduser().resolve() if env else DEFAULT_RUN


@st.cache_resource(max_entries=2, show_spinner="Opening the run...")
def _open_run(path: str, config_stamp: int) -> MunkeyRun:
    # config_stamp (config.json's mtime) is part of the cache key: a run retrained in place is reopened.
    # A deletion changes only the bank: get_run re-reads it in place instead of reopening the whole run.
    from munkey_core.service import MunkeyRun

    return MunkeyRun(path)


@st.cache_resource(show_spinner=False)
def _training_job(path: str, profile: str) -> TrainingJob:
    return TrainingJob(path, dataset="digits", profile=profile)


@contextlib.contextmanager
def user_errors():
    """Show a MunkeyError's message (what went wrong and what to do) instead of a traceback."""
    try:
        yield
    except MunkeyError as exc:
        st.error(str(exc), icon=":material/error:")


def has_run(path: Path) -> bool:
    return (path / "config.json").exists()


def get_run() -> MunkeyRun | None:
    """The loaded run, or None when the run directory holds no run yet. A damaged run stops the page
    with its error message."""
    path = run_dir()
    if not has_run(path):
        return None
    try:
        run = _open_run(str(path), (path / "config.json").stat().st_mtime_ns)
        # a deletion made elsewhere (CLI, another session) rewrote the bank: re-read it (milliseconds, no
        # greyed page); skipped while this process holds the run (its own deletion keeps it current)
        if run.lock.acquire(blocking=False):
            try:
                run.reload_if_changed()
            finally:
                run.lock.release()
        return run
    except (MunkeyError, FileNotFoundError) as exc:
        st.error(str(exc) if isinstance(exc, MunkeyError) else
                 f"{path} is not a complete run directory ({exc.filename} is missing). "
                 "Delete it to retrain the demo run, or set MUNKEY_RUN to another run.",
                 icon=":material/error:")
        st.stop()


def require_run() -> MunkeyRun:
    """The loaded run; when there is none yet, show the training status and stop the page."""
    run = get_run()
    if run is None:
        training_panel(run_dir())
        st.stop()
    return run


def demo_profile() -> str:
    """The profile the dashboard trains the demo run with: $MUNKEY_PROFILE, default cpu."""
    return os.environ.get("MUNKEY_PROFILE", "cpu")


def training_panel(path: Path, *, page_needs_model: bool = True) -> TrainingJob | None:
    """Offer (and by default start) training the demo run on digits in the background, with its
    progress and time left. Returns the job (None when it cannot be made: the error is shown)."""
    profile = demo_profile()
    try:
        job = _training_job(str(path), profile)
        if job.state == "done" and not has_run(path):  # the trained run was removed since: train anew
            _training_job.clear()
            job = _training_job(str(path), profile)
    except MunkeyError as exc:
        st.title("No MUNKEY run yet")
        st.error(str(exc), icon=":material/error:")
        return None
    token = configured_token()
    # autostart: the demo (no operator credential configured), or when the server's starter asks for it
    autostart = os.environ.get("MUNKEY_AUTOTRAIN", "1" if token is None else "0") != "0"
    if job.state == "idle" and autostart:
        job.start()
    st.title("Training the demo model (first start)" if job.state in ("running", "done") else "No MUNKEY run yet")
    st.write(f"The run directory `{path}` holds no trained model yet. The demo run trains MUNKEY on the "
             f"embedded `{job.dataset}` data with the `{profile}` profile ({job.epochs} epochs) in the "
             "background; the time left below follows the epochs as they finish. Set `MUNKEY_RUN` to open "
             "another run, `MUNKEY_PROFILE` to change the profile.")
    if job.state in ("idle", "failed"):
        if job.state == "failed":
            st.error(job.error or "Training failed.", icon=":material/error:")
        allowed = token is None
        if token is not None:
            from munkey_core.dashboard.views import credential_gate  # the model code: drawn after the data

            given = st.text_input("Operator credential (training writes the run folder)", type="password",
                                  key="train_credential")
            allowed = credential_gate.check(given, token, who="training panel")
        if st.button("Train the demo run" if job.state == "idle" else "Try again", type="primary",
                     key="train_start", disabled=not allowed):
            job.start()
            st.rerun()
        return job
    _training_progress(job)
    if page_needs_model:
        st.info("This page needs the trained model: it opens by itself when training ends. The Overview "
                "shows the training data meanwhile.", icon=":material/hourglass_top:")
    return job


@st.fragment(run_every=1.0)
def _training_progress(job: TrainingJob) -> None:
    st.progress(job.fraction, text=job.status_line())
    rec = job.last_record
    if rec:
        st.caption(f"Last epoch: loss {fmt(rec.get('loss'), 3)}, training accuracy {fmt(rec.get('train_acc'), 1, ' %')}"
                   + (f", validation accuracy {fmt(rec.get('val_acc'), 1, ' %')}" if rec.get("val_acc") is not None
                      else "") + ".")
    if job.state != "running":
        st.rerun(scope="app")


def configured_token() -> str | None:
    """The operator credential: $MUNKEY_OPERATOR_TOKEN, else `operator_token` in .streamlit/secrets.toml."""
    token = os.environ.get("MUNKEY_OPERATOR_TOKEN")
    if token:
        return token
    try:
        value = st.secrets.get("operator_token")
    except Exception:  # no secrets.toml at all, or an unreadable one
        return None
    return str(value) if value else None


def collect_finished_job(job_key: str, result_key: str, result_attr: str) -> None:
    """When the background job in session_state[job_key] has ended: store its `result_attr` under
    `result_key` (done) or show its error (failed), and forget the job. Call before drawing anything
    that depends on the result."""
    job = st.session_state.get(job_key)
    if job is None or job.state not in ("done", "failed"):
        return
    if job.state == "done":
        st.session_state[result_key] = getattr(job, result_attr)
    else:
        st.error(job.error or f"{job.what} failed.", icon=":material/error:")
    del st.session_state[job_key]


IMAGE_TYPES = ["png", "jpg", "jpeg", "bmp", "tif", "tiff", "npy"]


def decoded_uploads(files) -> list[tuple[str, object]]:
    """(name, image) for each readable uploaded file, decoded in memory; an unreadable one shows its
    error and is skipped (the page keeps working)."""
    from munkey_core.data.images import decode_image

    out = []
    for f in files or []:
        try:
            out.append((f.name, decode_image(f.getvalue(), f.name)))
        except MunkeyError as exc:
            st.error(str(exc), icon=":material/error:")
    return out


def fmt(value, digits: int = 2, suffix: str = "") -> str:
    """A number for display; em dash for None, NaN or infinity of any float type (never "nan" or "None" on a page)."""
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return "—"
    return f"{value:.{digits}f}{suffix}"


def thumbnail_grid(run: MunkeyRun, ids: Sequence[int], *, size: int, per_row: int,
                   caption: Callable[[int, str], str]) -> None:
    """Training images by id in rows of `per_row` thumbnails, each captioned by caption(id, label name)."""
    from munkey_core.dashboard.views import training_images

    labels = run.dataset.lookup(ids).labels
    image_grid(training_images(run, ids), [caption(int(i), run.class_names[int(lab)]) for i, lab in zip(ids, labels)],
               size=size, per_row=per_row)


def image_grid(images: Sequence, captions: Sequence[str], *, size: int, per_row: int) -> None:
    """Images (H, W, C) uint8 in rows of `per_row` thumbnails, each with its caption."""
    for start in range(0, len(images), per_row):
        cols = st.columns(per_row)
        for col, img, text in zip(cols, images[start:start + per_row], captions[start:start + per_row]):
            col.image(display_image(img, 2 * size), width="stretch")  # fits narrow columns (800 px)
            col.caption(text)


def grid_filter(key: str, ids: Sequence[int], labels: Sequence[int], class_names: Sequence[str], *,
                limit: int | None = None, classes: bool = True):
    """Class and id filters above an image grid, and the count shown ("Showing 12 of 126."). Returns the
    gridfilter.GridView (positions into ids to draw); filtering changes only what is drawn, never a selection."""
    from munkey_core.dashboard.gridfilter import GridFilter, filter_grid

    cols = st.columns(2)
    picked = (cols[0].multiselect("Filter by class", range(len(class_names)), format_func=lambda c: class_names[c],
                                  key=f"{key}_classes", placeholder="all classes") if classes else [])
    query = cols[1 if classes else 0].text_input("Filter by id", key=f"{key}_ids",
                                                 placeholder="all ids, or e.g. 12, 40-60")
    try:
        view = filter_grid(ids, labels, GridFilter(tuple(picked), query), limit=limit)
    except MunkeyError as exc:  # an unreadable id filter: say so, filter by class only
        st.error(str(exc), icon=":material/error:")
        view = filter_grid(ids, labels, GridFilter(tuple(picked)), limit=limit)
    st.caption(view.caption)
    return view


@st.cache_resource(max_entries=2, show_spinner="Indexing the training images for copy search (once per run)...")
def _pixel_index(path: str, train_size: int):
    from munkey_core.run.copycache import pixel_index

    return pixel_index(get_run())


@st.cache_resource(max_entries=1, show_spinner="Bringing the copy search's thresholds up to date...")
def _copy_index(path: str, train_size: int, deleted: str):
    from munkey_core.dashboard.trust import copy_index

    return copy_index(get_run(), index=_pixel_index(path, train_size))


def copy_index_for(run: MunkeyRun):
    """The run's near-duplicate index (trust.copy_index) with thresholds for its current deleted ids: a
    deletion (here or in another process) makes the next call re-derive them without the deleted images
    (run/copycache.py); the previous ones are not kept. The image index itself is built once per run."""
    deleted = hashlib.sha256(repr(sorted(run.forgotten_ids)).encode()).hexdigest()[:16]
    return _copy_index(str(run.paths.root), len(run.dataset.train), deleted)


@st.cache_resource(max_entries=4, show_spinner=False)
def _similarity_calibration(path: str, bank_size: int):
    from munkey_core.dashboard.trust import similarity_calibration

    return similarity_calibration(get_run())


@st.cache_data(max_entries=8, show_spinner=False)
def _example_index(path: str, bank_size: int) -> int:
    from munkey_core.demo import example_sample

    return example_sample(get_run())[0]


def example_index_for(run: MunkeyRun) -> int:
    """The test sample the Evidence page opens on: the demo's example (demo.example_sample, the first test
    sample predicted right), per bank size (a deletion can change it)."""
    return _example_index(str(run.paths.root), len(run.bank))


def similarity_calibration_for(run: MunkeyRun):
    """The run's out-of-distribution threshold (trust.similarity_calibration), per bank size."""
    return _similarity_calibration(str(run.paths.root), len(run.bank))
