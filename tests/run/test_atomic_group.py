"""atomic.py `atomic_write_many` (several files, one group of flushes) and `json_text` (the layouts).

A group write must leave each file old or new, never a mix, whatever point it stops at, and every
file durable and in place on return; `json_text(rows=True)` must be the same JSON value as the
indented form.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal

import pytest

from munkey_core.atomic import atomic_write_many, json_text


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


HOSTILE = ["", "a\nb", 'q"uote\\', "\u00e9\u2028\U0001f600", "</script>"]


def test_rows_layout_is_the_same_json_value():
    value = {
        "samples": [{"id": i, "memory_sha256": f"{i:064x}", "image_sha256": None, "note": HOSTILE[i % 5]}
                    for i in range(50)],
        "requested_ids": list(range(50)), "empty": [], "nested": {"a": [[1, 2], {"b": []}], "c": {}},
        "floats": [0.1, -2.5e-300, 1e300], "big": 2 ** 63 - 1, "mixed": [1, {"x": [1]}], "k": {"1": None},
        "tuple": (1, "two"), HOSTILE[1]: HOSTILE[3],
    }
    text = json_text(value, rows=True)
    assert json.loads(text) == json.loads(json.dumps(value))
    lines = text.splitlines()
    assert '    {"id": 6, "image_sha256": null, "memory_sha256": "' + f"{6:064x}" + '", "note": "a\\nb"},' in lines
    assert '  "requested_ids": [' + ", ".join(map(str, range(50))) + "]," in lines
    assert json_text(value) == json.dumps(value, indent=2, sort_keys=True)
    assert json_text(value, compact=True) == json.dumps(value, sort_keys=True, separators=(",", ":"))


def test_rows_layout_keeps_json_key_rules():
    value = {"outer": {1: "one", 2: [True]}}  # keys json converts: its own indented text, re-indented
    assert json.loads(json_text(value, rows=True)) == json.loads(json.dumps(value))
