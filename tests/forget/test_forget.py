"""Key-deletion requests: id parsing, files, random fractions, and the purge of checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from munkey_core.errors import MunkeyError
from munkey_core.data.sampling import random_ids
from munkey_core.forget.ids import parse_ids, read_ids_file
from munkey_core.run.rows import purge_checkpoint_rows


def test_parse_ids_accepts_commas_spaces_lines_and_dedups() -> None:
    assert parse_ids("3, 1,2\n7 3\n# comment\n") == [3, 1, 2, 7]


def test_parse_ids_reads_the_id_column_of_a_csv() -> None:
    assert parse_ids("name,id,label\na,10,3\nb,11,4\n") == [10, 11]


@pytest.mark.parametrize("text", ["1,2,x", "1.5", "-3", "12a"])
def test_parse_ids_rejects_malformed_tokens(text: str) -> None:
    with pytest.raises(MunkeyError, match="malformed"):
        parse_ids(text)


@pytest.mark.parametrize("text", ["", "  \n", "# only a comment\n", "id\n"])
def test_parse_ids_rejects_empty_requests(text: str) -> None:
    with pytest.raises(MunkeyError, match="names no sample id"):
        parse_ids(text)


def test_read_ids_file_text_binary_and_missing(tmp_path) -> None:
    good = tmp_path / "ids.txt"
    good.write_text("5\n6\n")
    assert read_ids_file(good) == [5, 6]
    binary = tmp_path / "ids.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(MunkeyError, match="not a text file"):
        read_ids_file(binary)
    with pytest.raises(MunkeyError, match="does not exist"):
        read_ids_file(tmp_path / "nope.txt")


def test_random_ids_is_seeded_and_sized() -> None:
    ids = np.arange(1000, 2000)
    a, b = random_ids(ids, 0.1, seed=4), random_ids(ids, 0.1, seed=4)
    assert a == b and len(a) == 100 and set(a) <= set(ids.tolist())
    assert random_ids(ids, 0.1, seed=5) != a
    for bad in (0.0, 1.0, -0.2, 1.5):
        with pytest.raises(MunkeyError, match="between 0 and 1"):
            random_ids(ids, bad, seed=0)


def test_purge_checkpoints_drops_exactly_the_deleted_rows(tmp_path) -> None:
    values = torch.randn(6, 4)
    for e in (1, 2):
        torch.save({"epoch": e, "ids": torch.arange(10, 16), "values": values * e, "model": {}},
                   tmp_path / f"epoch_{e:03d}.pt")
    assert purge_checkpoint_rows(tmp_path, [11, 14, 99]) == 2
    for e in (1, 2):
        ck = torch.load(tmp_path / f"epoch_{e:03d}.pt", weights_only=True)
        assert ck["ids"].tolist() == [10, 12, 13, 15]
        torch.testing.assert_close(ck["values"], values[[0, 2, 3, 5]] * e)
        for victim in (1, 4):
            assert (values[victim] * e).numpy().tobytes() not in (tmp_path / f"epoch_{e:03d}.pt").read_bytes()
    assert purge_checkpoint_rows(tmp_path, [11]) == 0  # nothing left to do
