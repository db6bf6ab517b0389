"""``train.precision=fp16``: float16 autocast with a ``torch.amp.GradScaler`` (GPUs without bf16). On the CPU,
as far as autocast goes there: the encoder really runs in float16, the scaled gradients are unscaled before
clipping (the reported norm is the true one), an overflow skips the step on the device and halves the scale,
GradCache carries the scale through every micro-batch, and the scale is part of the checkpoint so a resume
is bit-identical."""

from __future__ import annotations

import json

import pytest
import torch

from levjepa.objective import build_objective
from levjepa.rng import make_generator
from levjepa.train.loop import build_models, pretrain
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, train_step
from levjepa.weights import load_tensors
from test_train_step import _batches
from train_utils import tiny_config


def _setup(*overrides):
    cfg = tiny_config("optim.grad_clip=none", *overrides)
    model = Pretrainer(*build_models(cfg, seed=0))
    objective = build_objective(cfg.objective, check_finite=False)
    return cfg, model, objective, build_optimizer(model, cfg.optim)


def _step(cfg, model, objective, opt, micro, *, dtype, scaler, step=0):
    drops = [make_generator(0, "drop", i) for i in range(len(micro))]
    return train_step(model, objective, opt, micro, drops, step=step, lr=1e-3, autocast_dtype=dtype, scaler=scaler)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_the_scaled_gradients_are_unscaled_before_the_norm_and_the_step(micro_batches):
    cfg, model, objective, opt = _setup()
    micro = [_batches(cfg, 1)[0]] if micro_batches == 1 else _batches(tiny_config("data.batch_size=4"), 2)
    reference = _step(cfg, model, objective, opt, micro, dtype=torch.float16, scaler=None)
    cfg, model, objective, opt = _setup()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaled = _step(cfg, model, objective, opt, micro, dtype=torch.float16, scaler=scaler)
    assert not bool(scaled.skipped) and scaler.get_scale() == 2.0**10  # no overflow: the scale stays
    # the same float16 forward: the norm is the true one (x 1024 if unscaling were missing), to fp16 rounding
    assert float(scaled.grad_norm) == pytest.approx(float(reference.grad_norm), rel=2e-2)
    assert torch.equal(scaled.loss, reference.loss)


def test_float16_autocast_changes_the_numbers_and_stays_close():
    cfg, model, objective, opt = _setup()
    micro = [_batches(cfg, 1)[0]]
    half = _step(cfg, model, objective, opt, micro, dtype=torch.float16, scaler=None)
    cfg, model, objective, opt = _setup()
    full = _step(cfg, model, objective, opt, micro, dtype=None, scaler=None)
    assert float(half.loss) != float(full.loss)  # float16 matmuls ran
    assert float(half.loss) == pytest.approx(float(full.loss), rel=1e-2)


def test_an_overflow_skips_the_step_and_halves_the_scale():
    cfg, model, objective, opt = _setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120)  # the scaled float32 gradients overflow
    out = _step(cfg, model, objective, opt, [_batches(cfg, 1)[0]], dtype=torch.float16, scaler=scaler)
    assert bool(out.skipped) and scaler.get_scale() == 2.0**119
    for key, value in model.state_dict().items():
        if not key.endswith(("running_mean", "running_var", "num_batches_tracked")):
            assert torch.equal(value, before[key]), key


def test_an_fp16_run_resumes_bit_identically_with_its_scale(tmp_path):
    common = ["train.precision=fp16", "train.checkpoint_every=2", "train.log_every=2"]
    straight = pretrain(tiny_config("train.steps=4", *common), tmp_path / "a", progress=False)
    pretrain(tiny_config("train.steps=2", *common), tmp_path / "b", progress=False)
    meta = json.loads((tmp_path / "b" / "checkpoints" / "step_000002" / "meta.json").read_text())
    assert meta["grad_scaler"]["scale"] == 2.0**16  # torch's initial scale, no overflow yet
    pretrain(tiny_config("train.steps=4", *common), tmp_path / "b", resume=True, progress=False)
    assert straight.skipped_steps == []
    for name in ("model.safetensors", "ema.safetensors", "trainer.safetensors"):
        a, _ = load_tensors(tmp_path / "a" / "checkpoints" / "step_000004" / name)
        b, _ = load_tensors(tmp_path / "b" / "checkpoints" / "step_000004" / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name
