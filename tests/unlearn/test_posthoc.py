"""Post-hoc random-forgetting baselines on the real tiny plain ViT (digits): each one forgets, is timed,
and leaves the original model untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from munkey_core.model.classifiers import logits_of
from munkey_core.run.loaded import ClassifierRun
from munkey_core.training.classifier import train_classifier_run
from munkey_core.errors import MunkeyError
from munkey_core.data.sampling import random_ids
from munkey_core.unlearn.posthoc import METHODS, run_posthoc


@pytest.fixture(scope="module")
def vit_setup(tmp_path_factory: pytest.TempPathFactory):
    """A tiny plain ViT that fits digits (40 epochs: the session's 15-epoch one is underfit, and an
    underfit model's forget loss falls with any fine-tuning), and a random 10% forget set."""
    path = tmp_path_factory.mktemp("posthoc") / "vit"
    train_classifier_run("digits", path, arch="vit", profile="tiny", device="cpu", progress=False,
                         overrides={"epochs": 40, "augment_shift": 0.0})
    run = ClassifierRun(path, device="cpu")
    ds = run.dataset
    forget_ids = random_ids(ds.train.ids, 0.1, seed=0)
    f = np.isin(ds.train.ids, forget_ids)
    forget = (ds.train.images[f], ds.train.labels[f])
    retain = (ds.train.images[~f], ds.train.labels[~f])
    return run, forget, retain, (ds.test.images, ds.test.labels)


def _loss(model, data, size) -> float:
    logits = torch.from_numpy(logits_of(model, data[0], size))
    return float(F.cross_entropy(logits, torch.from_numpy(data[1]).long()))


def _acc(model, data, size) -> float:
    return float(100 * np.mean(logits_of(model, data[0], size).argmax(1) == data[1]))


@pytest.mark.parametrize("method", METHODS)
def test_method_raises_the_forget_loss_and_keeps_the_original(vit_setup, method: str) -> None:
    run, forget, retain, test = vit_setup
    size = run.cfg.img_size
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    res = run_posthoc(method, run.model, run.to_input, forget, retain, num_classes=10, seed=0)
    assert res.method == method and res.seconds > 0
    assert all(torch.equal(before[k], v) for k, v in run.model.state_dict().items())  # original untouched
    assert _loss(res.model, forget, size) > _loss(run.model, forget, size)
    assert _acc(res.model, test, size) > 85  # still a working classifier (the original: about 97)
    if method == "ssd":
        assert res.details["dampened"] > 0
        for (name, p0), p1 in zip(run.model.named_parameters(), res.model.parameters()):
            assert torch.all(p1.abs() <= p0.abs() + 1e-7), name  # SSD only shrinks weights


def test_methods_are_deterministic(vit_setup) -> None:
    run, forget, retain, _ = vit_setup
    a = run_posthoc("neggrad+", run.model, run.to_input, forget, retain, num_classes=10, seed=3).model
    b = run_posthoc("neggrad+", run.model, run.to_input, forget, retain, num_classes=10, seed=3).model
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_unknown_method_and_empty_forget_set(vit_setup) -> None:
    run, forget, retain, _ = vit_setup
    with pytest.raises(MunkeyError, match="Unknown post-hoc method"):
        run_posthoc("finetune", run.model, run.to_input, forget, retain, num_classes=10)
    empty = (forget[0][:0], forget[1][:0])
    with pytest.raises(MunkeyError, match="empty"):
        run_posthoc("scrub", run.model, run.to_input, empty, retain, num_classes=10)
