"""FLOPs accounting: hand-computed counts, torch's own FLOP counter on the real model, the paper's numbers."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from levjepa.commands import flops
from levjepa.model import VideoEncoder, encoder_config
from levjepa.tools.flops import (
    K710_20PCT_CLIPS,
    encoder_flops,
    rho_sweep,
    run_flops,
    training_flops_per_clip,
    view_tokens,
)

TINY = encoder_config("vit-test", dim=12, heads=2, depth=1, mlp_ratio=2.0, patch_size=4, proj_hidden=10, proj_dim=6)


def test_tiny_config_reproduces_hand_computed_counts():
    # global view 2x8x8, patch 4: 8 patches, rho 0.5 keeps 4, + CLS = 5 tokens; D = 12, H = 24, 48 pixels/patch
    fwd = encoder_flops(TINY, frames=2, size=8, drop_ratio=0.5)
    assert fwd == {
        "patch_embed": 2 * 4 * 48 * 12,  # 4608: only the kept patches are embedded
        "qkv": 2 * 5 * 12 * 36,  # 4320
        "attention": 4 * 5 * 5 * 12,  # 1200: QK^T and AV
        "attn_proj": 2 * 5 * 12 * 12,  # 1440
        "mlp": 2 * 5 * (12 * 24 + 24 * 12),  # 5760
    }
    assert encoder_flops(TINY, frames=2, size=8, drop_ratio=0.5, embed_all=True)["patch_embed"] == 9216
    # + one local view 2x4x4: 2 patches -> 1 kept, 2 tokens; projector 12 -> 10 -> 6; SIGReg M = 8, J = 3
    clip = training_flops_per_clip(
        TINY, frames=2, global_size=8, local_size=4, num_local=1, drop_ratio=0.5, sigreg_directions=8, sigreg_nodes=3
    )
    assert clip.forward == {
        "patch_embed": 4608 + 1152,
        "qkv": 4320 + 1728,
        "attention": 1200 + 192,
        "attn_proj": 1440 + 576,
        "mlp": 5760 + 2304,
        "projector": 2 * 2 * (12 * 10 + 10 * 6),  # 720
        "objective": 2 * (2 * 6 * 8 + 5 * 8 * 3 + 3 * 6),  # 468
    }
    assert clip.training == {
        "patch_embed": 2 * 5760,  # pixels need no gradient: backward = 1x forward
        "qkv": 3 * 6048,
        "attention": 3 * 1392,
        "attn_proj": 3 * 2016,
        "mlp": 3 * 8064,
        "projector": 3 * 720,
        "objective": 3 * 468,
    }
    assert clip.tokens == {"global": 5, "local": 2}
    assert run_flops(TINY, clips=10, epochs=3, frames=2, global_size=8, local_size=4, num_local=1, drop_ratio=0.5,
                     sigreg_directions=8, sigreg_nodes=3) == 30 * clip.training_total  # fmt: skip


def _count(fn) -> dict[str, int]:
    """FLOPs torch's counter sees, per op (the CPU SDPA kernel is not in its registry: counted as 2 bmms)."""
    cpu_sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    mapping = {cpu_sdpa: lambda q, k, v, *args, out_shape=None, **kw: sdpa_flop_count(q, k, v)}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("drop", [True, False])
def test_formula_equals_torch_flop_counter_on_the_real_model(drop):
    cfg = encoder_config("vit-test", depth=3, drop_ratio=0.75)
    enc = VideoEncoder(cfg)
    video = torch.randn(2, 3, 4, 32, 32)
    out = {}
    counted = _count(lambda: out.setdefault("cls", enc(video, drop=drop, generator=torch.Generator())))
    pred = encoder_flops(cfg, frames=4, size=32, drop_ratio=cfg.drop_ratio if drop else None)
    if not drop:
        # the formula counts every score (the architecture's count, and what a step with dropping computes);
        # whole frames compute the block-causal ones only (``attention.KeySpans``): CLS reads all 65 tokens,
        # the 16 patches of frame t read the 16·(t + 1) patches of frames <= t
        pred["attention"] = cfg.depth * 4.0 * (65 + sum(16 * 16 * (t + 1) for t in range(4))) * cfg.dim
    assert sum(counted.values()) == 2 * sum(pred.values())  # 2 clips
    # backward: every linear layer and the attention products cost 2x their forward, the patch embedding 1x
    # (pixels need no gradient); these short CPU sequences take the explicit attention path
    # (``attention.attend``), whose products the counter sees as ``bmm``, forward and backward
    back = _count(lambda: out["cls"].sum().backward())
    linear = sum(pred.values()) - pred["attention"] - pred["patch_embed"]
    assert back["aten.bmm"] == 2 * 2 * pred["attention"]
    assert sum(back.values()) == 2 * (2 * (linear + pred["attention"]) + pred["patch_embed"])


def test_the_paper_numbers_vit_b():
    cfg = encoder_config("vit-base")
    clip = training_flops_per_clip(cfg)
    assert clip.tokens == {"global": 158, "local": 30}
    assert 1.4e11 < clip.training_total < 1.6e11  # paper: ~1.5e11 training FLOPs per clip
    paper_order = training_flops_per_clip(cfg, embed_all=True)
    assert 6.3e9 < paper_order.forward["patch_embed"] < 6.5e9  # the ~6.4 GFLOPs embedding of dropped patches
    assert 1.45e11 < paper_order.training_total < 1.65e11
    total = run_flops(cfg, clips=K710_20PCT_CLIPS, epochs=240)
    assert 0.9 * 4.8e18 < total < 1.1 * 4.8e18  # paper: 4.8 EFLOPs for 240 epochs on K710-20 %
    assert 0.9 * 4.8e18 < run_flops(cfg, embed_all=True) < 1.1 * 4.8e18


def test_cost_falls_with_rho_but_not_by_the_token_ratio():
    cfg = encoder_config("vit-base")
    rows = rho_sweep(cfg, (0.0, 0.5, 0.9, 0.95))
    totals = [r["total"] for r in rows]
    assert totals == sorted(totals, reverse=True)
    last = rows[-1]
    per_token_ratio = rows[0]["per_token"] / last["per_token"]
    assert per_token_ratio == pytest.approx((3137 + 4 * 577) / (158 + 4 * 30))  # 19.6: the token count ratio
    assert rows[0]["attention"] / last["attention"] > 300  # quadratic
    paper = rho_sweep(cfg, (0.0, 0.95), embed_all=True)
    assert paper[0]["patch_embed"] == paper[1]["patch_embed"]  # embedding every patch never gets cheaper
    assert paper[1]["speedup"] < last["speedup"]


def test_view_sizes_must_fit_the_patches():
    with pytest.raises(ValueError, match="multiple of patch_size=16"):
        view_tokens(encoder_config("vit-base"), 16, 100, None)
    with pytest.raises(ValueError, match="multiple of tubelet=2"):
        view_tokens(encoder_config("vit-base", tubelet=2), 15, 224, None)
    assert view_tokens(encoder_config("vit-base", tubelet=2, drop_mode="tube"), 16, 224, 0.9) == (1568, 8 * 20)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    flops.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_command_prints_the_breakdown_run_total_and_assumptions(capsys):
    assert flops.main(_args()) == 0
    out = capsys.readouterr().out
    assert "1.455e+11" in out and "EFLOPs" in out and "131,600 clips" in out and "2 FLOPs" in out
    assert flops.main(_args("--model", "vit-tiny", "--set", "tubelet=2", "--json", "--sweep", "0,0.9")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens_per_view"] == {"global": 79, "local": 15} and len(data["sweep"]) == 2
    with pytest.raises(ValueError, match="valid choices are uniform, tube"):
        flops.main(_args("--set", "drop_mode=cube"))
