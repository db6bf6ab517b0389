"""Crop and resize views on the training device: antialiased bilinear resizing as two matrix products.

The fast loader path (``data.resize_on="device"``) ships each clip's decoded frames (uint8, channels last,
as FFmpeg produced them) with one crop box per view, and cuts the views on the device, where the
photometric change already runs. This file is that cut.

**The equation.** Resizing a crop ``(top, left, h, w)`` of a frame ``X`` [H, W] to ``S × S`` with
antialiased bilinear interpolation (PyTorch's ``F.interpolate(mode="bilinear", antialias=True,
align_corners=False)``, the PIL filter) is separable and linear:

    view = A_y · X · A_xᵀ,    A_y [S, H],  A_x [S, W]

Row ``i`` of ``A_y`` holds the filter weights of output row ``i``: with ``scale = h / S``,
``support = max(scale, 1)``, ``center = scale · (i + 0.5)``, the taps are the crop rows
``j ∈ [⌊center − support + 0.5⌋₊, min(⌊center + support + 0.5⌋, h))``, weighted by the triangle
``max(0, 1 − |(j − center + 0.5) / max(scale, 1)|)`` and normalised to sum 1, then shifted by ``top``
into frame coordinates (zero outside the crop). ``A_x`` is the same with ``(left, w)``; a horizontal
flip reverses the rows of ``A_x``. This is exactly PyTorch's antialiased kernel (checked to 1e-15 in
float64 by ``tests/test_data_resize.py``), so the device path differs from the worker path (uint8 kernel,
rounded to integers) only by that rounding: at most one uint8 level, measured in ``bench/data.md``.

**Cost.** Per view and frame, ``S·H·3W + S·W·3S`` multiply-adds (full-frame matrices, no gather): about
5 GMAC per clip of 1 global 224 + 4 local 96 views of 16 frames from 256 × 454 frames, i.e. ~3 % of a
ViT-B/16 training step's FLOPs, run as ``2·(G+V)`` batched matrix products per batch. On CUDA the
products run in float16 (uint8 values are exact in float16; the weights carry a relative error of
2⁻¹¹, i.e. < 0.13 of a level on a 255 value) and accumulate in float32; on the CPU in float32.
"""

from __future__ import annotations

import torch

__all__ = ["crop_resize", "resize_matrices"]


def resize_matrices(
    start: torch.Tensor, length: torch.Tensor, full: int, size: int, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Antialiased bilinear weights ``[N, size, full]`` that resize the slices ``[start, start + length)``
    of an axis of ``full`` samples to ``size`` samples (see the module docstring). ``start`` and
    ``length`` are integer tensors ``[N]``."""
    if start.shape != length.shape or start.dim() != 1:
        raise ValueError(f"resize_matrices: start {tuple(start.shape)} and length {tuple(length.shape)}: expected [N]")
    device = start.device
    length_f = length.to(torch.float64)[:, None, None]  # [N, 1, 1]
    scale = length_f / size
    support = torch.clamp(scale, min=1.0)
    center = scale * (torch.arange(size, device=device, dtype=torch.float64)[None, :, None] + 0.5)  # [N, S, 1]
    rel = torch.arange(full, device=device, dtype=torch.float64)[None, None, :] - start.to(torch.float64)[:, None, None]
    lo = torch.clamp(torch.floor(center - support + 0.5), min=0.0)
    hi = torch.minimum(torch.floor(center + support + 0.5), length_f)
    weight = torch.clamp(1.0 - ((rel - center + 0.5) / support).abs(), min=0.0)
    weight = torch.where((rel >= lo) & (rel < hi), weight, torch.zeros_like(weight))
    weight = weight / weight.sum(-1, keepdim=True)
    return weight.to(dtype)


def crop_resize(
    frames: torch.Tensor, boxes: torch.Tensor, size: int, flips: torch.Tensor | None = None
) -> torch.Tensor:
    """Cut ``N`` views of every clip: ``frames`` uint8 (or float) ``[B, T, H, W, C]`` channels last, ``boxes``
    int ``[N, B, 4]`` = ``(top, left, h, w)``, ``flips`` bool ``[N, B]`` → float32 (float64 for float64
    frames) ``[N, B, C, T, size, size]`` in the frames' value range (0–255 for uint8: /255 for [0, 1]).

    Equal to cropping, then ``F.interpolate(..., mode="bilinear", antialias=True)``, then flipping (module
    docstring). Runs on ``frames.device``: float16 products on CUDA, float64 for float64 frames, else float32.
    """
    if frames.dim() != 5:
        raise ValueError(f"crop_resize: frames of shape {tuple(frames.shape)}, expected [B, T, H, W, C]")
    b, t, h, w, c = frames.shape
    if boxes.dim() != 3 or boxes.shape[1:] != (b, 4):
        raise ValueError(f"crop_resize: boxes of shape {tuple(boxes.shape)}, expected [N, {b}, 4]")
    if frames.dtype == torch.float64:
        compute = torch.float64
    else:
        compute = torch.float16 if frames.device.type == "cuda" else torch.float32
    out_dtype = torch.float64 if compute == torch.float64 else torch.float32
    boxes = boxes.to(frames.device, torch.int64)
    x = frames.to(compute).permute(0, 2, 1, 3, 4).reshape(b, h, t * w * c)  # [B, H, T·W·C]
    views = []
    for n in range(boxes.shape[0]):
        a_y = resize_matrices(boxes[n, :, 0], boxes[n, :, 2], h, size, dtype=compute)  # [B, S, H]
        a_x = resize_matrices(boxes[n, :, 1], boxes[n, :, 3], w, size, dtype=compute)  # [B, S, W]
        if flips is not None:
            a_x = torch.where(flips[n].to(frames.device, torch.bool)[:, None, None], a_x.flip(1), a_x)
        rows = torch.bmm(a_y, x).view(b, size, t, w, c)  # [B, S(y), T, W, C]
        rows = rows.permute(0, 3, 1, 2, 4).reshape(b, w, size * t * c)  # [B, W, S(y)·T·C]
        out = torch.bmm(a_x, rows).view(b, size, size, t, c)  # [B, S(x), S(y), T, C]
        views.append(out.permute(0, 4, 3, 2, 1).to(out_dtype))  # [B, C, T, S(y), S(x)]
    if not views:
        return torch.empty(0, b, c, t, size, size, device=frames.device, dtype=out_dtype)
    return torch.stack(views)
