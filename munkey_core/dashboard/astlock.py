"""One lock around `ast.parse` on the CPython releases where two threads parsing at once can fail.

Why: on CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 the AST constructor keeps its recursion depth in
state shared by every thread (python/cpython gh-106905, fixed in 3.11.8 and 3.12.2), so when the
garbage collector switches threads in the middle of a parse, the parse fails with "SystemError: AST
constructor recursion depth mismatch". The dashboard parses in two threads at once: Streamlit parses
each page script on every rerun, while a background job or a warm-up thread loads .npy files (numpy
reads their header with `ast.literal_eval`, which calls `ast.parse`). On an affected release the page
then fails to render. Taking one process-wide lock in `ast.parse` removes the overlap; on any other
release nothing is changed.
Test: tests/dashboard/test_astlock.py (two threads parsing under garbage-collector pressure).
"""

from __future__ import annotations

import ast
import functools
import sys
import threading

# [first affected, first fixed) per minor release
AFFECTED = (((3, 11, 0), (3, 11, 8)), ((3, 12, 0), (3, 12, 2)))

_INSTALL_LOCK = threading.Lock()
PARSE_LOCK = threading.RLock()  # held for each parse; re-entrant: a finaliser run by the garbage collector inside a parse may parse too


def affected(version: tuple[int, int, int] | None = None) -> bool:
    """Whether `version` (default: this interpreter) is a release with the shared-depth race."""
    v = tuple(sys.version_info[:3]) if version is None else tuple(version)
    return any(lo <= v < hi for lo, hi in AFFECTED)


def is_serialised() -> bool:
    """Whether `ast.parse` is the locked one (`serialise_ast_parsing` installed it and nothing undid it)."""
    return hasattr(ast.parse, "_munkey_unlocked")


def serialise_ast_parsing(force: bool = False) -> bool:
    """Make `ast.parse` hold one process-wide lock, on an affected release (or with `force`). Idempotent:
    a second call changes nothing. Returns whether `ast.parse` is now the locked one."""
    with _INSTALL_LOCK:  # two sessions' script threads may run app.py at once: wrap once
        if is_serialised():
            return True
        if not (force or affected()):
            return False
        ast.parse = _locked(ast.parse)  # numpy's literal_eval reaches it too: it looks `parse` up in the ast module
        return True


def _locked(parse):  # type: ignore[no-untyped-def]
    """`parse` behind PARSE_LOCK, keeping the original (which marks it, and `restore_ast_parsing` puts back)."""

    @functools.wraps(parse)
    def locked_parse(*args, **kwargs):  # type: ignore[no-untyped-def]  (ast.parse's own signature)
        with PARSE_LOCK:
            return parse(*args, **kwargs)

    locked_parse._munkey_unlocked = parse  # type: ignore[attr-defined]
    return locked_parse


def restore_ast_parsing() -> None:
    """Undo `serialise_ast_parsing` (tests)."""
    with _INSTALL_LOCK:
        original = getattr(ast.parse, "_munkey_unlocked", None)
        if original is not None:
            ast.parse = original
