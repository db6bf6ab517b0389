"""Frozen features of a whole labelled dataset, computed in a stream and stored on disk in shards: the *store*
row cutter of the one feature-set format (``levjepa.features.feature_set``: manifest, index, layouts, done rule,
reader).

This is the dataset-scale path of ``levjepa probe --task index:...`` / ``--protocol``: nothing holds a split
in memory. Memory is bounded by the decode prefetch (``workers`` × 2 files), one forward batch and one
shard of features; the dataset's size only changes how many shards are written.

**Rows.** Each file is cut into the views of ``StoreConfig.views`` (a ``levjepa.data.eval_clip.ViewSpec``:
``segments`` clips of ``frames`` frames at ``frame_stride`` spread over the video × ``crops`` square crops,
at short side ``size``); one row per view, the rows of a file consecutive and segment-major, with the index
fields ``file, label, item, segment, crop``.

**Augmented training views** (``StoreConfig.train_views = K > 0``, ``probe --train-views K``): instead of its
centre crop, each file gets ``K`` augmented views — view ``k`` is ``levjepa.data.eval_clip.load_train_views``
drawn from ``ViewKey(view_seed, item, k)`` (V-JEPA's frozen-evaluation train transform,
``levjepa.data.clip_augment``: V-JEPA 2's temporal starts, RandAugment, random resized crop of 8–100 % at aspect
3/4–4/3, random erasing, no flip), so a view depends only on (seed, item, k), never on workers, ranks or a
restart. Its rows carry ``view = k``, view-major then segment (``crops`` must be 1), through the store's token
codec like any row; ``train_views``, ``view_seed`` and the transform's name are in the manifest's settings
(another K, seed or transform is another store). ``K = 0`` writes exactly the store it always did (no ``view``
field, same settings). The probe trainer reads one view per file and epoch
(``levjepa.eval.source.StoreSource.set_epoch``).

**The job** is the one fill job (``levjepa.features.fill``): files decoded in ``workers`` processes, a bad file
reported and skipped, the one frozen forward (``levjepa.infer.encode.encode``: the features the in-memory path
computes), units of ``shard_items`` files (layout ``npy``; shard ``k`` on rank ``k mod world_size``, its bytes
independent of the rank count: ``tests/test_feature_store.py``), done units skipped on a restart.

**Arrays**: ``cls-KKKKK.npy`` float32 [n, D] (CLS token), ``mean-KKKKK.npy`` float32 [n, D] (mean of the patch
tokens), ``tokens-KKKKK.npy`` float16 [n, 1+L, D] (CLS then every patch token, time-major) when ``tokens`` —
or, with a compact ``codec`` (``levjepa.features.compact``: ``pool2``, ``int8``, ...), the tokens it keeps,
int8 ones (int4: uint8, two a byte) with ``scales-KKKKK.npy``.

**Reading back**: ``levjepa.features.feature_set.FeatureSet`` reads any rows of any array
with ``os.pread`` into a fresh buffer (no memory map stays resident), which is how the probes train from disk
(``levjepa.eval.source.StoreSource``).

Cost at ViT-B (D = 768) per 10k clips of 16×224² (8·14·14 = 1568 patch tokens + CLS): float16 tokens
10k × 1569 × 768 × 2 B = **24 GB of disk** per view (SSv2's 2 × 3 test views: 6 rows per video);
``cls`` + ``mean`` 61 MB. Probe memory is one batch of tokens (64 × 1569 × 768 × 4 B = 0.3 GB in fp32)
plus the probe, whatever the number of clips.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from levjepa import distributed
from levjepa.config import check
from levjepa.data import DataError, MediaItem, clip_augment
from levjepa.data.clip_augment import ViewKey
from levjepa.data.eval_clip import ViewSpec, load_train_views
from levjepa.features.compact import FULL, TokenCodec, grid_of
from levjepa.features.fill import FileUnits, Row, fill, manifest
from levjepa.infer.encode import encode
from levjepa.model.vit import VideoEncoder

__all__ = ["StoreConfig", "StoreResult", "build_store"]


@dataclass(frozen=True)
class StoreConfig:
    """How each file becomes rows (``views``: one per segment × crop) and how the work is cut (module doc)."""

    views: ViewSpec = field(default_factory=ViewSpec)
    tokens: bool = True  # store the tokens the attentive probe reads
    codec: TokenCodec = FULL  # what of them: every token in float16, or a compact form (features/compact.py)
    batch_size: int = 8  # views per encoder forward
    workers: int = 2  # decoding processes (0: decode in this process)
    shard_items: int = 256  # files per shard
    train_views: int = 0  # K > 0: K augmented training views per file instead of the fixed views (module doc)
    view_seed: int = 0  # the seed of those views (ViewKey)

    def __post_init__(self) -> None:
        check(self.train_views >= 0, f"store.train_views={self.train_views}: must be >= 0 (0: fixed views)")
        check(
            self.train_views == 0 or self.views.crops == 1,
            f"store.train_views={self.train_views} with crops={self.views.crops}: augmented views have one crop",
        )
        check(self.batch_size >= 1, f"store.batch_size={self.batch_size}: must be >= 1")
        check(self.workers >= 0, f"store.workers={self.workers}: must be >= 0")
        check(self.shard_items >= 1, f"store.shard_items={self.shard_items}: must be >= 1")

    def storage(self) -> dict[str, Any]:
        """The settings that determine the stored bytes: the views, ``tokens`` and ``shard_items`` — not
        ``workers`` and ``batch_size``, which may change between a kill and a restart (a batch never crosses a
        shard, and per-row results do not depend on the batch on the CPU; on CUDA keep the batch size for
        bit-identical files). The views are ``ViewSpec.record`` (its unset options left out, so a store computed
        before them keeps its name)."""
        out: dict[str, Any] = {**self.views.record(), "tokens": self.tokens, "shard_items": self.shard_items}
        if self.tokens and not self.codec.lossless:  # likewise a compact form of the tokens
            out["token_codec"] = self.codec.name
        if self.train_views:  # augmented views: only then, so a fixed store keeps its settings and name
            out["train_views"] = self.train_views
            out["view_seed"] = self.view_seed
            out["train_transform"] = clip_augment.NAME  # the transform that drew them (another is another store)
        return out


@dataclass
class StoreResult:
    out_dir: str
    rows: int
    files: int
    bad_files: int
    shards_done: int  # computed by this process in this call
    shards_skipped: int  # already on disk
    seconds: float
    info: dict[str, Any] = field(default_factory=dict)


def _views(items: list[MediaItem], views: ViewSpec, patch: int, train_views: int, seed: int, i: int) -> Tensor:
    """Item ``i``'s views ``[segments·crops, C, T, S, S]`` (uint8), or with ``train_views = K`` its K augmented
    views ``[K·segments, C, T, S, S]`` (view-major), in a decoding worker."""
    if train_views:
        keys = [ViewKey(seed, i, k) for k in range(train_views)]
        return torch.cat([load_train_views(items[i].path, views, patch, key, items[i].kind) for key in keys])
    return views.load(items[i].path, patch, items[i].kind)


@dataclass
class _ViewRows:
    """The store's row cutter (``levjepa.features.fill.Cutter``): file × segment × crop, or K training views ×
    segment; the frozen forward, then the codec's form of the tokens."""

    encoder: VideoEncoder
    cfg: StoreConfig
    items: list[MediaItem]
    device: str

    def rows(self, i: int, views: Tensor) -> Iterator[Row]:
        it, spec = self.items[i], self.cfg.views
        for v in range(len(views)):
            if self.cfg.train_views:
                view, seg = divmod(v, spec.segments)
                row = {"file": it.path, "label": it.label, "item": i, "view": view, "segment": seg, "crop": 0}
            else:
                seg, crop = divmod(v, spec.crops)
                row = {"file": it.path, "label": it.label, "item": i, "segment": seg, "crop": crop}
            yield row, views[v]

    def forward(self, clips: Tensor) -> dict[str, Tensor | None]:
        enc = encode(self.encoder, clips, self.device, tokens=self.cfg.tokens)
        feats: dict[str, Tensor | None] = {"cls": enc.cls, "mean": enc.mean}
        if enc.tokens is not None:
            codec = self.cfg.codec
            feats.update(codec.encode(codec.reduce(enc.tokens, grid_of(enc.positions))))
        return feats


def build_store(
    encoder: VideoEncoder,
    items: list[MediaItem],
    out_dir: str | Path,
    cfg: StoreConfig = StoreConfig(),
    *,
    device: str = "cpu",
    progress: bool = False,
    desc: str = "features",
) -> StoreResult:
    """Compute (or finish computing) the feature store of ``items`` in ``out_dir``; every rank of a
    ``torchrun`` job calls it with the same arguments (see the module doc)."""
    start = time.perf_counter()
    if not items:
        raise DataError(f"unreadable: no file to compute features of for {out_dir}")
    spec = cfg.views
    if spec.image_length != spec.frames and {it.kind for it in items} == {"image", "video"}:
        raise DataError(
            f"unreadable: {out_dir}: images as {spec.image_length} frame(s) beside videos of {spec.frames}: a store "
            "holds one clip length; probe images and videos as two tasks, or repeat the images (--image-frames repeat)"
        )
    device = distributed.resolve_device(device)
    out = Path(out_dir)
    units = FileUnits(out, "npy", len(items), cfg.shard_items)
    load = functools.partial(_views, items, spec, encoder.cfg.patch_size, cfg.train_views, cfg.view_seed)
    meta = manifest("store", "npy", cfg.storage(), encoder, items)
    cutter = _ViewRows(encoder, cfg, items, device)
    store = fill(
        out,
        meta,
        items,
        load,
        cutter,
        units,
        batch_size=cfg.batch_size,
        workers=cfg.workers,
        progress=progress,
        desc=desc,
    )
    return StoreResult(
        out_dir=str(out),
        rows=store["rows"],
        files=len(items) - store["bad_files"],
        bad_files=store["bad_files"],
        shards_done=units.computed,
        shards_skipped=units.skipped,
        seconds=time.perf_counter() - start,
        info={"device": device, "rank": distributed.rank(), "world_size": distributed.world_size()},
    )
