"""Compact token stores: how much of every output token the attentive probe's features keep.

A feature store keeps, for the attentive probe, every output token of every view in float16: ``(1 + L) · D · 2``
bytes per view (ViT-B, 16×224², L = 3136 per-frame patches: 4.8 MB; the ImageNet train set at ViT-L with 16
repeats: ~8 TB). A :class:`TokenCodec` says what is kept instead, and every path that gives the attentive probe
its tokens applies the same codec — feature stores on disk (``levjepa.features.store``), features in memory
(``levjepa.eval.clips_task``), and a kept probe at inference (``levjepa.eval.predict``, which reads the codec
from the classifier's record) — so a probe is deployed on the numbers it was trained on:

* ``pool=k`` — the patch tokens of each temporal slot averaged over ``k × k`` spatial neighbours
  (``k²`` times fewer; a grid side not divisible by ``k`` gets overlapping windows, ``adaptive_avg_pool2d``);
* ``tpool=k`` — the patch tokens of ``k`` consecutive temporal slots averaged (``k`` times fewer; a last
  group shorter than ``k`` is averaged as it is);
* ``slots="last"`` — only the last temporal slot's patch tokens (for image protocols, where every slot shows
  the same frame and the last one, block-causal, has seen them all: ``T'`` times fewer);
* ``bits=8`` — every token as int8 with one float16 scale per token, ``round(127 · x / max|x|)``
  (symmetric, per token: ``D + 2`` bytes instead of ``2 D``, about half);
* ``bits=4`` — the same at 4 bits, ``round(7 · x / max|x|)``, two values packed in a byte (``D / 2 + 2``
  bytes, about a quarter; ``D`` even, as every ViT width is);
* ``group=g`` (``int4g32``) — one float16 scale per group of ``g`` consecutive channels instead of one per token
  (``D / g`` scales: ``D / 2 + 2 D / g`` bytes at 4 bits): a channel 100× the others then coarsens the steps of
  its own group only, not of the whole token;
* ``rotate`` (``rot``) — the channels turned by a fixed orthonormal matrix ``R`` before quantising and turned back
  after, ``x̂ = Q(x R) Rᵀ``: ``R = diag(s) · (I ⊗ H_b)``, ``H_b`` the normalised Sylvester–Hadamard matrix of the
  largest power of two ``b`` dividing ``D`` (``b = D`` for 128, 256 for 768), ``s`` a fixed ±1 sign per channel
  (splitmix64 of the channel index, no RNG state). An outlier channel is spread over ``b`` channels, so the
  absmax scale of the rest is no longer set by it (QuaRot's trick); the signs keep a near-constant token from
  landing in one channel. No bytes added; a store of it needs :meth:`TokenCodec.restore` to read (the
  codec's instance, which knows ``R``), where the other codecs also read with the static
  :meth:`TokenCodec.decode`; its scales are stored negated, so that ``decode`` refuses them rather than
  return the rotated values.

Error bound of every integer codec, per token: ``‖x̂ − x‖₂ ≤ ½ √(Σ_c step_c²)`` with ``step_c`` the scale that
quantised channel ``c`` (plus float16 rounding of the scale and the output); without ``rot`` also per channel,
``|x̂_c − x_c| ≤ step_c / 2``. A scale is never below float16's smallest normal number (:data:`SCALE_MIN`,
6.1e-5): a group whose largest value is under ``127 · SCALE_MIN`` ≈ 7.8e-3 (int8; ``7 · SCALE_MIN`` ≈ 4.3e-4 for
int4) is quantised with that step, so its error is at most ``SCALE_MIN / 2`` a channel, absolute rather than
relative to its size (a subnormal scale would round by up to half itself and break the bound).

CLS is always kept as the first token. The codecs are named ``full``, ``pool2``, ``int8``, ``int4``, ``pool2-int8``,
``tpool2-int4``, ``last``, ``last-int8``, ``tpool3-rot-int4g32``, ... (:meth:`TokenCodec.parse`). Their bytes
per view and their accuracy against the full store are measured in ``bench/eval.md`` ("Compact stores"; where
they can fail, and which codec holds: "Codecs where they can fail (issue 53)").
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa.config import ConfigError

__all__ = ["FULL", "SCALE_MIN", "TokenCodec", "grid_of", "rotation"]

SCALE_MIN = torch.finfo(torch.float16).tiny  # the smallest stored scale: float16's smallest normal (module doc)


@dataclass(frozen=True)
class TokenCodec:
    """What a store keeps of the tokens (module doc)."""

    pool: int = 1  # spatial average pooling of each slot's patch tokens, pool × pool -> 1
    slots: Literal["all", "last"] = "all"  # every temporal slot, or the last one's patch tokens only
    bits: Literal[16, 8, 4] = 16  # float16, or int8 / packed int4 with a float16 scale per token
    tpool: int = 1  # temporal average pooling: tpool consecutive slots -> 1
    group: int = 0  # channels per float16 scale (int8 / int4); 0 = one scale per token
    rotate: bool = False  # turn the channels by the fixed orthonormal R before quantising (module doc)

    def __post_init__(self) -> None:
        if self.pool < 1 or self.tpool < 1 or self.slots not in ("all", "last") or self.bits not in (16, 8, 4):
            raise ConfigError(f"token codec {self}: pool, tpool >= 1, slots all or last, bits 16, 8 or 4")
        if self.group < 0 or (self.bits == 16 and (self.group or self.rotate)):
            raise ConfigError(f"token codec {self}: group scales and rot quantise: they need int8 or int4")

    @classmethod
    def parse(cls, text: str) -> TokenCodec:
        """``full``, ``pool2``, ``int8``, ``int4g32``, ``rot``, ``last``, or several joined by ``-``
        (``pool2-int8``, ``tpool3-rot-int4g32``)."""
        pool, slots, bits, tpool, group, rotate = 1, "all", 16, 1, 0, False
        for part in [p for p in text.split("-") if p] if text != "full" else []:
            bits_part = re.fullmatch(r"int(8|4)(?:g([1-9][0-9]*))?", part)
            if part.startswith("pool") and part[4:].isdigit() and int(part[4:]) >= 1:
                pool = int(part[4:])
            elif part.startswith("tpool") and part[5:].isdigit() and int(part[5:]) >= 1:
                tpool = int(part[5:])
            elif part == "last":
                slots = "last"
            elif part == "rot":
                rotate = True
            elif bits_part:
                bits, group = int(bits_part[1]), int(bits_part[2] or 0)
            else:
                raise ConfigError(
                    f"--tokens {text!r}: full, or any of pool<k> (spatial pooling), tpool<k> (temporal pooling), "
                    "last (the last temporal slot), int8 or int4 (8- or 4-bit tokens; int4g<g>: a scale per g "
                    "channels), rot (channels rotated before quantising) joined by '-', e.g. pool2-int8"
                )
        if rotate and bits == 16:
            raise ConfigError(f"--tokens {text!r}: rot turns the channels before quantising: add int8 or int4")
        return cls(pool, slots, bits, tpool, group, rotate)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        parts = [f"tpool{self.tpool}"] if self.tpool > 1 else []
        parts += ([f"pool{self.pool}"] if self.pool > 1 else []) + (["last"] if self.slots == "last" else [])
        parts += (["rot"] if self.rotate else []) + ([f"int{self.bits}"] if self.bits < 16 else [])
        if self.group:
            parts[-1] += f"g{self.group}"
        return "-".join(parts) or "full"

    @property
    def lossless(self) -> bool:
        return self == FULL

    def kept(self, grid: tuple[int, int, int]) -> int:
        """Tokens kept of a view whose patches form ``grid`` (T', h, w): CLS and the reduced patches."""
        t, h, w = grid
        side = (math.ceil(h / self.pool), math.ceil(w / self.pool))
        return 1 + (1 if self.slots == "last" else math.ceil(t / self.tpool)) * side[0] * side[1]

    def scales_per_token(self, dim: int) -> int:
        """Float16 scales kept per token of width ``dim`` (0 for float16 tokens)."""
        if self.bits == 16:
            return 0
        if self.group and dim % self.group:
            raise ValueError(f"token codec {self.name}: groups of {self.group} channels do not divide width {dim}")
        return dim // self.group if self.group else 1

    def bytes_per_view(self, grid: tuple[int, int, int], dim: int) -> int:
        """Bytes a store keeps of one view's tokens (values and scales)."""
        values = {16: dim * 2, 8: dim, 4: math.ceil(dim / 2)}[self.bits]
        return self.kept(grid) * (values + 2 * self.scales_per_token(dim))

    def reduce(self, tokens: Tensor, grid: tuple[int, int, int]) -> Tensor:
        """``[N, 1 + T'·h·w, D]`` (CLS first, time-major patches) -> ``[N, kept, D]``: the slots and the spatial
        pooling of the codec, in the tokens' dtype (pooling computed in float32)."""
        t, h, w = grid
        n, length, d = tokens.shape
        if length != 1 + t * h * w:
            raise ValueError(f"TokenCodec.reduce: {length} tokens are not CLS + {t}×{h}×{w} patches")
        if self.pool == 1 and self.tpool == 1 and self.slots == "all":
            return tokens
        patches = tokens[:, 1:].reshape(n, t, h, w, d)
        if self.slots == "last":
            patches, t = patches[:, -1:], 1
        if self.tpool > 1:
            groups = [patches[:, i : i + self.tpool].float().mean(1) for i in range(0, t, self.tpool)]
            patches, t = torch.stack(groups, 1).to(tokens.dtype), len(groups)
        if self.pool > 1:
            x = patches.float().permute(0, 1, 4, 2, 3).reshape(n * t, d, h, w)
            x = F.adaptive_avg_pool2d(x, (math.ceil(h / self.pool), math.ceil(w / self.pool)))
            patches = x.reshape(n, t, d, *x.shape[-2:]).permute(0, 1, 3, 4, 2).to(tokens.dtype)
        return torch.cat([tokens[:, :1], patches.reshape(n, -1, d)], 1)

    def encode(self, tokens: Tensor) -> dict[str, Tensor]:
        """Reduced tokens -> the arrays a store writes: ``tokens`` float16; or int8 ``tokens`` (int4: uint8, two
        values a byte, the even channel in the low nibble) + float16 ``scales``: ``[N, kept]`` with one scale per
        token, ``[N, kept, D / g]`` with groups of ``g`` channels. With ``rot`` the values are those of ``x R``."""
        if self.bits == 16:
            return {"tokens": tokens.to(torch.float16)}
        d = tokens.shape[-1]
        if self.bits == 4 and d % 2:
            raise ValueError(f"int4 tokens pack two channels a byte: width {d} is odd")
        groups = self.scales_per_token(d)
        top = 2 ** (self.bits - 1) - 1  # 127 or 7
        x = tokens.float() @ rotation(d) if self.rotate else tokens.float()
        x = x.unflatten(-1, (groups, d // groups))  # [N, kept, G, g]
        scale = (x.abs().amax(-1) / top).clamp_min(SCALE_MIN).to(torch.float16)  # [N, kept, G], as stored
        q = (x / scale.float()[..., None]).round().clamp(-top, top).to(torch.int8).flatten(-2)
        if self.bits == 4:
            nib = (q + 8).to(torch.uint8)  # 1..15
            q = nib[..., 0::2] | (nib[..., 1::2] << 4)
        scale = -scale if self.rotate else scale  # the sign bit marks rotated values (decode refuses them)
        return {"tokens": q, "scales": scale if self.group else scale.squeeze(-1)}

    @staticmethod
    def decode(tokens: Tensor, scales: Tensor | None) -> Tensor:
        """A store's arrays back to float16 tokens: int8 and packed int4 ones times their float16 scales (one
        per token, ``[N, kept]``, or one per group of channels, ``[N, kept, G]``). Not for ``rot`` codecs, whose
        values must be turned back: :meth:`restore` reads every codec. A ``rot`` codec stores its scales negated
        (the sign bit says "rotated"), so that this reader refuses them instead of returning ``x R``."""
        if scales is not None and bool(torch.signbit(scales).any()):
            raise ValueError(
                "TokenCodec.decode: these tokens were rotated (a 'rot' codec, negative scales): read them with "
                "TokenCodec.parse(codec_name).restore(tokens, scales)"
            )
        return _dequantise(tokens, scales).to(torch.float16)

    def restore(self, tokens: Tensor, scales: Tensor | None) -> Tensor:
        """A store of this codec's arrays back to float16 tokens (:meth:`decode`, then ``Rᵀ`` with ``rot``)."""
        if not self.rotate:
            return self.decode(tokens, scales)
        if scales is None or not bool(torch.signbit(scales).all()):
            raise ValueError(f"token codec {self.name}: these arrays were not written by a 'rot' codec")
        x = _dequantise(tokens, -scales)
        return (x @ rotation(x.shape[-1]).T).to(torch.float16)

    def roundtrip(self, tokens: Tensor, grid: tuple[int, int, int]) -> Tensor:
        """What a probe reads of ``tokens`` under this codec: reduced, stored and read back (float16)."""
        arrays = self.encode(self.reduce(tokens, grid))
        return self.restore(arrays["tokens"], arrays.get("scales"))


FULL = TokenCodec()


def _dequantise(tokens: Tensor, scales: Tensor | None) -> Tensor:
    """Stored values times their scales, float32 (float16 tokens as they are)."""
    if scales is None:
        return tokens.float()
    if tokens.dtype == torch.uint8:  # packed int4
        low, high = (tokens & 15).to(torch.int8) - 8, (tokens >> 4).to(torch.int8) - 8
        tokens = torch.stack([low, high], -1).flatten(-2)
    if scales.dim() == tokens.dim():  # one scale per group of channels: [N, kept, G]
        return (tokens.float().unflatten(-1, (scales.shape[-1], -1)) * scales.float()[..., None]).flatten(-2)
    return tokens.float() * scales.float()[..., None]


def _splitmix64(i: int) -> int:
    z = (i * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=8)
def rotation(dim: int) -> Tensor:
    """The ``rot`` codecs' fixed orthonormal ``R`` [dim, dim], float32 (module doc): ``diag(s) · (I ⊗ H_b)``, ``b``
    the largest power of two dividing ``dim``, ``s_c = ±1`` from bit 0 of splitmix64(c). A function of ``dim``
    only, exactly (entries ``±1/√b``), so a store is read back with the matrix that wrote it."""
    block = dim & -dim
    h = torch.ones(1, 1)
    while h.shape[0] < block:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.tensor([1.0 - 2.0 * (_splitmix64(c) & 1) for c in range(dim)])
    return signs[:, None] * torch.block_diag(*[h] * (dim // block)) / math.sqrt(block)


def grid_of(positions: Tensor) -> tuple[int, int, int]:
    """The token grid (T', h, w) of a whole view's patch positions ``[..., L, 3]`` (nothing dropped)."""
    top = positions.reshape(-1, 3).amax(0)
    return int(top[0]) + 1, int(top[1]) + 1, int(top[2]) + 1
