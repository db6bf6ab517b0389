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
  sequences), so no mask-specialised kernel was written for training; ``bench/gpu_encoder.py`` times the op
  per backend and mask type, and the whole step with and without mask.
* **Whole frames need no mask** (:class:`KeySpans`). When every clip holds the same tokens in time-major
  order — nothing dropped: inference, extraction, ρ = 0 — every query of one temporal slot reads the same
  *contiguous* run of keys (a patch of slot ``t``: the patches of slots ``≤ t``, within the window; CLS:
  itself and every patch). :func:`key_spans` finds those runs by evaluating the same predicate on the token
  metadata, one row per run of equal ``(frame, is_cls)`` (never ``index // tokens_per_frame``), and
  :func:`attend_spans` computes each run of queries as one unmasked attention over its keys: the same
  function as the masked one (``tests/test_attention.py``: outputs and gradients within 1e-5), half of its
  score FLOPs (the future is never computed), and no ``L × L`` tensor anywhere, so the attention pattern
  costs O(L) memory where the bias cost O(L²) (39 MiB at 16 × 224², 600 MiB at 64 frames). On the CPU the
  runs go through SDPA's fused kernel one after another (``bench/encoder.md``, "Clip inference"; FlexAttention
  was measured there too: its CPU kernel has no backward, its compiled forward is slower than the dense
  mask); on CUDA the same runs can be computed by one FlexAttention call with a block mask built from the
  spans (:func:`frame_kernel`, ``"flex"``; not the default until measured on a GPU, ``bench/gpu_peer.py``).
  Traced code keeps the dense bias: ``torch.export`` / ONNX (shapes are symbolic there, so the exported
  graphs are unchanged) and a forward compiled whole (``VideoEncoder.compile_views``, whose training views
  drop tokens anyway), since reading the metadata is a host step a graph cannot hold.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from levjepa.model.linear import linear
from levjepa.model.rope import compute_dtype, rotary_qkv

__all__ = [
    "FRAME_KERNELS",
    "SHORT_KEYS",
    "Attention",
    "AttnPattern",
    "KVCache",
    "KeySpans",
    "TokenMeta",
    "attend",
    "attend_spans",
    "attn_bias",
    "bidirectional",
    "block_causal",
    "build_attn_mask",
    "frame_kernel",
    "key_spans",
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
    bias = torch.zeros(attn_mask.shape, dtype=compute_dtype(like), device=attn_mask.device)
    return bias.masked_fill_(~attn_mask, float("-inf"))


# Up to this many keys, CPU float32 attention is two matmuls and a softmax rather than SDPA's fused CPU kernel,
# which is slower there on short sequences and faster on long ones (bench/train.md, "Short sequences").
SHORT_KEYS = 192


_exporting = getattr(torch.compiler, "is_exporting", lambda: False)  # torch >= 2.6; 2.5 exports the short path


def attend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor:
    """``softmax(q·kᵀ/√hd + attn_mask)·v`` over ``[B, h, L, hd]`` queries, keys and values; ``attn_mask`` as
    for ``F.scaled_dot_product_attention`` (boolean or additive, broadcast over batch and heads, or ``None``).

    ``F.scaled_dot_product_attention`` everywhere but one case: float32 on the CPU with at most
    :data:`SHORT_KEYS` keys and no boolean mask — the kept tokens of a training step (ρ = 0.95: 158 and 30)
    and the demo's views — where the explicit two matmuls and softmax are the same function computed faster
    than the fused kernel's blocked loop, at the cost of keeping the ``[B, h, L, L_k]`` probabilities (small
    at these lengths) for the backward pass. ``tests/test_attention.py`` holds the two paths equal. While
    ``torch.export`` traces (the deployment graphs), always SDPA: an exported graph serves every length, and
    SDPA is what the ONNX exporter writes as one fused ``Attention`` op (opset 23)."""
    cpu32 = q.device.type == "cpu" and q.dtype == torch.float32 and not _exporting()
    short = cpu32 and k.shape[-2] <= SHORT_KEYS
    if not short or (attn_mask is not None and attn_mask.dtype == torch.bool):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)  # in place: autograd keeps q, k
    if attn_mask is not None:
        scores.add_(attn_mask)
    return torch.matmul(scores.softmax(dim=-1), v)


class KeySpans(NamedTuple):
    """An attention pattern as contiguous runs, no mask: the queries ``queries[i] = (start, end)`` read exactly
    the keys in the ranges ``keys[i]`` (one or two ``(start, end)``), every clip alike (:func:`key_spans`)."""

    queries: tuple[tuple[int, int], ...]
    keys: tuple[tuple[tuple[int, int], ...], ...]

    def dense(self, num_keys: int) -> Tensor:
        """The ``[Lq, Lk]`` boolean mask these spans stand for (what the tests compare with the predicates)."""
        allowed = torch.zeros(self.queries[-1][1], num_keys, dtype=torch.bool)
        for (a, b), ranges in zip(self.queries, self.keys, strict=True):
            for c, d in ranges:
                allowed[a:b, c:d] = True
        return allowed


AttnPattern = Tensor | KeySpans | None  # a boolean or additive mask, spans of whole frames, or every pair


# more runs than this (tokens in no useful order, or one token per frame) and the dense mask is used instead
MAX_SPANS = 1024


def _runs(meta: TokenMeta) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of consecutive tokens with equal ``(frame, is_cls)`` in a ``[1, L]`` row."""
    f, c = meta.frame[0], meta.is_cls[0]
    change = ((f[1:] != f[:-1]) | (c[1:] != c[:-1])).nonzero().flatten() + 1
    edges = [0, *change.tolist(), f.numel()]
    return list(itertools.pairwise(edges))


def key_spans(kind: str, q: TokenMeta, k: TokenMeta, window: int | None = None) -> KeySpans | None:
    """The pattern ``kind`` (within ``window`` slots) as :class:`KeySpans`, or ``None`` where it has no such
    form: metadata that is not one row shared by the batch, runs that read more than two key ranges (tokens
    not in time-major order), a run that reads nothing, or more than :data:`MAX_SPANS` runs.

    The metadata must be on the CPU (it is read here; callers build it there, so no device synchronises).
    Each run of queries with equal ``(frame, is_cls)`` gets the key ranges of the predicate's row for its
    first query — the predicates depend on nothing else, so the spans are the mask, exactly."""
    if kind not in MASKS:
        raise ValueError(f"attention {kind!r}: valid choices are {', '.join(MASKS)}")
    if q.frame.shape[0] != 1 or k.frame.shape[0] != 1 or q.frame.device.type != "cpu":
        return None
    runs = _runs(q)
    if len(runs) > MAX_SPANS:
        return None
    queries, keys = [], []
    for a, b in runs:
        row = MASKS[kind](TokenMeta(q.frame[:, a : a + 1], q.is_cls[:, a : a + 1]), k, window)[0, 0]  # [Lk]
        step = torch.diff(
            row.to(torch.int8), prepend=row.new_zeros(1, dtype=torch.int8), append=row.new_zeros(1, dtype=torch.int8)
        )
        starts, ends = (step == 1).nonzero().flatten().tolist(), (step == -1).nonzero().flatten().tolist()
        if not 1 <= len(starts) <= 2:
            return None
        queries.append((a, b))
        keys.append(tuple(zip(starts, ends, strict=True)))
    return KeySpans(tuple(queries), tuple(keys))


FRAME_KERNELS = ("sdpa", "flex")
_frame_kernel = "sdpa"


@contextlib.contextmanager
def frame_kernel(name: str) -> Iterator[None]:
    """Within the block, :func:`attend_spans` computes the spans with ``name``: ``"sdpa"`` (the default: one
    unmasked SDPA call per run of queries) or ``"flex"`` (one FlexAttention call with a block mask made from
    the spans; CUDA, or the CPU forward only: PyTorch's CPU FlexAttention has no backward)."""
    global _frame_kernel
    if name not in FRAME_KERNELS:
        raise ValueError(f"frame kernel {name!r}: valid choices are {', '.join(FRAME_KERNELS)}")
    saved, _frame_kernel = _frame_kernel, name
    try:
        yield
    finally:
        _frame_kernel = saved


def _span_keys(x: Tensor, ranges: tuple[tuple[int, int], ...]) -> Tensor:
    """``x[:, :, ranges]`` along the token axis: a view for one range, a copy for two."""
    parts = [x[:, :, c:d] for c, d in ranges]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def attend_spans(q: Tensor, k: Tensor, v: Tensor, spans: KeySpans, queries: int | None = None) -> Tensor:
    """Attention of ``[B, h, Lq, hd]`` queries under ``spans`` (module docstring, "Whole frames need no
    mask"): each run of queries attends its keys with no mask, through :func:`attend`; the outputs of the
    first ``queries`` queries only when given (``q`` then holds just those)."""
    if _frame_kernel == "flex":
        return _flex(q, k, v, spans)
    out = []
    for (a, b), ranges in zip(spans.queries, spans.keys, strict=True):
        if queries is not None and a >= queries:
            break
        b = b if queries is None else min(b, queries)
        out.append(attend(q[:, :, a:b], _span_keys(k, ranges), _span_keys(v, ranges), None))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


_BLOCK_MASKS: dict[tuple[Any, ...], Any] = {}
_FLEX: list[Any] = []  # the compiled flex_attention, made on first use


def _flex(q: Tensor, k: Tensor, v: Tensor, spans: KeySpans) -> Tensor:
    """The spans as one FlexAttention call over the ``q.shape[2]`` first queries: its block mask (per spans,
    query and key counts and device, cached) reads, for each query, the first and second key range of its
    run — O(L) tensors, no ``L × L`` mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    lq, lk = q.shape[2], k.shape[2]
    key = (spans, lq, lk, q.device)
    if key not in _BLOCK_MASKS:
        n = spans.queries[-1][1]
        lo, hi = torch.zeros(2, n, dtype=torch.long), torch.zeros(2, n, dtype=torch.long)
        for (a, b), ranges in zip(spans.queries, spans.keys, strict=True):
            for r, (c, d) in enumerate(ranges):
                lo[r, a:b], hi[r, a:b] = c, d
        lo, hi = lo[:, :lq].to(q.device), hi[:, :lq].to(q.device)

        def mask_mod(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
            return ((ki >= lo[0, qi]) & (ki < hi[0, qi])) | ((ki >= lo[1, qi]) & (ki < hi[1, qi]))

        _BLOCK_MASKS[key] = create_block_mask(mask_mod, None, None, lq, lk, device=str(q.device))
    fn = flex_attention
    if q.device.type == "cuda":
        if not _FLEX:
            _FLEX.append(torch.compile(flex_attention, dynamic=False))
        fn = _FLEX[0]
    out = fn(q, k, v, block_mask=_BLOCK_MASKS[key])
    assert isinstance(out, Tensor)
    return out


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
        attn_mask: AttnPattern,
        kv_cache: KVCache | None = None,
        queries: int | None = None,
    ) -> Tensor:
        """``x`` ``[B, L, D]``; ``rope`` from ``Rope3D`` (``[B or 1, 1, L, hd]``); ``attn_mask`` boolean or
        additive (:func:`attn_bias`), ``[B or 1, 1, L, L_k]``, :class:`KeySpans` (whole frames, no mask) or
        ``None``. ``queries``: the outputs of only the first ``queries`` tokens ``[B, queries, D]``, reading the
        keys and values of all (``None``: every token's)."""
        b, n, d = x.shape
        qkv = linear(x, self.qkv).view(b, n, 3, self.heads, d // self.heads)
        q, k, v = rotary_qkv(qkv, *rope)  # [B, h, L, hd] each
        if kv_cache is not None:
            k, v = kv_cache(k, v)  # [B, h, L_past + L, hd]
        if queries is not None:
            n = queries
            q = q[:, :, :n]
            if isinstance(attn_mask, Tensor):
                attn_mask = attn_mask[:, :, :n]
        if isinstance(attn_mask, KeySpans):
            y = attend_spans(q, k, v, attn_mask, queries)  # [B, h, L, hd]
        else:
            y = attend(q, k, v, attn_mask)  # [B, h, L, hd]
        return linear(y.transpose(1, 2).reshape(b, n, d), self.proj)
