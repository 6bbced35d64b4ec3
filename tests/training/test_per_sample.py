"""Per-sample clipping and noise (training/per_sample.py) against B separate backward passes on real digits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from munkey_core.config import ModelConfig, TrainConfig
from munkey_core.errors import MunkeyError
from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
from munkey_core.training.per_sample import clipped_backward
from munkey_core.training.train import TrainData, train_munkey

MODEL = ModelConfig(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=2,
                    exemplar_dim=16)
B = 12


@pytest.fixture(scope="module")
def batch() -> dict:
    """A batch of real digits with every pathway case: both on, image dropped, token dropped, absent."""
    d = load_digits()
    images = torch.from_numpy(np.rint(d.images[:B] * 255 / 16).astype(np.uint8)[..., None])
    gen = torch.Generator().manual_seed(5)
    q = torch.softmax(torch.randn(B, 10, generator=gen), dim=1)
    drop_img = torch.zeros(B, dtype=torch.bool)
    drop_img[[0, 1]] = True
    drop_tok = torch.zeros(B, dtype=torch.bool)
    drop_tok[[2, 3, 4]] = True
    absent = drop_tok.clone()
    absent[[5, 6, 7]] = True  # retrieval simulation: neighbours' exemplars, image on
    return {"x": preprocess_images(images, 8), "y": torch.from_numpy(d.target[:B].astype(np.int64)),
            "drop_img": drop_img, "drop_tok": drop_tok, "absent": absent, "q": q}


def _model() -> MunkeyViT:
    torch.manual_seed(0)
    return MunkeyViT(MODEL).train()


def _values() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(B, 16, generator=torch.Generator().manual_seed(1)) * 0.5)


def _one_sample_grads(model: MunkeyViT, values: torch.nn.Parameter, bt: dict, i: int,
                      mix: float) -> tuple[dict, torch.Tensor, float]:
    """Sample i's gradients by an ordinary backward of its own loss, written out here (not step_loss)."""
    model.zero_grad(set_to_none=True)
    values.grad = None
    logits = model(bt["x"][i:i + 1], values[i:i + 1], bt["drop_img"][i:i + 1], bt["drop_tok"][i:i + 1])
    a = mix if bool(bt["absent"][i]) else 0.0
    target = (1 - a) * torch.nn.functional.one_hot(bt["y"][i], 10).float() + a * bt["q"][i]
    loss = -(target * torch.log_softmax(logits[0], dim=0)).sum()
    loss.backward()
    return ({n: p.grad.clone() for n, p in model.named_parameters()}, values.grad[i].clone(), loss.item())


@pytest.mark.parametrize("skip", [0.0, 0.34])
def test_clipped_gradient_equals_separate_backward_passes(batch: dict, skip: float) -> None:
    mix, clip = 0.25, 0.5
    model, values = _model(), _values()
    per = [_one_sample_grads(model, values, batch, i, mix) for i in range(B)]
    losses = torch.tensor([l for _, _, l in per])
    absent_rows = [i for i in range(B) if bool(batch["absent"][i])]
    n_skip = int(skip * len(absent_rows))  # the hardest absent samples of the batch give nothing
    skipped = set(sorted(absent_rows, key=lambda i: -losses[i])[:n_skip])
    assert (len(skipped) == 2) == (skip > 0)
    want = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    want_rows = torch.zeros_like(values)
    for i, (g, g_row, _) in enumerate(per):
        if i in skipped:
            continue
        norm = torch.sqrt(sum((t ** 2).sum() for t in g.values()))
        for n in want:
            want[n] += g[n] * min(1.0, clip / float(norm)) / B
        want_rows[i] = g_row / B  # the exemplar row is not clipped
    assert any(torch.sqrt(sum((t ** 2).sum() for t in g.values())) > clip for g, _, _ in per)  # the clip binds

    model.zero_grad(set_to_none=True)
    values.grad = None
    cfg = TrainConfig(absent_target_mix=mix, absent_skip_hardest=skip, per_sample_clip=clip)
    logits, loss_sum = clipped_backward(model, batch["x"], values[torch.arange(B)], batch["drop_img"],
                                        batch["drop_tok"], batch["y"], batch["absent"], batch["q"], cfg,
                                        torch.Generator().manual_seed(0))
    assert logits.shape == (B, 10)
    kept = [i for i in range(B) if i not in skipped]
    assert float(loss_sum) == pytest.approx(float(losses[kept].sum()), rel=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-7, msg=n)
    torch.testing.assert_close(values.grad, want_rows, rtol=1e-4, atol=1e-7)


def test_an_unbinding_clip_gives_the_batch_mean_gradient(batch: dict) -> None:
    model, values = _model(), _values()
    logits = model(batch["x"], values, batch["drop_img"], batch["drop_tok"])
    torch.nn.functional.cross_entropy(logits, batch["y"]).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    clipped_backward(model, batch["x"], values[torch.arange(B)], batch["drop_img"], batch["drop_tok"], batch["y"],
                     batch["absent"], batch["q"], TrainConfig(per_sample_clip=1e6), torch.Generator().manual_seed(0))
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-7, msg=n)


def test_noise_has_the_promised_spread(batch: dict) -> None:
    clip, sigma = 0.5, 2.0
    model, values = _model(), _values()
    args = (batch["drop_img"], batch["drop_tok"], batch["y"], batch["absent"], batch["q"])
    clipped_backward(model, batch["x"], values[torch.arange(B)], *args, TrainConfig(per_sample_clip=clip),
                     torch.Generator().manual_seed(0))
    clean = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    clipped_backward(model, batch["x"], values[torch.arange(B)], *args,
                     TrainConfig(per_sample_clip=clip, per_sample_noise=sigma), torch.Generator().manual_seed(0))
    noise = torch.cat([p.grad.flatten() for p in model.parameters()]) - clean
    assert noise.numel() > 10_000
    assert float(noise.std()) == pytest.approx(sigma * clip / B, rel=0.05)
    assert abs(float(noise.mean())) < 0.05 * sigma * clip / B


def test_training_with_the_clip_learns_and_refuses_noise_alone() -> None:
    d = load_digits()
    images = np.rint(d.images * 255 / 16).astype(np.uint8)[..., None]
    keys = d.data.astype(np.float32) - d.data.mean(0)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    train = TrainData(images[:600], d.target[:600].astype(np.int64), np.arange(600, dtype=np.int64), keys[:600])
    val = TrainData(images[1500:1700], d.target[1500:1700].astype(np.int64), np.arange(1500, 1700), keys[1500:1700])
    cfg = TrainConfig(epochs=8, batch_size=16, lr=2e-3, warmup_epochs=0.5, k=4, k_train=4, seed=0,
                      per_sample_clip=0.1, absent_skip_hardest=0.15)  # a clip that binds on most samples
    res = train_munkey(MODEL, cfg, train, val=val, progress=False)
    assert res.history[-1]["loss"] < 0.7 * res.history[0]["loss"]
    assert res.history[-1]["val_acc"] > 40  # chance is 10
    with pytest.raises(MunkeyError, match="per_sample_clip"):
        TrainConfig(per_sample_noise=1.0)


@pytest.mark.parametrize("argv", [["--per-sample-noise", "1"], ["--per-sample-clip", "-1"]])
def test_train_refuses_a_bad_clip_with_a_message_and_writes_nothing(tmp_path, capsys, argv: list[str]) -> None:
    from munkey_core.cli import main

    out = tmp_path / "run"
    code = main(["train", "--dataset", "digits", "--profile", "tiny", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert code != 0 and "per_sample_clip" in err and "Traceback" not in err
    assert not out.exists()
