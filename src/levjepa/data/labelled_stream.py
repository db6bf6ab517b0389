"""Labelled training clips for supervised training (``levjepa finetune``): sample position ``p`` -> an augmented
clip and its label, the same whatever the ranks or the restart, and the stream of one rank's micro-batches.

The run reads an endless stream of positions; step ``s`` holds positions ``[s · B, (s + 1) · B)`` (``B`` the
effective batch), split into ``G = B / micro_batch`` global micro-batches: micro-batch ``g`` holds the
positions ``s · B + g + G · j`` (``j < micro_batch``), and rank ``r`` of ``R``, accumulating ``A = G / R``
micro-batches, computes ``g = m · R + r`` as its ``m``-th (:func:`rank_positions`; every position of rank
``r`` is ``r`` modulo ``R``). What a micro-batch holds depends on ``g`` alone, not on ``(R, A)``, so its
draws keyed by ``g`` (``loop.train_step``) make 2 ranks compute the step of 1 rank accumulating 2 (the
micro-batch size the same; ``tests/test_finetune_distributed.py``). Position ``p`` is clip
``perm_e[p mod n]`` of epoch ``e = p // n`` (``perm_e`` a permutation drawn from ``(seed, "order", e)``), and
its augmentation is drawn from ``(seed, "augment", p)``: a resumed run, or one on another number of ranks,
sees the same clips (``tests/test_finetune.py`` resumes bit-exactly). :class:`TrainStream` decodes a rank's
positions in ``workers`` processes (``levjepa.data.workers.safe_map``): an unreadable file is reported in ``bad``
and its micro-batch is one clip short; a micro-batch no file of which could be read ends the run.

Augmentation (a subset of VideoMAE's fine-tuning augmentation: a random temporal window, a random resized crop, a
horizontal flip; its RandAugment and random erasing are not applied, ``loop.py`` lists what is not): the
window of ``frames`` frames at ``frame_stride`` (or ``fps``; the run's views) starts anywhere in the video;
the frames are resized to a short side of ``size`` (``levjepa.data.eval_clip``), then a square of
``crop_scale`` of the area at a random place is cut and resized back to ``size`` (the same box for every
frame), then flipped with ``flip_p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from levjepa.data.badfiles import BadFileReport, DataError
from levjepa.data.eval_clip import ViewSpec, load_eval_clip, random_resized_crop
from levjepa.data.sources import MediaItem
from levjepa.data.video import frame_step, probe_video
from levjepa.data.workers import safe_map
from levjepa.rng import make_generator

__all__ = ["Augment", "TrainClips", "TrainStream", "augment", "rank_positions"]


@dataclass(frozen=True)
class Augment:
    """The training clips' draws: ``seed`` (the order of each epoch, each position's augmentation), the random
    resized crop's area fraction ``crop_scale`` and the flip probability ``flip_p``."""

    seed: int
    crop_scale: tuple[float, float]
    flip_p: float


def rank_positions(steps: range, batch_size: int, micro: int, accum: int, rank: int, world_size: int) -> list[int]:
    """The positions rank ``rank`` of ``world_size`` reads over ``steps``, in the order it reads them: per step,
    its ``accum`` micro-batches of ``micro`` clips, the ``m``-th the global micro-batch ``m · world_size + rank``
    of the module doc."""
    count = accum * world_size  # global micro-batches per step
    return [
        s * batch_size + m * world_size + rank + count * j for s in steps for m in range(accum) for j in range(micro)
    ]


def augment(clip: Tensor, aug: Augment, gen: torch.Generator) -> Tensor:
    """uint8 ``[T, S, S, 3]`` -> the random resized crop and flip of the module doc, uint8 ``[T, S, S, 3]``."""
    return random_resized_crop(clip, aug.crop_scale, aug.flip_p, gen)


class TrainClips:
    """Position ``p`` -> its augmented uint8 clip ``[C, T, S, S]`` (see the module doc): called in decoding
    workers through ``levjepa.data.workers.safe_map``, which turns a file that cannot be read into a reason.
    ``item_at(p)`` (the same permutation, in any process) says which file position ``p`` is."""

    def __init__(self, items: list[MediaItem], aug: Augment, patch: int, views: ViewSpec) -> None:
        self.items, self.aug, self.patch, self.views = items, aug, patch, views
        self._perms: dict[int, list[int]] = {}

    def item_at(self, p: int) -> int:
        n = len(self.items)
        epoch = p // n
        if epoch not in self._perms:
            self._perms[epoch] = torch.randperm(n, generator=make_generator(self.aug.seed, "order", epoch)).tolist()
        return self._perms[epoch][p % n]

    def label(self, p: int) -> int:
        return int(self.items[self.item_at(p)].label or 0)

    def __call__(self, p: int) -> Tensor:
        it, v = self.items[self.item_at(p)], self.views
        gen = make_generator(self.aug.seed, "augment", p)
        start = 0
        if it.kind == "video":
            info = probe_video(it.path)
            step = frame_step(info.fps, v.frame_stride, v.fps)
            room = max(0, info.num_frames - (round((v.frames - 1) * step) + 1))
            start = int(torch.randint(0, room + 1, (), generator=gen))
        clip = load_eval_clip(
            it.path,
            num_frames=v.frames,
            size=v.size,
            patch=self.patch,
            frame_stride=v.frame_stride,
            start=start,
            kind=it.kind,
            target_fps=v.fps,
        )
        return augment(clip, self.aug, gen).permute(3, 0, 1, 2).contiguous()


class TrainStream:
    """The micro-batches of one rank for ``steps`` (module doc): per step ``accum`` micro-batches of ``micro``
    clips of the effective batch ``batch_size``, rank ``rank`` of ``world_size``."""

    def __init__(
        self,
        items: list[MediaItem],
        aug: Augment,
        views: ViewSpec,
        patch: int,
        *,
        steps: range,
        batch_size: int,
        micro: int,
        accum: int,
        rank: int,
        world_size: int,
        workers: int,
    ) -> None:
        self.micro, self.accum = micro, accum
        self.bad = BadFileReport()
        self.clips = TrainClips(items, aug, patch, views)
        positions = rank_positions(steps, batch_size, micro, accum, rank, world_size)
        self._stream = safe_map(self.clips, positions, workers)

    def next_step(self) -> list[tuple[Tensor, Tensor]]:
        """The next ``accum`` micro-batches (uint8 ``[B, C, T, S, S]``, labels ``[B]``)."""
        out = []
        for _ in range(self.accum):
            xs, ys = [], []
            for _ in range(self.micro):
                p, clip, err = next(self._stream)
                if clip is None:
                    self.bad.add(self.clips.items[self.clips.item_at(p)].path, err)
                    continue
                xs.append(clip)
                ys.append(self.clips.label(p))
            if not xs:
                raise DataError("unreadable: a whole micro-batch of training files could not be read")
            out.append((torch.stack(xs), torch.tensor(ys)))
        return out

    def close(self) -> None:
        """End the decoding workers."""
        self._stream.close()
