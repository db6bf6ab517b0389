"""3D RoPE: a true rotation per pair, scores that depend only on per-axis offsets, a naive complex-number
reference, and proof that these checks catch V-JEPA 2's frequency-duplication bug class."""

from __future__ import annotations

import cmath
from collections.abc import Callable

import pytest
import torch

from levjepa.model import rope as rope_module
from levjepa.model.rope import Rope3D, apply_rope, rope_split, rotary_qkv

Rotate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [L, hd], positions [L, 3]) -> [L, hd]


def ours(head_dim: int, base: float = 10000.0) -> Rotate:
    rope = Rope3D(head_dim, base)

    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = rope(positions[None])  # [1, 1, L, hd]
        return apply_rope(x[None, None], cos, sin)[0, 0]

    return rotate


def vjepa2_bug(head_dim: int, base: float = 10000.0) -> Rotate:
    """The bug class frozen into V-JEPA 2: per-axis angles ``[a_0..a_{k-1}]`` repeated as a block
    (``[a_0..a_{k-1}, a_0..a_{k-1}]``) where the rotation expects each angle twice in a row (interleaved
    pairs ``(2i, 2i+1)``), so the two members of a pair turn by different angles."""
    split = rope_split(head_dim)

    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = []
        for axis, k in enumerate(split):
            freqs = base ** (-torch.arange(k, dtype=torch.float64) / k)
            a = positions[:, axis : axis + 1].double() * freqs  # [L, k]
            angles.append(a.repeat(1, 2))  # BUG: should be a.repeat_interleave(2, dim=1)
        ang = torch.cat(angles, dim=1).float()  # [L, hd]
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[:, 0::2], x[:, 1::2]
        out = torch.empty_like(x)
        out[:, 0::2] = x1 * cos[:, 0::2] - x2 * sin[:, 0::2]
        out[:, 1::2] = x2 * cos[:, 1::2] + x1 * sin[:, 1::2]
        return out

    return rotate


def naive_complex_reference(x: torch.Tensor, positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """Pair ``i`` is the complex number ``x[i] + 1j·x[i + n]``; multiply it by ``exp(1j·pos[axis]·base^(−j/k))``
    where pair ``i`` is the ``j``-th of the ``k`` pairs of its axis, axes in the order t, y, x."""
    n = head_dim // 2
    split = rope_split(head_dim)
    owner = [(axis, j, k) for axis, k in enumerate(split) for j in range(k)]
    assert len(owner) == n
    out = torch.zeros(x.shape, dtype=torch.float64)
    for row in range(x.shape[0]):
        for i, (axis, j, k) in enumerate(owner):
            z = complex(x[row, i], x[row, i + n])
            z *= cmath.exp(1j * float(positions[row, axis]) * base ** (-j / k))
            out[row, i], out[row, i + n] = z.real, z.imag
    return out


def norm_violation(rotate: Rotate, head_dim: int) -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, head_dim, generator=g)
    positions = torch.randint(0, 16, (64, 3), generator=g)
    y = rotate(x, positions)
    return float((y.norm(dim=1) - x.norm(dim=1)).abs().max() / x.norm(dim=1).max())


def relative_violation(rotate: Rotate, head_dim: int) -> float:
    """max |q·k(p, p') − q·k(p + s, p' + s)| over random vectors, positions and per-axis shifts s."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(128, head_dim, generator=g), torch.randn(128, head_dim, generator=g)
    p, p2 = torch.randint(0, 16, (128, 3), generator=g), torch.randint(0, 16, (128, 3), generator=g)
    s = torch.randint(-20, 20, (128, 3), generator=g)
    before = (rotate(q, p) * rotate(k, p2)).sum(1)
    after = (rotate(q, p + s) * rotate(k, p2 + s)).sum(1)
    return float((before - after).abs().max() / before.abs().max())


@pytest.mark.parametrize(
    ("head_dim", "split"), [(16, (2, 3, 3)), (32, (5, 5, 6)), (64, (10, 11, 11)), (80, (13, 13, 14))]
)
def test_split_gives_every_pair_to_an_axis_with_nothing_unrotated(head_dim, split):
    assert rope_split(head_dim) == split and sum(split) == head_dim // 2
    ang = Rope3D(head_dim).angles(torch.tensor([[[1, 1, 1]]]))[0, 0]  # frequencies at unit positions
    assert (ang > 0).all()  # every pair turns: no unrotated remainder
    start = 0
    for k in split:  # per axis: 1, base^(-1/k), ...: distinct, strictly decreasing
        freqs = ang[start : start + k]
        assert freqs[0] == 1.0 and (freqs.diff() < 0).all()
        start += k


@pytest.mark.parametrize("head_dim", [16, 64, 80])
def test_matches_naive_complex_number_reference(head_dim):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20, head_dim, generator=g)
    positions = torch.randint(0, 40, (20, 3), generator=g)
    ref = naive_complex_reference(x, positions, head_dim, 10000.0)
    torch.testing.assert_close(ours(head_dim)(x, positions).double(), ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("head_dim", [16, 64, 80])
def test_preserves_norms_and_scores_depend_only_on_relative_offsets(head_dim):
    assert norm_violation(ours(head_dim), head_dim) < 1e-6
    assert relative_violation(ours(head_dim), head_dim) < 1e-5


def test_every_axis_moves_the_score():
    rotate = ours(64)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 64, generator=g), torch.randn(1, 64, generator=g)
    origin = torch.zeros(1, 3, dtype=torch.long)
    base_score = (rotate(q, origin) * rotate(k, origin)).sum()
    for axis in range(3):
        moved = origin.clone()
        moved[0, axis] = 3
        assert abs(float((rotate(q, origin) * rotate(k, moved)).sum() - base_score)) > 1e-3


def test_the_property_checks_catch_the_vjepa2_frequency_duplication_bug():
    assert norm_violation(vjepa2_bug(64), 64) > 1e-2
    assert relative_violation(vjepa2_bug(64), 64) > 1e-2


def test_low_precision_inputs_rotate_in_float32_and_keep_their_dtype():
    rope = Rope3D(16)
    x = torch.randn(1, 2, 5, 16)
    cos, sin = rope(torch.randint(0, 8, (1, 5, 3)))
    y16 = apply_rope(x.bfloat16(), cos, sin)
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), apply_rope(x.bfloat16().float(), cos, sin), atol=2e-2, rtol=2e-2)


def test_odd_or_tiny_head_dims_are_refused():
    for bad in (5, 4, 15):
        with pytest.raises(ValueError, match="even head dim >= 6"):
            rope_split(bad)


def _qkv_by_definition(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Queries and keys rotated one by one with :func:`apply_rope`, values as they are, each ``[B, h, L, hd]``."""
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


@pytest.mark.parametrize("layout", ["levjepa", "vjepa2"])
@pytest.mark.parametrize("per_clip", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("path", ["fused", "fallback"])
def test_rotary_qkv_is_the_rotation_of_queries_and_keys_forward_and_backward(
    layout, per_clip, dtype, path, monkeypatch
):
    """Both paths of ``rotary_qkv`` (the fused autograd function of eager float32/64, and the one
    ``torch.compile`` and lower precisions take) against the rotation applied to each of q and k by definition:
    the same outputs and the same gradient of the ``qkv`` projection, whichever of q, k, v the loss reads."""
    if path == "fallback":
        monkeypatch.setattr(rope_module.torch.compiler, "is_compiling", lambda: True)
    torch.manual_seed(0)
    b, n, h, hd = 3, 7, 2, 16
    rope = Rope3D(hd, layout=layout)
    cos, sin = rope(torch.randint(0, 6, (b if per_clip else 1, n, 3)))
    base = torch.randn(b, n, 3 * h * hd, dtype=dtype, requires_grad=True)
    got = rotary_qkv(base.view(b, n, 3, h, hd), cos, sin)
    want = _qkv_by_definition(base.view(b, n, 3, h, hd), cos, sin)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (b, h, n, hd) and g.dtype == dtype
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-12)
    if path == "fused":
        assert all(t.is_contiguous() for t in got)  # what the attention products take without a copy
    for used in ([0, 1, 2], [0], [2], [0, 2]):  # unused outputs get no gradient: those slots must be zero
        weights = [torch.randn(b, h, n, hd, dtype=dtype) for _ in range(3)]
        outs = rotary_qkv(base.view(b, n, 3, h, hd), cos, sin)
        (grad,) = torch.autograd.grad(sum((outs[i] * weights[i]).sum() for i in used), base)
        refs = _qkv_by_definition(base.view(b, n, 3, h, hd), cos, sin)
        (ref,) = torch.autograd.grad(sum((refs[i] * weights[i]).sum() for i in used), base)
        torch.testing.assert_close(grad, ref, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-12)


def test_tables_take_the_compute_dtype_of_16_bit_runs_only():
    rope, pos = Rope3D(16), torch.randint(0, 8, (1, 5, 3))
    for like in (torch.zeros(1, dtype=torch.float32), torch.zeros(1, dtype=torch.float64)):
        assert all(t.dtype == torch.float32 for t in rope.tables(pos, like))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = rope.tables(pos, torch.zeros(1))
    assert cos.dtype == sin.dtype == torch.bfloat16
    torch.testing.assert_close(cos.float(), rope(pos)[0], rtol=2**-8, atol=0)
    assert all(t.dtype == torch.float16 for t in rope.tables(pos, torch.zeros(1, dtype=torch.float16)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rotation_in_the_compute_dtype_is_within_its_rounding(dtype):
    """Queries and keys rotated in bf16 / fp16 with tables of that dtype (one autograd function, no float32
    intermediate) against the float32 rotation of the same inputs cast once: within a few units of the
    dtype's last place, forward and backward."""
    torch.manual_seed(0)
    b, n, h, hd = 2, 40, 3, 64
    rope = Rope3D(hd)
    pos = torch.randint(0, 16, (1, n, 3))
    qkv32 = torch.randn(b, n, 3 * h * hd)
    qkv = qkv32.to(dtype).requires_grad_(True)
    eps = torch.finfo(dtype).eps
    low = rotary_qkv(qkv.view(b, n, 3, h, hd), *(t.to(dtype) for t in rope(pos)))
    ref_in = qkv.detach().float().requires_grad_(True)
    ref = rotary_qkv(ref_in.view(b, n, 3, h, hd), *rope(pos))
    weights = [torch.randn(b, h, n, hd) for _ in range(3)]
    for got, want in zip(low, ref, strict=True):
        assert got.dtype == dtype and got.is_contiguous()
        assert float((got.float() - want).abs().max()) <= 4 * eps * float(want.abs().max())
    (g,) = torch.autograd.grad(sum((o * w.to(dtype)).sum() for o, w in zip(low, weights, strict=True)), qkv)
    (r,) = torch.autograd.grad(sum((o * w).sum() for o, w in zip(ref, weights, strict=True)), ref_in)
    assert float((g.float() - r).abs().max()) <= 8 * eps * float(r.abs().max())


def test_a_bf16_encoder_is_as_close_to_float32_as_with_float32_tables(monkeypatch):
    """Under bf16 autocast the whole encoder, RoPE in bf16, stays as close to its float32 outputs as with the
    rotation in float32 (what it computed before): the rotation adds nothing to bf16's own error."""
    from levjepa.model import VideoEncoder, encoder_config

    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", depth=4)).eval()
    video = torch.randn(2, 3, 4, 32, 32)

    def error() -> float:
        with torch.no_grad():
            want = enc.forward_features(video).tokens
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = enc.forward_features(video).tokens.float()
        return float((got - want).norm() / want.norm())

    in_bf16 = error()
    monkeypatch.setattr(Rope3D, "tables", lambda self, positions, like: self(positions))  # float32 tables
    in_float32 = error()
    assert 0 < in_bf16 <= 1.25 * in_float32 + 1e-3
