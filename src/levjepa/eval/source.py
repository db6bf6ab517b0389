"""Where probes read their inputs: one interface over frozen features in memory or in a feature store on disk.

A **feature source** is the samples of one split. Sample ``i`` has, per task, a label, and three inputs a
probe may read (``levjepa.eval.config.PROBE_INPUTS``): ``tokens`` [S·(1+L), D] (CLS then every patch token,
float16), ``mean`` [D] (the patch tokens averaged) and ``cls`` [D]. The probe trainer
(``levjepa.eval.trainer``) and kNN (``levjepa.eval.knn``) see nothing else, so the same loop trains from
either source.

* :class:`MemorySource` — features computed once into memory (``levjepa.features.cache``): one sample per
  clip, one view.
* :class:`StoreSource` — a feature store on disk (``levjepa.features.store``) read batch by batch with
  ``pread``, so memory does not grow with the number of clips. A sample is one (file, crop): the rows of its
  ``segments`` clips for that crop. Its tokens are those of all its segments concatenated
  ``[segments · (1+L), D]`` (V-JEPA 2's multi-clip evaluation concatenates the clips' tokens); its ``mean``
  and ``cls`` are the segments' averaged. A file's ``crops`` samples are consecutive: at evaluation their
  class probabilities are averaged and accuracy counts files (V-JEPA 2 averages its views' softmax outputs).
  kNN reads each file's CLS averaged over every view.

  **Augmented training views.** A store of ``K`` augmented views per file (``train_views`` in its settings,
  rows with a ``view`` field; ``levjepa.features.store``) has one sample per file whose rows change with the
  epoch: :meth:`FeatureSource.set_epoch` (called by the trainer at the start of every epoch) makes epoch ``e``
  read view ``e mod K`` of every file. Chosen over a per-file offset or a seeded draw because then a store of
  ``K ≥ epochs`` views gives, epoch for epoch, the very pixels ``probe --online`` draws (both take view ``k =
  epoch`` from ``ViewKey(seed, item, k)``), and every probe of the pass reads the same rows. Before
  any ``set_epoch`` (the standardizer, a dimension) it reads view 0.
* :class:`SeedSources` — one source per probe seed block (``--seeds N`` with augmented views: block ``s`` reads
  the views drawn with seed ``seed + s``, :meth:`FeatureSource.seed_view`), so each block is the run
  ``--seed seed+s`` makes alone.

Memory of a store source: the index (a few int64 per row) plus the batch asked for; kNN keeps every file's
CLS vector (N × D float32), which is what kNN is.

**Choice: tokens stored once and streamed** by default, not the frozen encoder re-run every epoch. At ViT-B
(D = 768), 16×224² clips (1 + 1568 tokens), one view, per 10k clips: 24 GB of float16 tokens on disk
(+ 61 MB of CLS / mean) and one batch in memory (64 × 1569 × 768 × 4 B = 0.31 GB in fp32) plus the grid.
Re-running the encoder instead costs, per 10k clips and 20 epochs, 200k decodes and ≈ 7×10^16 FLOPs, every
time a grid is trained; stored tokens are computed once and shared by every probe, grid and seed. The
deviation from V-JEPA 2's protocol this implies: its training clips are random-resized-crop augmented each
epoch; a store's are its fixed views. Two other sources cover what a store cannot: a compact store keeps
fewer or smaller tokens (``levjepa.features.compact``, ``probe --tokens``), and
:class:`levjepa.eval.online.OnlineSource` runs the encoder every epoch with that augmentation (``probe
--online``: V-JEPA 2's protocol, no token stored).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from levjepa.features.feature_set import FeatureSet

__all__ = ["FeatureSource", "MemorySource", "Samples", "SeedSources", "StoreSource", "samples"]


class FeatureSource(ABC):
    """The samples of one split: per-task labels (int64 [N]) and :meth:`read` of any batch of inputs."""

    name: str  # what the source is (a store's path), for error messages
    labels: dict[str, Tensor]  # task -> int64 [N], one label per sample
    crops: int = 1  # consecutive samples of one file; their probabilities are averaged at evaluation

    def __len__(self) -> int:
        return len(next(iter(self.labels.values())))

    @property
    def files(self) -> int:
        return len(self) // self.crops

    @abstractmethod
    def read(self, what: str, idx: Tensor) -> Tensor:
        """Input ``what`` (``tokens``, ``mean``, ``cls``) of samples ``idx`` (int64 [B]): [B, ...]."""

    @abstractmethod
    def file_cls(self) -> Tensor:
        """Every file's CLS averaged over its views: float32 [files, D] (kNN's input)."""

    def file_labels(self, task: str) -> Tensor:
        return self.labels[task][:: self.crops]

    def dim(self, what: str) -> int:
        return int(self.read(what, torch.zeros(1, dtype=torch.int64)).shape[-1])

    def set_epoch(self, epoch: int) -> None:
        """Called by the trainer at the start of epoch ``epoch``: a source whose samples change per epoch
        (augmented views) picks that epoch's; the others ignore it."""
        return None

    def seed_view(self, block: int) -> FeatureSource:
        """The training samples seed block ``block`` of ``--seeds N`` reads (``levjepa.eval.trainer``): the views
        ``--seed seed+block`` alone would read. Fixed views are the same for every seed: this source."""
        return self

    def info(self) -> dict[str, Any]:
        """What a probe result records about where it was trained."""
        return {}

    def close(self) -> None:  # noqa: B027 (a source in memory has nothing to release)
        """Release open files."""


class SeedSources(FeatureSource):
    """One source per seed block (``sources[s]``: the augmented views drawn with seed ``seed + s``, e.g. a K-view
    store per view seed): block 0's answers everything, :meth:`seed_view` gives block ``s`` its own."""

    def __init__(self, sources: list[FeatureSource]):
        if not sources or len({len(s) for s in sources}) != 1:
            raise ValueError("SeedSources: one source per seed block, all of the same samples")
        self.sources = sources
        first = sources[0]
        self.name, self.labels, self.crops = first.name, first.labels, first.crops

    def read(self, what: str, idx: Tensor) -> Tensor:
        return self.sources[0].read(what, idx)

    def file_cls(self) -> Tensor:
        return self.sources[0].file_cls()

    def dim(self, what: str) -> int:
        return self.sources[0].dim(what)

    def set_epoch(self, epoch: int) -> None:
        self.sources[0].set_epoch(epoch)

    def seed_view(self, block: int) -> FeatureSource:
        return self.sources[block]

    def info(self) -> dict[str, Any]:
        return self.sources[0].info()

    def close(self) -> None:
        for s in self.sources:
            s.close()


class MemorySource(FeatureSource):
    """Inputs held as tensors (``inputs[what]``: [N, ...]), one view per sample."""

    def __init__(self, inputs: Mapping[str, Tensor | None], labels: Mapping[str, Tensor], name: str = "memory"):
        self.inputs = {k: v for k, v in inputs.items() if v is not None}
        self.labels = {t: y.long() for t, y in labels.items()}
        self.name = name
        n = {len(v) for v in self.inputs.values()} | {len(y) for y in self.labels.values()}
        if len(n) != 1:
            raise ValueError(f"{name}: inputs and labels of different lengths {sorted(n)}")

    def read(self, what: str, idx: Tensor) -> Tensor:
        if what not in self.inputs:
            if what == "tokens":
                raise ValueError("the attentive probe needs every token: compute the features with keep_tokens=True")
            raise ValueError(f"{self.name}: no input {what!r} (have {', '.join(self.inputs)})")
        return self.inputs[what][idx]

    def file_cls(self) -> Tensor:
        return self.inputs["cls"]

    def info(self) -> dict[str, Any]:
        return {"trained_with_tasks": list(self.labels)}


@dataclass(frozen=True)
class Samples:
    """The samples of a store: ``rows[i]`` = the store rows of sample i (its segments, in order); a store of
    ``K`` augmented views has ``view_rows[k, i]``, the rows of view ``k`` (``rows`` is view 0's)."""

    rows: np.ndarray  # int64 [N, segments]
    labels: np.ndarray  # int64 [N]
    file: np.ndarray  # int64 [N]: the item id, shared by the crops of one file
    view_rows: np.ndarray | None = None  # int64 [K, N, segments], augmented views only

    def __len__(self) -> int:
        return len(self.labels)


def train_views(store: FeatureSet) -> int:
    """``K``, the augmented views per file of ``store`` (0: its fixed views)."""
    return int(store.config.get("train_views", 0))


def samples(store: FeatureSet) -> Samples:
    """One sample per (file, crop) of ``store`` (see the module doc)."""
    segments, crops, k = int(store.config["segments"]), int(store.config["crops"]), max(1, train_views(store))
    first = np.nonzero((store.segment == 0) & (store.crop == 0))[0][::k]  # first row of each file
    if len(first) * k * segments * crops != len(store):
        raise ValueError(
            f"{store.path}: {len(store)} rows are not {k} view(s) × {segments} segments × {crops} crops per file"
        )
    base = np.repeat(first, crops) + np.tile(np.arange(crops), len(first))  # [files · crops]
    rows = base[:, None] + crops * np.arange(segments)[None, :]
    if (store.labels[first] < 0).any():
        raise ValueError(f"{store.path}: some rows have no label; a probe needs a labelled store")
    labels, file = np.repeat(store.labels[first], crops), np.repeat(store.item[first], crops)
    if not train_views(store):
        return Samples(rows.astype(np.int64), labels, file)
    view_rows = rows[None] + segments * np.arange(k)[:, None, None]  # [K, N, segments], view-major per file
    if not (store.column("view")[view_rows] == np.arange(k)[:, None, None]).all():
        raise ValueError(f"{store.path}: the rows of a file are not its {k} views, view-major")
    return Samples(rows.astype(np.int64), labels, file, view_rows.astype(np.int64))


class StoreSource(FeatureSource):
    """The samples of a complete feature store, labelled with task ``task`` (see the module doc)."""

    def __init__(self, store: FeatureSet, task: str = "labels", batch_rows: int = 4096):
        self.store, self.name = store, str(store.path)
        self.smp = samples(store)
        self.crops = int(store.config["crops"])
        self.views = int(store.config["segments"]) * self.crops
        self.labels = {task: torch.from_numpy(self.smp.labels)}
        self.batch_rows = batch_rows
        self.train_views = train_views(store)
        self.views *= max(1, self.train_views)  # rows per file
        self.rows = self.smp.rows  # this epoch's rows of every sample (set_epoch)

    def set_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` reads view ``epoch mod K`` of every file (module doc); fixed views: nothing."""
        if self.smp.view_rows is not None:
            self.rows = self.smp.view_rows[epoch % self.train_views]

    def read(self, what: str, idx: Tensor) -> Tensor:
        rows = self.rows[idx.numpy()]
        b, s = rows.shape
        if what == "tokens":
            t = torch.from_numpy(self.store.read("tokens", rows.reshape(-1)))  # [B·S, 1+L, D] float16
            return t.reshape(b, s * t.shape[1], t.shape[2])
        return torch.from_numpy(self.store.read(what, rows.reshape(-1))).reshape(b, s, -1).mean(1)

    def file_cls(self) -> Tensor:
        first = np.nonzero((self.store.segment == 0) & (self.store.crop == 0))[0][:: max(1, self.train_views)]
        per = max(1, self.batch_rows // self.views)
        out = []
        for i in range(0, len(first), per):
            rows = (first[i : i + per, None] + np.arange(self.views)[None, :]).reshape(-1)
            cls = torch.from_numpy(self.store.read("cls", rows))
            out.append(cls.reshape(len(rows) // self.views, self.views, -1).mean(1))
        return torch.cat(out)

    def info(self) -> dict[str, Any]:
        views = f"{self.train_views} augmented views per video" if self.train_views else "fixed centre crops"
        return {"from_disk": True, "train_samples": len(self), "train_views": views}

    def close(self) -> None:
        self.store.close()
