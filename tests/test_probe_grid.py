"""V-JEPA 2's grid and report (issue 65): its 20 heads, its schedulers (warm-up + cosine lr, cosine wd, stepped
before each optimizer step), each head its own AdamW, and the table's two labelled numbers."""

from __future__ import annotations

import math

import pytest
import torch

from levjepa.eval.probes import VJEPA2_LRS, VJEPA2_WDS, probe_config
from levjepa.eval.result import EvalResult
from levjepa.eval.trainer import GridAdamW, GridResult, _schedule


def test_the_grid_is_v_jepa_2s_config():
    cfg = probe_config("demo", grid="vjepa2")
    assert cfg.grid("attentive") == [(lr, wd) for wd in VJEPA2_WDS for lr in VJEPA2_LRS] and len(VJEPA2_LRS) == 5
    assert VJEPA2_LRS == (5e-3, 3e-3, 1e-3, 3e-4, 1e-4) and VJEPA2_WDS == (0.01, 0.1, 0.4, 0.8)
    assert cfg.schedule == "vjepa2" and cfg.epochs == 20 and cfg.warmup_epochs == 0 and cfg.select == "acc"
    assert cfg.batch_size == probe_config("demo").batch_size  # the budget keeps its batch
    assert probe_config("full").schedule == "levjepa"
    with pytest.raises(ValueError, match="grid="):
        probe_config("full", grid="other")


def _reference(k: int, total: int, warmup: int, ref_wd: float, final_wd: float) -> tuple[float, float]:
    """V-JEPA 2's WarmupCosineLRSchedule (start_lr = ref_lr = 1, final_lr = 0) and CosineWDSchedule at step k."""
    if k < warmup:
        lr = 1.0
    else:
        lr = max(0.0, 0.5 * (1.0 + math.cos(math.pi * (k - warmup) / max(1, total - warmup))))
    wd = final_wd + (ref_wd - final_wd) * 0.5 * (1.0 + math.cos(math.pi * k / total))
    return lr, max(final_wd, wd)


@pytest.mark.parametrize("warmup,ratio", [(0, 1.0), (7, 0.5), (3, 0.0)])
def test_the_schedule_is_v_jepa_2s_schedulers(warmup, ratio):
    cfg = probe_config("demo", grid="vjepa2", final_wd_ratio=ratio)
    total = 40
    for step in range(total):  # its schedulers step before the optimizer: step `step` runs at k = step + 1
        lr, wd = _schedule(cfg, step, total, warmup)
        ref_lr, ref_wd = _reference(step + 1, total, warmup, 1.0, ratio)
        assert lr == pytest.approx(ref_lr) and wd == pytest.approx(ref_wd), step
    assert _schedule(cfg, total - 1, total, warmup)[0] == pytest.approx(0.0)  # the last step at final_lr = 0
    assert _schedule(probe_config("demo"), 0, total, 0) == (1.0, 1.0)  # levjepa's: no warm-up, lr at its peak


def test_each_head_is_its_own_adamw_with_scaled_weight_decay():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(3, 4, 5, generator=g, requires_grad=True)
    grads = [torch.randn(3, 4, 5, generator=g) for _ in range(3)]
    lrs, wds = [5e-3, 1e-3, 1e-4], [0.01, 0.4, 0.8]
    refs = [torch.nn.Parameter(p.detach()[i].clone()) for i in range(3)]
    opts = [torch.optim.AdamW([r], lr=lrs[i], weight_decay=wds[i]) for i, r in enumerate(refs)]
    grid = GridAdamW([p], lrs, wds, decay=[True])
    for t, (lr_s, wd_s) in enumerate([(1.0, 1.0), (0.7, 0.5), (0.2, 0.9)]):
        p.grad = grads[t]
        grid.step(lr_s, wd_s)
        for i, (r, o) in enumerate(zip(refs, opts, strict=True)):
            o.param_groups[0]["lr"], o.param_groups[0]["weight_decay"] = lrs[i] * lr_s, wds[i] * wd_s
            r.grad = grads[t][i].clone()
            o.step()
    for i in range(3):
        torch.testing.assert_close(p.detach()[i], refs[i].detach(), rtol=1e-6, atol=1e-7)


def test_the_table_prints_both_numbers_labelled():
    res = GridResult("attentive", [1e-3, 1e-4], [0.01, 0.01], [50.0, 60.0], [1.0, 0.9], [70.0, 55.0], 1, 20, 1.0)
    assert res.reported == 55.0 and res.best_on_eval == 70.0  # chosen on val vs the best head on test
    info = {"split_sizes": {"train": 4, "val": 2, "test": 2}, "grid": "vjepa2", "has_test": True}
    table = EvalResult(["enc"], ["t"], ["attentive"], {"enc": {"t": {"attentive": res}}}, {"t": 50.0}, info)
    text = table.table()
    assert "| t | attentive, chosen on val (levjepa) | 55.0 |" in text
    assert "| t | attentive, best head on test (V-JEPA 2) | 70.0 |" in text
    assert "V-JEPA 2's grid" in table.caption() and res.to_json()["best_on_eval_acc"] == 70.0
    plain = EvalResult(["enc"], ["t"], ["attentive"], {"enc": {"t": {"attentive": res}}}, {"t": 50.0}, {})
    assert "| t | attentive | 55.0 |" in plain.table()  # the budget's grid: one row, as before
