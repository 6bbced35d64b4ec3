"""unlearn/forwardcache.py: the test forwards a class request reuses give what a full `predict` gives,
for every kind of model and bank a request measures, and are actually reused (tiny digits run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from munkey_core.model.predict import predict
from munkey_core.unlearn.classforget import ClassEditor, mask_logit
from munkey_core.unlearn.forwardcache import ForwardCache

INDEX = np.arange(0, 359, 3)  # 120 test rows


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def editor(tiny_run_template) -> ClassEditor:
    return ClassEditor(tiny_run_template, device="cpu")  # read only: requests edit copies


def _reference(editor: ClassEditor, model, bank, index=INDEX) -> np.ndarray:
    """The plain prediction, computed from scratch (model/predict.py)."""
    run = editor.run
    test = run.dataset.test
    x = run.to_input(test.images[index])
    return predict(model, bank, x, run.split_keys("test")[index], k=run.train_cfg.k, tau=run.train_cfg.tau,
                   neighbour_predictions=False).probs


def _check(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, atol=2e-5)
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4  # a tie may round either way
    assert np.array_equal(got.argmax(1)[clear], want.argmax(1)[clear])


def test_every_kind_of_request_model_matches_a_full_prediction(editor: ClassEditor) -> None:
    fw = ForwardCache(editor.run)
    run_bank = editor.run.bank
    cls_bank, _ = editor.class_bank(3)

    _check(fw.probabilities(editor.model, run_bank, INDEX), _reference(editor, editor.model, run_bank))
    first = dict(fw.stats)
    assert first["pairs_computed"] == len(INDEX) * editor.run.train_cfg.k and first["head_runs"] == 1

    # key deletion: the unedited model, a bank without class 3; only pairs that lost a neighbour are new
    _check(fw.probabilities(editor.model, cls_bank, INDEX), _reference(editor, editor.model, cls_bank))
    new = fw.stats["pairs_computed"] - first["pairs_computed"]
    assert 0 < new < len(INDEX) * editor.run.train_cfg.k and fw.stats["pairs_reused"] > first["pairs_reused"]

    # UnAct's edit (last block's MLP + classifier): the stored prefixes and a suffix run
    edited, res = editor.run_unact(editor.class_images(3, 5), bank=cls_bank, target=3)
    assert res.rounds and fw._differing(edited)
    computed = fw.stats["pairs_computed"]
    _check(fw.probabilities(edited, cls_bank, INDEX), _reference(editor, edited, cls_bank))
    assert fw.stats["suffix_runs"] == 1 and fw.stats["pairs_computed"] == computed  # nothing recomputed below

    # the masked logit: the classifier alone
    masked = mask_logit(editor.working_copy(), 3)
    _check(fw.probabilities(masked, run_bank, INDEX), _reference(editor, masked, run_bank))
    assert set(fw._differing(masked)) == {"vit.head.bias", "vit.head.weight"}
    assert fw.stats["head_runs"] == 3 and fw.stats["full_runs"] == 0

    # an edit below the cut (the first block): nothing stored applies, the full forward runs
    early = editor.working_copy()
    with torch.no_grad():
        early.vit.blocks[0].mlp.fc2.weight.mul_(0.5)
    _check(fw.probabilities(early, run_bank, INDEX), _reference(editor, early, run_bank))
    assert fw.stats["full_runs"] == 1


def test_a_repeated_question_is_remembered_by_content_not_by_object(editor: ClassEditor) -> None:
    fw = ForwardCache(editor.run)
    model = editor.working_copy()
    bank = editor.run.bank
    a = fw.probabilities(model, bank, INDEX)
    b = fw.probabilities(model, bank, INDEX)
    assert fw.stats["memo_hits"] == 1 and np.array_equal(a, b)
    with torch.no_grad():  # an edit in place (what each UnAct round does): not the remembered answer
        model.vit.head.weight[2] = 0.0
    c = fw.probabilities(model, bank, INDEX)
    assert fw.stats["memo_hits"] == 1
    _check(c, _reference(editor, model, bank))
    assert not np.allclose(a, c)


def test_over_the_budget_the_full_forward_runs(editor: ClassEditor) -> None:
    fw = ForwardCache(editor.run, budget=1000)  # not one row's pairs fit
    got = fw.probabilities(editor.model, editor.run.bank, INDEX[:10])
    _check(got, _reference(editor, editor.model, editor.run.bank, INDEX[:10]))
    assert fw.stats["full_runs"] == 1 and fw.stats["pairs_computed"] == 0


def test_the_retain_probe_forward_reuses_the_unedited_part_and_equals_the_full_forward(editor: ClassEditor) -> None:
    """The probe's forward (prefix once, then the edited blocks each round) gives the logits, weights and
    per-unit statistics of the full inference-path forward, before and after an edit inside the scope."""
    from munkey_core.model.predict import neighbour_weights
    from munkey_core.unlearn.forwardcache import prefix_ensemble_forward
    from munkey_core.unlearn.unact import munkey_ensemble_forward, scope_for, vit_blocks

    run, model = editor.run, editor.working_copy()
    train = run.dataset.train
    rows = np.arange(0, 40, 2)
    keys = torch.as_tensor(run.split_keys("train")[rows])
    sims, found = run.bank.search(keys, run.train_cfg.k)
    values = run.bank.values[found].float()
    weights = neighbour_weights(sims.float(), run.train_cfg.tau, "ensemble")
    x = run.to_input(train.images[rows])
    depth = len(model.vit.blocks)
    cut = depth - vit_blocks(depth)
    cached = prefix_ensemble_forward(model, x, values, weights, cut)
    assert cached is not None
    full = munkey_ensemble_forward(model, values, weights)
    with torch.no_grad():
        for _ in range(2):  # unedited, then with scoped MLP units and classifier inputs dampened in place
            for part in (slice(0, 20), slice(5, 12)):
                got, w_got = cached(x[part], part)
                want, w_want = full(x[part], part)
                torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
                torch.testing.assert_close(w_got, w_want)
                scope_c = scope_for(model, forward=cached, score="attribution", head=True)
                scope_f = scope_for(model, forward=full, score="attribution", head=True)
                for a, b in zip(scope_c.forward_stats(x[part], part), scope_f.forward_stats(x[part], part)):
                    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
            scope_for(model, head=True).dampen(torch.arange(0, scope_for(model, head=True).n_units, 7), 0.0)
    assert prefix_ensemble_forward(model, x, values, weights, cut, budget=1000) is None  # over the budget
    assert prefix_ensemble_forward(model, x, values, weights, model.inject_at - 1) is None


def _whole_blocks(model, h: torch.Tensor, cut: int, pre_logits: bool) -> torch.Tensor:
    """The reference: block `cut`'s MLP, then every later block whole on every token (timm's Block)."""
    b = model.vit.blocks[cut]
    h = h + b.drop_path2(b.ls2(b.mlp(b.norm2(h))))
    for block in model.vit.blocks[cut + 1:]:
        h = block(h)
    return model.vit.forward_head(model.vit.norm(h), pre_logits=pre_logits)


def test_the_suffix_on_the_cls_row_equals_the_whole_blocks_bit_for_bit(editor: ClassEditor) -> None:
    """suffix_of runs the last block's MLP on the [CLS] row only (what the head reads): the logits and
    features must be the same numbers as the whole blocks give, edited or not, for every cut UnAct uses,
    or a request would edit other units than before."""
    from munkey_core.unlearn.forwardcache import prefix_of, suffix_of
    from munkey_core.unlearn.unact import scope_for

    run, model = editor.run, editor.working_copy()
    rows = np.arange(0, 60)
    keys = torch.as_tensor(run.split_keys("test")[rows])
    _, found = run.bank.search(keys, run.train_cfg.k)
    v = run.bank.values[found].float().reshape(len(rows) * run.train_cfg.k, -1)
    x = run.to_input(run.dataset.test.images[rows]).repeat_interleave(run.train_cfg.k, dim=0)
    depth = len(model.vit.blocks)
    assert depth >= 2
    with torch.no_grad():
        for edited in (False, True):
            if edited:
                scope = scope_for(model, head=True)
                scope.dampen(torch.arange(0, scope.n_units, 5), 0.01)
            for cut in sorted({model.inject_at, depth - 2, depth - 1}):
                h = prefix_of(model, x, v, cut)
                for pre in (False, True):
                    got, want = suffix_of(model, h, cut, pre_logits=pre), _whole_blocks(model, h, cut, pre)
                    assert got.shape == want.shape and torch.equal(got, want), (edited, cut, pre)


def test_a_requests_images_score_the_same_with_the_prefix_computed_once(editor: ClassEditor) -> None:
    """run_unact scores the request's images each round from a prefix computed once: logits and unit
    statistics equal the full inference-path forward's bit for bit, before and after an edit in the
    scope, so the units a request selects do not change."""
    from munkey_core.unlearn.forwardcache import prefix_ensemble_forward
    from munkey_core.unlearn.unact import munkey_ensemble_forward, scope_for, vit_blocks

    model = editor.working_copy()
    images = editor.class_images(4, 5)
    values, weights = editor.neighbours(images)
    x = editor.to_input(images)
    depth = len(model.vit.blocks)
    cached = prefix_ensemble_forward(model, x, values, weights, depth - vit_blocks(depth))
    full = munkey_ensemble_forward(model, values, weights)
    with torch.no_grad():
        for _ in range(2):  # unedited, then with scoped units dampened in place
            a = scope_for(model, forward=cached, score="attribution", head=True).forward_stats(x, slice(0, len(x)))
            b = scope_for(model, forward=full, score="attribution", head=True).forward_stats(x, slice(0, len(x)))
            assert all(torch.equal(p, q) for p, q in zip(a, b))
            scope_for(model, head=True).dampen(torch.arange(0, scope_for(model, head=True).n_units, 7), 0.01)
