"""AdamW parameter groups, the learning-rate schedule, and the EMA evaluation copy."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from levjepa.train.config import OptimConfig
from levjepa.train.ema import EMA
from levjepa.train.optim import build_optimizer, lr_at, param_groups


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 4))
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.register_buffer("count", torch.zeros(()))


def test_weight_decay_only_on_matrices():
    m = _Tiny()
    decay, no_decay = param_groups(m, 0.04)
    assert decay["weight_decay"] == 0.04 and no_decay["weight_decay"] == 0.0
    assert [id(p) for p in decay["params"]] == [id(m.fc.weight)]
    assert {id(p) for p in no_decay["params"]} == {id(m.cls_token), id(m.fc.bias), id(m.norm.weight), id(m.norm.bias)}


def test_schedule_warmup_then_flat_or_cosine():
    flat = OptimConfig(lr=4e-4, start_lr=1e-4, warmup_steps=1200)
    assert lr_at(0, flat, 10_000) == pytest.approx(1e-4)
    assert lr_at(600, flat, 10_000) == pytest.approx(2.5e-4)
    assert lr_at(1200, flat, 10_000) == lr_at(9999, flat, 10_000) == pytest.approx(4e-4)
    cos = OptimConfig(lr=1e-3, start_lr=0.0, final_lr=1e-5, warmup_steps=10, schedule="cosine")
    assert lr_at(10, cos, 110) == pytest.approx(1e-3)
    assert lr_at(60, cos, 110) == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5))
    assert lr_at(110, cos, 110) == pytest.approx(1e-5)
    lrs = [lr_at(s, cos, 110) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_fused_adamw_skips_on_found_inf_without_touching_state():
    m = _Tiny()
    opt = build_optimizer(m, OptimConfig(warmup_steps=0))
    before = [p.detach().clone() for p in m.parameters()]
    for p in m.parameters():
        p.grad = torch.full_like(p, float("nan"))
    opt.found_inf = torch.tensor(1.0)
    opt.grad_scale = None
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))
    assert all(float(s["step"]) == 0 for s in opt.state.values())


def test_ema_matches_closed_form_and_is_float32():
    m = nn.Linear(3, 2).to(torch.bfloat16)
    w0 = m.weight.detach().float().clone()
    ema = EMA(m, decay=0.9, every=32)
    assert ema.due(32) and ema.due(64) and not ema.due(33)
    with torch.no_grad():
        m.weight.fill_(1.0)
    ema.update(m)
    ema.update(m)
    expected = 0.81 * w0 + (1 - 0.81) * 1.0  # two updates toward a constant
    torch.testing.assert_close(ema.params["weight"], expected)
    assert ema.params["weight"].dtype == torch.float32
    fresh = ema.copy_to(nn.Linear(3, 2))
    torch.testing.assert_close(fresh.weight, expected)
    assert not math.isnan(float(fresh.weight.detach().sum()))
