"""One attention bias per forward: the encoder's outputs and gradients equal the implementation it replaced
(a boolean ``[B, 1, L, L]`` mask per clip, converted by SDPA in every layer, and per-clip RoPE tables), kept
below as the reference, for every option; and autograd keeps one bias, ``[1, 1, L, L]`` without dropping
(none on the CPU short-sequence path)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa.infer import StreamingEncoder
from levjepa.model import VideoEncoder, attention, encoder_config
from levjepa.model.attention import TokenMeta, attn_bias, block_causal
from levjepa.model.tokens import grid_positions, sample_keep_idx
from levjepa.rng import fold_keys, sample_keys


def assert_close(got: Tensor, want: Tensor, msg: str = "") -> None:
    """Equal to float32 rounding: the largest difference within 1e-6 of the largest entry (a gradient summed
    over many tokens carries rounding of the order of its scale, not of each entry)."""
    assert got.shape == want.shape, msg
    err, scale = float((got - want).detach().abs().max()), float(want.detach().abs().max())
    assert err <= 1e-6 * scale + 1e-9, f"{msg}: max |difference| {err:.3g} against max |value| {scale:.3g}"


# ---- the reference: the forward as it was before the bias was built once (kept verbatim in substance) ---


def _ref_rope(enc: VideoEncoder, pos: Tensor) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` ``[B, 1, L, hd]`` per clip, as ``Rope3D.forward`` computed them."""
    rope = enc.rope
    if rope.layout == "vjepa2":
        p = torch.cat([pos, torch.zeros_like(pos[..., :1])], dim=-1).float()
        ang = (p[..., rope._axis] * rope._channel_freq.float())[:, None]
        n = rope.head_dim // 2
        return ang.cos(), ang.sin() * torch.cat([-torch.ones(n), torch.ones(n)])
    p = pos.float()
    ang = torch.cat([p[..., a : a + 1] * f.float() for a, f in enumerate(rope._freqs)], dim=-1)[:, None]
    cos, sin = ang.cos(), ang.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def _ref_apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    partner = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x * cos + partner * sin


def _ref_mask(kind: str, frame: Tensor, is_cls: Tensor, window: int | None) -> Tensor | None:
    if kind == "bidirectional":
        return None
    m = TokenMeta(frame, is_cls)
    return block_causal(m, m, window)[:, None]  # boolean [B, 1, L, L]: SDPA converts it in every layer


def _ref_tokens(enc: VideoEncoder, video: Tensor, keep_idx: Tensor | None, window: int | None):
    """Per-clip tokens, positions, RoPE and boolean mask, as ``_prepare`` built them."""
    pe, b = enc.patch_embed, video.shape[0]
    t, h, w = pe.grid(video)
    grid = grid_positions(t, h, w)
    pv = pe.patches(video)
    if keep_idx is None:
        pixels, positions = pv.reshape(b, t * h * w, -1), grid.expand(b, -1, -1)
    else:
        positions = grid[keep_idx]
        bidx = torch.arange(b)[:, None]
        pixels = pv[bidx, positions[..., 0], positions[..., 1], positions[..., 2]].flatten(2)
    patches = pe.proj(pixels)
    rotated_at = t - 1 if enc.cfg.rope_layout == "levjepa" else 0
    cls_pos = torch.tensor([rotated_at, 0, 0]).expand(b, 1, 3)
    all_pos = torch.cat([cls_pos, positions], dim=1)
    frame = torch.cat([torch.full((b, 1), t - 1), positions[..., 0]], dim=1)
    is_cls = torch.zeros_like(frame, dtype=torch.bool)
    is_cls[:, 0] = True
    x = torch.cat([enc.cls_token.expand(b, -1, -1), patches], dim=1)
    slots = None if window is None else window // enc.cfg.tubelet
    return x, positions, _ref_rope(enc, all_pos), _ref_mask(enc.cfg.attention, frame, is_cls, slots)


def _ref_block(enc: VideoEncoder, i: int, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
    blk = enc.blocks[i]
    b, n, d = x.shape
    heads = enc.cfg.heads
    qkv = blk.attn.qkv(blk.norm1(x)).view(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = _ref_apply_rope(q, *rope), _ref_apply_rope(k, *rope)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    x = x + blk.attn.proj(y.transpose(1, 2).reshape(b, n, d))
    return x + blk.mlp.fc2(F.gelu(blk.mlp.fc1(blk.norm2(x))))


def reference_forward(enc: VideoEncoder, video: Tensor, keep_idx: Tensor | None = None, window: int | None = None):
    """``(tokens after the final norm [B, 1+L, D], positions [B, L, 3])`` by the replaced implementation."""
    x, positions, rope, mask = _ref_tokens(enc, video, keep_idx, window)
    for i in range(enc.cfg.depth):
        x = _ref_block(enc, i, x, rope, mask)
    return enc.norm(x), positions


# ---- equivalence -------------------------------------------------------------------------------------------


def _grads(module: torch.nn.Module) -> dict[str, Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _compare(enc: VideoEncoder, video: Tensor, drop: bool, window: int | None = None) -> None:
    ref = copy.deepcopy(enc)
    seed = 3
    out = enc.forward_features(video, drop=drop, generator=torch.Generator().manual_seed(seed), window=window)
    c = enc.cfg
    keep_idx = None
    if drop:
        grid = enc.patch_embed.grid(video)
        keep_idx = sample_keep_idx(video.shape[0], grid, c.drop_ratio, c.drop_mode, torch.Generator().manual_seed(seed))
    tokens, positions = reference_forward(ref, video, keep_idx, window)
    assert torch.equal(out.positions, positions)
    assert_close(out.tokens, tokens)
    weights = torch.randn_like(tokens)  # a random linear read-out of every token: every gradient path
    (out.tokens * weights).sum().backward()
    (tokens * weights).sum().backward()
    got, want = _grads(enc), _grads(ref)
    assert got.keys() == want.keys() and len(got) == len(list(enc.parameters()))
    for name in want:
        assert_close(got[name], want[name], name)


@pytest.mark.parametrize("attention", ["block_causal", "bidirectional"])
@pytest.mark.parametrize("drop", ["none", "uniform", "tube"])
@pytest.mark.parametrize("tubelet", [1, 2])
@pytest.mark.parametrize("layout", ["levjepa", "vjepa2"])
def test_forward_and_gradients_equal_the_per_layer_boolean_mask(attention, drop, tubelet, layout):
    torch.manual_seed(0)
    mode = "uniform" if drop == "none" else drop
    cfg = encoder_config(
        "vit-test", attention=attention, tubelet=tubelet, rope_layout=layout, drop_ratio=0.6, drop_mode=mode
    )
    enc = VideoEncoder(cfg)
    _compare(enc, torch.randn(3, 3, 4, 32, 24), drop=drop != "none")


@pytest.mark.parametrize("layout", ["levjepa", "vjepa2"])
@pytest.mark.parametrize("tubelet", [1, 2])
def test_rho_zero_training_takes_whole_frames_and_equals_the_reference(tubelet, layout):
    """ρ = 0 keeps every token: the training forward (``drop=True``) computes the spans of whole frames, with
    the outputs and gradients of the per-clip boolean mask."""
    torch.manual_seed(4)
    enc = VideoEncoder(encoder_config("vit-test", tubelet=tubelet, rope_layout=layout, drop_ratio=0.0))
    _compare(enc, torch.randn(2, 3, 4, 32, 24), drop=True)


@pytest.mark.parametrize("tubelet", [1, 2])
def test_windowed_forward_equals_the_reference(tubelet):
    torch.manual_seed(1)
    enc = VideoEncoder(encoder_config("vit-test", tubelet=tubelet))
    _compare(enc, torch.randn(2, 3, 8, 16, 16), drop=False, window=2 * tubelet)


@pytest.mark.parametrize("drop_ratio", [0.5, 0.0])  # 0: whole frames, the spans with CLS alone in the last block
def test_forward_views_equals_the_reference_per_group(drop_ratio):
    torch.manual_seed(2)
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=drop_ratio))
    ref = copy.deepcopy(enc)
    groups = (torch.randn(1, 2, 3, 4, 32, 32), torch.randn(3, 2, 3, 4, 16, 16))
    keys = sample_keys(0, "drop", 0, positions=range(2))
    cls = enc.forward_views(*groups, keys=keys)
    want, slot = [], 0
    for views in groups:
        v, b = views.shape[:2]
        video = views.flatten(0, 1)
        c = ref.cfg
        view_keys = fold_keys(keys, slot, count=v).reshape(-1)
        keep_idx = sample_keep_idx(v * b, ref.patch_embed.grid(video), c.drop_ratio, c.drop_mode, keys=view_keys)
        want.append(reference_forward(ref, video, keep_idx)[0][:, 0].view(v, b, -1))
        slot += v
    want_cls = torch.cat(want)
    assert_close(cls, want_cls)
    weights = torch.randn_like(cls)
    (cls * weights).sum().backward()
    (want_cls * weights).sum().backward()
    got, ref_grads = _grads(enc), _grads(ref)
    for name in ref_grads:
        assert_close(got[name], ref_grads[name], name)


@pytest.mark.parametrize("window", [None, 2])
def test_stream_equals_the_reference_forward(window):
    torch.manual_seed(3)
    enc = VideoEncoder(encoder_config("vit-test")).eval()
    video = torch.randn(2, 3, 5, 16, 24)
    stream = StreamingEncoder(enc, window=window)
    with torch.no_grad():
        tokens, _ = reference_forward(enc, video, window=window)
        per_frame = enc.patch_embed.grid(video)[1] * enc.patch_embed.grid(video)[2]
        for t in range(video.shape[2]):
            new = stream.push(video[:, :, t : t + 1])
            assert_close(new, tokens[:, 1 + t * per_frame : 1 + (t + 1) * per_frame])
        assert_close(stream.cls(), tokens[:, 0])


# ---- one bias, batch 1 without dropping ----------------------------------------------------------------------


def _saved_masks(enc: VideoEncoder, video: Tensor, drop: bool) -> list[tuple[int, ...]]:
    """Shapes of the distinct float ``[*, 1, L, L]`` tensors (L: tokens per clip) autograd saves for backward."""
    found: dict[int, tuple[int, ...]] = {}

    def pack(t: Tensor) -> Tensor:
        if t.dim() == 4 and t.is_floating_point() and t.shape[1] == 1 and t.shape[-1] == t.shape[-2]:
            found[t.untyped_storage().data_ptr()] = tuple(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = enc.forward_features(video, drop=drop, generator=torch.Generator().manual_seed(0))
        out.cls.sum().backward()
    n = 1 + out.positions.shape[1]
    return [shape for shape in found.values() if shape[-1] == n]


@pytest.mark.parametrize("kernel", ["sdpa", "short"])
def test_autograd_keeps_no_mask_without_dropping_and_one_bias_per_clip_with_it(kernel, monkeypatch):
    """Whole frames need no mask: without dropping autograd keeps no ``L × L`` tensor at all (the spans of
    ``attention.key_spans``); with dropping, through SDPA (long sequences, CUDA), it keeps the one per-clip bias
    for every layer, and through the CPU short-sequence path (``attention.attend``) none, the bias being only
    added to the scores."""
    if kernel == "sdpa":
        monkeypatch.setattr(attention, "SHORT_KEYS", 0)
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", depth=3))
    video = torch.randn(4, 3, 4, 16, 16)  # 4 clips, 1 + 16 tokens each
    kept, dropped = _saved_masks(enc, video, drop=False), _saved_masks(enc, video, drop=True)
    assert kept == []
    if kernel == "short":
        assert dropped == []
        return
    assert len(dropped) == 1 and dropped[0][0] == 4  # per clip, still one for all layers


def test_bias_is_zero_where_allowed_and_minus_infinity_elsewhere_in_the_query_dtype():
    allowed = torch.tensor([[[[True, False], [True, True]]]])
    x = torch.zeros(1, 2, 4, dtype=torch.float64)
    bias = attn_bias(allowed, x)
    assert bias is not None and bias.dtype == torch.float64
    assert torch.equal(bias, torch.tensor([[[[0.0, float("-inf")], [0.0, 0.0]]]], dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = attn_bias(allowed, x.float())
    assert low is not None and low.dtype == torch.bfloat16
    assert attn_bias(None, x) is None
