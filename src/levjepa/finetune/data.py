"""Fine-tuning's data: the labelled task, the training stream of a rank, and the evaluation of a split.

* :class:`Task`: the splits and class names of the ``TRAIN, VAL[, TEST]`` index files
  (``levjepa.eval.labelled.read_task``: one class, or a VAL / TEST label TRAIN never has, is refused) and the
  views validation and test files are cut into (the model's clips, or a protocol's views: ``FinetuneConfig.views``).
* :class:`TrainStream`: the augmented training clips of one rank, step after step (``clips.py``: which clip
  each position is, keyed so that a resumed run or another number of ranks sees the same ones), decoded in
  ``workers`` processes (``levjepa.data.workers.safe_map``); an unreadable file is reported in ``bad`` and its
  micro-batch is one clip short; a micro-batch no file of which could be read ends the run.
* :func:`evaluate`: top-1 accuracy of a split with ``levjepa.eval.predict`` (the views of the task: every
  segment and crop, as ``levjepa classify`` reads files).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from levjepa.data import BadFileReport, DataError, MediaItem
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.workers import safe_map
from levjepa.eval.labelled import LabelledTask, read_task
from levjepa.eval.predict import accuracy, predict
from levjepa.finetune.clips import Augment, TrainClips, rank_positions
from levjepa.model.classifier import VideoClassifier

__all__ = ["Task", "TrainStream", "evaluate", "open_task"]


@dataclass
class Task:
    """The labelled files and their class names, and the views validation and test files are cut into."""

    files: LabelledTask
    views: ViewSpec

    @property
    def labels(self) -> tuple[str, ...]:
        return self.files.label_names

    @property
    def splits(self) -> dict[str, list[Any]]:
        return self.files.splits


def open_task(files: tuple[str, ...], views: ViewSpec, *, allow_shared: bool = False) -> Task:
    """The split files read and checked (``levjepa.eval.labelled.read_task``; ``allow_shared``: splits that
    share files are read, not refused)."""
    return Task(read_task(files, allow_shared=allow_shared), views)


def evaluate(model: VideoClassifier, task: Task, split: str, *, workers: int, device: str) -> float:
    """Top-1 accuracy (%) of ``model`` on ``split`` (evaluated in eval mode, left in training mode)."""
    model.eval()
    preds = list(predict(model, task.labels, task.views, task.splits[split], top_k=1, workers=workers,
                         device=device))  # fmt: skip
    model.train()
    acc = accuracy(preds)
    if acc is None:
        raise DataError(f"unreadable: no file of the {split} split could be read")
    return acc


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
