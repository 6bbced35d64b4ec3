"""Every import of a munkey_core module resolves, function-level ones included; the module map names
every module.

Modules move between packages (docs/modules.md); an import inside a function that still names the
old place is invisible to the layering check (.importlinter) and fails only when that function runs.
This reads every `import munkey_core...` / `from munkey_core... import name` in munkey_core/, pages/,
scripts/ and tests/ and imports it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports() -> list[tuple[str, int, str, str | None]]:
    """(file, line, module, name or None) of every munkey_core import in the project's Python files."""
    out = []
    for folder in ("munkey_core", "pages", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                rel = str(path.relative_to(ROOT))
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("munkey_core"):
                    out += [(rel, node.lineno, node.module, a.name) for a in node.names]
                elif isinstance(node, ast.Import):
                    out += [(rel, node.lineno, a.name, None) for a in node.names if a.name.startswith("munkey_core")]
    return out


def test_every_munkey_core_import_resolves() -> None:
    pytest.importorskip("streamlit")  # pages/ import it at module level; their munkey_core imports are checked too
    missing = []
    for rel, line, module, name in _imports():
        try:
            mod = importlib.import_module(module)
            if name is not None and not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")  # a submodule imported by name
        except ImportError as exc:
            missing.append(f"{rel}:{line}: {module}{'' if name is None else '.' + name}: {exc}")
    assert not missing, "imports that do not resolve:\n" + "\n".join(missing)


def test_the_check_sees_a_stale_function_level_import(tmp_path: Path) -> None:
    """The reader finds imports inside functions (the kind that went stale before)."""
    src = "def f():\n    from munkey_core.run.classifier import predict_labels\n"
    tree = ast.parse(src)
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert found == ["munkey_core.run.classifier"]
    with pytest.raises(ImportError):
        importlib.import_module(found[0])


def test_the_module_map_and_package_docstrings_name_every_module() -> None:
    """docs/modules.md names every module of munkey_core (with its tests), and each subpackage's
    docstring lists its modules: a module added without its line in the map fails here."""
    text = (ROOT / "docs" / "modules.md").read_text(encoding="utf-8")
    pkg = ROOT / "munkey_core"
    unmapped = [str(p.relative_to(pkg)) for p in sorted(pkg.rglob("*.py"))
                if p.name != "__init__.py" and f"`{p.relative_to(pkg)}`" not in text]
    assert not unmapped, f"docs/modules.md does not name: {unmapped}"
    unlisted = []
    for init in sorted(pkg.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        unlisted += [f"{init.parent.name}/{p.name}" for p in sorted(init.parent.glob("*.py"))
                     if p.name != "__init__.py" and p.name not in doc]
    assert not unlisted, f"package docstrings do not list: {unlisted}"
