"""A labelled task on disk: TRAIN, VAL (and TEST) split files read and checked once, for every reader of
labelled files (frozen probes at dataset scale, ``levjepa.eval.dataset_task``; fine-tuning,
``levjepa.finetune``).

Each split file is an index (``path label``), a Kinetics CSV or a Something-Something v2 JSON
(``levjepa.eval.protocols.read_labelled``, which also gives the class names when rows are labelled by name;
TRAIN's names number the classes of VAL and TEST). Checked before any decoding, each in one line naming the
file: two or three split files; a label on every row, a class number >= 0 (no ``-1`` for "unlabelled"); at
least two classes in TRAIN; no VAL or TEST label that TRAIN never has (a
probe or classifier cannot learn a class it never saw); with a benchmark's class count, every label in range;
no file in two splits (paths compared after normalisation). A shared file is refused rather than warned of:
a probe trained on a VAL file and chosen on it scores it perfectly, and without TEST that score is the number
reported, a wrong result that a warning in a long job's log does not stop from travelling (kept probes,
``--out``); deliberate overlaps (TRAIN given as VAL for a sanity check) pass ``allow_shared=True``
(``--allow-shared-files``, fine-tuning's ``allow_shared_files=true``), and the task then records the overlap
(:attr:`LabelledTask.shared`) for the result to state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from levjepa.data import DataError, MediaItem
from levjepa.eval.protocols import read_labelled

__all__ = ["SPLITS", "LabelledTask", "read_task", "shared_files"]

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class LabelledTask:
    """The labelled files of each split, the split files they came from, and the class names in index order
    (index files labelled by integers: the integers as text)."""

    splits: dict[str, list[MediaItem]]
    paths: dict[str, str]
    label_names: tuple[str, ...]
    shared: dict[str, int] = field(default_factory=dict)  # "train/val" -> files in both (allow_shared only)

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
    allow_shared: bool = False,
) -> LabelledTask:
    """Read and check ``TRAIN, VAL[, TEST]`` (module doc). ``num_classes``: a benchmark's class count (``what``
    names where it came from, for the error); otherwise the largest label + 1 (at least 2). ``allow_shared``:
    splits that share files are read (the overlap in ``shared``) instead of refused."""
    if len(paths) not in (2, 3):
        raise DataError(f"unreadable: index task: expected TRAIN,VAL[,TEST] files, got {len(paths)}: {list(paths)}")
    names = {s: str(p) for s, p in zip(SPLITS, paths, strict=False)}
    splits: dict[str, list[MediaItem]] = {}
    classes: dict[str, int] | None = None
    for split, path in names.items():
        splits[split], found = read_labelled(path, video_root=video_root, classes=classes, labels_file=labels_file)
        classes = classes or found
    for split, items in splits.items():
        _check_labels(names[split], items)
    top = max(int(it.label or 0) for items in splits.values() for it in items)
    count = num_classes if num_classes is not None else max(2, top + 1)
    if top >= count:
        where = next(f"{names[s]} ({it.path})" for s, items in splits.items() for it in items if it.label == top)
        raise DataError(
            f"unreadable: label {top} of {where} is out of range for {what}: {count} classes, 0..{count - 1}"
        )
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
    shared = shared_files(splits)
    if shared and not allow_shared:
        pair, (count_shared, example) = next(iter(shared.items()))
        a, b = pair.split("/")
        raise DataError(
            f"unreadable: {names[a]} and {names[b]} share {count_shared} file(s) (e.g. {example}): a probe or "
            f"classifier would be scored on files it trained on; remove them from one split, or pass "
            "--allow-shared-files (fine-tuning: allow_shared_files=true) to run anyway, the result saying so"
        )
    by_index = {i: n for n, i in (classes or {}).items()}
    counts = {pair: n for pair, (n, _) in shared.items()}
    return LabelledTask(splits, names, tuple(by_index.get(i, str(i)) for i in range(count)), counts)


def _check_labels(path: str, items: list[MediaItem]) -> None:
    """Every label of the split file ``path`` is a class number >= 0 (``read_labelled`` refused a row without
    one): refused in one line otherwise, naming the file, how many rows and the first of them (a -1 would reach
    the loss after every file was encoded)."""
    negative = [it for it in items if int(it.label or 0) < 0]
    if negative:
        raise DataError(
            f"unreadable: {path}: {len(negative)} row(s) have a negative label (e.g. {negative[0].path} "
            f"{negative[0].label}): labels are class numbers 0, 1, 2, ...; leave unlabelled files out of the split"
        )


def shared_files(splits: dict[str, list[MediaItem]]) -> dict[str, tuple[int, str]]:
    """``"train/val"`` -> (how many files both splits hold, one of them), for every pair of splits that share
    files; paths are compared normalised (``a/./b.mp4`` is ``a/b.mp4``), nothing is read from disk."""
    paths = {s: {os.path.normpath(it.path) for it in items} for s, items in splits.items()}
    names = list(paths)
    out: dict[str, tuple[int, str]] = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = paths[a] & paths[b]
            if both:
                out[f"{a}/{b}"] = (len(both), min(both))
    return out
