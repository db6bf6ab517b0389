"""Online probes: the frozen encoder runs every epoch, for when no token store fits (``probe --online``).

A feature store computes every token of every view once and the probes train from disk (``levjepa.eval.source``).
When the tokens do not fit — the ImageNet train set at ViT-L is terabytes even compact (``bench/eval.md``) —
V-JEPA 2's evaluation runs the frozen encoder on every batch instead, with the protocol's train-time
augmentation, so every epoch sees new crops. :class:`OnlineSource` is that: the ``tokens`` of a batch of samples
are decoded (in worker processes, ``levjepa.data.workers.safe_map``), augmented — training split: the one
frozen-evaluation train transform, ``levjepa.data.eval_clip.load_train_views`` (``levjepa.data.clip_augment``:
V-JEPA 2's temporal starts per segment, RandAugment, a random resized crop of 8–100 % of the area at aspect
3/4–4/3 and random erasing, the same for all frames of a segment, no flip), epoch ``e`` drawing view ``k = e``
from ``ViewKey(seed, item, e)`` — the very views a store of ``K ≥ epochs`` augmented views holds
(``levjepa.features.store``) — and encoded by
the one frozen forward (``levjepa.infer.encode``) when the trainer asks for them. Validation and test views
are the protocol's, unaugmented. The small inputs (``mean``,
``cls``, for the linear probes and kNN) still come from a store without tokens.

Every probe of a grid reads the same batch in one forward of the stacked grid (``levjepa.eval.trainer``), so the
encoder runs once per view and epoch for the whole attentive grid: ``epochs`` forwards per training view, one
per validation and test view. With ``--seeds N`` seed block ``s`` reads its own batches of its own views,
drawn with seed ``seed + s`` (:meth:`OnlineSource.seed_view`: the run ``--seed seed+s`` makes alone), so every
(item, epoch, seed) view is encoded once: ``N`` times the training views an epoch. ``levjepa probe --plan``
prints these counts and the time they take.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Literal

import torch
from torch import Tensor

from levjepa.data import DataError, MediaItem
from levjepa.data.clip_augment import ViewKey
from levjepa.data.eval_clip import ViewSpec, load_train_views
from levjepa.data.workers import safe_map
from levjepa.eval.source import FeatureSource, StoreSource
from levjepa.infer.encode import encode
from levjepa.model.vit import VideoEncoder

__all__ = ["OnlineSource"]

_Key = tuple[str, Literal["video", "image"], int, int]  # a sample: path, kind, item, crop


def _views(views: ViewSpec, patch: int, augment: bool, seed: int, epoch: int, key: _Key) -> Tensor:
    """The views of one sample ``key = (path, kind, item, crop)`` in a worker: its ``segments`` clips of that
    crop, uint8 ``[segments, C, T, S, S]``, augmented for training (view ``epoch`` of the item). (The key carries
    the file, so a worker is sent one sample, not the split's list of files.)"""
    path, kind, item, crop = key
    if augment:
        return load_train_views(path, views, patch, ViewKey(seed, item, epoch), kind)
    every = views.load(path, patch, kind)  # [segments · crops, ...], segment-major
    return every[crop :: views.crops]


class OnlineSource(FeatureSource):
    """The samples of a store without tokens (``store``: their labels, ``mean`` and ``cls``), whose ``tokens``
    the frozen ``encoder`` computes when they are read (module doc)."""

    def __init__(
        self,
        store: StoreSource,
        items: list[MediaItem],
        views: ViewSpec,
        encoder: VideoEncoder,
        *,
        augment: bool,
        seed: int = 0,
        device: str = "cpu",
        workers: int = 2,
        batch_size: int = 8,
    ) -> None:
        self.store, self.items, self.views, self.encoder = store, items, views, encoder
        self.augment, self.seed, self.device, self.workers = augment, seed, device, workers
        self.batch_size = batch_size
        self.name, self.labels, self.crops = f"{store.name} (tokens online)", store.labels, store.crops
        self.epoch = 0  # the trainer's epoch (set_epoch): the view every read of it draws
        self._forwards = [0]  # views encoded so far, by this source and its seed views together

    @property
    def forwards(self) -> int:
        return self._forwards[0]

    def read(self, what: str, idx: Tensor) -> Tensor:
        if what != "tokens":
            return self.store.read(what, idx)
        keys: list[_Key] = []
        for i in idx.tolist():
            item = int(self.store.smp.file[i])
            keys.append((self.items[item].path, self.items[item].kind, item, int(i) % self.crops))
        load = functools.partial(_views, self.views, self.encoder.cfg.patch_size, self.augment, self.seed, self.epoch)
        samples: list[Tensor] = []
        for key, views, reason in safe_map(load, keys, self.workers if len(keys) > 1 else 0):
            if views is None:  # the store read this file: it became unreadable since
                raise DataError(f"unreadable: {key[0]}: {reason}")
            samples.append(views)
        every = torch.cat(samples)  # [samples · segments, C, T, S, S]: encoded batch_size views at a time
        step = self.batch_size
        parts = [encode(self.encoder, every[j : j + step], self.device).tokens for j in range(0, len(every), step)]
        tokens = torch.cat([t for t in parts if t is not None])  # [samples · segments, 1 + L, D] float16
        self._forwards[0] += len(every)
        return tokens.reshape(len(samples), -1, tokens.shape[-1])  # each sample's segments, one after another

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def seed_view(self, block: int) -> FeatureSource:
        """The same samples with views drawn from seed ``seed + block`` (its own epoch; the forwards counted
        together)."""
        if block == 0 or not self.augment:
            return self
        other = copy.copy(self)
        other.seed, other.epoch = self.seed + block, 0
        return other

    def dim(self, what: str) -> int:
        return self.encoder.num_features if what == "tokens" else self.store.dim(what)  # no forward to ask it

    def file_cls(self) -> Tensor:
        return self.store.file_cls()

    def info(self) -> dict[str, Any]:
        views = "augmented every epoch (online)" if self.augment else self.store.info().get("train_views")
        return {**self.store.info(), "online": True, "encoder_forwards": self.forwards, "train_views": views}

    def close(self) -> None:
        self.store.close()
