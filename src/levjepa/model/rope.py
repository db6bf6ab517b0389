"""3D rotary position embedding (RoPE) over the ``(t, y, x)`` grid position of each token.

Paper fact (SPEC §2.4, LeVJEPA §3.8.2): every token has coordinates ``(t, y, x)``, its *original* grid
position; each head's dimension is split into three groups rotated by ``t``, ``y`` and ``x``; there is no
absolute position embedding, so one set of weights serves 224 and 96 inputs and any clip length.

Design (the choices the paper leaves open):

* **Pairs and the split.** A head of dimension ``d`` has ``n = d/2`` rotated pairs; pair ``i`` is
  ``(x[i], x[i + n])`` (half-split layout, like ``rotate_half``). The pairs go to the axes in the order
  ``t, y, x``: each axis gets ``n // 3``, and the ``n mod 3`` left over go one each to ``x`` then ``y``
  (:func:`rope_split`). So **no dimension is left unrotated**: d = 64 (ViT-T/S/B/L) -> 10/11/11 pairs,
  d = 80 (ViT-H) -> 13/13/14, d = 16 (``vit-test``) -> 2/3/3.
* **Frequencies.** An axis with ``k`` pairs rotates its ``j``-th pair by ``θ_j = base^(−j/k)``,
  ``j = 0..k−1`` (``base = rope_base``, 10000 as in V-JEPA 2): the usual 1-D RoPE spectrum per axis. Every
  pair has its own frequency and both members of a pair share it, so the map is a true rotation by angle
  ``pos[axis(i)]·θ_i`` in each pair-plane. V-JEPA 2 froze a bug of exactly this class into its checkpoints
  (frequencies duplicated along the wrong layout, so the two members of a "pair" rotated by different
  angles): it preserves neither norms nor relative-position dependence, and ``tests/test_rope.py`` checks
  both, plus agreement with a naive complex-number reference, and that the checks do fail on that bug.
* **Property.** With ``R(p)`` the rotation, ``⟨R(p)q, R(p')k⟩ = ⟨q, R(p' − p)k⟩``: attention scores depend
  only on the per-axis offset ``p' − p``.
* **CLS.** CLS is rotated at position ``(t_last, 0, 0)``: spatially unrotated (2-D RoPE ViTs commonly
  leave CLS unrotated) and temporally at the newest temporal slot of the clip (``T/τ − 1``; in streaming, of the
  frames seen so far). Patches never read CLS under block-causal attention and CLS's score with itself is
  position-free, so this position only shapes how CLS weighs patches: by how far back a frame is, not by
  its absolute index, which is what a sliding-window stream of any length needs. Under bidirectional
  attention the same position is used.
* Angles, cos and sin are computed in float32. :meth:`Rope3D.tables` then casts them, once per forward, to the
  dtype the queries will have when that is a 16-bit float (the autocast dtype under autocast), so that the
  rotation runs in the compute dtype — under bf16 autocast three bf16 elementwise kernels, no float32
  intermediate and no casts (the convention of Hugging Face's Llama); the rotation's two products then round
  in bf16 each instead of once, a difference of the order of bf16's own rounding of the queries
  (``tests/test_rope.py``). Float32 and float64 runs keep float32 tables and are unchanged. Tables in another
  dtype than the queries' (a stream run under autocast) still rotate in float32 and cast back.
* The tables are computed once per forward and shared by every layer; :func:`apply_rope` is one autograd
  function (three kernels forward, three backward: no copy of the swapped halves, and autograd saves only
  the tables). :func:`rotary_qkv` is what the attention layer calls: from its ``qkv`` projection to the
  rotated queries and keys and the values, each contiguous ``[B, h, L, hd]`` as the attention products take
  them, in one function whose backward writes the three gradients straight into the layout of the ``qkv``
  output (no split, stack or transposing copies, forward or backward).

**The ``vjepa2`` layout** (``EncoderConfig.rope_layout="vjepa2"``): the function the official LeVJEPA code
and its released checkpoints compute (V-JEPA 2's "pretrained-compatible" RoPE), reproduced exactly so that
imported weights give the official outputs. In the official channel order, each axis ``t, y, x`` owns a
contiguous slice of ``w = 2·((d // 3) // 2)`` channels (``d − 3w`` channels stay unrotated: 2 of 64 at
ViT-B/L), channel ``m`` of a slice is paired with its neighbour (``2i, 2i+1``) and rotated by
``pos·θ_(m mod w/2)``, ``θ_k = base^(−k/(w/2))`` — so the two members of a pair turn by different
angles (the bug described above, frozen into the checkpoints), and CLS is not rotated at all (its RoPE
position is ``(0, 0, 0)``; its place in the attention mask is unchanged). levjepa keeps its half-split
pairing ``(i, i + n)`` in the attention code and expresses the official map as per-channel tables: official
pair ``(2i, 2i+1)`` is levjepa pair ``(i, i + n)``, i.e. levjepa channel ``i`` is official channel ``2i``
and ``i + n`` is ``2i + 1`` (:func:`vjepa2_channel_order`). The importer (``levjepa.formats.reading.official``)
permutes the query and key rows of each head's ``qkv`` weight accordingly, a relabelling of channels that
leaves every attention score ``⟨q, k⟩`` unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["ROPE_LAYOUTS", "Rope3D", "apply_rope", "compute_dtype", "rope_split", "rotary_qkv", "vjepa2_channel_order"]

ROPE_LAYOUTS = ("levjepa", "vjepa2")


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Rotated pairs per axis ``(t, y, x)`` for a head of ``head_dim``: ``n // 3`` each, remainder to x then y."""
    if head_dim % 2 or head_dim < 6:
        raise ValueError(f"head_dim={head_dim}: 3D RoPE needs an even head dim >= 6 (a pair per axis)")
    base, rem = divmod(head_dim // 2, 3)
    return base, base + int(rem == 2), base + int(rem >= 1)


def vjepa2_channel_order(head_dim: int) -> Tensor:
    """``[head_dim]`` long: the official channel of each levjepa channel in the ``vjepa2`` layout, official
    pair ``(2i, 2i+1)`` -> levjepa pair ``(i, i + n)``: ``[0, 2, 4, ..., 1, 3, 5, ...]``."""
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim}: RoPE needs an even head dim")
    return torch.cat([torch.arange(0, head_dim, 2, device="cpu"), torch.arange(1, head_dim, 2, device="cpu")])


def _vjepa2_tables(head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """Per levjepa channel: the axis it turns with (0, 1, 2; 3 = unrotated) and its frequency (float64)."""
    w = 2 * ((head_dim // 3) // 2)  # channels per axis in the official layout
    official = torch.arange(head_dim, device="cpu")  # host tables, also when built under a meta-device context
    axis = torch.where(official < 3 * w, official // max(w, 1), torch.full_like(official, 3))
    half = max(w // 2, 1)
    k = (official % max(w, 1)) % half
    freq = torch.where(
        axis < 3, base ** (-k.to(torch.float64) / half), torch.zeros((), dtype=torch.float64, device="cpu")
    )
    order = vjepa2_channel_order(head_dim)
    return axis[order], freq[order]


def compute_dtype(like: Tensor) -> torch.dtype:
    """The dtype of what a linear layer computes from ``like``: the autocast dtype of its device under
    autocast, ``like.dtype`` otherwise (the dtype of the queries, keys and attention bias)."""
    device = like.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else like.dtype


class Rope3D(nn.Module):
    """``forward(positions [B, L, 3]) -> (cos, sin)``, each ``[B, 1, L, head_dim]`` (float32), in the
    ``levjepa`` layout (the default) or the official code's ``vjepa2`` layout (see the module docstring)."""

    def __init__(self, head_dim: int, base: float = 10000.0, layout: str = "levjepa") -> None:
        super().__init__()
        if layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope layout {layout!r}: valid choices are {', '.join(ROPE_LAYOUTS)}")
        self.head_dim, self.base, self.layout = head_dim, base, layout
        self.split = rope_split(head_dim)
        # per-axis frequencies in float64 on the host, never cast by module.to(dtype)
        self._freqs = [base ** (-torch.arange(k, dtype=torch.float64, device="cpu") / k) for k in self.split]
        if layout == "vjepa2":
            self._axis, self._channel_freq = _vjepa2_tables(head_dim, base)

    def angles(self, positions: Tensor) -> Tensor:
        """``[B, L, n]`` angle of every pair: ``pos[..., axis(i)] · θ_i``."""
        pos = positions.to(torch.float32)
        parts = [pos[..., a : a + 1] * f.to(pos.device, torch.float32) for a, f in enumerate(self._freqs)]
        return torch.cat(parts, dim=-1)

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` laid out for :func:`apply_rope`: ``[B, 1, L, head_dim]`` each, ``cos`` of every pair
        angle on both halves, ``sin`` negated on the first half (the sign of the rotation folded in)."""
        if self.layout == "vjepa2":
            return self._vjepa2(positions)
        ang = self.angles(positions)[:, None]  # [B, 1, L, n]: broadcasts over heads
        cos, sin = ang.cos(), ang.sin()
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)

    def tables(self, positions: Tensor, like: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`forward`'s tables in the compute dtype of ``like`` (the tokens) when that is a 16-bit float, in
        float32 otherwise (module docstring): what every layer of one forward rotates with."""
        cos, sin = self(positions)
        dtype = compute_dtype(like)
        if dtype in (torch.float16, torch.bfloat16):
            return cos.to(dtype), sin.to(dtype)
        return cos, sin

    def _vjepa2(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The official map as per-channel tables: channel ``c`` turns by ``pos[axis(c)]·freq(c)`` (0 for the
        unrotated ones); the first half of each pair carries the ``−sin``."""
        pos = torch.cat([positions, torch.zeros_like(positions[..., :1])], dim=-1).to(torch.float32)  # axis 3 = 0
        axis = self._axis.to(positions.device)
        freq = self._channel_freq.to(positions.device, torch.float32)
        ang = (pos[..., axis] * freq)[:, None]  # [B, 1, L, head_dim]
        n = self.head_dim // 2
        sign = torch.cat([-torch.ones(n, device=positions.device), torch.ones(n, device=positions.device)])
        return ang.cos(), ang.sin() * sign

    def extra_repr(self) -> str:
        if self.layout == "vjepa2":
            return f"head_dim={self.head_dim}, layout=vjepa2, base={self.base:g}"
        return f"head_dim={self.head_dim}, pairs(t,y,x)={self.split}, base={self.base:g}"


class _Rotate(torch.autograd.Function):
    """``y = x·cos + swap(x)·sin`` (``swap`` exchanges the two halves of the last dim), whose transpose is
    ``g·cos + swap(g·sin)``: the backward pass is the same three kernels with the halves of ``sin`` exchanged,
    and autograd keeps only the tables (shared by every layer of a forward), not a rotated copy of ``x``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if cos.requires_grad or sin.requires_grad:
            raise ValueError("apply_rope: the RoPE tables are functions of positions, not differentiable inputs")
        ctx.save_for_backward(cos, sin)
        ctx.shape = x.shape
        return _rotate(x, cos, sin, transpose=False)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        dx = _rotate(grad, cos, sin, transpose=True)
        return (dx if dx.shape == ctx.shape else dx.sum_to_size(ctx.shape)), None, None


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, *, transpose: bool) -> Tensor:
    """``[x1·c1 + x2·s1, x2·c2 + x1·s2]`` (``transpose``: ``s1`` and ``s2`` exchanged) in the wider of ``x``'s
    and the tables' dtypes: the compute dtype when both are 16-bit (tables of :meth:`Rope3D.tables` under
    autocast), float32 for float32 tables on 16-bit ``x``, ``x``'s own for float32 and float64 ``x``. One
    multiply over the whole width, then a fused multiply-add into each half in place (three kernels, no
    ``out=``, which TorchDynamo cannot trace into views), cast to ``x.dtype``."""
    n = x.shape[-1] // 2
    s1, s2 = (sin[..., n:], sin[..., :n]) if transpose else (sin[..., :n], sin[..., n:])
    out = x * cos  # the promoted dtype of x and the tables
    out[..., :n].addcmul_(x[..., n:], s1)
    out[..., n:].addcmul_(x[..., :n], s2)
    return out.to(x.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair ``(x[i], x[i+n])`` of ``x`` ``[..., L, 2n]`` by its angle, given ``(cos, sin)`` from
    :meth:`Rope3D.forward` or :meth:`Rope3D.tables` (any layout that broadcasts against ``x``): ``[x1, x2] ->
    [x1·cos − x2·sin, x2·cos + x1·sin]``, computed in the wider of ``x``'s and the tables' dtypes (16-bit
    tables on 16-bit ``x``: the compute dtype, no float32 intermediate; float32 tables on 16-bit ``x``:
    float32), returned in ``x.dtype``."""
    out = _Rotate.apply(x, cos, sin)
    assert isinstance(out, Tensor)
    return out


class _RotaryQKV(torch.autograd.Function):
    """``qkv`` ``[B, L, 3, h, hd]`` -> rotated ``q``, ``k`` and ``v``, each contiguous ``[B, h, L, hd]``: the
    rotation (as :class:`_Rotate`) reads the strided ``qkv`` view and writes one contiguous ``[3, B, h, L, hd]``
    buffer, so neither the attention products nor the backward copy it again; the backward writes the
    transposed rotation of ``dq``, ``dk`` and ``dv`` into one ``[B, L, 3, h, hd]`` tensor, the gradient of
    the ``qkv`` projection's output as it is laid out (where a split, a stack and the transposes' copies
    made it before). Autograd keeps only the tables. Eager only: ``out=`` into views does not trace."""

    @staticmethod
    def forward(ctx: Any, qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if cos.requires_grad or sin.requires_grad:
            raise ValueError("rotary_qkv: the RoPE tables are functions of positions, not differentiable inputs")
        ctx.save_for_backward(cos, sin)
        x = qkv.permute(2, 0, 3, 1, 4)  # [3, B, h, L, hd], a view
        out = torch.empty(x.shape, dtype=qkv.dtype, device=qkv.device)
        _rotate_into(out[:2], x[:2], cos, sin, transpose=False)
        out[2].copy_(x[2])
        return out[0], out[1], out[2]

    @staticmethod
    def backward(ctx: Any, dq: Tensor | None, dk: Tensor | None, dv: Tensor | None) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        like = next(g for g in (dq, dk, dv) if g is not None)  # [B, h, L, hd], the outputs' dtype
        dq, dk, dv = (like.new_zeros(like.shape) if g is None else g for g in (dq, dk, dv))  # an unused output
        b, h, n, hd = like.shape
        grad = like.new_empty(b, n, 3, h, hd)
        gx = grad.permute(2, 0, 3, 1, 4)  # [3, B, h, L, hd] view of the qkv output's layout
        _rotate_into(gx[:2], torch.stack((dq, dk)), cos, sin, transpose=True)  # both by one set of kernels
        gx[2].copy_(dv)
        return grad, None, None


def _rotate_into(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, *, transpose: bool) -> None:
    """:func:`_rotate` written into ``out`` (``x``'s shape and dtype, any strides), computed in that dtype: the
    tables are of it (16-bit under autocast with :meth:`Rope3D.tables`, float32 in float32 runs) or narrower
    (float32 tables on float64 ``x``), never wider (:func:`rotary_qkv` sends those to :func:`apply_rope`)."""
    n = x.shape[-1] // 2
    s1, s2 = (sin[..., n:], sin[..., :n]) if transpose else (sin[..., :n], sin[..., n:])
    torch.mul(x, cos, out=out)
    out[..., :n].addcmul_(x[..., n:], s1)
    out[..., n:].addcmul_(x[..., :n], s2)


def rotary_qkv(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Queries and keys rotated by RoPE, and the values, each ``[B, h, L, hd]``, from a ``qkv`` projection viewed
    as ``[B, L, 3, h, hd]`` and the tables ``(cos, sin)`` of :meth:`Rope3D.forward` (``[B or 1, 1, L, hd]``).

    In eager mode with tables of the queries' dtype or wider (float32 / float64 runs; bf16 / fp16 under autocast
    with :meth:`Rope3D.tables`), one autograd function (:class:`_RotaryQKV`: contiguous outputs written in the
    compute dtype, one gradient tensor in the projection's layout); otherwise (under ``torch.compile``, which
    fuses the rotation and the split into one kernel itself, or with float32 tables on 16-bit queries, whose
    rotation runs in float32 and casts back) :func:`apply_rope` on the queries and keys together and views of
    the values. The two paths compute the same function (``tests/test_rope.py``)."""
    same_dtype = torch.promote_types(qkv.dtype, cos.dtype) == qkv.dtype
    if same_dtype and qkv.is_floating_point() and not torch.compiler.is_compiling():
        q, k, v = _RotaryQKV.apply(qkv, cos, sin)
        return q, k, v
    qk, v = qkv.split([2, 1], dim=2)  # [B, L, 2|1, h, hd]
    c, s = (t.transpose(1, 2).unsqueeze(2) for t in (cos, sin))  # [B or 1, L, 1, 1, hd]: over q, k and heads
    q, k = apply_rope(qk, c, s).transpose(1, 3).unbind(2)  # queries and keys in one rotation
    return q, k, v.squeeze(2).transpose(1, 2)
