"""Frozen-probe evaluation of a user's labelled dataset at scale: ``levjepa probe --task index:TRAIN,VAL[,TEST]``
(optionally ``--protocol ssv2 | k400 | in1k | diving48``).

For each encoder and split, the split's features are computed once into a feature store on disk
(``levjepa.eval.feature_store``: worker-process decoding, bad files reported and skipped, sharded across
``torchrun`` ranks, resumable), named by the encoder's weights fingerprint and the data (split file,
settings) so that a second call reuses them. The probes then train from those stores in bounded memory
(``levjepa.eval.disk_probe``). Training features use the protocol's ``segments`` with one centre crop;
validation and test use its ``segments × crops`` views, averaged per file. Without a protocol, one
centre clip of ``frames`` frames at ``frame_stride`` per file (the previous in-memory behaviour).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from levjepa import distributed
from levjepa.data import BadFileReport, DataError, MediaItem
from levjepa.eval.benchmark import BenchmarkResult, EvalConfig, Result
from levjepa.eval.disk_probe import knn_from_stores, probe_from_stores
from levjepa.eval.feature_store import FeatureStore, StoreConfig, build_store
from levjepa.eval.features import encoder_fingerprint
from levjepa.eval.protocols import PROTOCOLS, Protocol, read_labelled
from levjepa.model.vit import VideoEncoder
from levjepa.rng import make_generator

__all__ = ["DatasetTask", "dataset_task", "evaluate_dataset"]

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class DatasetTask:
    """The labelled files of each split, how they are viewed, and the class count."""

    splits: dict[str, list[MediaItem]]
    paths: dict[str, str]
    num_classes: int
    train_views: StoreConfig
    test_views: StoreConfig
    protocol: Protocol | None

    def key(self, split: str) -> str:
        views = self.train_views if split == "train" else self.test_views
        text = json.dumps([self.paths[split], views.storage()], sort_keys=True)
        return f"{Path(self.paths[split]).stem}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"

    @property
    def clip_text(self) -> str:
        t, v = self.train_views, self.test_views
        return f"{t.frames}×{t.size}×{t.size} (T×H×W); views train {t.segments}×1, val/test {v.segments}×{v.crops}"


def dataset_task(
    paths: Sequence[str],
    *,
    protocol: str | None = None,
    frames: int = 16,
    frame_stride: int = 2,
    size: int = 224,
    video_root: str | None = None,
    labels_file: str | None = None,
    tokens: bool = True,
    batch_size: int = 8,
    workers: int = 2,
    shard_items: int = 256,
) -> DatasetTask:
    """Read the split files (index, Kinetics CSV or SSv2 JSON: ``levjepa.eval.protocols.read_labelled``)."""
    if len(paths) not in (2, 3):
        raise DataError(f"unreadable: index task: expected TRAIN,VAL[,TEST] files, got {len(paths)}: {list(paths)}")
    proto = None
    if protocol is not None:
        if protocol not in PROTOCOLS:
            raise DataError(f"unreadable: --protocol {protocol!r}: valid choices are {', '.join(PROTOCOLS)}")
        proto = PROTOCOLS[protocol]
        frames, frame_stride, size = proto.frames, proto.frame_stride, proto.size
    segments, crops = (proto.segments, proto.crops) if proto is not None else (1, 1)
    base = StoreConfig(
        frames=frames,
        frame_stride=frame_stride,
        size=size,
        segments=segments,
        crops=1,
        tokens=tokens,
        batch_size=batch_size,
        workers=workers,
        shard_items=shard_items,
    )
    splits: dict[str, list[MediaItem]] = {}
    classes: dict[str, int] | None = None
    for split, path in zip(SPLITS, paths, strict=False):
        splits[split], names = read_labelled(path, video_root=video_root, classes=classes, labels_file=labels_file)
        classes = classes or names
    top = max(int(it.label or 0) for items in splits.values() for it in items)
    num_classes = proto.num_classes if proto is not None else max(2, top + 1)
    if top >= num_classes:
        raise DataError(f"unreadable: a label {top} is out of range for --protocol {protocol} ({num_classes} classes)")
    return DatasetTask(
        splits,
        {s: str(p) for s, p in zip(SPLITS, paths, strict=False)},
        num_classes,
        base,
        replace(base, crops=crops),
        proto,
    )


def _chance(store: FeatureStore, num_classes: int) -> float:
    first = (store.segment == 0) & (store.crop == 0)
    counts = np.bincount(store.labels[first], minlength=num_classes)
    return 100.0 * float(counts.max()) / max(1, int(first.sum()))


def evaluate_dataset(
    encoders: Mapping[str, VideoEncoder],
    task: DatasetTask,
    cfg: EvalConfig,
    features_dir: str | Path,
    *,
    bad_files: BadFileReport | None = None,
) -> BenchmarkResult | None:
    """Stores of every encoder × split (every rank; all of them before any probe, so that no rank waits at
    a barrier while rank 0 trains), then the probes (rank 0; the other ranks return None)."""
    results: dict[str, dict[str, dict[str, Result]]] = {}
    root = Path(features_dir)
    chance: dict[str, float] = {}
    sizes: dict[str, int] = {}
    store_dirs: dict[str, dict[str, str]] = {}
    all_stores: dict[str, dict[str, Path]] = {}
    for name, enc in encoders.items():  # every store first: the ranks stay together until the probes
        enc = getattr(enc, "encoder", enc)
        fp = encoder_fingerprint(enc)[:16]
        stores: dict[str, Path] = {}
        for split, items in task.splits.items():
            views = task.train_views if split == "train" else task.test_views
            views = replace(views, tokens=views.tokens and "attentive" in cfg.probes)
            stores[split] = root / f"{fp}-{task.key(split)}{'' if views.tokens else '-notokens'}"
            build_store(
                enc, items, stores[split], views, device=cfg.device, progress=cfg.progress, desc=f"{name} {split}"
            )
        all_stores[name] = stores
        store_dirs[name] = {s: str(p) for s, p in stores.items()}
    if not distributed.is_main():  # rank 0 trains the probes
        return None
    for name, stores in all_stores.items():
        opened = {s: FeatureStore(p) for s, p in stores.items()}
        if bad_files is not None:
            for p in stores.values():
                bad_files.extend(BadFileReport.read(p / "bad_files.json").files.items())  # warns once per file
        reported = opened.get("test", opened["val"])
        chance = {"labels": _chance(reported, task.num_classes)}
        sizes = {s: int(((st.segment == 0) & (st.crop == 0)).sum()) for s, st in opened.items()}
        out: dict[str, Result] = {}
        for probe in cfg.probes:
            if probe == "knn":
                out[probe] = knn_from_stores(
                    opened["train"], opened["val"], opened.get("test"), num_classes=task.num_classes
                )
            else:
                out[probe] = probe_from_stores(
                    probe,  # type: ignore[arg-type]
                    cfg.probe_cfg,
                    opened["train"],
                    opened["val"],
                    opened.get("test"),
                    num_classes=task.num_classes,
                    generator=make_generator("probe", cfg.seed, "labels", probe),
                    device=cfg.device,
                )
        for st in opened.values():
            st.close()
        results[name] = {"labels": out}
    probe_cfg = cfg.probe_cfg
    info: dict[str, Any] = {
        "title": cfg.title,
        "image_source": ", ".join(task.paths.values()),
        "clip": task.clip_text,
        "split_sizes": sizes,
        "has_test": "test" in task.splits,
        "budget": cfg.budget,
        "probe_depth": probe_cfg.depth,
        "probe_config": {k: list(v) if isinstance(v, tuple) else v for k, v in probe_cfg.__dict__.items()},
        "device": str(cfg.device),
        "seed": cfg.seed,
        "protocol": None if task.protocol is None else task.protocol.__dict__,
        "feature_stores": store_dirs,
        "torch_threads": torch.get_num_threads(),
    }
    return BenchmarkResult(list(encoders), ["labels"], list(cfg.probes), results, chance, info)
