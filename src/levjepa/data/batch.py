"""What a loader worker ships per batch, and how it becomes views on the training device.

Two forms, one interface (``augment_to_device``, ``pin_memory``, ``bad_files``, ``index``, ``epoch``, ``step``):

* :class:`ViewBatch` (``data.resize_on="worker"``): the views are cut in the worker, uint8
  ``[G, B, C, T, Sg, Sg]`` and ``[V, B, C, T, Sl, Sl]``; the device only changes colours and normalises.
  Right for CPU training, where the "device" is the trainer's own core.
* :class:`FrameBatch` (``"device"``): the worker ships the decoded frames as FFmpeg produced them (uint8,
  channels last, no transposing copy), cropped to the union of the view boxes that read them, plus each
  view's crop box and flip; the device cuts and resizes every view (``resize.py``), then changes colours
  and normalises. Clips decoded together (``data.repeats``) share one frame span: ``frames`` holds ``F``
  spans, sample ``b`` reads ``frames[span[b], frame_index[b]]``. Bytes per clip of 1 × 224 + 4 × 96 views,
  16 frames, 256 × 454 source: at most 5.6 MB of frames (half with 2 clips per span; ``bench/data.md``
  gives the measured mean) instead of 4.2 MB of views. The worker no longer resizes (what that saved:
  ``bench/data.md``, "Each lever, and whether it stays").

Both give ``[global float [G, B, C, T, Sg, Sg], local float [V, B, C, T, Sl, Sl]]``, ImageNet-normalised,
the same numbers within one uint8 level (the worker rounds its resize to integers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from levjepa.data.resize import crop_resize
from levjepa.data.views import apply_photometric, normalize

__all__ = ["FrameBatch", "ViewBatch", "collate_views"]

_CHUNK = 16  # clips cut at once on the device


def _photometric_and_normalize(
    local: torch.Tensor, photometric: torch.Tensor, dtype: torch.dtype, non_blocking: bool
) -> torch.Tensor:
    """``local`` float [V, B, C, T, h, w] in [0, 1] → colour-changed, normalised (batched on its device)."""
    if local.shape[0] == 0:
        return normalize(local, dtype=dtype)
    v, b = local.shape[:2]
    params = photometric.to(local.device, non_blocking=non_blocking).reshape(v * b, -1)
    x = apply_photometric(local.reshape(v * b, *local.shape[2:]).to(dtype), params).reshape(local.shape)
    return normalize(x, dtype=dtype)


@dataclass
class ViewBatch:
    """One per-rank batch: uint8 view groups, the local views' photometric parameters, and provenance."""

    views: list[torch.Tensor]  # [global uint8 [G, B, C, T, Hg, Wg], local uint8 [V, B, C, T, Hl, Wl]]
    photometric: torch.Tensor  # float32 [V, B, 6] (PHOTOMETRIC_FIELDS of views.py)
    index: torch.Tensor  # int64 [B] positions in the epoch
    epoch: int
    step: int  # the global batch number
    bad_files: list[tuple[str, str]] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.index.numel())

    def pin_memory(self) -> ViewBatch:
        """The batch with its pixel tensors in pinned memory (the DataLoader's pin-memory thread calls it)."""
        return replace(self, views=[v.pin_memory() for v in self.views], photometric=self.photometric.pin_memory())

    def augment_to_device(
        self, device: torch.device | str, *, non_blocking: bool = True, dtype: torch.dtype = torch.float32
    ) -> list[torch.Tensor]:
        """``[global float [G, B, C, T, H, W], local float [V, B, C, T, h, w]]`` on ``device``: the local group
        photometrically changed (in batch, by ``photometric``), then every view ImageNet-normalised."""
        glob, local = (v.to(device, non_blocking=non_blocking) for v in self.views)
        local = local.to(dtype) / 255.0
        return [normalize(glob, dtype=dtype), _photometric_and_normalize(local, self.photometric, dtype, non_blocking)]


@dataclass
class FrameBatch:
    """One per-rank batch of decoded frames and view boxes; the views are cut on the device (module doc)."""

    frames: torch.Tensor  # uint8 [F, U, H, W, C]: F decoded spans (zero-padded to the batch's largest)
    span: torch.Tensor  # int64 [B]: the span of each sample
    frame_index: torch.Tensor  # int64 [B, T]: its frames within the span
    boxes: torch.Tensor  # int64 [G + V, B, 4]: (top, left, h, w) of every view, global views first
    flips: torch.Tensor  # bool [V, B]: horizontal flip of each local view
    photometric: torch.Tensor  # float32 [V, B, 6]
    sizes: tuple[int, int, int]  # (num_global, global_size, local_size)
    index: torch.Tensor  # int64 [B] positions in the epoch
    epoch: int
    step: int
    bad_files: list[tuple[str, str]] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.index.numel())

    def pin_memory(self) -> FrameBatch:
        """The batch with its frames and photometric parameters in pinned memory."""
        return replace(self, frames=self.frames.pin_memory(), photometric=self.photometric.pin_memory())

    def augment_to_device(
        self, device: torch.device | str, *, non_blocking: bool = True, dtype: torch.dtype = torch.float32
    ) -> list[torch.Tensor]:
        """The same views as :meth:`ViewBatch.augment_to_device`, cut from the frames on ``device``."""
        num_global, global_size, local_size = self.sizes
        frames = self.frames.to(device, non_blocking=non_blocking)
        span, frame_index = self.span.to(frames.device), self.frame_index.to(frames.device)
        boxes, flips = self.boxes.to(frames.device), self.flips.to(frames.device)
        glob, local = [], []
        for lo in range(0, span.shape[0], _CHUNK):  # bounded scratch memory: ~1 GB per 16 clips of 256x454
            part = frames[span[lo : lo + _CHUNK, None], frame_index[lo : lo + _CHUNK]]  # [b, T, H, W, C]
            glob.append(crop_resize(part, boxes[:num_global, lo : lo + _CHUNK], global_size))
            local.append(
                crop_resize(part, boxes[num_global:, lo : lo + _CHUNK], local_size, flips[:, lo : lo + _CHUNK])
            )
        glob_t, local_t = torch.cat(glob, 1) / 255.0, torch.cat(local, 1) / 255.0
        return [
            normalize(glob_t, dtype=dtype),
            _photometric_and_normalize(local_t, self.photometric, dtype, non_blocking),
        ]


def _shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor, in shared memory when built in a DataLoader worker (as ``default_collate`` does), so
    that handing the batch to the trainer does not copy it once more."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * torch.empty((), dtype=dtype).element_size())
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def _collate_frames(samples: list[dict[str, Any]]) -> FrameBatch:
    """Each span is shipped cropped to the union of its samples' view boxes (pixels no view reads stay in the
    worker; the boxes are shifted to match), then zero-padded to the batch's largest."""
    spans: list[torch.Tensor] = []
    span_of: dict[int, int] = {}
    for s in samples:  # samples decoded together hold the very same tensor
        if id(s["frames"]) not in span_of:
            span_of[id(s["frames"])] = len(spans)
            spans.append(s["frames"])
    span = torch.tensor([span_of[id(s["frames"])] for s in samples], dtype=torch.int64)
    boxes = torch.stack([s["boxes"] for s in samples], 1)  # [G + V, B, 4]
    crops = []
    for k in range(len(spans)):
        mine = boxes[:, span == k].reshape(-1, 4)
        y0, x0 = int(mine[:, 0].min()), int(mine[:, 1].min())
        y1, x1 = int((mine[:, 0] + mine[:, 2]).max()), int((mine[:, 1] + mine[:, 3]).max())
        crops.append(spans[k][:, y0:y1, x0:x1])
        boxes[:, span == k, 0] -= y0
        boxes[:, span == k, 1] -= x0
    shape = tuple(max(f.shape[d] for f in crops) for d in range(4))
    frames = _shared_empty((len(crops), *shape), torch.uint8)
    for k, f in enumerate(crops):
        u, h, w = f.shape[:3]
        frames[k, :u, :h, :w] = f
        frames[k, u:] = 0  # zero only the padding (no view reads it; zeros keep batches reproducible)
        frames[k, :u, h:] = 0
        frames[k, :u, :h, w:] = 0
    first = samples[0]
    return FrameBatch(
        frames=frames,
        span=span,
        frame_index=torch.stack([s["frame_index"] for s in samples]),
        boxes=boxes,
        flips=torch.stack([s["flips"] for s in samples], 1),
        photometric=torch.stack([s["photometric"] for s in samples], 1),
        sizes=first["sizes"],
        index=torch.tensor([s["position"] for s in samples], dtype=torch.int64),
        epoch=first["epoch"],
        step=first["step"],
        bad_files=[pair for s in samples for pair in s["bad_files"]],
    )


def collate_views(samples: list[dict[str, Any]]) -> ViewBatch | FrameBatch:
    """Stack per-sample views along a new batch dim 1 (``[G, C, T, H, W]`` × B → ``[G, B, C, T, H, W]``), or,
    for samples that carry frames, build a :class:`FrameBatch`."""
    if "frames" in samples[0]:
        return _collate_frames(samples)
    return ViewBatch(
        views=[torch.stack([s["global"] for s in samples], 1), torch.stack([s["local"] for s in samples], 1)],
        photometric=torch.stack([s["photometric"] for s in samples], 1),
        index=torch.tensor([s["position"] for s in samples], dtype=torch.int64),
        epoch=samples[0]["epoch"],
        step=samples[0]["step"],
        bad_files=[pair for s in samples for pair in s["bad_files"]],
    )
