"""Canonical JSON (RFC 8785, "JCS", for the types we store) and the hashes built on it.

The audit log hashes entries over this encoding, so anyone can re-compute a hash with any JCS
library: object keys sorted by UTF-16 code units, no insignificant whitespace, UTF-8, strings
escaped as ECMAScript's JSON.stringify does, numbers in ECMAScript's shortest round-trip form
(1.0 -> "1", 1e-7 -> "1e-7", 1e21 -> "1e+21"). Only dict, list, str, int (|x| <= 2**53 - 1, I-JSON's
safe range), float (finite), bool and None are accepted; anything else is a bug and raises TypeError /
ValueError.
A list of flat records (a request's samples) is written by the C JSON encoder, whose bytes are the
same for such values (`_flat_records`). `Encoded` holds the canonical text of a value already encoded, emitted as is inside a larger value:
a request's entry body (1,000 samples' hashes for 1,000 ids) is encoded once, not once for the log
row, once for its hash and twice for the receipt's hash and signature.
Tests: tests/audit/test_audit.py (RFC 8785 number vectors, round trip), tests/audit/test_canonical_oracle.py
(byte for byte against the rfc8785 package).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

_MAX_SAFE_INT = 2 ** 53 - 1  # as the rfc8785 package (our test oracle) refuses 2**53
_ESCAPED = re.compile(r'[\x00-\x1f\\"]')  # what json.dumps(ensure_ascii=False) escapes: ", \ and controls


def _number(x: float) -> str:
    """ECMAScript Number::toString for a finite double (what RFC 8785 prescribes)."""
    if not math.isfinite(x):
        raise ValueError(f"canonical JSON has no representation for {x!r}")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    mant, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mant.partition(".")
    raw = whole + frac
    lead = len(raw) - len(raw.lstrip("0"))
    digits = raw.lstrip("0").rstrip("0") or "0"
    n = len(whole) + int(exp or 0) - lead  # value = 0.digits x 10^n
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    return sign + digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def _string(s: str) -> str:
    """A JSON string literal as JSON.stringify writes it (json.dumps only when something needs escaping:
    the common case, a plain id or hash, costs no call into the encoder)."""
    return json.dumps(s, ensure_ascii=False) if _ESCAPED.search(s) else '"' + s + '"'


class Encoded:
    """A value's canonical JSON text, made only by `encoded` (so it is always canonical); `_encode`
    writes the text where the value would be encoded."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def encoded(obj: Any) -> Encoded:
    """`obj` encoded once, for use inside larger values: canonical_json({"a": encoded(x)}) ==
    canonical_json({"a": x})."""
    return Encoded(canonical_json(obj))


def _int(x: int) -> str:
    if abs(x) > _MAX_SAFE_INT:
        raise ValueError(f"integer {x} is too large for canonical JSON (limit 2**53 - 1)")
    return str(int(x))


# For a list of flat records (dicts of ASCII keys -> str, int within the safe range, bool or None),
# the C JSON encoder writes RFC 8785's bytes: keys sorted (ASCII: code point order is UTF-16 order),
# the same string escapes (`_string` takes them from json.dumps), ints as digits, no spaces. A
# request's samples (1,000 records for 1,000 ids) are written that way in one call.
_RECORDS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False).encode


def _flat_records(obj: list) -> str | None:
    """The canonical text of `obj` when it is a list of flat records, else None (the general path)."""
    for record in obj:
        if type(record) is not dict:
            return None
        for key, value in record.items():
            if type(key) is not str or not key.isascii():
                return None
            kind = type(value)
            if kind is int:
                if abs(value) > _MAX_SAFE_INT:
                    return None  # the general path refuses it
            elif kind is not str and kind is not bool and value is not None:
                return None
    return _RECORDS(obj)


def _encode(obj: Any, out: list[str]) -> None:
    if obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, str):
        out.append(_string(obj))
    elif isinstance(obj, int):
        out.append(_int(obj))
    elif isinstance(obj, float):
        out.append(_number(obj))
    elif isinstance(obj, (list, tuple)):
        if obj and all(type(x) is int for x in obj):  # a list of ids: one join (bool is not exactly int)
            out.append("[" + ",".join(map(_int, obj)) + "]")
            return
        if obj and type(obj[0]) is dict:
            text = _flat_records(obj)
            if text is not None:
                out.append(text)
                return
        out.append("[")
        for i, item in enumerate(obj):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    elif isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("canonical JSON object keys must be strings")
        # UTF-16 code unit order; for ASCII keys (nearly all) that is plain string order
        keys = sorted(obj) if all(k.isascii() for k in obj) else sorted(obj, key=lambda s: s.encode("utf-16-be"))
        out.append("{")
        for i, key in enumerate(keys):
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _encode(obj[key], out)
        out.append("}")
    elif isinstance(obj, Encoded):
        out.append(obj.text)
    else:
        raise TypeError(f"canonical JSON cannot encode {type(obj).__name__}")


def canonical_json(obj: Any) -> str:
    """The RFC 8785 text of `obj`."""
    out: list[str] = []
    _encode(obj, out)
    return "".join(out)


def canonical_bytes(obj: Any) -> bytes:
    return canonical_json(obj).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plain(obj: Any) -> Any:
    """`obj` with numpy scalars turned into Python numbers and NaN/inf into None (JSON-ready)."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if hasattr(obj, "item") and not isinstance(obj, (bytes, bytearray)):  # numpy / torch scalars
        return plain(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj
