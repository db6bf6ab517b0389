"""Encoding frames into video files with PyAV: :class:`VideoWriter` and :func:`write_video`.

Used by ``prepare`` (re-encoding for training), the tests and the benchmarks. Decoding lives in
``video.py``; this file only writes. ``width`` and ``height`` must be even for ``yuv420p`` (x264's 4:2:0
chroma); ``keyint`` is the maximum distance between key frames (the GOP size); ``options`` go to the
encoder as they are (e.g. ``{"crf": "23", "preset": "veryfast", "x264-params": "bframes=1"}``), and
``metadata`` to the container (mp4 keeps ``comment``; ``prepare`` marks its fixed-GOP files there).
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any

import av
import numpy as np
import torch

__all__ = ["VideoWriter", "write_video"]


class VideoWriter:
    """Encode RGB frames to a video file (h264 in mp4 by default; width and height even for yuv420p).

    ``options`` are passed to the encoder (e.g. ``{"crf": "23", "preset": "veryfast"}``); ``keyint`` sets
    the maximum distance between key frames (the GOP size).
    """

    def __init__(
        self,
        path: str | os.PathLike | Any,
        *,
        width: int,
        height: int,
        fps: float = 30.0,
        codec: str = "libx264",
        options: dict[str, str] | None = None,
        keyint: int | None = None,
        container_format: str | None = None,
        pix_fmt: str = "yuv420p",
        metadata: dict[str, str] | None = None,
    ) -> None:
        if pix_fmt == "yuv420p" and (width % 2 or height % 2):
            raise ValueError(f"VideoWriter: width={width}, height={height}: both must be even for yuv420p")
        self.path = path if hasattr(path, "write") else os.fspath(path)  # a path, or a binary file object
        self.width, self.height = width, height
        self.rate = Fraction(fps).limit_denominator(100_000)
        self._container: av.container.OutputContainer | None = av.open(self.path, "w", format=container_format)
        for key, value in (metadata or {}).items():
            self._container.metadata[key] = value
        stream = self._container.add_stream(codec, rate=self.rate)
        assert isinstance(stream, av.VideoStream), f"{codec} is not a video codec"
        self._stream = stream
        self._stream.width, self._stream.height = width, height
        self._stream.pix_fmt = pix_fmt
        self._time_base = 1 / self.rate  # frame pts count frames; the muxer may change the stream's time base
        self._stream.time_base = self._time_base
        if keyint is not None:
            self._stream.codec_context.gop_size = keyint
        if options:
            self._stream.options = dict(options)
        self._count = 0

    def write(self, frame: np.ndarray | torch.Tensor | Any) -> None:
        """Append one frame: uint8 RGB ``[H, W, 3]`` (or an ``av.VideoFrame``)."""
        if isinstance(frame, torch.Tensor):
            frame = frame.numpy()
        if isinstance(frame, np.ndarray):
            if frame.shape != (self.height, self.width, 3) or frame.dtype != np.uint8:
                raise ValueError(
                    f"VideoWriter.write: got {frame.dtype} {frame.shape}, expected uint8 {(self.height, self.width, 3)}"
                )
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        frame.pict_type = av.video.frame.PictureType.NONE  # a decoded frame's type would force x264's choice
        frame.pts = self._count
        frame.time_base = self._time_base
        self._count += 1
        if self._container is None:
            raise ValueError("VideoWriter.write: the writer is closed")
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def close(self) -> None:
        if self._container is None:
            return
        try:
            for packet in self._stream.encode():
                self._container.mux(packet)
        finally:
            self._container.close()
            self._container = None

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_video(path: str | os.PathLike | Any, frames: np.ndarray | torch.Tensor, **options: Any) -> None:
    """Encode uint8 ``[T, H, W, 3]`` frames to ``path`` (even H and W for yuv420p); ``options`` are
    :class:`VideoWriter`'s (``fps=30.0``, ``codec``, ``options``, ``keyint``, ``pix_fmt``, ``container_format``,
    ``metadata``)."""
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"write_video: frames of shape {tuple(frames.shape)}, expected [T, H, W, 3]")
    with VideoWriter(path, width=frames.shape[2], height=frames.shape[1], **options) as writer:
        for frame in frames:
            writer.write(frame)
