"""Frozen-probe evaluation of a user's labelled dataset at scale: ``levjepa probe --task index:TRAIN,VAL[,TEST]``
(optionally ``--protocol ssv2 | k400 | in1k | diving48``).

For each encoder and split, the split's features are computed once into a feature store on disk
(``levjepa.features.store``: worker-process decoding, bad files reported and skipped, sharded across
``torchrun`` ranks, resumable), named by the encoder's function fingerprint and the data (split file,
settings) so that a second call reuses them. The probes then train from those stores in bounded memory
(``levjepa.eval.source``, ``levjepa.eval.trainer``). Training features use the protocol's ``segments`` with
one centre crop; validation and test use its ``segments × crops`` views, averaged per file. Without a protocol, one
centre clip of ``frames`` frames at ``frame_stride`` per file. With ``train_views = K > 0`` (``probe
--train-views K``) the training store holds instead ``K`` augmented views per file, drawn with the run's seed
(``levjepa.features.store``), and each epoch of the probes reads one of them (``levjepa.eval.source``);
``--online`` draws a new one every epoch from the same transform and stores no token. With ``--seeds N`` seed
block ``s`` reads views drawn with seed ``seed + s`` (N K-view stores; online, its own draws), so each block is
the run ``--seed seed+s`` makes alone.

:class:`DatasetTask` is a task of the one harness (``levjepa.eval.harness.evaluate``): :meth:`prepare`
builds every store of every encoder on every rank (all of them before any probe, so that no rank waits at
a barrier while rank 0 trains), :meth:`sources` opens them (``levjepa.eval.source.StoreSource``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from levjepa import distributed
from levjepa.config import check
from levjepa.data import BadFileReport, DataError, MediaItem, clip_augment
from levjepa.data.eval_clip import ViewSpec
from levjepa.eval.config import EvalConfig
from levjepa.eval.labelled import read_task
from levjepa.eval.online import OnlineSource
from levjepa.eval.probe_records import RECORDS, ProbeRecords
from levjepa.eval.protocols import PROTOCOLS, SLOTS_DEFAULT, Protocol, Slots
from levjepa.eval.source import FeatureSource, SeedSources, StoreSource
from levjepa.features.compact import FULL
from levjepa.features.feature_set import FeatureSet
from levjepa.features.store import StoreConfig, build_store
from levjepa.model.fingerprint import function_fingerprint
from levjepa.model.vit import VideoEncoder
from levjepa.weights import BAD_FILES

__all__ = ["DatasetTask", "dataset_task", "task_name"]


@dataclass
class DatasetTask:
    """The labelled files of each split, how they are viewed, the class count, and where the feature stores
    go (``features_dir``; ``bad_files`` collects the files they skipped)."""

    splits: dict[str, list[MediaItem]]
    paths: dict[str, str]
    classes: int
    train_views: StoreConfig
    test_views: StoreConfig
    protocol: Protocol | None
    features_dir: Path = Path("features")
    bad_files: BadFileReport | None = None
    label_names: tuple[str, ...] = ()  # class names in index order (index files: the integers)
    report_seconds: bool = False  # the stores are reused by a second call: a wall time would mean two things
    stores: dict[str, dict[str, Path]] = field(default_factory=dict)  # encoder -> split -> store folder
    seed_stores: dict[str, list[Path]] = field(default_factory=dict)  # encoder -> K-view stores of seeds 1..N-1
    name: str = "labels"  # the task's name: its row in the table, its kept probes' folder (task_name)
    protocol_text: str = ""  # the protocol and its slots, as the table states them
    online: bool = False  # the attentive probes' training tokens are encoded every epoch (set by prepare)
    shared: dict[str, int] = field(default_factory=dict)  # "train/val" -> files in both (--allow-shared-files)

    @property
    def num_classes(self) -> dict[str, int]:
        return {self.name: self.classes}

    @property
    def image_source(self) -> str:
        return ", ".join(self.paths.values())

    def key(self, split: str, views: StoreConfig | None = None) -> str:
        """A store's name: the split file's stem and a hash of the file and every setting the rows depend on."""
        views = views or (self.train_views if split == "train" else self.test_views)
        text = json.dumps([self.paths[split], views.storage()], sort_keys=True)
        return f"{Path(self.paths[split]).stem}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"

    @property
    def clip_text(self) -> str:
        t, v = self.train_views.views, self.test_views.views
        clip = f"{t.frames}×{t.size}×{t.size} (T×H×W) {t.sampling}"
        k = self.train_views.train_views
        train = f"{k} augmented views × {t.segments}" if k else f"{t.segments}×1"
        views = f"views train {train}, val/test {v.segments}×{v.crops}"
        return f"{clip}; {views}" + (f"; protocol {self.protocol_text}" if self.protocol_text else "")

    def prepare(self, encoders: Mapping[str, VideoEncoder], cfg: EvalConfig) -> bool:
        """Every store of every encoder × split, on every rank; True on rank 0, which trains the probes."""
        self.online = cfg.online and cfg.reads_tokens
        for name, enc in encoders.items():
            fp = function_fingerprint(enc)
            self.stores[name] = {}
            self.seed_stores[name] = []
            for split, items in self.splits.items():
                views = self.train_views if split == "train" else self.test_views
                keep = views.tokens and cfg.reads_tokens and not cfg.online  # online: tokens never stored
                views = replace(views, tokens=keep, codec=cfg.codec)
                seeds = [cfg.seed]
                if split == "train" and self.train_views.train_views:
                    check(not cfg.online, "eval: --online draws a new view every epoch: drop --train-views")
                    seeds = [cfg.seed + s for s in range(cfg.seeds)]  # seed block s reads the views of seed + s
                for i, seed in enumerate(seeds):
                    if split == "train" and self.train_views.train_views:
                        views = replace(views, view_seed=seed)
                    path = self._store_path(fp, split, views, cfg)
                    if i == 0:
                        self.stores[name][split] = path
                    else:
                        self.seed_stores[name].append(path)
                    desc = f"{name} {split}" + (f" (views of seed {seed})" if len(seeds) > 1 else "")
                    build_store(enc, items, path, views, device=cfg.device, progress=cfg.progress, desc=desc)
        return distributed.is_main()

    def _store_path(self, fp: str, split: str, views: StoreConfig, cfg: EvalConfig) -> Path:
        """A store's folder; a full store keeps the name it always had: the codec is in the key only when compact."""
        plain = replace(views, tokens=True, codec=cfg.codec if views.tokens else FULL)
        return self.features_dir / f"{fp}-{self.key(split, plain)}{'' if views.tokens else '-notokens'}"

    def sources(self, name: str, encoder: VideoEncoder, cfg: EvalConfig) -> dict[str, FeatureSource]:
        if self.bad_files is not None:
            for p in self.stores[name].values():
                self.bad_files.extend(BadFileReport.read(p / BAD_FILES).files.items())  # warns once per file
        sources: dict[str, FeatureSource] = {
            s: StoreSource(FeatureSet(p), task=self.name) for s, p in self.stores[name].items()
        }
        if self.seed_stores.get(name):  # K-view stores of seeds 1..N-1: each seed block reads its own
            more = [StoreSource(FeatureSet(p), task=self.name) for p in self.seed_stores[name]]
            sources["train"] = SeedSources([sources["train"], *more])
        if cfg.online and cfg.reads_tokens:
            for s, src in sources.items():
                assert isinstance(src, StoreSource)
                views = (self.train_views if s == "train" else self.test_views).views
                sources[s] = OnlineSource(
                    src,
                    self.splits[s],
                    views,
                    encoder,
                    augment=s == "train",
                    seed=cfg.seed,
                    device=cfg.device,
                    workers=self.test_views.workers,
                    batch_size=cfg.batch_size,
                )
        for split, src in sources.items():
            if len(src) == 0:
                for other in sources.values():
                    other.close()
                raise DataError(
                    f"unreadable: none of the {len(self.splits[split])} file(s) of {self.paths[split]} could be read "
                    f"(reasons in {self.stores[name][split] / 'bad_files.json'})"
                )
        return sources

    def train_views_text(self) -> str:
        """What the probes trained on, in words (the result's ``train_views``)."""
        if self.online:
            return "augmented every epoch (online)"
        k = self.train_views.train_views
        return f"{k} augmented views per video" if k else "fixed centre crops"

    def records(self, name: str) -> ProbeRecords:
        """The finished probes of encoder ``name``, kept beside its stores (``levjepa.eval.probe_records``)."""
        return ProbeRecords(self.features_dir / RECORDS, self.stores[name])

    def info(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "protocol": None if self.protocol is None else self.protocol_text,
            "views": self.test_views.views.fields(),
            "train_views": self.train_views_text(),
            **({"train_transform": clip_augment.NAME} if self.online or self.train_views.train_views else {}),
            "feature_stores": {n: {s: str(p) for s, p in st.items()} for n, st in self.stores.items()},
            "torch_threads": torch.get_num_threads(),
            **({"shared_files": dict(self.shared)} if self.shared else {}),
        }


def dataset_task(
    paths: Sequence[str],
    *,
    protocol: str | None = None,
    views: ViewSpec | None = None,
    slots: Slots = SLOTS_DEFAULT,
    tubelet: int = 1,
    name: str | None = None,
    video_root: str | None = None,
    labels_file: str | None = None,
    tokens: bool = True,
    batch_size: int = 8,
    workers: int = 2,
    shard_items: int = 256,
    train_views: int | None = None,
    features_dir: str | Path = "features",
    bad_files: BadFileReport | None = None,
    allow_shared: bool = False,
) -> DatasetTask:
    """Read the split files (``levjepa.eval.labelled.read_task``). ``views``: how a file is cut (what the reader
    resolved from the model, ``levjepa.formats.reading.views``; default one centre clip of 16 frames at stride 2,
    224 px); with a ``protocol``, its views for an encoder of ``tubelet`` frames per token at ``slots`` temporal
    positions, sampled as ``views`` says (``levjepa.eval.protocols``). ``name``: the task's name (default:
    :func:`task_name` of the files). ``train_views``: ``K`` augmented training views per file in the store (0:
    the fixed centre crops; default: the protocol's ``train_views``, else 0; a protocol's ``online`` is no store
    of augmented views but ``EvalConfig(online=True)``, which ``levjepa probe`` sets from it). ``allow_shared``:
    splits that share files are evaluated (the overlap in ``shared``, stated by the result) instead of refused."""
    views = views or ViewSpec()
    proto, text = None, ""
    if protocol is not None:
        if protocol not in PROTOCOLS:
            raise DataError(f"unreadable: --protocol {protocol!r}: valid choices are {', '.join(PROTOCOLS)}")
        proto = PROTOCOLS[protocol]
        views = proto.views(tubelet, views, slots)
        text = proto.describe(views, slots, tubelet)
    default = proto.train_views if proto is not None else 0  # "online" is the evaluation's (EvalConfig.online)
    k = train_views if train_views is not None else (default if isinstance(default, int) else 0)
    task = read_task(
        paths,
        video_root=video_root,
        labels_file=labels_file,
        num_classes=None if proto is None else proto.num_classes,
        what=f"--protocol {protocol}",
        allow_shared=allow_shared,
    )
    test = StoreConfig(views, tokens=tokens, batch_size=batch_size, workers=workers, shard_items=shard_items)
    return DatasetTask(
        task.splits,
        task.paths,
        task.num_classes,
        # training features: the segments, one centre crop, or K augmented views of them
        replace(test, views=replace(views, crops=1), train_views=k),
        test,
        proto,
        Path(features_dir),
        bad_files,
        task.label_names,
        name=name or task_name(task.paths["train"]),
        protocol_text=text,
        shared=task.shared,
    )


# split-file names that say nothing of the dataset: the task is then named by the folder that holds them
_GENERIC = {"train", "training", "trainlist", "trainlist01", "train_list", "index", "labels", "all", "data"}


def task_name(train: str) -> str:
    """The name of a labelled task, from its TRAIN file: the file's stem (``ssv2_train.csv`` -> ``ssv2_train``),
    or, for a generic one (``train.txt``), the folder that holds it (``/data/ssv2/train.txt`` -> ``ssv2``);
    letters, digits, ``.``, ``-`` and ``_`` only. Two tasks of different files may get one name
    (``/a/ssv2/train.txt``, ``/b/ssv2/train.csv``): keeping the second's probes where the first's are is refused
    (``levjepa.eval.kept_probes.check_probe_dir``; ``--name`` sets another)."""
    path = Path(train).expanduser().resolve()
    stem = path.stem
    raw = path.parent.name if stem.lower() in _GENERIC and path.parent.name else stem
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("._-")
    return clean or "labels"
