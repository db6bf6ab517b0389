"""The ``index:TRAIN,VAL[,TEST]`` task: a user's labelled V-JEPA index files as :class:`LabelledSplits`.

Each row ``path label`` of an index file (videos or images; ``levjepa.data.sources.parse_index``) becomes one
clip through the evaluation transform (``levjepa.data.eval_clip.load_eval_clip``): the centre window of
``frames`` frames at ``frame_stride`` of a video, resized to a short side of ``size`` and centre-cropped to a
square multiple of the patch size, or an image repeated along time. Unreadable files are skipped and
reported in a :class:`levjepa.data.BadFileReport`; a split with no readable clip, or a row without an
integer label, is an error. The task is named ``labels`` and has ``max(label) + 1`` classes (at least 2).
"""

from __future__ import annotations

import hashlib
import json

import torch

from levjepa.data import BadFileReport, DataError
from levjepa.data.eval_clip import load_eval_clip
from levjepa.data.sources import parse_index
from levjepa.eval.benchmark import LabelledSplits

__all__ = ["load_index_splits"]


def load_index_splits(
    paths: list[str],
    *,
    frames: int = 16,
    frame_stride: int = 2,
    size: int = 224,
    patch: int = 16,
    bad_files: BadFileReport | None = None,
) -> LabelledSplits:
    """Clips and labels of V-JEPA index files ``[train, val(, test)]`` as one task named ``labels``."""
    if len(paths) not in (2, 3):
        raise ValueError(f"index task: expected TRAIN,VAL[,TEST] index files, got {len(paths)}: {paths}")
    report = bad_files if bad_files is not None else BadFileReport()
    clips, labels = {}, {}
    for split, path in zip(("train", "val", "test"), paths, strict=False):
        items = parse_index(path)
        unlabeled = [it.path for it in items if it.label is None]
        if unlabeled:
            raise ValueError(f"{path}: {len(unlabeled)} row(s) have no integer label, e.g. {unlabeled[0]!r}")
        xs, ys = [], []
        for it in items:
            try:
                clip = load_eval_clip(
                    it.path, num_frames=frames, frame_stride=frame_stride, size=size, patch=patch, kind=it.kind
                )
                xs.append(clip.permute(3, 0, 1, 2).contiguous())  # [C, T, S, S]
                ys.append(it.label)
            except (DataError, OSError, RuntimeError) as err:
                report.add(it.path, str(err))
        if not xs:
            raise ValueError(f"{path}: no readable clip ({report.total} bad file(s) so far)")
        clips[split] = torch.stack(xs)
        labels[split] = {"labels": torch.tensor(ys, dtype=torch.long)}
    num_classes = int(max(int(v["labels"].max()) for v in labels.values())) + 1
    key = hashlib.sha1(json.dumps([paths, frames, frame_stride, size, patch]).encode()).hexdigest()[:12]
    return LabelledSplits(clips, labels, {"labels": max(2, num_classes)}, f"index {paths[0]}", key=f"index-{key}")
