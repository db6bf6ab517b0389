"""Frozen features of a whole labelled dataset, computed in a stream and stored on disk in shards: the *store*
row cutter of the one feature-set format (``levjepa.features.feature_set``: manifest, index, layouts, done rule,
reader).

This is the dataset-scale path of ``levjepa probe --task index:...`` / ``--protocol``: nothing holds a split
in memory. Memory is bounded by the decode prefetch (``workers`` × 2 files), one forward batch and one
shard of features; the dataset's size only changes how many shards are written.

**Rows.** Each file is cut into the views of ``StoreConfig.views`` (a ``levjepa.data.eval_clip.ViewSpec``:
``segments`` clips of ``frames`` frames at ``frame_stride`` spread over the video × ``crops`` square crops,
at short side ``size``); one row per view, the rows of a file consecutive and segment-major, with the index
fields ``file, label, item, segment, crop``. Decoding runs in ``workers`` worker processes
(``levjepa.data.workers.safe_map``).

**Augmented training views** (``StoreConfig.train_views = K > 0``, ``probe --train-views K``): instead of its
centre crop, each file gets ``K`` augmented views — view ``k`` is ``levjepa.data.eval_clip.load_train_views``
drawn from ``train_key(view_seed, item, k)`` (V-JEPA's frozen-evaluation train transform,
``levjepa.data.clip_augment``: V-JEPA 2's temporal starts, RandAugment, random resized crop of 8–100 % at aspect
3/4–4/3, random erasing, no flip), so a view depends only on (seed, item, k), never on workers, ranks or a
restart. Its rows carry ``view = k``, view-major then segment (``crops`` must be 1), through the store's token
codec like any row; ``train_views``, ``view_seed`` and the transform's name are in the manifest's settings
(another K, seed or transform is another store). ``K = 0`` writes exactly the store it always did (no ``view``
field, same settings). The probe trainer reads one view per file and epoch
(``levjepa.eval.source.StoreSource.set_epoch``).

A file that cannot be read (``DataError``, a decoder error) is reported (``bad-KKKKK.json``, then
``bad_files.json``, with the reason) and skipped, never fatal; it contributes no row.

**The encoder** runs the one frozen forward, ``levjepa.infer.encode.encode`` (``eval()``, ``inference_mode``,
nothing dropped, its precision rule: bf16 autocast on CUDA, float32 elsewhere), so a store holds exactly the
features the in-memory path computes.

**Shards and ranks.** The layout is ``npy``. Item ``i`` of the list belongs to shard ``i // shard_items``;
under ``torchrun`` shard ``k`` is computed by rank ``k mod world_size``. A forward batch never crosses a
shard, so a shard's bytes depend only on its items and the encoder — not on the rank count
(``tests/test_feature_store.py``: 2 gloo ranks give the same files as 1 process).

**Arrays**: ``cls-KKKKK.npy`` float32 [n, D] (CLS token), ``mean-KKKKK.npy`` float32 [n, D] (mean of the patch
tokens), ``tokens-KKKKK.npy`` float16 [n, 1+L, D] (CLS then every patch token, time-major) when ``tokens`` —
or, with a compact ``codec`` (``levjepa.features.compact``: ``pool2``, ``int8``, ...), the tokens it keeps,
int8 ones (int4: uint8, two a byte) with ``scales-KKKKK.npy``.

**Restart.** Shards whose index exists are skipped, so a job killed at any point (``kill -9`` included)
and started again with the same command finishes with the same files as an uninterrupted run; a restart
with different settings, encoder or items is refused (delete the folder or choose another).

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
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from levjepa import distributed
from levjepa.config import check
from levjepa.data import DataError, MediaItem, clip_augment
from levjepa.data.eval_clip import ViewSpec, load_train_views, train_key
from levjepa.data.progress import Progress
from levjepa.data.sources import items_hash
from levjepa.data.workers import safe_map
from levjepa.features.compact import FULL, TokenCodec, grid_of
from levjepa.features.feature_set import VERSION, FeatureSet, Unit, clear_unit, finish, open_for_writing, unit_done
from levjepa.infer.encode import encode
from levjepa.model.fingerprint import function_fingerprint
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
    view_seed: int = 0  # the seed of those views (train_key)

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
        bit-identical files). Keys in the order ``store.json`` has always written them."""
        v = self.views
        out: dict[str, Any] = {
            "frames": v.frames,
            "frame_stride": v.frame_stride,
            "size": v.size,
            "segments": v.segments,
            "crops": v.crops,
            "tokens": self.tokens,
            "shard_items": self.shard_items,
        }
        if v.fps is not None:  # a rate: written only when set, so a store computed before rates is reused
            out["fps"] = v.fps
        if v.image_frames is not None:  # likewise images read as fewer frames than the clip's
            out["image_frames"] = v.image_frames
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
        keys = [train_key(seed, i, k) for k in range(train_views)]
        return torch.cat([load_train_views(items[i].path, views, patch, key, items[i].kind) for key in keys])
    return views.load(items[i].path, patch, items[i].kind)


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
    manifest = {
        "version": VERSION,
        "cutter": "store",
        "layout": "npy",
        "config": cfg.storage(),
        "encoder": function_fingerprint(encoder),
        "patch": encoder.cfg.patch_size,
        "items": len(items),
        "items_sha1": items_hash(items),
    }
    if encoder.cfg.readout_layers is not None:  # said only when not the last block: a default manifest is unchanged
        manifest["readout_layers"] = list(encoder.cfg.readout_layers)
    done = open_for_writing(out, manifest, overwrite=False, hint="delete it or choose another folder")
    rank, world = distributed.rank(), distributed.world_size()
    n_shards = math.ceil(len(items) / cfg.shard_items)
    mine = [k for k in range(rank, n_shards, world)]
    todo = [] if done is not None else [k for k in mine if not unit_done(out, "npy", f"{k:05d}")]
    for k in todo:  # what a killed job left of this rank's shards still to do (atomic writes never finished)
        clear_unit(out, "npy", f"{k:05d}")
    shards = {k: Unit(f"{k:05d}") for k in todo}
    remaining = {k: min(cfg.shard_items, len(items) - k * cfg.shard_items) for k in todo}
    order = [i for k in todo for i in range(k * cfg.shard_items, k * cfg.shard_items + remaining[k])]
    bar = Progress(len(order), desc, "file", show=progress and rank == 0)
    pending: list[tuple[dict[str, Any], Tensor]] = []  # (row, one view) of the current shard

    def run(shard: Unit) -> None:
        while pending:
            chunk, pending[:] = pending[: cfg.batch_size], pending[cfg.batch_size :]
            enc = encode(encoder, torch.stack([v for _, v in chunk]), device, tokens=cfg.tokens)
            feats: dict[str, Tensor | None] = {"cls": enc.cls, "mean": enc.mean}
            if enc.tokens is not None:
                feats.update(cfg.codec.encode(cfg.codec.reduce(enc.tokens, grid_of(enc.positions))))
            shard.add([m for m, _ in chunk], feats)

    load = functools.partial(_views, items, cfg.views, encoder.cfg.patch_size, cfg.train_views, cfg.view_seed)
    for i, views, reason in safe_map(load, order, cfg.workers):
        k = i // cfg.shard_items
        shard = shards[k]
        it = items[i]
        if views is None:
            shard.bad.append((it.path, reason))
        else:
            for v in range(len(views)):
                seg, crop = divmod(v, cfg.views.crops)
                row = {"file": it.path, "label": it.label, "item": i, "segment": seg, "crop": crop}
                if cfg.train_views:
                    view, seg = divmod(v, cfg.views.segments)
                    row = {"file": it.path, "label": it.label, "item": i, "view": view, "segment": seg, "crop": 0}
                pending.append((row, views[v]))
                if len(pending) >= cfg.batch_size:
                    run(shard)
        remaining[k] -= 1
        if remaining[k] == 0:
            run(shard)
            shard.write(out, "npy")
            del shards[k]
        bar.update(1)
    bar.close()
    distributed.barrier()
    if rank == 0 and done is None:
        done = finish(out, manifest, "npy", [f"{k:05d}" for k in range(n_shards)])
    distributed.barrier()
    store = done if done is not None else FeatureSet(out).meta
    return StoreResult(
        out_dir=str(out),
        rows=store["rows"],
        files=len(items) - store["bad_files"],
        bad_files=store["bad_files"],
        shards_done=len(todo),
        shards_skipped=len(mine) - len(todo),
        seconds=time.perf_counter() - start,
        info={"device": device, "rank": rank, "world_size": world},
    )
