"""The audit log's canonical JSON (munkey_core.audit.canonical) against the maintained `rfc8785`
package as an independent oracle: byte for byte on a seeded corpus of floats (every exponent,
subnormals, shortest round-trip cases), integers up to the safe limit, unicode (astral planes, whose
keys sort by UTF-16 code units, controls, U+2028) and nesting; and the same values refused. A value
encoded once (`encoded`) and nested in larger ones, and a logged entry with its receipt (whose hashes
and signature are computed that way), match the oracle's encoding of the whole."""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from pathlib import Path

import pytest

from munkey_core.audit import log as audit
from munkey_core.audit import receipts
from munkey_core.audit.canonical import canonical_bytes, encoded

rfc8785 = pytest.importorskip("rfc8785", reason="the test oracle: pip install 'munkey-core[test]'")

EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.1, 0.2 + 0.1, 1 / 3, 2 / 3, 1e21, 1e20, 9.999999999999999e20, 1e-6, 1e-7,
               9.99999e-7, 123456789012345680000.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
               333333333.33333329, 4.5, 2e-3, 1e-27, 9007199254740992.0, 9007199254740993.0, 0.000001234,
               295147905179352830000.0, 1.5e300, -1.5e-300, 100.0, 1e15, 1e16, 1e17, 12345.678e10]
EDGE_INTS = [0, 1, -1, 10 ** 15, 2 ** 31, -(2 ** 31), 2 ** 53 - 1, -(2 ** 53 - 1)]
EDGE_STRINGS = ["", "a", "é", "€", "\U0001f600", "\ufb33", "\uffff", "\u2028\u2029", "\x00\x01\x1f\x7f",
                "\"\\/", "\b\f\n\r\t", "\ud7ff\ue000", "Dana Ortiz (DPO)", "DSR-2026-0042", "日本語", "\u00ad\u0600"]


def _random_float(rng: random.Random) -> float:
    """A finite double from a random bit pattern (every exponent equally likely), or a short decimal."""
    while True:
        if rng.random() < 0.3:
            x = round(rng.uniform(-1e4, 1e4), rng.randint(0, 6))  # the kind the log stores: metrics, seconds
        else:
            x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(x):
            return x


def _random_string(rng: random.Random) -> str:
    pools = [(0x20, 0x7e), (0x00, 0x1f), (0xa0, 0x2fff), (0xe000, 0xfffd), (0x10000, 0x10ffff)]
    out = []
    for _ in range(rng.randint(0, 12)):
        lo, hi = rng.choice(pools)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 4 else 6)
    if kind == 0:
        return _random_float(rng)
    if kind == 1:
        return rng.randint(-(2 ** 53 - 1), 2 ** 53 - 1) if rng.random() < 0.5 else rng.randint(-1000, 1000)
    if kind == 2:
        return _random_string(rng)
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return rng.choice(EDGE_FLOATS + EDGE_INTS + EDGE_STRINGS)
    if kind == 5:
        return []
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {_random_string(rng) if rng.random() < 0.7 else rng.choice(EDGE_STRINGS): _random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 6))}


@pytest.mark.parametrize("value", EDGE_FLOATS + [-x for x in EDGE_FLOATS] + EDGE_INTS + EDGE_STRINGS,
                         ids=repr)
def test_edge_values_match_the_oracle(value) -> None:
    assert canonical_bytes(value) == rfc8785.dumps(value)


def test_keys_sort_by_utf16_code_units_as_the_oracle_does() -> None:
    # By code point U+FB33 comes before U+1F600; in UTF-16 U+1F600 is 0xD83D 0xDE00, which comes before
    # 0xFB33: the RFC sorts by UTF-16 code units, so the emoji key goes first.
    obj = {"\U0001f600": 1, "\ufb33": 2, "a": 3, "\u00e9": 4, "": 5, "A": 6, "\U00010000": 7, "\uffff": 8}
    assert canonical_bytes(obj) == rfc8785.dumps(obj)
    text = canonical_bytes(obj).decode("utf-8")
    assert text.index("\U0001f600") < text.index("\ufb33")


def test_a_seeded_corpus_matches_the_oracle_byte_for_byte() -> None:
    rng = random.Random(8785)
    floats = [_random_float(rng) for _ in range(5000)]
    assert canonical_bytes(floats) == rfc8785.dumps(floats)
    for i in range(1500):
        value = _random_value(rng)
        assert canonical_bytes(value) == rfc8785.dumps(value), f"corpus item {i}: {value!r}"


def test_a_real_audit_entry_matches_the_oracle() -> None:
    entry = {"kind": "deletion", "request_id": "req-20261129T202245Z-2c6ac5ec", "operator": "Dana Ortiz (DPO)",
             "samples": [{"id": 12, "memory_sha256": "ab" * 32, "image_sha256": "cd" * 32}],
             "metrics": {"before": {"TA": 97.49303621169916, "RA": 100.0, "FA": None, "MIA": None, "Ps": 0.07},
                         "after": {"TA": 97.49303621169916, "FA": 96.03174603174604, "MIA": 54.28}},
             "bank": {"before": {"size": 1258}, "after": {"size": 1132}}, "delete_seconds": 0.4812}
    assert canonical_bytes(entry) == rfc8785.dumps(entry)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 2 ** 53, -(2 ** 53), 2 ** 64, object(),
                                 {1: "non-string key"}], ids=repr)
def test_values_the_oracle_refuses_are_refused(bad) -> None:
    with pytest.raises(Exception):
        rfc8785.dumps(bad)
    with pytest.raises((ValueError, TypeError)):
        canonical_bytes(bad)


def test_a_value_encoded_once_nests_as_the_oracle_encodes_it() -> None:
    rng = random.Random(2026)
    for i in range(400):
        value = _random_value(rng)
        outer = {"body": value, "z": [value, 1], "\U0001f600": {"a": value}}
        fast = {"body": encoded(value), "z": [encoded(value), 1], "\U0001f600": {"a": encoded(value)}}
        assert canonical_bytes(fast) == rfc8785.dumps(outer), f"corpus item {i}: {value!r}"


def test_an_entry_and_its_receipt_hash_and_sign_what_the_oracle_encodes(tmp_path: Path) -> None:
    """The log row, the entry hash, receipt_sha256 and the signature are all computed from the body's
    text encoded once; each must equal the hash (or verify over the bytes) of the oracle's encoding."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    log = audit.open_log(tmp_path, create=True)
    body = {"kind": "deletion", "request_id": "r1", "run_id": log.run_id, "operator": "Dana Ortiz (DPO) \u00e9",
            "samples": [{"id": i, "memory_sha256": f"{i:064x}", "image_sha256": None} for i in range(1000)],
            "requested_ids": list(range(1000)), "metrics": {"after": {"TA": 97.49303621169916, "Ps": 0.07}}}
    entry = log.append(body)
    row = log.rows()[-1]
    assert row.body == rfc8785.dumps(body).decode("utf-8")
    wrapped = {"format": audit.LOG_FORMAT, "run_id": log.run_id, "seq": 1, "prev_hash": audit.GENESIS, "body": body}
    assert entry.entry_hash == row.entry_hash == hashlib.sha256(rfc8785.dumps(wrapped)).hexdigest()
    r = receipts.build_receipt(log, entry)
    rest = {k: v for k, v in r.items() if k not in ("receipt_sha256", "signature")}
    assert r["receipt_sha256"] == hashlib.sha256(rfc8785.dumps(rest)).hexdigest()
    signed = rfc8785.dumps({k: v for k, v in r.items() if k != "signature"})
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(r["public_key"])).verify(
        base64.b64decode(r["signature"]["value"]), signed)  # raises if it does not verify
    assert receipts.verify_receipt(r)["ok"] and log.verify().ok
    log.close()


def _random_record(rng: random.Random) -> dict:
    def key() -> str:
        k = _random_string(rng)
        return k if rng.random() < 0.2 else "".join(c for c in k if c.isascii()) or "k"

    def value():
        return rng.choice([_random_string(rng), rng.choice(EDGE_STRINGS), rng.choice(EDGE_INTS),
                           rng.randint(-1000, 10 ** 6), True, False, None])

    return {key(): value() for _ in range(rng.randint(0, 5))}


def test_lists_of_flat_records_match_the_oracle() -> None:
    """A request's samples and the like: the path that writes them with the C JSON encoder."""
    rng = random.Random(1000)
    for i in range(600):
        records = [_random_record(rng) for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.1:
            records.append({"x": rng.choice(EDGE_FLOATS + [[1], {"a": 1}])})  # not flat: the general path
        assert canonical_bytes(records) == rfc8785.dumps(records), f"corpus item {i}: {records!r}"
        assert canonical_bytes({"samples": records}) == rfc8785.dumps({"samples": records})
    samples = [{"id": i, "memory_sha256": f"{i:064x}", "image_sha256": None} for i in range(1000)]
    assert canonical_bytes(samples) == rfc8785.dumps(samples)
    for bad in ([{"id": 2 ** 53}], [{"id": 1}, {"id": math.nan}]):
        with pytest.raises(Exception):
            rfc8785.dumps(bad)
        with pytest.raises((ValueError, TypeError)):
            canonical_bytes(bad)
