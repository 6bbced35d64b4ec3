"""The ast.parse lock: two threads parsing at once under garbage-collector pressure, the way a page rerun
and a background job loading .npy files do, fail on an affected CPython without it and never with it."""

from __future__ import annotations

import ast
import io
import sys
import threading
import time

import numpy as np
import pytest

from munkey_core.dashboard.astlock import (PARSE_LOCK, affected, is_serialised, restore_ast_parsing,
                                           serialise_ast_parsing)

# a page-sized module to parse (about what Streamlit parses on every rerun of a page)
PAGE = "\n".join(f"def f{i}(a, b=({i}, [1, 2, {{'k': {i}}}])):\n    return [x * {i} for x in range(a) if x % 3]"
                 for i in range(300))


class _Cycle:
    """A finaliser on objects in reference cycles: the garbage collector runs Python code mid-parse."""

    def __del__(self) -> None:
        sum(range(50))


def _garbage() -> None:
    objs = [_Cycle() for _ in range(200)]
    for a, b in zip(objs, objs[1:]):
        a.next, b.prev = b, a


def _deeper(frames: int, call):  # type: ignore[no-untyped-def]
    """`call()` from `frames` more Python frames down: the race shows when the parsing threads start
    at different stack depths (each parse resets the shared depth to its own)."""
    return call() if frames == 0 else _deeper(frames - 1, call)


def _npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.zeros((4, 3), dtype=np.float32))
    return buf.getvalue()


def _race(seconds: float, stop_at_first: bool) -> tuple[list[str], int]:
    """Three threads for `seconds`: two parse PAGE (at different stack depths), one loads .npy files (numpy parses their header with
    ast.literal_eval), all making cyclic garbage. Returns the SystemErrors seen and the parses done."""
    npy = _npy()
    errors: list[str] = []
    done = [0]
    end = time.monotonic() + seconds

    def work(parse) -> None:  # type: ignore[no-untyped-def]
        while time.monotonic() < end and not (stop_at_first and errors):
            _garbage()
            try:
                parse()
                done[0] += 1
            except SystemError as e:
                errors.append(str(e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(lambda: ast.parse(PAGE),)),
                   threading.Thread(target=work, args=(lambda: _deeper(6, lambda: ast.parse(PAGE)),)),
                   threading.Thread(target=work, args=(lambda: np.load(io.BytesIO(npy)),))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return errors, done[0]


def test_affected_releases() -> None:
    assert affected((3, 11, 7)) and affected((3, 11, 0)) and affected((3, 12, 1))
    assert not affected((3, 11, 8)) and not affected((3, 12, 2)) and not affected((3, 13, 0))
    assert not affected((3, 10, 13))


@pytest.mark.skipif(not affected(), reason="this CPython has the fix (gh-106905): nothing to race")
def test_unlocked_parsing_fails_on_this_release() -> None:
    """The positive control: without the lock the race shows within seconds on this interpreter (a race
    either fails at once or settles into a rhythm where it rarely does: short races, started again)."""
    restore_ast_parsing()
    errors: list[str] = []
    try:
        for _ in range(15):
            errors, _ = _race(2.0, stop_at_first=True)
            if errors:
                break
    finally:
        serialise_ast_parsing()
    assert errors and "recursion depth mismatch" in errors[0]


def test_locked_parsing_never_fails() -> None:
    assert serialise_ast_parsing(force=True)
    assert serialise_ast_parsing(force=True)  # idempotent: still one lock, not a lock around a lock ...
    restore_ast_parsing()
    assert not is_serialised()  # ... so one restore undoes it
    assert serialise_ast_parsing(force=True) and is_serialised()
    try:
        errors, parses = _race(5.0, stop_at_first=False)
    finally:
        if not affected():
            restore_ast_parsing()  # forced here only: leave this interpreter's parser as it was
    assert parses > 100 and errors == []


def test_numpy_header_parsing_takes_the_lock() -> None:
    """The path the dashboard's background threads take (np.load -> ast.literal_eval -> ast.parse) waits
    for the lock: held here, a load in another thread does not finish until it is released."""
    assert serialise_ast_parsing(force=True)
    npy, loaded = _npy(), threading.Event()
    worker = threading.Thread(target=lambda: (np.load(io.BytesIO(npy)), loaded.set()))
    try:
        with PARSE_LOCK:
            worker.start()
            assert not loaded.wait(0.5)
        assert loaded.wait(30)
    finally:
        worker.join(30)
        if not affected():
            restore_ast_parsing()
