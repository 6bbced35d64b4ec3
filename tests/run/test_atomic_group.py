"""atomic.py `atomic_write_many`: several files written as one group of flushes.

A group write must leave each file old or new, never a mix, whatever point it stops at, and every
file in place on return.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

from munkey_core.atomic import atomic_write_many, json_bytes


def _temps(*folders):
    return [p for d in folders for p in d.iterdir() if p.name.endswith(".tmp")]


def test_group_write_replaces_every_file(tmp_path):
    a, b = tmp_path / "one", tmp_path / "two"
    a.mkdir()
    (a / "x.bin").write_bytes(b"old x")
    files = [(a / "x.bin", b"new x"), (a / "y.bin", b"\x00" * 70_000), (b / "z.json", b'{"z": 1}\n')]
    atomic_write_many(files)
    assert (a / "x.bin").read_bytes() == b"new x"
    assert (a / "y.bin").read_bytes() == b"\x00" * 70_000
    assert (b / "z.json").read_bytes() == b'{"z": 1}\n'
    assert _temps(a, b) == []
    atomic_write_many([])  # nothing to write: nothing happens


def test_a_failure_before_the_renames_changes_nothing(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"old x")
    (tmp_path / "blocker").write_bytes(b"a file where a folder should be")
    with pytest.raises(OSError):
        atomic_write_many([(tmp_path / "x.bin", b"new x"), (tmp_path / "blocker" / "y.bin", b"y")])
    assert (tmp_path / "x.bin").read_bytes() == b"old x"
    assert _temps(tmp_path) == []


def _killed_after_first_rename(folder: str) -> None:
    real = os.replace

    def replace_then_die(src, dst):
        real(src, dst)
        os.kill(os.getpid(), signal.SIGKILL)  # a crash between the two renames

    os.replace = replace_then_die
    atomic_write_many([(os.path.join(folder, "a.bin"), b"A" * 5000), (os.path.join(folder, "b.bin"), b"B" * 5000)])


def test_killed_between_renames_leaves_each_file_old_or_new(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a" * 3000)
    (tmp_path / "b.bin").write_bytes(b"b" * 3000)
    child = mp.get_context("fork").Process(target=_killed_after_first_rename, args=(str(tmp_path),))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert (tmp_path / "a.bin").read_bytes() == b"A" * 5000  # renamed before the kill: new, whole
    assert (tmp_path / "b.bin").read_bytes() == b"b" * 3000  # not renamed: old, whole
    # the unrenamed temp file is what atomic_write leaves after a kill too (a stray .tmp, cleaned on open)
    assert [p.name.startswith(".b.bin.") for p in _temps(tmp_path)] == [True]


def test_a_receipt_written_in_a_group_keeps_its_json_text(tmp_path):
    import json

    value = {"b": [1, 2.5, None], "a": {"z": "\u00e9\n", "y": []}}
    atomic_write_many([(tmp_path / "r.json", json_bytes(value)), (tmp_path / "c.json", json_bytes(value, compact=True))])
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == json.dumps(value, indent=2, sort_keys=True) + "\n"
    assert (tmp_path / "c.json").read_text(encoding="utf-8") == json.dumps(value, sort_keys=True,
                                                                          separators=(",", ":")) + "\n"
