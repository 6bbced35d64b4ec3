"""The ResNet-18 default UnAct request (ClassEditor.default_config): 30 rounds of the top 1 %, where the
paper's 20 leave part of the class on a small ResNet. Real tiny digits run; the result re-measured with
the model's own forward and its test predictions."""

from __future__ import annotations

import numpy as np
import torch

from munkey_core.model.classifiers import predict_labels
from munkey_core.unlearn.classforget import ClassEditor
from munkey_core.unlearn.unact import UnActConfig


def test_resnet_default_removes_what_the_paper_rounds_leave(tiny_classifier_runs) -> None:
    ed = ClassEditor(tiny_classifier_runs["resnet18"], device="cpu")
    cls = 0  # on this width-8 net the paper's 20 rounds leave about a third of class 0's images on it
    imgs = ed.class_images(cls)
    x = ed.to_input(imgs)
    paper, _ = ed.run_unact(imgs, UnActConfig(99.0, 0.01, 20, "attribution"), target=cls)
    model, res = ed.run_unact(imgs, ed.default_config(), target=cls)
    with torch.no_grad():
        p_paper = torch.softmax(paper(x), dim=1).numpy()  # (n, classes)
        p = torch.softmax(model(x), dim=1).numpy()
    assert (p_paper.argmax(1) == cls).any()  # the paper's 20 rounds stop short of the class
    assert len(res.rounds) == 30 and not (p.argmax(1) == cls).any()
    # the class's unseen test images go with it; the other classes lose at most 2 points
    test = ed.dataset.test
    before, after = (predict_labels(m, test.images, ed.run.cfg.img_size) for m in (ed.model, model))
    mine = test.labels == cls
    assert np.mean(after[mine] == cls) == 0.0
    assert np.mean(after[~mine] == test.labels[~mine]) >= np.mean(before[~mine] == test.labels[~mine]) - 0.02
