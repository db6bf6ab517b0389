"""What an extraction keeps of each window beyond its CLS and mean: the *readouts* downstream models read.

Definitions, on one window's frozen output (``levjepa.infer.encode``): CLS ``c`` [D] and the patch tokens
``p`` [T', h, w, D] — ``T'`` temporal slots (frames / tubelet), ``h × w`` patches a slot, time-major — every
value float32 as the encoder gave it. ``D`` is the encoder's readout width: with readout layers (``extract
--layers``, ``levjepa.model.readout_layers``) every channel-wise definition below reads the blocks' concatenated
channels, each block's part pooled as one block's alone would be (a codec's one scale per token spans every
block's channels; its groups of 32 channels stay inside a block when ``dim`` is a multiple of 32):

* ``cls = c`` and ``mean = mean_{t,y,x} p`` [D] — always kept (the default extraction);
* ``frames`` [T', D] — ``frames[t] = mean_{y,x} p[t]``: per-frame (per-slot) spatially pooled tokens, float32;
* ``last`` — the last temporal slot, array ``last_mean`` [D] = ``frames[T' − 1]``, float32. Its CLS is
  ``cls``: CLS attends every patch token of the window, which are exactly the tokens of the frames up to and
  including the last slot (the CLS a streaming reader reads after the last slot; ``levjepa.infer.stream``).
  Its tokens are the ``last`` token codec below;
* ``tokens`` — a token codec (``levjepa.features.compact.TokenCodec``, the probes' compact stores' code, one
  implementation): CLS then the patch tokens reduced and stored as the codec says, ``[kept, D]`` —
  ``last`` (the last slot's ``h·w`` tokens), ``pool2`` / ``pool<k>`` (``k × k`` spatial average pooling:
  14 × 14 → 7 × 7 at ``k = 2``), ``tpool<k>``, ``int8``, ``int4g32``, joined (``pool2-last``,
  ``tpool3-int4g32``). The arrays are the codec's ``tokens`` (float16, or int8 / packed int4) and ``scales``;
  ``levjepa.features.feature_set.FeatureSet.read("tokens", rows)`` returns them as float16 (restored, a ``rot``
  codec's rotation undone). The codec reduces the float16 tokens a feature store keeps, so an extraction's
  tokens are the bytes a compact store of the same codec holds for the same view.

The patch tokens themselves (``patches`` [T'·h·w, D] float16) stay ``ExtractConfig.patches`` (``--patch``).
A feature set records its readout in its manifest (``store.json``'s ``config``: ``readout`` and
``token_codec``, written only when asked for, so a default extraction's manifest is the one it always was);
the reader refuses an array the manifest does not hold in one line (``FeatureSet.read``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from levjepa.config import ConfigError, check
from levjepa.features.compact import TokenCodec

__all__ = ["READOUTS", "Readout"]

READOUTS = ("frames", "last")  # the pooled readouts by name (--readout); tokens: a codec (--tokens)


@dataclass(frozen=True)
class Readout:
    """The readouts kept besides ``cls`` and ``mean`` (module doc)."""

    frames: bool = False  # per-slot pooled patch tokens [T', D] float32 ("frames")
    last: bool = False  # the last slot's pooled patch token [D] float32 ("last_mean")
    tokens: str | None = None  # a TokenCodec name: CLS + the codec's patch tokens ("tokens", "scales")

    def __post_init__(self) -> None:
        if self.tokens is not None:
            check(isinstance(self.tokens, str), f"readout.tokens={self.tokens!r}: a token codec name, e.g. pool2-int8")
            TokenCodec.parse(self.tokens)  # raises ConfigError naming --tokens and the valid parts

    @classmethod
    def parse(cls, names: str | None, tokens: str | None = None) -> Readout:
        """``--readout frames,last`` (any of :data:`READOUTS`, comma-separated; empty or None: none) and
        ``--tokens CODEC``."""
        picked = [n.strip() for n in (names or "").split(",") if n.strip()]
        bad = [n for n in picked if n not in READOUTS]
        if bad:
            raise ConfigError(f"--readout {names!r}: valid readouts are {', '.join(READOUTS)} (comma-separated)")
        return cls("frames" in picked, "last" in picked, tokens)

    @property
    def codec(self) -> TokenCodec | None:
        return None if self.tokens is None else TokenCodec.parse(self.tokens)

    @property
    def default(self) -> bool:
        """Nothing but ``cls`` and ``mean``."""
        return self == Readout()

    def arrays(self) -> list[str]:
        """The arrays these readouts add to a feature set, in write order."""
        out = (["frames"] if self.frames else []) + (["last_mean"] if self.last else [])
        codec = self.codec
        if codec is not None:
            out += ["tokens"] + (["scales"] if codec.bits < 16 else [])
        return out

    def storage(self) -> dict[str, object]:
        """What the manifest's ``config`` records (only what is asked for: module doc)."""
        out: dict[str, object] = {}
        names = [n for n in READOUTS if getattr(self, n)]
        if names:
            out["readout"] = names
        if self.codec is not None:
            out["token_codec"] = self.codec.name
        return out

    def slot_dependent(self) -> bool:
        """Whether an array's shape depends on the number of temporal slots (``frames``; a codec keeping every
        slot)."""
        codec = self.codec
        return self.frames or (codec is not None and codec.slots == "all")

    def compute(self, tokens: Tensor, grid: tuple[int, int, int]) -> dict[str, Tensor]:
        """The readouts' arrays of ``tokens`` [B, 1 + T'·h·w, D] (CLS first, time-major patches; float32 for the
        pooled readouts' exactness) whose patches form ``grid`` = (T', h, w) (module doc)."""
        t, h, w = grid
        b, length, d = tokens.shape
        if length != 1 + t * h * w:
            raise ValueError(f"Readout.compute: {length} tokens are not CLS + {t}×{h}×{w} patches")
        out: dict[str, Tensor] = {}
        if self.frames or self.last:
            frames = tokens[:, 1:].float().reshape(b, t, h * w, d).mean(2)  # [B, T', D]
            if self.frames:
                out["frames"] = frames
            if self.last:
                out["last_mean"] = frames[:, -1].contiguous()
        codec = self.codec
        if codec is not None:  # the compact store's path: float16 tokens, reduced, then stored
            out.update(codec.encode(codec.reduce(tokens.to(torch.float16), grid)))
        return out
