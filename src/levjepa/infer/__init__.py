"""Inference-time encoders: :class:`StreamingEncoder` (block-causal KV cache, frame by frame)."""

from __future__ import annotations

from levjepa.infer.stream import StreamingEncoder

__all__ = ["StreamingEncoder"]
