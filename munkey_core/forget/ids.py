"""A deletion request's ids, from text, a CSV with an `id` column, a file or a dashboard upload.

Malformed input raises MunkeyError naming the bad tokens, before anything is deleted. (A random
fraction of the bank is `data.sampling.random_ids`; the deletion itself is forget/request.py.)
Tests: tests/test_forget.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from munkey_core.errors import MunkeyError

_HEADER_NAMES = {"id", "ids", "sample_id", "sample"}


def parse_ids(text: str, source: str = "ids") -> list[int]:
    """Parse ids separated by commas, whitespace or new lines; a CSV whose header names an `id`
    column is read from that column. Malformed tokens raise MunkeyError naming them."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    column = None
    if lines:
        header = [t.strip().strip('"').lower() for t in lines[0].split(",")]
        named = [i for i, t in enumerate(header) if t in _HEADER_NAMES]
        if named:
            column, lines = named[0], lines[1:]
    tokens: list[str] = []
    for ln in lines:
        if column is not None:
            cells = ln.split(",")
            tokens.append(cells[column].strip().strip('"') if column < len(cells) else "")
        else:
            tokens.extend(t for t in re.split(r"[,\s;]+", ln.strip()) if t)
    bad = [t for t in tokens if not re.fullmatch(r"\d+", t)]
    if bad:
        shown = ", ".join(repr(t) for t in bad[:5])
        raise MunkeyError(f"{source}: {len(bad)} malformed id(s) ({shown}); ids are non-negative integers "
                          "separated by commas or new lines. Nothing was deleted.")
    if not tokens:
        raise MunkeyError(f"{source}: the request names no sample id. Nothing was deleted.")
    return list(dict.fromkeys(int(t) for t in tokens))


def ids_from_bytes(data: bytes, source: str = "ids file") -> list[int]:
    """Ids from the bytes of a text or CSV file (a file or a dashboard upload); binary -> MunkeyError."""
    try:
        if b"\x00" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise MunkeyError(f"{source} is not a text file (UTF-8 expected); give one id per line or comma separated. "
                          "Nothing was deleted.") from None
    return parse_ids(text, source=source)


def read_ids_file(path: str | Path) -> list[int]:
    """Ids from a text or CSV file; a missing or binary file raises MunkeyError."""
    path = Path(path)
    if not path.is_file():
        raise MunkeyError(f"The ids file {path} does not exist. Nothing was deleted.")
    return ids_from_bytes(path.read_bytes(), source=str(path))
