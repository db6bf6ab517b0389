"""A labelled task on disk: TRAIN, VAL (and TEST) split files read and checked once, for every reader of
labelled files (frozen probes at dataset scale, ``levjepa.eval.dataset_task``; fine-tuning,
``levjepa.finetune``).

Each split file is an index (``path label``), a Kinetics CSV or a Something-Something v2 JSON
(``levjepa.eval.protocols.read_labelled``, which also gives the class names when rows are labelled by name;
TRAIN's names number the classes of VAL and TEST). Checked before any decoding, each in one line naming the
file: two or three split files; at least two classes in TRAIN; no VAL or TEST label that TRAIN never has (a
probe or classifier cannot learn a class it never saw); with a benchmark's class count, every label in range.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from levjepa.data import DataError, MediaItem
from levjepa.eval.protocols import read_labelled

__all__ = ["SPLITS", "LabelledTask", "read_task"]

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class LabelledTask:
    """The labelled files of each split, the split files they came from, and the class names in index order
    (index files labelled by integers: the integers as text)."""

    splits: dict[str, list[MediaItem]]
    paths: dict[str, str]
    label_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.label_names)


def read_task(
    paths: Sequence[str | os.PathLike[str]],
    *,
    video_root: str | None = None,
    labels_file: str | None = None,
    num_classes: int | None = None,
    what: str = "--protocol",
) -> LabelledTask:
    """Read and check ``TRAIN, VAL[, TEST]`` (module doc). ``num_classes``: a benchmark's class count (``what``
    names where it came from, for the error); otherwise the largest label + 1 (at least 2)."""
    if len(paths) not in (2, 3):
        raise DataError(f"unreadable: index task: expected TRAIN,VAL[,TEST] files, got {len(paths)}: {list(paths)}")
    names = {s: str(p) for s, p in zip(SPLITS, paths, strict=False)}
    splits: dict[str, list[MediaItem]] = {}
    classes: dict[str, int] | None = None
    for split, path in names.items():
        splits[split], found = read_labelled(path, video_root=video_root, classes=classes, labels_file=labels_file)
        classes = classes or found
    top = max(int(it.label or 0) for items in splits.values() for it in items)
    count = num_classes if num_classes is not None else max(2, top + 1)
    if top >= count:
        raise DataError(f"unreadable: a label {top} is out of range for {what} ({count} classes)")
    seen = {int(it.label or 0) for it in splits["train"]}
    if len(seen) < 2:
        raise DataError(f"unreadable: {names['train']}: every row has the label {seen.pop()}: need >= 2 classes")
    for split in ("val", "test"):
        unseen = sorted({int(it.label or 0) for it in splits.get(split, [])} - seen)
        if unseen:
            raise DataError(
                f"unreadable: {names[split]}: label(s) {unseen[:5]} never occur in TRAIN {names['train']}: a probe "
                "or classifier cannot learn a class it never saw"
            )
    by_index = {i: n for n, i in (classes or {}).items()}
    return LabelledTask(splits, names, tuple(by_index.get(i, str(i)) for i in range(count)))
