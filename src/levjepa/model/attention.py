"""Attention masks as small named predicates of token metadata, and the attention layer that uses them.

Paper facts (SPEC §2.5, LeVJEPA §3.9, table 2):

* **Block-causal** (default; IN1K 51.2 %): a patch token of frame ``t`` reads every patch token of frames
  ``≤ t`` (bidirectional inside its frame) and **never CLS**; CLS reads every patch and itself. Hence each
  frame's patch features depend only on the present and the past, ``H_t = F(x_1..x_t)``, and CLS cannot
  carry the future back to early patches.
* **Bidirectional** (the ablation; IN1K 50.7 %): every token reads every token of its view.

Design:

* The masks are computed from the metadata of the tokens *actually present* (:class:`TokenMeta`: each
  token's temporal slot and whether it is CLS), never from ``index // tokens_per_frame``, which breaks as
  soon as tokens are dropped. ``attn_mask`` is True where a query may attend a key (the
  ``F.scaled_dot_product_attention`` convention); it is never used for the kept/dropped sets (that is
  ``keep_idx``).
* CLS's ``frame`` is the newest temporal slot of its clip (the same ``t`` it is rotated at by RoPE), so the
  one predicate also serves the streaming encoder, whose queries and keys are different token sets.
* ``window = W`` (in temporal slots) additionally bounds what is read to the last ``W`` slots: patches of
  slot ``t`` read slots ``t − W < s ≤ t``, CLS reads the last ``W`` slots of its clip. It is what the
  streaming encoder's sliding window computes; ``None`` (training, evaluation) is unbounded.
* **One mask per forward, in the form the kernel takes.** ``F.scaled_dot_product_attention`` turns a
  boolean mask into an additive float one (0 where allowed, −inf elsewhere) inside every call, and autograd
  keeps that float copy for the backward pass: one per layer. So the encoder builds the additive bias
  once per forward (:func:`attn_bias`, in the dtype the queries will have, the autocast dtype under
  autocast, so no layer casts it either) and every layer receives the same tensor, which autograd saves
  once. Patterns that need no mask get none: bidirectional without a window is ``None`` (SDPA's fastest
  kernels). When every clip keeps the whole grid (no dropping: evaluation, extraction, ρ = 0) the token
  metadata is the same for every clip and the bias is ``[1, 1, L, L]``, broadcast over the batch, instead
  of one ``[B, 1, L, L]`` copy per clip (at 16×224², L = 3137: 38 MiB in float32, where SDPA's own
  conversion kept 38 MiB per clip and per layer). Block-causal with dropping is per clip,
  ``[B, 1, L, L]`` — small at the kept lengths (158 and 30 tokens at ρ = 0.95).
* One function on every device, :func:`attend`: ``F.scaled_dot_product_attention`` with that bias
  broadcast over heads, except for short float32 sequences on the CPU (see there). On CUDA, SDPA picks a
  fused kernel that accepts arbitrary masks (memory-efficient attention); without a mask it can take the
  flash kernel. Attention scores are ~2 % of the encoder's FLOPs at ρ = 0.95 (158- and 30-token
  sequences), so no mask-specialised kernel was written; ``bench/gpu_encoder.py`` times the op per backend
  and mask type, and the whole step with and without mask.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from levjepa.model.linear import linear
from levjepa.model.rope import rotary_qkv

__all__ = [
    "SHORT_KEYS",
    "Attention",
    "KVCache",
    "TokenMeta",
    "attend",
    "attn_bias",
    "bidirectional",
    "block_causal",
    "build_attn_mask",
]


class TokenMeta(NamedTuple):
    """Per-token metadata the masks read: ``frame`` (long temporal slot; CLS: the clip's newest slot) and
    ``is_cls`` (bool), both ``[B, L]`` (or ``[1, L]`` when shared by the batch)."""

    frame: Tensor
    is_cls: Tensor

    @classmethod
    def patches(cls, frame: Tensor) -> TokenMeta:
        """Patch tokens at temporal slots ``frame`` ``[B, L]`` (long)."""
        return cls(frame, torch.zeros_like(frame, dtype=torch.bool))

    def cat(self, other: TokenMeta) -> TokenMeta:
        """These tokens followed by ``other``'s (a batch dimension of 1 broadcasts)."""
        b = max(self.frame.shape[0], other.frame.shape[0])
        return TokenMeta(
            torch.cat([self.frame.expand(b, -1), other.frame.expand(b, -1)], dim=1),
            torch.cat([self.is_cls.expand(b, -1), other.is_cls.expand(b, -1)], dim=1),
        )


def block_causal(q: TokenMeta, k: TokenMeta, window: int | None = None) -> Tensor:
    """``[B, Lq, Lk]``: a patch reads patches of its own or earlier slots (within ``window``), never CLS;
    CLS reads every patch (within ``window`` of its slot) and itself."""
    qf, kf = q.frame[:, :, None], k.frame[:, None, :]
    k_patch = ~k.is_cls[:, None, :]
    reads_patch = k_patch & (kf <= qf)
    if window is not None:
        reads_patch = reads_patch & (kf > qf - window)
    cls_reads_cls = q.is_cls[:, :, None] & ~k_patch
    return reads_patch | cls_reads_cls


def bidirectional(q: TokenMeta, k: TokenMeta, window: int | None = None) -> Tensor:
    """``[B, Lq, Lk]``: every token reads every token of its view."""
    if window is not None:
        raise ValueError(f"window={window}: a sliding window needs block-causal attention")
    b = max(q.frame.shape[0], k.frame.shape[0])
    return torch.ones(b, q.frame.shape[1], k.frame.shape[1], dtype=torch.bool, device=q.frame.device)


MASKS = {"block_causal": block_causal, "bidirectional": bidirectional}


def build_attn_mask(kind: str, q: TokenMeta, k: TokenMeta, window: int | None = None) -> Tensor | None:
    """The ``[B, 1, Lq, Lk]`` boolean ``attn_mask`` of ``kind``, or ``None`` when every pair may attend."""
    if kind == "bidirectional" and window is None:
        return None  # no mask: SDPA's fastest kernels
    if kind not in MASKS:
        raise ValueError(f"attention {kind!r}: valid choices are {', '.join(MASKS)}")
    return MASKS[kind](q, k, window)[:, None]


def attn_bias(attn_mask: Tensor | None, like: Tensor) -> Tensor | None:
    """The additive form of a boolean ``attn_mask`` (what SDPA would otherwise build from it in every call):
    0 where a query may attend, −inf elsewhere, in the dtype the queries computed from ``like`` (the
    tokens) will have: the autocast dtype under autocast, ``like.dtype`` otherwise. ``None`` stays ``None``."""
    if attn_mask is None:
        return None
    device = like.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else like.dtype
    bias = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device)
    return bias.masked_fill_(~attn_mask, float("-inf"))


# Up to this many keys, CPU float32 attention is two matmuls and a softmax rather than SDPA's fused CPU kernel,
# which is slower there on short sequences and faster on long ones (bench/train.md, "Short sequences").
SHORT_KEYS = 192


def attend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor:
    """``softmax(q·kᵀ/√hd + attn_mask)·v`` over ``[B, h, L, hd]`` queries, keys and values; ``attn_mask`` as
    for ``F.scaled_dot_product_attention`` (boolean or additive, broadcast over batch and heads, or ``None``).

    ``F.scaled_dot_product_attention`` everywhere but one case: float32 on the CPU with at most
    :data:`SHORT_KEYS` keys and no boolean mask — the kept tokens of a training step (ρ = 0.95: 158 and 30)
    and the demo's views — where the explicit two matmuls and softmax are the same function computed faster
    than the fused kernel's blocked loop, at the cost of keeping the ``[B, h, L, L_k]`` probabilities (small
    at these lengths) for the backward pass. ``tests/test_attention.py`` holds the two paths equal."""
    short = q.device.type == "cpu" and q.dtype == torch.float32 and k.shape[-2] <= SHORT_KEYS
    if not short or (attn_mask is not None and attn_mask.dtype == torch.bool):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)  # in place: autograd keeps q, k
    if attn_mask is not None:
        scores.add_(attn_mask)
    return torch.matmul(scores.softmax(dim=-1), v)


class KVCache(Protocol):
    """Streaming hook: receives this call's rotated keys/values ``[B, h, L, hd]`` and returns the keys/values
    to attend over (the cached past followed by them), storing what it keeps."""

    def __call__(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...


class Attention(nn.Module):
    """Multi-head self-attention with 3D RoPE on queries and keys."""

    def __init__(self, dim: int, heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        attn_mask: Tensor | None,
        kv_cache: KVCache | None = None,
        queries: int | None = None,
    ) -> Tensor:
        """``x`` ``[B, L, D]``; ``rope`` from ``Rope3D`` (``[B or 1, 1, L, hd]``); ``attn_mask`` boolean or
        additive (:func:`attn_bias`), ``[B or 1, 1, L, L_k]``, or ``None``. ``queries``: the outputs of only the
        first ``queries`` tokens ``[B, queries, D]``, reading the keys and values of all (``None``: every token's)."""
        b, n, d = x.shape
        qkv = linear(x, self.qkv).view(b, n, 3, self.heads, d // self.heads)
        q, k, v = rotary_qkv(qkv, *rope)  # [B, h, L, hd] each
        if kv_cache is not None:
            k, v = kv_cache(k, v)  # [B, h, L_past + L, hd]
        if queries is not None:
            n = queries
            q = q[:, :, :n]
            attn_mask = None if attn_mask is None else attn_mask[:, :, :n]
        y = attend(q, k, v, attn_mask)  # [B, h, L, hd]
        return linear(y.transpose(1, 2).reshape(b, n, d), self.proj)
