"""Checkpoint model selection on a real tiny digits run: every checkpoint scored, the rule applied,
the validation split used (never test), the chosen checkpoint written as a new run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from munkey_core.cli import main
from munkey_core.errors import MunkeyError
from munkey_core.eval.metrics import accuracy
from munkey_core.eval.selection import checkpoint_files, checkpoint_state, select_checkpoint, write_selected
from munkey_core.service import MunkeyRun
from _helpers import file_digests


def test_every_checkpoint_is_scored_and_the_rule_is_applied(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    files = checkpoint_files(run)
    assert len(files) == 10  # 15 epochs, the newest 10 kept
    sel = select_checkpoint(run, val_rate=0.1, max_ps=10.0, max_samples=0, oracle_progress=False)
    assert [s.name for s in sel.scores] == [f.name for f in files]
    assert [s.epoch for s in sel.scores] == list(range(6, 16))
    best = min(sel.scores, key=lambda s: s.AvgGap)
    assert sel.selected == best.name and sel.best is best
    # the gap is the mean of the four absolute differences to the oracle on the same samples
    for s in sel.scores:
        parts = [abs(getattr(s, m) - sel.oracle[m]) for m in ("TA", "RA", "FA", "MIA")]
        assert s.AvgGap == pytest.approx(sum(parts) / 4)
    # only balanced checkpoints compete: with the bound between two Ps values, the rule follows it
    ps = sorted({s.Ps for s in sel.scores})
    if len(ps) > 1:
        bound = (ps[0] + ps[1]) / 2
        again = select_checkpoint(run, val_rate=0.1, max_ps=bound, max_samples=0, oracle_progress=False)
        assert again.selected == min((s for s in again.scores if s.Ps <= bound), key=lambda s: s.AvgGap).name
        assert all(s.eligible == (s.Ps <= bound) for s in again.scores)
    # the oracle was trained once, for the split plus nothing else, and is reused
    assert len(list((tiny_run / "oracles").iterdir())) == 1


def test_checkpoints_are_scored_on_the_validation_split(tiny_run: Path) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    last = checkpoint_files(run)[-1]
    model, bank, epoch = checkpoint_state(run, last)
    assert epoch == 15  # the newest checkpoint is the run's own state
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), run.model.state_dict().values()))
    assert torch.equal(bank.values, run.bank.values[torch.from_numpy(run.bank.rows_of(bank.ids))])
    sel = select_checkpoint(run, val_rate=0.1, max_ps=10.0, max_samples=0, oracle_progress=False)
    ds = run.dataset
    both = run.predict_prepared(ds.val.images, run.split_keys("val"), neighbour_predictions=False)
    image = run.predict_prepared(ds.val.images, run.split_keys("val"), pathway="image", neighbour_predictions=False)
    assert sel.scores[-1].A_img == pytest.approx(accuracy(image.labels, ds.val.labels))
    assert sel.scores[-1].Ps == pytest.approx(
        abs(sel.scores[-1].A_img - sel.scores[-1].A_tok) / accuracy(both.labels, ds.val.labels), rel=1e-6)


def test_selected_checkpoint_becomes_a_new_run_and_the_original_is_untouched(tiny_run: Path, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    before = file_digests(tiny_run, exclude=("oracles",))
    out = tmp_path / "selected"
    assert main(["select", str(tiny_run), "--val-rate", "0.1", "--max-ps", "10", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["written"] == str(out) and result["selected"]
    assert file_digests(tiny_run, exclude=("oracles",)) == before
    run = MunkeyRun(tiny_run, device="cpu")
    model, bank, epoch = checkpoint_state(run, tiny_run / "checkpoints" / result["selected"])
    new = MunkeyRun(out, device="cpu")
    assert new.config["selected_from"]["epoch"] == epoch
    assert all(torch.equal(a, b) for a, b in zip(new.model.state_dict().values(), model.state_dict().values()))
    assert np.array_equal(np.sort(new.bank.ids), np.sort(bank.ids))
    assert torch.equal(new.bank.values[torch.from_numpy(new.bank.rows_of(bank.ids))], bank.values)
    # the new run serves and forgets like any run
    assert main(["forget", str(out), "--ids", str(int(bank.ids[0])), "--operator", "t", "--no-evaluate"]) == 0
    # a second write to the same folder, or onto a file, is refused before any scoring, nothing overwritten
    assert main(["select", str(tiny_run), "--val-rate", "0.1", "--max-ps", "10", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert "not an empty folder" in captured.err and "epoch_" not in captured.out
    (tmp_path / "file").write_text("keep me")
    assert main(["select", str(tiny_run), "--out", str(tmp_path / "file")]) == 2
    assert "not an empty folder" in capsys.readouterr().err and (tmp_path / "file").read_text() == "keep me"


def test_no_balanced_checkpoint_and_bad_input_give_clear_errors(tiny_run: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    run = MunkeyRun(tiny_run, device="cpu")
    with pytest.raises(MunkeyError, match="val-rate"):
        select_checkpoint(run, val_rate=0.7)
    with pytest.raises(MunkeyError, match="max-ps"):
        select_checkpoint(run, max_ps=0)
    with pytest.raises(MunkeyError, match="without --no-train"):
        select_checkpoint(run, train_missing=False)
    assert main(["select", str(tiny_run), "--val-rate", "0.1", "--max-ps", "1e-12", "--max-samples", "100"]) == 0
    assert "none selected" in capsys.readouterr().out
    assert main(["select", str(tiny_run), "--val-rate", "0.1", "--max-ps", "1e-12", "--max-samples", "100",
                 "--out", str(tmp_path / "x")]) == 2
    captured = capsys.readouterr()
    assert "Ps <=" in captured.err and not (tmp_path / "x").exists()
    assert "epoch_015.pt" in captured.out and "none selected" in captured.out  # the scores are still shown
    # after a deletion the scores still work, but the run is not rewound (its audit trail stays with it)
    assert main(["forget", str(tiny_run), "--ids", str(int(run.bank.ids[0])), "--operator", "t", "--no-evaluate"]) == 0
    run = MunkeyRun(tiny_run, device="cpu")
    sel = select_checkpoint(run, val_rate=0.1, max_ps=10.0, max_samples=100, oracle_progress=False)
    with pytest.raises(MunkeyError, match="already has deletions"):
        write_selected(run, sel, tmp_path / "y")
    assert main(["select", str(tiny_run), "--out", str(tmp_path / "y")]) == 2  # refused before scoring
    captured = capsys.readouterr()
    assert "already has deletions" in captured.err and "epoch_" not in captured.out
    for f in checkpoint_files(run):
        f.unlink()
    with pytest.raises(MunkeyError, match="no per-epoch checkpoints"):
        select_checkpoint(run)
