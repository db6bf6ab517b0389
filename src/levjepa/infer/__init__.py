"""Inference-time encoders: :class:`StreamingEncoder` (block-causal KV cache, frame by frame) and
:func:`stream_video` (a decoded video through it, with per-frame latencies)."""

from __future__ import annotations

from levjepa.infer.stream import StreamingEncoder, stream_video

__all__ = ["StreamingEncoder", "stream_video"]
