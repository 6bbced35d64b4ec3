"""A deletion request's ids, from text, a CSV with an `id` column, a file or a dashboard upload.

Malformed input raises MunkeyError naming the bad tokens, before anything is deleted. (A random
fraction of the bank is `data.sampling.random_ids`; the deletion itself is forget/request.py.)
Tests: tests/forget/test_forget.py.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from munkey_core.errors import MunkeyError

MAX_ID = 2 ** 63 - 1  # ids are int64 in the bank
MAX_IDS_BYTES = 10 * 1024 * 1024  # an ids file or upload larger than this is refused before it is read
MAX_IDS = 1_000_000  # ids in one request
_HEADER_NAMES = {"id", "ids", "sample_id", "sample"}
_SEPARATORS = re.compile(r"[\s;]+")


def _check_token(token: str) -> int | None:
    """The id a token names, or None when it is not a non-negative integer within int64."""
    if not token.isascii() or not token.isdigit() or len(token) > 19:
        return None
    value = int(token)
    return value if value <= MAX_ID else None


def parse_ids(text: str, source: str = "ids") -> list[int]:
    """Parse ids: a CSV with a header naming an `id` column (read from that column by name; quoted
    fields honoured), or ids separated by commas, spaces, semicolons or new lines (each CSV field
    must then be an id). An id is a non-negative integer within int64. Lines starting with # are
    comments. Malformed input raises MunkeyError naming the bad tokens; nothing is guessed."""
    if len(text) > MAX_IDS_BYTES:
        raise MunkeyError(f"{source}: {len(text)} characters is more than a request may hold "
                          f"({MAX_IDS_BYTES // (1024 * 1024)} MB); split it. Nothing was deleted.")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    try:
        rows = list(csv.reader(lines, strict=True))
    except csv.Error as exc:
        raise MunkeyError(f"{source}: not valid CSV ({exc}); quote fields with double quotes. Nothing was "
                          "deleted.") from None
    column = None
    if rows:
        header = [c.strip().lower() for c in rows[0]]
        named = [i for i, c in enumerate(header) if c in _HEADER_NAMES]
        if len(named) > 1:
            raise MunkeyError(f"{source}: the header names {len(named)} id columns; keep one. Nothing was deleted.")
        if named:
            column, rows = named[0], rows[1:]
    tokens: list[str] = []
    for n, cells in enumerate(rows, start=2 if column is not None else 1):
        if column is not None:
            if column >= len(cells):
                raise MunkeyError(f"{source}: row {n} has no field in the id column. Nothing was deleted.")
            tokens.append(cells[column].strip())
        else:
            for cell in cells:
                tokens.extend(t for t in _SEPARATORS.split(cell.strip()) if t)
        if len(tokens) > MAX_IDS:
            raise MunkeyError(f"{source}: more than {MAX_IDS} ids in one request; split it. Nothing was deleted.")
    bad = [t for t in tokens if _check_token(t) is None]
    if bad:
        shown = ", ".join(repr(t[:30]) for t in bad[:5])
        raise MunkeyError(f"{source}: {len(bad)} malformed id(s) ({shown}); an id is a non-negative whole number "
                          f"of at most {MAX_ID} (int64)"
                          + ("; a CSV file needs a column named 'id'" if column is None and len(rows[0]) > 1 else "")
                          + ". Nothing was deleted.")
    if not tokens:
        raise MunkeyError(f"{source}: the request names no sample id. Nothing was deleted.")
    return list(dict.fromkeys(int(t) for t in tokens))


def ids_from_bytes(data: bytes, source: str = "ids file") -> list[int]:
    """Ids from the bytes of a text or CSV file (a file or a dashboard upload); binary -> MunkeyError."""
    if len(data) > MAX_IDS_BYTES:
        raise MunkeyError(f"{source} is {len(data) / 1e6:.1f} MB, more than an ids file may be "
                          f"({MAX_IDS_BYTES // (1024 * 1024)} MB); split the request. Nothing was deleted.")
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
    size = path.stat().st_size  # checked before reading: a huge file is refused at once
    if size > MAX_IDS_BYTES:
        raise MunkeyError(f"{path} is {size / 1e6:.1f} MB, more than an ids file may be "
                          f"({MAX_IDS_BYTES // (1024 * 1024)} MB); split the request. Nothing was deleted.")
    with open(path, "rb") as f:
        data = f.read(MAX_IDS_BYTES + 1)
    return ids_from_bytes(data, source=str(path))

