"""Shared fixtures: an isolated key cache and one tiny trained run on the real digits data."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# tests live in one folder per package (tests/forget/, tests/audit/, ...); the shared helpers
# (_helpers, _browser) stay here, so this folder is importable from every one of them
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the operator's keys (signing, subject pseudonyms) of the test session: never the user's own
os.environ.setdefault("MUNKEY_CONFIG_DIR", tempfile.mkdtemp(prefix="munkey-test-config-"))
torch_threads = os.environ.get("MUNKEY_TEST_THREADS")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A key cache shared by the whole test session (keys are computed once)."""
    path = tmp_path_factory.mktemp("munkey-cache")
    os.environ["MUNKEY_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_run_template(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained once per session with the tiny profile on digits (do not modify: copy it)."""
    from munkey_core.service import train_run

    out = tmp_path_factory.mktemp("template") / "run"
    train_run("digits", out, profile="tiny", device="cpu", overrides={"epochs": 15}, progress=False)
    return out


@pytest.fixture
def tiny_run(tiny_run_template: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny run that a test may change."""
    dest = tmp_path / "run"
    shutil.copytree(tiny_run_template, dest)
    return dest


@pytest.fixture(scope="session")
def tiny_classifier_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A ResNet-18 and a plain ViT trained once per session on digits (tiny profile; do not modify)."""
    from munkey_core.training.classifier import train_classifier_run

    root = tmp_path_factory.mktemp("classifiers")
    runs = {"resnet18": root / "resnet18", "vit": root / "vit"}
    train_classifier_run("digits", runs["resnet18"], arch="resnet18", profile="tiny", device="cpu", progress=False,
                         overrides={"epochs": 4})
    train_classifier_run("digits", runs["vit"], arch="vit", profile="tiny", device="cpu", progress=False,
                         overrides={"epochs": 15})
    return runs
