"""UnAct: the selection rule, the weight edits, the pseudo-label, determinism, forward-passes-only,
and clear errors that leave the model unchanged (on tiny models trained on the real digits data)."""

from __future__ import annotations

import builtins
import math

import numpy as np
import pytest
import torch

from munkey_core.unlearn.classforget import ClassEditor
from munkey_core.errors import MunkeyError
from munkey_core.unlearn.unact import UnActConfig, ViTScope, scope_for, select_units, unact


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("scores, p, expected", [
    ([1.0, 3.0, 3.0, 2.0], 50, [1, 2]),            # m = 4 - ceil(3 * 0.5) = 2; tie 3/3 -> lower index first
    ([5.0, 2.0, 2.0, 2.0, 1.0], 60, [0, 1]),        # m = 5 - ceil(4 * 0.6) = 2; the tie at 2 is cut by index
    ([2.0, 2.0, 2.0, 2.0], 90, [0]),                # all tied: exactly m = 1, the lowest index
    ([0.1, 0.4, 0.3], 0, [1, 2, 0]),                # p = 0 selects every unit, in rank order
    ([0.1, 0.4, 0.3], 100, [1]),                    # p = 100 selects the single top unit
])
def test_select_units_percentile_and_ties(scores, p, expected) -> None:
    assert select_units(np.array(scores), p).tolist() == expected


def test_select_units_count_matches_the_percentile_rule() -> None:
    rng = np.random.default_rng(0)
    for n in (7, 64, 512, 1000):
        for p in (0, 50, 85, 90, 99, 100):
            chosen = select_units(rng.normal(size=n), p)
            assert len(chosen) == n - math.ceil((n - 1) * p / 100)


@pytest.fixture(scope="module")
def resnet_editor(tiny_classifier_runs) -> ClassEditor:
    return ClassEditor(tiny_classifier_runs["resnet18"], device="cpu")


@pytest.fixture(scope="module")
def vit_editor(tiny_classifier_runs) -> ClassEditor:
    return ClassEditor(tiny_classifier_runs["vit"], device="cpu")


def test_resnet_edit_touches_exactly_the_selected_channels(resnet_editor: ClassEditor) -> None:
    images = resnet_editor.to_input(resnet_editor.class_images(3, 20))
    model = resnet_editor.working_copy()
    before = _state(model)
    res = unact(scope_for(model), images, UnActConfig(p=90, gamma=0.25, k=1))
    units = res.rounds[0].selected
    assert len(units) == 64 - math.ceil(63 * 0.9)  # tiny ResNet: width 8 -> 64 output channels
    after = model.state_dict()
    others = [j for j in range(64) if j not in units]
    blk = "layer4.1."
    for name, axis in [(blk + "conv2.weight", 0), (blk + "bn2.weight", 0), (blk + "bn2.bias", 0), ("fc.weight", 1)]:
        sel = before[name].index_select(axis, torch.tensor(units))
        torch.testing.assert_close(after[name].index_select(axis, torch.tensor(units)), sel * 0.25)
        torch.testing.assert_close(after[name].index_select(axis, torch.tensor(others)),
                                   before[name].index_select(axis, torch.tensor(others)), rtol=0, atol=0)
    untouched = [k for k in before if not k.startswith((blk + "conv2", blk + "bn2.weight", blk + "bn2.bias", "fc.weight"))]
    for k in untouched:  # BatchNorm running statistics included: they stay frozen
        assert torch.equal(after[k], before[k]), k


def test_resnet_scores_are_mean_post_relu_channel_activations(resnet_editor: ClassEditor) -> None:
    model = resnet_editor.working_copy()
    x = resnet_editor.to_input(resnet_editor.class_images(5, 8))
    with torch.no_grad():
        _, scores = scope_for(model).logits_and_scores(x, 0)
        feats = model.layer4(model.layer3(model.layer2(model.layer1(torch.relu(model.bn1(model.conv1(x)))))))
    torch.testing.assert_close(scores, feats.mean(dim=(2, 3)))
    assert (scores >= 0).all()  # post-ReLU


def _manual_vit_scores(vit, x: torch.Tensor, target: int) -> torch.Tensor:
    """An independent, block-by-block computation of the first-order attribution at [CLS]."""
    with torch.no_grad():
        h = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
        per_block = []
        for i, blk in enumerate(vit.blocks):
            h = h + blk.ls1(blk.attn(blk.norm1(h)))
            g = blk.mlp.act(blk.mlp.fc1(blk.norm2(h)))[:, 0, :]  # (B, H) GELU output at [CLS]
            if i >= len(vit.blocks) - 4:
                per_block.append(g)
            h = h + blk.ls2(blk.mlp(blk.norm2(h)))
        cls = h[:, 0, :]
        sigma = torch.sqrt(cls.var(dim=1, unbiased=False) + vit.norm.eps)
        head = vit.head.weight
        u = (head[target] - head.mean(0)) * vit.norm.weight
        blocks = list(vit.blocks)[-4:]
        cols = []
        for g, blk in zip(per_block, blocks):
            for j in range(g.shape[1]):
                cols.append(g[:, j] * torch.dot(blk.mlp.fc2.weight[:, j], u) / sigma)
        return torch.stack(cols, dim=1)


def test_vit_scores_are_first_order_logit_attributions(vit_editor: ClassEditor) -> None:
    model = vit_editor.working_copy()
    x = vit_editor.to_input(vit_editor.class_images(7, 6))
    scope = scope_for(model)
    assert isinstance(scope, ViTScope) and scope.n_units == len(list(model.blocks)[-4:]) * scope.hidden
    with torch.no_grad():
        logits, scores = scope.logits_and_scores(x, 7)
    torch.testing.assert_close(scores, _manual_vit_scores(model, x, 7), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(logits, model(x))


def test_vit_edit_touches_fc1_rows_bias_and_fc2_columns_only(vit_editor: ClassEditor) -> None:
    model = vit_editor.working_copy()
    before = _state(model)
    scope = scope_for(model)
    res = unact(scope, vit_editor.to_input(vit_editor.class_images(2, 10)), UnActConfig(p=80, gamma=0.5, k=1))
    units = np.array(res.rounds[0].selected)
    after = model.state_dict()
    nblocks = len(model.blocks)
    first = nblocks - len(scope.blocks)
    changed = set()
    for bi in range(len(scope.blocks)):
        local = torch.tensor(units[(units >= bi * scope.hidden) & (units < (bi + 1) * scope.hidden)] - bi * scope.hidden,
                             dtype=torch.long)
        pre = f"blocks.{first + bi}.mlp."
        for name, axis in [("fc1.weight", 0), ("fc1.bias", 0), ("fc2.weight", 1)]:
            changed.add(pre + name)
            mask = torch.zeros(after[pre + name].shape[axis], dtype=torch.bool)
            mask[local] = True
            a, b = after[pre + name].movedim(axis, 0), before[pre + name].movedim(axis, 0)
            torch.testing.assert_close(a[mask], b[mask] * 0.5)
            assert torch.equal(a[~mask], b[~mask])
    for k in before:
        if k not in changed:
            assert torch.equal(after[k], before[k]), k


def test_pseudo_label_is_the_argmax_of_the_mean_logits(resnet_editor: ClassEditor) -> None:
    for cls in (1, 4, 9):
        imgs = resnet_editor.class_images(cls, 25)
        res = unact(scope_for(resnet_editor.working_copy()), resnet_editor.to_input(imgs), UnActConfig(k=1))
        with torch.no_grad():
            mean = resnet_editor.model(resnet_editor.to_input(imgs)).mean(0)
        assert res.pseudo_label == int(mean.argmax()) == cls  # a trained model: its own mean vote is the class
        np.testing.assert_allclose(res.mean_logits, mean.double().numpy(), rtol=1e-5, atol=1e-5)


def test_unact_is_deterministic(vit_editor: ClassEditor, resnet_editor: ClassEditor) -> None:
    for ed in (vit_editor, resnet_editor):
        imgs = ed.class_images(6, 15)
        m1, r1 = ed.run_unact(imgs)
        m2, r2 = ed.run_unact(imgs)
        assert [r.selected for r in r1.rounds] == [r.selected for r in r2.rounds]
        for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
            assert torch.equal(a, b), k


def test_unact_forgets_the_class_and_keeps_the_rest(resnet_editor: ClassEditor) -> None:
    # a 64-channel tiny ResNet: p 90 dampens 7 channels a round (p 99 is the 512-channel working point)
    req, _, _ = resnet_editor.request("unact", resnet_editor.class_images(3), cfg=UnActConfig(p=90, gamma=0.1, k=10))
    assert req.cls == 3 and req.pseudo_label == 3
    assert req.before.Af > 80
    assert req.after.Af < req.before.Af - 40
    assert req.after.Ar > req.before.Ar - 5


def test_unact_uses_forward_passes_only_and_reads_nothing_else(resnet_editor: ClassEditor, vit_editor: ClassEditor,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No .backward, no autograd.grad, no requires_grad change, and no file or dataset read during a request."""
    jobs = []
    for ed in (resnet_editor, vit_editor):
        x = ed.to_input(ed.class_images(4, 10))
        jobs.append((ed.working_copy(), x))

    def forbidden(*args, **kwargs):
        raise AssertionError("UnAct must not call this")

    monkeypatch.setattr(torch.Tensor, "backward", forbidden)
    monkeypatch.setattr(torch.autograd, "backward", forbidden)
    monkeypatch.setattr(torch.autograd, "grad", forbidden)
    monkeypatch.setattr(torch.Tensor, "requires_grad_", forbidden)
    monkeypatch.setattr(torch.nn.Module, "requires_grad_", forbidden)
    monkeypatch.setattr(builtins, "open", forbidden)
    monkeypatch.setattr(np, "load", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr("munkey_core.data.datasets.load_dataset", forbidden)
    for model, x in jobs:
        flags = {n: p.requires_grad for n, p in model.named_parameters()}
        res = unact(scope_for(model), x, UnActConfig(p=90, gamma=0.1, k=3))
        assert len(res.rounds) == 3
        assert all(p.grad is None for p in model.parameters())
        assert {n: p.requires_grad for n, p in model.named_parameters()} == flags


@pytest.mark.parametrize("cfg, message", [
    (UnActConfig(p=-1), "p must be"), (UnActConfig(p=100.5), "p must be"), (UnActConfig(p=float("nan")), "p must be"),
    (UnActConfig(gamma=0.0), "gamma"), (UnActConfig(gamma=1.0), "gamma"), (UnActConfig(gamma=1.5), "gamma"),
    (UnActConfig(gamma=-0.1), "gamma"), (UnActConfig(k=0), r"k \(rounds\)"),
])
def test_bad_settings_raise_and_leave_the_model_unchanged(resnet_editor: ClassEditor, cfg, message) -> None:
    model = resnet_editor.working_copy()
    before = _state(model)
    with pytest.raises(MunkeyError, match=message):
        unact(scope_for(model), resnet_editor.to_input(resnet_editor.class_images(2, 5)), cfg)
    assert all(torch.equal(a, before[k]) for k, a in model.state_dict().items())


def test_bad_images_raise_and_leave_the_model_unchanged(resnet_editor: ClassEditor) -> None:
    model = resnet_editor.working_copy()
    before = _state(model)
    good = resnet_editor.to_input(resnet_editor.class_images(2, 5))  # (5, 1, 16, 16)
    bad = {
        "no images": good[:0],
        "wrong size": torch.nn.functional.interpolate(good, size=(20, 20)),
        "wrong channels": good.repeat(1, 3, 1, 1),
        "not finite": torch.full_like(good, float("nan")),
    }
    for what, images in bad.items():
        with pytest.raises(MunkeyError):
            unact(scope_for(model), images, UnActConfig())
    assert all(torch.equal(a, before[k]) for k, a in model.state_dict().items())
    with pytest.raises(MunkeyError, match="at least one image"):
        resnet_editor.run_unact(resnet_editor.class_images(2, 5)[:0])


def test_stops_early_when_the_edit_changes_nothing(resnet_editor: ClassEditor) -> None:
    model = resnet_editor.working_copy()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # nothing left to dampen
    res = unact(scope_for(model), resnet_editor.to_input(resnet_editor.class_images(1, 5)), UnActConfig(k=5))
    assert res.stopped_early and res.rounds == []


def test_munkey_backbone_scope_reads_no_bank(tiny_run) -> None:
    ed = ClassEditor(tiny_run, device="cpu")
    imgs = ed.class_images(5, 10)
    model = ed.working_copy()
    ed.run.bank = None  # UnAct on the backbone's image pathway must not need the bank
    _, res = ed.run_unact(imgs, UnActConfig(p=85, gamma=0.1, k=2), model=model)
    assert res.pseudo_label == 5 and len(res.rounds) == 2
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, ed.model.state_dict()[k])]
    assert changed and all(".mlp.fc" in k for k in changed)


def test_resnet_attribution_scores_weight_activations_by_the_class_logit_direction(resnet_editor: ClassEditor) -> None:
    model = resnet_editor.working_copy()
    x = resnet_editor.to_input(resnet_editor.class_images(8, 8))
    with torch.no_grad():
        _, act = scope_for(model).logits_and_scores(x, 8)
        logits, attr = scope_for(model, score="attribution").logits_and_scores(x, 8)
        w = model.fc.weight
        torch.testing.assert_close(attr, act * (w[8] - w.mean(0)))
        # the attributions add up to the class logit minus the mean logit (up to the biases)
        b = model.fc.bias
        torch.testing.assert_close(attr.sum(1), logits[:, 8] - logits.mean(1) - (b[8] - b.mean()))
    with pytest.raises(MunkeyError, match="Unknown ResNet scoring"):
        scope_for(model, score="gradient")
