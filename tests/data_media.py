"""Small videos with known content, written with PyAV, for the data tests.

Two codings that survive H.264 (written near-lossless, crf 0) and any crop or resize:

* ``uniform``: frame k is one flat colour, ``(R, G, B) = 24 + 40·(k mod 6, ⌊k/6⌋ mod 6, ⌊k/36⌋ mod 6)``
  (216 distinct frames, steps of 40 levels); :func:`read_uniform` recovers k from any crop of the frame.
* ``pattern`` (bit-exact RGB H.264): frame k has a flat red level ``16 + 10·k`` (k < 24) over a static
  spatial pattern (green = horizontal ramp, blue = vertical ramp), so a view's frame index reads from its
  red channel and its crop box from its green/blue channels, which must then be the same in every frame.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from levjepa.data.encode import write_video

LOSSLESS = {"crf": "0", "preset": "ultrafast"}


def uniform_code(k: int) -> tuple[int, int, int]:
    return (24 + 40 * (k % 6), 24 + 40 * ((k // 6) % 6), 24 + 40 * ((k // 36) % 6))


def uniform_frames(num_frames: int, height: int = 48, width: int = 64) -> np.ndarray:
    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    for k in range(num_frames):
        frames[k] = uniform_code(k)
    return frames


def read_uniform(frames: torch.Tensor | np.ndarray, channel_dim: int = -1) -> list[int]:
    """Frame indices of uniform-coded frames ``[T, ..., 3]`` (channel dim given), from each frame's mean."""
    x = torch.as_tensor(np.asarray(frames)).to(torch.float64).movedim(channel_dim, -1)
    means = x.reshape(x.shape[0], -1, 3).mean(1)
    digits = torch.round((means - 24) / 40).clamp(0, 5).to(torch.int64)
    return (digits[:, 0] + 6 * digits[:, 1] + 36 * digits[:, 2]).tolist()


def pattern_frames(num_frames: int, height: int = 48, width: int = 64) -> np.ndarray:
    assert num_frames <= 24
    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    frames[..., 1] = np.linspace(20, 235, width).round().astype(np.uint8)[None, None, :]
    frames[..., 2] = np.linspace(20, 235, height).round().astype(np.uint8)[None, :, None]
    for k in range(num_frames):
        frames[k, ..., 0] = 16 + 10 * k
    return frames


def read_pattern_index(view: torch.Tensor) -> list[int]:
    """Frame indices of a pattern-coded view ``[C, T, H, W]`` (uint8), from the red channel's mean."""
    red = view[0].to(torch.float64).mean(dim=(-2, -1))
    return torch.round((red - 16) / 10).to(torch.int64).tolist()


def write_uniform(path: Path, num_frames: int, *, fps: float = 30.0, height: int = 48, width: int = 64, **kw) -> Path:
    write_video(path, uniform_frames(num_frames, height, width), fps=fps, options=LOSSLESS, **kw)
    return path


def write_pattern(path: Path, num_frames: int, *, fps: float = 30.0, height: int = 48, width: int = 64) -> Path:
    # H.264 in RGB (libx264rgb, crf 0): bit-exact, so a view's green/blue channels pin its crop exactly
    frames = pattern_frames(num_frames, height, width)
    write_video(path, frames, fps=fps, codec="libx264rgb", options=LOSSLESS, pix_fmt="rgb24")
    return path
