"""The encoder: config and presets, the conventional API, the multi-view training forward, the projector."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from levjepa.config import ConfigError, apply_overrides, from_dict, to_dict
from levjepa.model import ENCODER_PRESETS, EncoderConfig, Projector, VideoEncoder, encoder_config
from levjepa.model.tokens import sample_keep_idx
from levjepa.rng import fold_keys, sample_keys


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- config ---------------------------------------------------------------------------------------------


def test_presets_have_the_paper_sizes_and_defaults():
    sizes = {name: (c.dim, c.depth, c.heads) for name, c in ENCODER_PRESETS.items()}
    assert sizes["vit-tiny"] == (192, 12, 3) and sizes["vit-small"] == (384, 12, 6)
    assert sizes["vit-base"] == (768, 12, 12) and sizes["vit-large"] == (1024, 24, 16)
    assert sizes["vit-huge"] == (1280, 32, 16)
    assert EncoderConfig() == encoder_config() == ENCODER_PRESETS["vit-base"]
    c = EncoderConfig()
    assert (c.patch_size, c.tubelet, c.drop_ratio, c.drop_mode, c.attention) == (16, 1, 0.95, "uniform", "block_causal")
    assert (c.final_norm, c.proj_hidden, c.proj_dim) == (True, 2048, 256)
    demo = ENCODER_PRESETS["vit-demo"]
    assert (demo.dim, demo.depth, demo.heads, demo.patch_size, demo.proj_hidden, demo.proj_dim) == (
        128,
        4,
        4,
        8,
        1024,
        128,
    )


def test_unknown_preset_or_field_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid names are vit-tiny, vit-small, vit-base, vit-large, vit-huge"):
        encoder_config("vit-giant")
    with pytest.raises(ValueError, match=r"unknown EncoderConfig field.*depht.*valid fields are dim, depth"):
        encoder_config("vit-test", depht=3)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"heads": 5}, r"model.dim=32 is not divisible by model.heads=5: choose heads among .*1, 2, 4, 8, 16"),
        ({"dim": 36, "heads": 4}, r"head dim .* = 9; 3D RoPE needs an even head dim"),
        ({"drop_ratio": 1.0}, r"drop_ratio=1.0: expected 0 <= drop_ratio < 1"),
        ({"drop_mode": "random"}, r"drop_mode='random': valid choices are uniform, tube"),
        ({"attention": "causal"}, r"attention='causal': valid choices are block_causal, bidirectional"),
        ({"tubelet_init": "inflated"}, r"tubelet_init='inflated': valid choices are random, inflate"),
        ({"tubelet": 0}, r"model.tubelet=0: expected a whole number 1..256"),
        ({"patch_size": 2.5}, r"model.patch_size=2.5: expected a whole number 1..1024"),
    ],
)
def test_inconsistent_values_raise_naming_field_and_choices(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        encoder_config("vit-test", **overrides)


def test_config_round_trips_and_takes_command_line_overrides():
    cfg = apply_overrides(
        encoder_config("vit-small"), ["drop_mode=tube", "attention=bidirectional", "final_norm=false", "tubelet=2"]
    )
    assert (cfg.drop_mode, cfg.attention, cfg.final_norm, cfg.tubelet) == ("tube", "bidirectional", False, 2)
    assert from_dict(EncoderConfig, to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="valid choices are uniform, tube"):
        apply_overrides(cfg, ["drop_mode=cube"])
    with pytest.raises(ConfigError, match="unknown config key"):
        from_dict(EncoderConfig, {**to_dict(cfg), "depht": 3})


# ---- the conventional API -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def enc() -> VideoEncoder:
    torch.manual_seed(0)
    return VideoEncoder(encoder_config("vit-test")).eval()


def test_one_set_of_weights_runs_224_and_96_inputs():
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", patch_size=16)).eval()
    with torch.no_grad():
        big = enc.forward_features(torch.randn(1, 3, 2, 224, 224))
        small = enc.forward_features(torch.randn(1, 3, 2, 96, 96))
    assert big.patches.shape == (1, 2 * 196, 32) and small.patches.shape == (1, 2 * 36, 32)
    assert int(big.positions[..., 1].max()) == 13 and int(small.positions[..., 1].max()) == 5
    assert torch.isfinite(big.patches).all() and torch.isfinite(small.cls).all()
    assert not any("pos_embed" in name for name, _ in enc.named_parameters())  # RoPE only


def test_forward_is_the_cls_of_forward_features(enc):
    video = torch.randn(2, 3, 4, 16, 16)
    with torch.no_grad():
        out = enc.forward_features(video)
        assert torch.equal(enc(video), out.cls)
    assert out.cls.shape == (2, 32) and out.patches.shape == (2, 16, 32)


def test_clips_of_a_batch_do_not_see_each_other(enc):
    video = torch.randn(3, 3, 4, 16, 16)
    with torch.no_grad():
        batched = enc.forward_features(video)
        for i in range(3):
            alone = enc.forward_features(video[i : i + 1])
            torch.testing.assert_close(alone.patches[0], batched.patches[i], rtol=0, atol=1e-5)
            torch.testing.assert_close(alone.cls[0], batched.cls[i], rtol=0, atol=1e-5)


def test_get_intermediate_layers_follows_the_dino_convention(enc):
    video = torch.randn(2, 3, 2, 16, 16)
    with torch.no_grad():
        final = enc.forward_features(video)
        last = enc.get_intermediate_layers(video)
        both = enc.get_intermediate_layers(video, 2)
        by_index = enc.get_intermediate_layers(video, [0, -1])
        raw = enc.get_intermediate_layers(video, 1, norm=False)
    assert len(last) == 1 and len(both) == 2 and len(by_index) == 2
    torch.testing.assert_close(last[0].patches, final.patches)
    torch.testing.assert_close(last[0].cls, final.cls)
    torch.testing.assert_close(both[0].patches, by_index[0].patches)
    torch.testing.assert_close(enc.norm(raw[0].patches), final.patches)
    assert (both[0].patches - both[1].patches).abs().max() > 1e-3  # block 0 differs from block 1
    assert torch.equal(last[0].positions, final.positions)
    for bad in (0, 3, [2], [-3]):
        with pytest.raises(ValueError, match=r"depth 2|1\.\.2"):
            enc.get_intermediate_layers(video, bad)


def test_final_norm_can_be_removed():
    enc = VideoEncoder(encoder_config("vit-test", final_norm=False)).eval()
    assert isinstance(enc.norm, nn.Identity)
    video = torch.randn(1, 3, 2, 16, 16)
    with torch.no_grad():
        a = enc.get_intermediate_layers(video, norm=True)[0]
        b = enc.get_intermediate_layers(video, norm=False)[0]
    assert torch.equal(a.patches, b.patches)


# ---- the training forward -------------------------------------------------------------------------------


def test_forward_views_is_one_call_per_group_with_the_same_randomness():
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=0.75))
    global_views, local_views = torch.randn(1, 3, 3, 4, 32, 32), torch.randn(4, 3, 3, 4, 16, 16)
    calls = []
    enc.blocks[0].register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))
    cls = enc.forward_views(global_views, local_views, generator=gen(7))
    assert cls.shape == (5, 3, 32)
    assert calls == [(3, 1 + 16, 32), (12, 1 + 4, 32)]  # 1·B clips x (16 kept + CLS), then V·B x (4 + CLS)
    g = gen(7)
    ref_global = enc.forward_features(global_views.flatten(0, 1), drop=True, generator=g).cls
    ref_local = enc.forward_features(local_views.flatten(0, 1), drop=True, generator=g).cls
    torch.testing.assert_close(cls[0], ref_global)
    torch.testing.assert_close(cls[1:], ref_local.view(4, 3, 32))


def test_training_step_reaches_every_parameter():
    torch.manual_seed(0)
    cfg = encoder_config("vit-test")
    enc, proj = VideoEncoder(cfg).train(), Projector.from_config(cfg).train()
    cls = enc.forward_views(torch.randn(1, 4, 3, 2, 32, 32), torch.randn(2, 4, 3, 2, 16, 16), generator=gen())
    z = proj(cls.flatten(0, 1))  # [3·4, 16]: one projector call for every view
    assert z.shape == (12, 16)
    z.square().mean().backward()
    for name, p in [*enc.named_parameters(), *proj.named_parameters()]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = VideoEncoder(encoder_config("vit-test")).train()
    ckpt = VideoEncoder(encoder_config("vit-test", grad_checkpointing=True)).train()
    ckpt.load_state_dict(plain.state_dict())
    views = torch.randn(2, 2, 3, 2, 16, 16)
    for model in (plain, ckpt):
        model.forward_views(views, generator=gen(3)).square().sum().backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_forward_views_rejects_malformed_groups(enc):
    with pytest.raises(ValueError, match=r"groups\[0\] must be \[V, B, C, T, H, W\], got \(2, 3, 2, 16, 16\)"):
        enc.forward_views(torch.randn(2, 3, 2, 16, 16), generator=gen())
    with pytest.raises(ValueError, match=r"groups\[1\] has B=3 clips but groups\[0\] has 2"):
        enc.forward_views(torch.randn(1, 2, 3, 2, 16, 16), torch.randn(1, 3, 3, 2, 16, 16), generator=gen())
    with pytest.raises(ValueError, match=r"^groups\[1\]: H and W must be multiples of the patch size 8"):
        enc.forward_views(torch.randn(1, 2, 3, 2, 16, 16), torch.randn(1, 2, 3, 2, 12, 12), generator=gen())
    with pytest.raises(ValueError, match="at least one view group"):
        enc.forward_views(generator=gen())


def test_init_is_truncated_normal_with_rescaled_residual_projections():
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-small"))
    qkv = enc.blocks[5].attn.qkv.weight.detach()
    assert abs(float(qkv.std()) - 0.02) < 1e-3 and float(enc.blocks[0].attn.qkv.bias.detach().abs().max()) == 0
    ratio = enc.blocks[5].mlp.fc2.weight.detach().std() / enc.blocks[0].mlp.fc2.weight.detach().std()
    assert abs(float(ratio) - (1 / 6) ** 0.5) < 0.02  # 1/sqrt(2·6) vs 1/sqrt(2·1)


def _compiled_vs_eager(backend: str, local_views: int) -> None:
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=0.5))
    ref = copy.deepcopy(enc)
    keys = list(enc.state_dict())
    assert list(enc.compile_blocks(backend=backend).state_dict()) == keys  # same keys: checkpoints unchanged
    groups = [torch.randn(1, 2, 3, 2, 32, 32), torch.randn(local_views, 2, 3, 2, 16, 16)][: 1 + (local_views > 0)]
    drop = sample_keys(0, "drop", 0, positions=range(2))
    with torch.no_grad():  # the GradCache pass (no grad), then the training pass: both graphs run
        torch.testing.assert_close(enc.forward_views(*groups, keys=drop), ref.forward_views(*groups, keys=drop))
    exact = copy.deepcopy(ref).double()  # float64: how far float32 rounding alone takes each gradient
    out, want = enc.forward_views(*groups, keys=drop), ref.forward_views(*groups, keys=drop)
    (out.square().sum()).backward()
    (want.square().sum()).backward()
    exact.forward_views(*(g.double() for g in groups), keys=drop).square().sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    # the loss's sums cancel, so float32 gradients sit ~1e-4 of their scale from float64 on either path; the
    # compiled ones must be as close to float64 as eager's (a wrong graph is off by far more)
    for (name, p), q, r in zip(enc.named_parameters(), ref.parameters(), exact.parameters(), strict=True):
        compiled_err, eager_err = ((g.grad.double() - r.grad).abs().max() for g in (p, q))
        assert compiled_err <= 4 * eager_err + 1e-6 * r.grad.abs().max(), (name, compiled_err, eager_err)


def test_compiled_blocks_trace_and_run_forward_and_backward():
    # the graph capture of every block (TorchDynamo + AOTAutograd's joint forward/backward graph), run once
    # without and once with grad; "aot_eager" executes those graphs with eager kernels: ~5 s, where Inductor's
    # C++ code generation of one tiny block took 34-46 s on this project's 2-core CPU (measured with a cold
    # cache; the slow test below runs it, on both view shapes)
    _compiled_vs_eager("aot_eager", local_views=0)


def test_compiled_block_stack_has_static_shapes_one_graph_per_view_shape():
    # the kept-token counts are fixed per view, so each view shape (and grad mode) gets a graph with its sizes
    # known: no symbolic size reaches the backend (TorchDynamo's default would make the second shape dynamic)
    torch._dynamo.reset()
    graphs: list[list[tuple[int, ...]]] = []

    def record(gm, example_inputs):
        assert all(isinstance(t, torch.Tensor) for t in example_inputs), "a symbolic size is a graph input"
        graphs.append([tuple(t.shape) for t in example_inputs])
        return gm.forward

    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=0.5)).compile_blocks(backend=record)
    groups = [torch.randn(1, 2, 3, 2, 32, 32), torch.randn(2, 2, 3, 2, 16, 16)]
    drop = sample_keys(0, "drop", 0, positions=range(2))
    for _ in range(2):  # a second step compiles nothing new
        enc.forward_views(*groups, keys=drop).sum().backward()
    # one graph per view shape, holding the whole stack: every block's weights are its inputs, and the last
    # block's CLS-alone call (queries=1) is inside it, not a graph of its own
    assert len(graphs) == 2
    tokens = sorted(next(s for s in shapes if len(s) == 3) for shapes in graphs)  # x [V·B, 1 + kept, D]
    assert tokens == sorted([(2, 1 + 16, 32), (4, 1 + 4, 32)])
    qkv_weights = [s for s in graphs[0] if s == (3 * 32, 32)]
    assert len(qkv_weights) == enc.cfg.depth


def test_compiled_block_stack_with_grad_checkpointing_matches_eager():
    # model.grad_checkpointing inside the compiled stack: each block a checkpointed region of the one graph
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=0.5, grad_checkpointing=True))
    ref = copy.deepcopy(enc)
    enc.compile_blocks(backend="aot_eager")
    groups = [torch.randn(1, 2, 3, 2, 32, 32), torch.randn(2, 2, 3, 2, 16, 16)]
    drop = sample_keys(0, "drop", 0, positions=range(2))
    enc.forward_views(*groups, keys=drop).square().sum().backward()
    ref.forward_views(*groups, keys=drop).square().sum().backward()
    for (name, p), q in zip(enc.named_parameters(), ref.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max() <= 1e-4 * q.grad.abs().max(), name  # float32 rounding apart


@pytest.mark.slow
def test_compiled_blocks_with_inductor_match_eager():
    _compiled_vs_eager("inductor", local_views=2)


# ---- projector ------------------------------------------------------------------------------------------


def test_projector_is_linear_batchnorm_gelu_linear():
    proj = Projector.from_config(encoder_config("vit-base"))
    kinds = [type(m) for m in proj.net]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.GELU, nn.Linear]
    assert (proj.net[0].in_features, proj.net[0].out_features, proj.net[3].out_features) == (768, 2048, 256)
    x = torch.randn(64, 768) * 3 + 1
    hidden = proj.net[1](proj.net[0](x))  # BatchNorm statistics over the rows of one call
    torch.testing.assert_close(hidden.mean(0), torch.zeros(2048), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=r"expected input \[N, 768\], got shape \(5, 64, 768\)"):
        proj(torch.randn(5, 64, 768))


def test_projector_state_survives_a_sync_batchnorm_swap():
    from levjepa.distributed import SyncBatchNorm1d, convert_sync_batchnorm

    proj = Projector(32, 64, 16)
    swapped = convert_sync_batchnorm(copy.deepcopy(proj))
    assert isinstance(swapped.net[1], SyncBatchNorm1d)
    x = torch.randn(8, 32)
    torch.testing.assert_close(swapped(x), proj(x))


def test_forward_views_gives_every_view_slot_its_own_dropping_key():
    # the contract: view slot s of clip b keeps the tokens of fold_keys(keys, s)[b], slots numbered across the
    # groups (global first). All views sharing one key, or the slot count restarting (or shifted) in each
    # group, would pass the shape and randomness tests above but fail here
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=0.75))
    groups = (torch.randn(2, 3, 3, 4, 32, 32), torch.randn(3, 3, 3, 4, 16, 16))
    keys = sample_keys(0, "drop", 0, positions=torch.arange(3))
    seen: list[torch.Tensor] = []
    enc.patch_embed.register_forward_pre_hook(lambda m, args: seen.append(args[1]))
    enc.forward_views(*groups, keys=keys)
    slot = 0
    for views, keep_idx in zip(groups, seen, strict=True):
        v, b = views.shape[:2]
        grid = enc.patch_embed.grid(views[0])
        for s in range(v):
            expected = sample_keep_idx(b, grid, 0.75, "uniform", keys=fold_keys(keys, slot + s))
            assert torch.equal(keep_idx.view(v, b, -1)[s], expected), (slot + s, keep_idx.view(v, b, -1)[s])
        slot += v
    assert slot == 5 and len(seen) == 2
    # what the CLS shows of it: the same pixels in every slot still give every slot its own tokens, and how
    # same-shaped views are grouped does not change which tokens a slot keeps
    same = torch.randn(1, 3, 3, 4, 32, 32).expand(3, -1, -1, -1, -1, -1)
    with torch.no_grad():
        cls = enc.forward_views(same, keys=keys)
        split = enc.forward_views(same[:1], same[1:], keys=keys)
    assert all(not torch.allclose(cls[i], cls[j]) for i, j in ((0, 1), (0, 2), (1, 2)))
    torch.testing.assert_close(split, cls)


def test_forward_views_computes_only_cls_in_the_last_block():
    # training reads CLS alone, so the last block runs its attention output, MLP and residuals on CLS only
    # (keys and values still from every kept token): the saving is real, and the other blocks see every token
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=0.5))
    rows: list[tuple[int, ...]] = []
    for blk in enc.blocks:
        blk.mlp.fc1.register_forward_hook(lambda m, args, out: rows.append(tuple(args[0].shape)))
    enc.forward_views(torch.randn(1, 2, 3, 2, 32, 32), generator=gen(1))
    assert rows == [(2, 1 + 16, 32), (2, 1, 32)]  # vit-test: depth 2; 1 + 32 · 0.5 tokens, then CLS alone
