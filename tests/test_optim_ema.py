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


def test_weight_decay_as_the_official_code_decays():
    """The official main.py keeps out of decay what has "bias" or "norm" in its name or is 1-D: the CLS token
    ([1, 1, D]) is decayed with the matrices, a 2-D "norm" parameter is not."""
    m = _Tiny()
    m.norm_gain = nn.Parameter(torch.ones(2, 4))  # 2-D but named a norm: kept out, as the official rule does
    decay, no_decay = param_groups(m, 0.04)
    assert decay["weight_decay"] == 0.04 and no_decay["weight_decay"] == 0.0
    assert [id(p) for p in decay["params"]] == [id(m.cls_token), id(m.fc.weight)]
    no = {id(m.fc.bias), id(m.norm.weight), id(m.norm.bias), id(m.norm_gain)}
    assert {id(p) for p in no_decay["params"]} == no


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


def test_ema_is_the_weighted_average_of_the_trained_weights_it_claims():
    # after k updates (while the warm-up decay n / (n + 10) is below the asymptote 0.9999) the copy is
    # sum_m w_m theta_m over the online weights at updates m = 1..k, w_m proportional to m (m+1) ... (m+8);
    # the random initialisation has weight 0
    m = nn.Linear(3, 2).to(torch.bfloat16)
    ema = EMA(m, decay=0.9999, every=32)
    assert ema.due(32) and ema.due(64) and not ema.due(33)
    g = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(30):
        with torch.no_grad():
            m.weight.copy_(torch.randn(2, 3, generator=g))
        seen.append(m.weight.detach().float().clone())
        ema.update(m)
    k = torch.arange(1, 31, dtype=torch.float64)
    w = torch.stack([k + j for j in range(9)]).prod(0)
    w /= w.sum()
    expected = sum(float(wm) * theta for wm, theta in zip(w, seen, strict=True))
    torch.testing.assert_close(ema.params["weight"], expected, rtol=1e-5, atol=1e-6)
    assert ema.params["weight"].dtype == torch.float32 and ema.updates == 30
    weights = ema.weights(30)  # the same weights, as the class reports them (index 0: the initialisation)
    assert float(weights[0]) == 0.0 and float(weights.sum()) == pytest.approx(1.0)
    torch.testing.assert_close(weights[1:], w)
    fresh = ema.copy_to(nn.Linear(3, 2))
    torch.testing.assert_close(fresh.weight, expected, rtol=1e-5, atol=1e-6)
    assert not math.isnan(float(fresh.weight.detach().sum()))


def test_ema_decay_warms_up_to_the_papers_asymptote():
    ema = EMA(nn.Linear(2, 2), decay=0.9999, every=32)
    assert ema.decay_at(0) == 0.0 and ema.decay_at(10) == 0.5  # the first update copies the weights
    assert ema.decay_at(99_989) < 0.9999 == ema.decay_at(99_990) == ema.decay_at(10**7)
    # after vit-b-paper's 322 updates the last 20 % carry 89 % of the weight: an average of recent weights,
    # where the paper's fixed decay from the initialisation would still hold 0.9999^322 = 96.8 % of it
    w = ema.weights(322)
    assert float(w[1 + int(0.8 * 322) :].sum()) == pytest.approx(0.89, abs=0.01)
    assert pytest.approx(0.968, abs=1e-3) == 0.9999**322


def test_ema_warmup_zero_is_the_papers_literal_ema():
    # train.ema_warmup=0: beta = 0.9999 from the first update, so after k updates the initialisation keeps
    # weight 0.9999^k and update m weighs (1 - beta) beta^(k - m)
    m = nn.Linear(2, 2)
    ema = EMA(m, decay=0.9999, every=32, warmup=0)
    assert all(ema.decay_at(n) == 0.9999 for n in (0, 1, 10, 10**6))
    w = ema.weights(5)
    assert float(w[0]) == pytest.approx(0.9999**5) and float(w[5]) == pytest.approx(1e-4)
    initial = m.weight.detach().clone()
    with torch.no_grad():
        m.weight.add_(1.0)
    ema.update(m)
    torch.testing.assert_close(ema.params["weight"], initial + 1e-4)
    with pytest.raises(ValueError, match="warmup >= 0"):
        EMA(m, warmup=-1)
