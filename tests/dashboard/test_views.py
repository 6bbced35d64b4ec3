"""munkey_core.dashboard.views: what the dashboard shows, tested without Streamlit on the tiny digits run."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from munkey_core.dashboard import views
from munkey_core.errors import MunkeyError
from munkey_core.service import MunkeyRun
from munkey_core.run.rows import load_bank


@pytest.fixture(scope="module")
def shared_run(tiny_run_template: Path) -> MunkeyRun:
    """The session's tiny run, opened once; tests using it must not change it."""
    return MunkeyRun(tiny_run_template, device="cpu")


def test_display_image_enlarges_small_images_crisply() -> None:
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8, 1)
    out = views.display_image(gray, min_side=96)
    assert out.shape == (96, 96)  # gray drops its channel axis, factor 12
    assert (out[:12, :12] == gray[0, 0, 0]).all() and out[-1, -1] == gray[-1, -1, 0]
    rgb = np.zeros((200, 300, 3), np.uint8)
    assert views.display_image(rgb, min_side=96).shape == (200, 300, 3)


def test_ids_from_bytes_reads_csv_and_text_and_refuses_garbage() -> None:
    assert views.ids_from_bytes(b"\xef\xbb\xbfid,name\n5,a\n7,b\n", "req.csv") == [5, 7]
    assert views.ids_from_bytes(b"1 2\n3,3\n", "req.txt") == [1, 2, 3]
    with pytest.raises(MunkeyError, match="not a text file"):
        views.ids_from_bytes(b"\x00\x01\x02", "blob.csv")
    with pytest.raises(MunkeyError, match="malformed"):
        views.ids_from_bytes(b"1, two, 3", "bad.txt")
    with pytest.raises(MunkeyError, match="UTF-8"):
        views.ids_from_bytes(b"\xff\xfe1", "latin.txt")


def test_check_credential_needs_a_configured_matching_token() -> None:
    assert views.check_credential("s3cret", "s3cret")
    assert not views.check_credential("wrong", "s3cret")
    assert not views.check_credential("", "s3cret")
    assert not views.check_credential("anything", None)
    assert not views.check_credential(None, "")


def test_predict_test_sample_carries_evidence(shared_run: MunkeyRun) -> None:
    sp = views.predict_test_sample(shared_run, 3, k=4)
    test = shared_run.dataset.test
    assert sp.id == int(test.ids[3]) and sp.label == int(test.labels[3])
    assert np.array_equal(sp.image, test.images[3])
    rows = views.evidence_rows(shared_run, sp.predictions, 0)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    sims = [r["similarity"] for r in rows]
    assert sims == sorted(sims, reverse=True)
    assert sum(r["weight"] for r in rows) == pytest.approx(1.0, abs=1e-4)
    predicted = int(sp.predictions.labels[0])
    assert all(r["supports_prediction"] == (r["votes_for"] == predicted) for r in rows)
    assert all(r["id"] in shared_run.bank for r in rows)
    imgs = views.training_images(shared_run, [r["id"] for r in rows])
    assert np.array_equal(imgs, shared_run.dataset.lookup([r["id"] for r in rows]).images)
    with pytest.raises(MunkeyError, match="out of range"):
        views.predict_test_sample(shared_run, len(test))
    fused = views.predict_test_sample(shared_run, 3, k=2, mode="rank_fusion")
    assert fused.predictions.neighbour_ids.shape == (1, 2)


def test_similar_training_samples_finds_the_sample_itself(shared_run: MunkeyRun) -> None:
    train = shared_run.dataset.train
    a, b = int(train.ids[10]), int(train.ids[20])
    rows = views.similar_training_samples(shared_run, [train.images[10]], n=5)
    assert len(rows) == 5 and rows[0]["id"] == a
    assert rows[0]["similarity"] == pytest.approx(1.0, abs=1e-3)
    assert rows[0]["label_name"] == shared_run.class_names[int(train.labels[10])]
    both = views.similar_training_samples(shared_run, [train.images[10], train.images[20]], n=6)
    assert {a, b} <= {r["id"] for r in both} and len(both) == 6
    assert next(r for r in both if r["id"] == b)["query"] == 1
    with pytest.raises(MunkeyError):
        views.similar_training_samples(shared_run, [], n=3)


def test_classify_ids(shared_run: MunkeyRun) -> None:
    in_bank = [int(i) for i in shared_run.bank.ids[:2]]
    groups = views.classify_ids(shared_run, [*in_bank, 10**9, in_bank[0]])
    assert groups == {"in_bank": in_bank, "already_deleted": [], "unknown": [10**9], "other_split": {}}


def test_delete_and_measure_deletes_and_reports(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    n0 = len(run.bank)
    ids = [int(i) for i in run.bank.ids[5:12]]
    with pytest.raises(MunkeyError, match="not training samples"):
        views.delete_and_measure(run, [*ids, 10**9], operator="dpo")
    assert len(run.bank) == n0 and not run.forgotten_ids
    stages = []
    summary = views.delete_and_measure(run, ids, operator="dpo", max_samples=200,
                                       progress=lambda s, f: stages.append(f))
    assert summary["deleted"] == ids and summary["bank_size_after"] == n0 - len(ids)
    assert stages == sorted(stages) and stages[-1] == 1.0
    assert summary["operator"] == "dpo" and Path(summary["receipt_json"]).is_file()
    before, after = summary["metrics_before"], summary["metrics_after"]
    assert before["MIA"] is None and before["FA"] is not None and before["TA"] is not None
    assert after["FA"] is not None and after["MIA"] is not None and after["deleted"] == len(ids)
    assert summary["retrieval_check"]["ok"] and summary["retrieval_check"]["ids_checked"] == len(ids)
    same = summary["same_class"]  # FA against unseen samples of the same classes, not TA overall
    assert same["FA_minus_TA_same_classes"] == pytest.approx(summary["FA_this_request_after"] - same["TA_same_classes"])
    assert "does not show" in same["same_class_note"]
    assert not set(ids) & set(load_bank(tiny_run).ids.tolist())
    json.dumps(summary)  # JSON-ready as is
    assert len(run.metrics_history) == 2  # before (no current entry existed) and after
    rows = views.metrics_table(before, after)
    assert [r["metric"] for r in rows] == ["TA", "RA", "FA", "MIA", "Ps"]
    assert rows[3]["change"] is None
    # a second request reuses the current metrics entry as its "before"
    again = views.delete_and_measure(run, [ids[0], int(run.bank.ids[0])], operator="dpo", max_samples=200)
    assert again["already_deleted"] == [ids[0]] and again["before_source"].startswith("metrics.json")
    reqs = views.deletion_requests(run)
    assert [r["n_ids"] for r in reqs] == [len(ids), 1] and reqs[0]["ids"] == ids
    assert views.latest_metrics(run, current_only=True) is not None


def test_training_job_estimates_the_time_left_from_its_epochs(tmp_path: Path) -> None:
    job = views.TrainingJob(tmp_path / "run", profile="cpu")
    assert job.seconds_left is None and "not training" in job.status_line()  # idle
    now = time.time()
    job.state, job.started, job.epochs = "running", now - 100, 10
    assert job.seconds_left is None  # no epoch has ended: the setup's share is unknown
    job.epoch, job.epoch_ends = 1, [now - 70]  # the first epoch includes loading data and keys: not used
    assert job.seconds_left is None and "time left known after the second epoch" in job.status_line()
    job.epoch, job.epoch_ends = 3, [now - 80, now - 60, now - 40]  # epochs 2 and 3 took 20 s each
    assert job.seconds_left == pytest.approx(7 * 20 - 40, abs=1)  # 7 epochs of 20 s, the 4th began 40 s ago
    line = job.status_line()
    assert line.startswith("The demo model is training: 30% (epoch 3/10)") and "about 1 min 40 s left" in line
    job.epoch_ends = [now - 500, now - 450]  # slower than the time left says: never negative
    assert job.seconds_left == 0.0
    job.epoch = 10
    assert "writing the run" in job.status_line()
    # the last 10 epochs only: 20 slow epochs (30 s) then 10 fast ones (10 s) -> 10 s per epoch
    job.epoch = 31  # of 41: 10 epochs left
    job.epoch_ends = [now - 700 + 30 * i for i in range(21)] + [now - 100 + 10 * i for i in range(1, 11)]
    job.epochs = 41
    assert job.seconds_left == pytest.approx(10 * 10, abs=1)


def test_training_job_trains_with_its_own_thread_count(tmp_path: Path) -> None:
    import torch

    seen = []
    before = torch.get_num_threads()
    job = views.TrainingJob(tmp_path / "run", profile="tiny", threads=before + 1,
                            trainer=lambda *a, **k: seen.append(torch.get_num_threads()))
    assert views.TrainingJob(tmp_path / "r2", profile="tiny").threads == max(1, os.cpu_count() - 1)
    job.start()
    assert job.wait(5) == "done" and seen == [before + 1]
    assert torch.get_num_threads() == before  # the pages' thread keeps its own setting


def test_training_job_reports_progress_and_errors(tmp_path: Path) -> None:
    gate = threading.Event()

    def fake_train(dataset, out, *, on_epoch, **kwargs):
        on_epoch({"epoch": 1, "loss": 1.0, "train_acc": 50.0, "val_acc": 40.0})
        gate.wait(5)
        on_epoch({"epoch": 3, "loss": 0.5, "train_acc": 80.0})

    job = views.TrainingJob(tmp_path / "run", profile="tiny", trainer=fake_train)
    assert job.state == "idle" and job.epochs == 3
    assert job.start() and not job.start()  # a running job is not started twice
    for _ in range(100):
        if job.epoch == 1:
            break
        threading.Event().wait(0.01)
    assert job.state == "running" and "epoch 1/3" in job.stage and job.fraction == pytest.approx(1 / 3)
    gate.set()
    assert job.wait(5) == "done" and job.fraction == 1.0

    def failing(*args, **kwargs):
        raise MunkeyError("no data: put it somewhere")

    job = views.TrainingJob(tmp_path / "r2", profile="tiny", trainer=failing)
    job.start()
    assert job.wait(5) == "failed" and job.error == "no data: put it somewhere"

    def buggy(*args, **kwargs):
        raise ValueError("boom")

    job = views.TrainingJob(tmp_path / "r3", profile="tiny", trainer=buggy)
    job.start()
    assert job.wait(5) == "failed" and "ValueError: boom" in job.error
    assert job.start()  # a failed job may be started again
    job.wait(5)
    with pytest.raises(MunkeyError):
        views.TrainingJob(tmp_path / "r4", profile="no-such-profile")
