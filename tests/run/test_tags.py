"""Sample tags and saved views in the run (run/tags.py): round trip, refusals, damaged files, and the
deletion purge (no byte of a deleted id left in tags.json, after a normal and an interrupted deletion)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from _helpers import cli, forked
from munkey_core.cli import main
from munkey_core.errors import MunkeyError
from munkey_core.run import tags
from munkey_core.run.rows import load_bank
from munkey_core.service import MunkeyRun


def _two_bank_ids(run: Path) -> tuple[int, int]:
    """Two ids still in the bank, >= 100 (never equal to a class index or a view setting) and such that
    neither's digits occur as a whole number inside the other."""
    ids = [int(i) for i in load_bank(run).ids if int(i) >= 100]
    return ids[3], ids[40]


def _holds_number(raw: bytes, n: int) -> bool:
    """True when `n` occurs in the file as a whole number (not as part of a longer one)."""
    return re.search(rb"(?<![0-9])" + str(n).encode() + rb"(?![0-9])", raw) is not None


def test_tags_and_views_round_trip(tiny_run: Path) -> None:
    a, b = _two_bank_ids(tiny_run)
    assert tags.read_tags(tiny_run).tags == {} and not tags.tags_path(tiny_run).exists()  # no file: no tags
    assert tags.add_tag(tiny_run, "review", [b, a, a]) == {"tagged": sorted([a, b]), "skipped": []}
    tags.add_tag(tiny_run, " consent-withdrawn ", [a])
    store = tags.read_tags(tiny_run)
    assert store.tags == {"review": sorted([a, b]), "consent-withdrawn": [a]}
    assert store.ids_with(["consent-withdrawn"]) == {a} and store.tags_of(a) == ["consent-withdrawn", "review"]
    view = {"classes": [3], "id_ranges": [[a - 5, a + 5]], "tags": ["review"], "wrong": True, "low_confidence": 0.8}
    tags.save_view(tiny_run, "to check", view)
    assert tags.read_tags(tiny_run).views == {"to check": view}
    assert tags.remove_tag(tiny_run, "review", [a]) == 1
    assert tags.read_tags(tiny_run).tags["review"] == [b]
    assert tags.remove_tag(tiny_run, "review") == 1 and "review" not in tags.read_tags(tiny_run).tags
    assert tags.delete_view(tiny_run, "to check") and not tags.delete_view(tiny_run, "to check")
    data = json.loads(tags.tags_path(tiny_run).read_text())
    assert data == {"format": 1, "tags": {"consent-withdrawn": [a]}, "views": {}}
    assert not list(tiny_run.glob(".tags.json.*.tmp"))  # atomic writes leave no temp file


def test_only_samples_in_the_bank_can_be_tagged(tiny_run: Path) -> None:
    a, b = _two_bank_ids(tiny_run)
    assert main(["forget", str(tiny_run), "--ids", str(a), "--operator", "o", "--no-evaluate"]) == 0
    assert tags.add_tag(tiny_run, "review", [a, b, 10**9]) == {"tagged": [b], "skipped": [a, 10**9]}
    with pytest.raises(MunkeyError, match="none can be tagged"):
        tags.add_tag(tiny_run, "review", [a])
    for bad in ("", "   ", "x" * 61, "<script>", "a\nb"):
        with pytest.raises(MunkeyError, match="cannot be a tag name"):
            tags.add_tag(tiny_run, bad, [b])
    with pytest.raises(MunkeyError, match="at least one sample"):
        tags.add_tag(tiny_run, "review", [])
    assert tags.read_tags(tiny_run).tags == {"review": [b]}  # the refusals changed nothing


def test_a_damaged_tags_file_gives_a_clear_message(tiny_run: Path) -> None:
    path = tags.tags_path(tiny_run)
    for raw in (b"{not json", b"[1, 2]", b'{"format": 1, "tags": {"x": "12"}}', b'{"format": 7}', b"\xff\xfe",
                b'{"format": 1, "views": {"v": {"id_ranges": [[1]]}}}'):
        path.write_bytes(raw)
        with pytest.raises(MunkeyError, match="is damaged") as exc:
            tags.read_tags(tiny_run)
        assert "Move it away" in str(exc.value) and "Traceback" not in str(exc.value)
        with pytest.raises(MunkeyError, match="is damaged"):  # and a write refuses instead of overwriting it
            tags.add_tag(tiny_run, "review", [_two_bank_ids(tiny_run)[0]])
        assert path.read_bytes() == raw


def test_subtract_ids_cuts_deleted_ids_out_of_ranges() -> None:
    assert tags.subtract_ids([[40, 60]], [50]) == [[40, 49], [51, 60]]
    assert tags.subtract_ids([[40, 60]], [40, 60, 99]) == [[41, 59]]
    assert tags.subtract_ids([[7, 7], [1, 3]], [7, 2]) == [[1, 1], [3, 3]]
    assert tags.subtract_ids([[1, 5]], []) == [[1, 5]]


def _tag_for_deletion(run: Path) -> tuple[int, int]:
    a, b = _two_bank_ids(run)
    tags.add_tag(run, "consent-withdrawn", [a])
    tags.add_tag(run, "review", [a, b])
    tags.save_view(run, "subject", {"classes": [], "id_ranges": [[a, a], [a - 2, a + 2]], "tags": ["consent-withdrawn"],
                                    "wrong": False, "low_confidence": None})
    raw = tags.tags_path(run).read_bytes()
    assert _holds_number(raw, a) and b"consent-withdrawn" in raw  # the check below can see them
    return a, b


def _expect_purged(run: Path, a: int, b: int) -> None:
    raw = tags.tags_path(run).read_bytes()
    assert not _holds_number(raw, a), raw.decode()
    assert b"consent-withdrawn" not in raw  # a tag only the deleted sample carried goes with it
    store = tags.read_tags(run)
    assert store.tags == {"review": [b]}
    assert store.views["subject"]["id_ranges"] == [[a - 2, a - 1], [a + 1, a + 2]] and store.views["subject"]["tags"] == []
    assert not list(run.glob(".tags.json.*.tmp"))


def test_a_deletion_purges_the_deleted_ids_tags_from_disk(tiny_run: Path) -> None:
    a, b = _tag_for_deletion(tiny_run)
    (tiny_run / ".tags.json.leftover.tmp").write_bytes(tags.tags_path(tiny_run).read_bytes())  # a killed writer's
    assert main(["forget", str(tiny_run), "--ids", str(a), "--operator", "o", "--no-evaluate"]) == 0
    _expect_purged(tiny_run, a, b)


def test_an_interrupted_deletion_purges_the_tags_when_rolled_forward(tiny_run: Path) -> None:
    a, b = _tag_for_deletion(tiny_run)
    assert forked(cli("forget", str(tiny_run), "--ids", str(a), "--operator", "o", "--no-evaluate"),
                  env={"MUNKEY_CRASH_AT": "bank"}) == -9
    assert _holds_number(tags.tags_path(tiny_run).read_bytes(), a)  # killed before the purge
    MunkeyRun(tiny_run, device="cpu")  # opening the run rolls the deletion forward
    _expect_purged(tiny_run, a, b)


def test_a_deletion_removes_a_damaged_tags_file(tiny_run: Path) -> None:
    a, _ = _two_bank_ids(tiny_run)
    tags.tags_path(tiny_run).write_bytes(b'{"format": 1, "tags": {"x": [' + str(a).encode() + b']')  # truncated
    assert main(["forget", str(tiny_run), "--ids", str(a), "--operator", "o", "--no-evaluate"]) == 0
    assert not tags.tags_path(tiny_run).exists()
    assert tags.read_tags(tiny_run).tags == {}
