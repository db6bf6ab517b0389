"""What a fine-tuning run is: :class:`FinetuneConfig`, frozen, written to ``OUT/config.json`` and compared on
``--resume`` (:func:`check_resume`).

Defaults follow the video fine-tuning recipes (VideoMAE, Tong et al. 2022, its ``run_class_finetuning.py``:
AdamW betas (0.9, 0.999), weight decay 0.05, layer-wise lr decay 0.75, drop-path 0.1, label smoothing 0.1,
mixup optional, warm-up then cosine to ``min_lr``; V-JEPA's attentive classifier head on top of the encoder,
Bardes et al. 2024). The learning rate is for the effective batch ``batch_size`` (the sum over ranks and
micro-batches).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints

from levjepa.config import MAX_SEED, ConfigError, check, check_range, to_dict
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.labelled_stream import Augment
from levjepa.eval.protocols import PROTOCOLS, parse_slots
from levjepa.formats.reading.load import LoadedEncoder
from levjepa.formats.reading.views import model_views
from levjepa.formats.writing.finetuned import HeadStart, Start
from levjepa.model.probe_kinds import kind_names
from levjepa.train.config import TrainConfig
from levjepa.train.finetune_recipe import Schedule, StepRecipe
from levjepa.train.run_dir import check_steps
from levjepa.weights import CONFIG, read_json

__all__ = ["RESUMABLE", "FinetuneConfig", "check_resume", "check_resume_dir"]

LOGGERS = get_args(get_args(get_type_hints(TrainConfig)["loggers"])[0])  # what train.report.MetricsLogger writes to

# what results.json and best/'s classifier.json record of how the classifier was trained
RECIPE_KEYS = (
    "lr",
    "layer_decay",
    "weight_decay",
    "drop_path",
    "label_smoothing",
    "mixup",
    "keep_ratio",
    "batch_size",
    "head_from",
)


@dataclass(frozen=True)
class FinetuneConfig:
    """Every setting of a fine-tuning run (see the module doc)."""

    source: str = ""  # a levjepa run, checkpoint, export or imported weights
    weights: Literal["ema", "online"] = "ema"  # which copy of a run's weights to start from
    random_init: bool = False  # start from the same architecture at random initialisation (a baseline)
    task: tuple[str, ...] = ()  # TRAIN, VAL[, TEST] split files
    allow_shared_files: bool = False  # splits that share files: trained anyway (refused otherwise; eval.labelled)
    protocol: str | None = None  # levjepa.eval.protocols: size, the val/test views, temporal slots
    slots: str | None = None  # with a protocol: 8 (the paper's matched evaluation, default), 16 or vjepa2
    frames: int | None = None  # None: the model's (levjepa.formats.reading.views)
    frame_stride: int | None = None  # None: the model's sampling
    fps: float | None = None  # frames per second instead of a stride; None: the model's rate when it has one
    size: int | None = None  # None: the model's
    head: str = "attentive"  # a kind of levjepa.model.probe_kinds: attentive, linear, or one registered there
    head_depth: int = 1
    head_from: str | None = None  # start the head from a kept probe (linear-probe-then-fine-tune, LP-FT)
    steps: int = 1000
    batch_size: int = 16  # effective batch: micro_batch x micro-batches x ranks
    micro_batch: int = 0  # clips per forward on one rank; 0 = batch_size / ranks (no accumulation)
    lr: float = 5e-4
    min_lr: float = 1e-6
    warmup_steps: int = 50
    weight_decay: float = 0.05
    layer_decay: float = 0.75
    beta1: float = 0.9
    beta2: float = 0.999
    drop_path: float = 0.1
    label_smoothing: float = 0.1
    mixup: float = 0.0  # Beta(alpha, alpha) of mixup; 0 = off (VideoMAE: 0.8)
    keep_ratio: float = 1.0  # tokens kept per clip during training (1 = every token)
    crop_scale: tuple[float, float] = (0.4, 1.0)  # random resized crop, area fraction of the square
    flip_p: float = 0.5  # 0 where a mirror image is another class (digits, text: bench/finetune.md)
    seed: int = 0
    eval_every: int = 100
    checkpoint_every: int = 100
    keep_last: int = 2  # checkpoints kept (the newest); OUT/best is kept apart
    log_every: int = 10
    max_consecutive_skips: int = 5  # non-finite steps in a row before the run stops
    workers: int = 2
    loggers: tuple[str, ...] = ("tensorboard",)
    device: str = "auto"

    def __post_init__(self) -> None:
        check(len(self.task) in (2, 3), f"task: expected TRAIN,VAL[,TEST] files, got {list(self.task)}")
        check(self.head in kind_names(), f"head={self.head!r}: valid choices are {', '.join(kind_names())}")
        for name in ("head_depth", "steps", "batch_size", "eval_every", "checkpoint_every", "keep_last", "log_every"):
            check(getattr(self, name) >= 1, f"{name}={getattr(self, name)}: must be >= 1")
        check(self.max_consecutive_skips >= 1, f"max_consecutive_skips={self.max_consecutive_skips}: must be >= 1")
        check(self.micro_batch >= 0, f"micro_batch={self.micro_batch}: must be >= 0 (0: batch_size / ranks)")
        check(0 < self.keep_ratio <= 1, f"keep_ratio={self.keep_ratio}: must be in (0, 1]")
        check(0 <= self.drop_path < 1, f"drop_path={self.drop_path}: must be in [0, 1)")
        check(0 <= self.label_smoothing < 1, f"label_smoothing={self.label_smoothing}: must be in [0, 1)")
        check(self.mixup >= 0, f"mixup={self.mixup}: must be >= 0 (0: off)")
        check(0 < self.layer_decay <= 1, f"layer_decay={self.layer_decay}: must be in (0, 1]")
        check(
            len(self.crop_scale) == 2 and 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1,
            f"crop_scale={self.crop_scale}: 0 < lo <= hi <= 1",
        )
        check(self.lr > 0, f"lr={self.lr}: must be > 0")
        check(0 <= self.min_lr <= self.lr, f"min_lr={self.min_lr}: must be in [0, lr = {self.lr}]")
        check(self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps}: must be >= 0")
        check(self.weight_decay >= 0, f"weight_decay={self.weight_decay}: must be >= 0")
        for name in ("beta1", "beta2"):
            check(0 <= getattr(self, name) < 1, f"{name}={getattr(self, name)}: must be in [0, 1)")
        check(0 <= self.flip_p <= 1, f"flip_p={self.flip_p}: must be a probability in [0, 1]")
        check_range("seed", self.seed, 0, MAX_SEED)
        check(0 <= self.workers <= 1024, f"workers={self.workers}: must be 0..1024 (0: decode in this process)")
        for name in ("frames", "frame_stride", "size"):
            value = getattr(self, name)
            check(value is None or value >= 1, f"{name}={value}: must be >= 1 (or none: the model's)")
        check(self.fps is None or self.fps > 0, f"fps={self.fps}: must be > 0 (or none: the model's rate)")
        check(
            re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device) is not None,
            f"device={self.device!r}: expected auto, cpu, cuda or cuda:N",
        )
        bad = [x for x in self.loggers if x not in LOGGERS]
        check(not bad, f"loggers={','.join(self.loggers)}: valid choices are {', '.join(LOGGERS)} (or none)")
        if self.slots is not None:
            slots = parse_slots(self.slots)
            check(
                slots == "vjepa2" or slots >= 1, f"slots={self.slots}: a number of temporal positions >= 1, or vjepa2"
            )

    # each service of the run receives only its own part of the config
    @property
    def start(self) -> Start:
        """Where the encoder starts (``levjepa.formats.writing.finetuned.start_encoder``)."""
        return Start(self.source, self.weights, self.random_init, self.seed)

    @property
    def head_start(self) -> HeadStart:
        """Which head, and where it starts (``levjepa.formats.writing.finetuned.start_head``)."""
        return HeadStart(self.head, self.head_depth, self.head_from, self.seed)

    @property
    def schedule(self) -> Schedule:
        return Schedule(self.lr, self.min_lr, self.warmup_steps, self.steps)

    @property
    def step_recipe(self) -> StepRecipe:
        """What ``loop.train_step`` reads."""
        return StepRecipe(self.schedule, self.seed, self.label_smoothing, self.mixup, self.keep_ratio)

    @property
    def augment(self) -> Augment:
        """What the training clips draw (``levjepa.data.labelled_stream``)."""
        return Augment(self.seed, self.crop_scale, self.flip_p)

    def recipe_record(self) -> dict[str, Any]:
        """How the classifier was trained, as ``best/classifier.json`` records it."""
        return {k: getattr(self, k) for k in RECIPE_KEYS}

    def views(self, loaded: LoadedEncoder) -> tuple[ViewSpec, str]:
        """How files are cut (training clips at their size and frames; validation and test files into every
        view), and the line that says so: the model's clips (``levjepa.formats.reading.views``) with what this config
        sets overriding them, or the protocol's views at its temporal slots."""
        sampling, said = model_views(
            loaded, size=self.size, frames=self.frames, frame_stride=self.frame_stride, fps=self.fps
        )
        if self.protocol is None:
            return sampling, said
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol {self.protocol!r}: valid choices are {', '.join(PROTOCOLS)}")
        p, slots, tau = PROTOCOLS[self.protocol], parse_slots(self.slots), loaded.config.tubelet
        views = p.views(tau, sampling, slots)
        return views, f"views: protocol {p.describe(views, slots, tau)}"

    def batch_layout(self, world_size: int) -> tuple[int, int]:
        """(clips per forward, forwards per step) on each of ``world_size`` ranks."""
        per_rank, rest = divmod(self.batch_size, world_size)
        micro = self.micro_batch or per_rank
        if rest or micro < 1 or per_rank % micro:
            raise ConfigError(
                f"batch_size={self.batch_size} must be a multiple of micro_batch ({micro}) x ranks ({world_size})"
            )
        return micro, per_rank // micro


# what --resume may change: how long the run goes on, what it logs and keeps, how it decodes
RESUMABLE = (
    "steps",
    "eval_every",
    "checkpoint_every",
    "keep_last",
    "log_every",
    "max_consecutive_skips",
    "workers",
    "loggers",
    "device",
    "micro_batch",
)


def check_resume(saved: dict[str, Any], new: FinetuneConfig) -> None:
    """Refuse a resume that would change what is trained (``RESUMABLE`` lists what may change)."""
    names = [f.name for f in fields(FinetuneConfig)]
    now = to_dict(new)
    changed = [k for k in names if k not in RESUMABLE and saved.get(k) != now[k]]
    if changed:
        diffs = ", ".join(f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in changed)
        raise ConfigError(
            f"--resume may change only {', '.join(RESUMABLE)}; this command changes {diffs}: start a new --out"
        )


def check_resume_dir(path: Path, cfg: FinetuneConfig, at: Path | None = None) -> None:
    """What a fine-tuning ``--resume`` of the run in ``path`` must not change (:func:`check_resume` against its
    ``config.json``), and a length that ends before the checkpoint it resumes from (``at``, else the latest)."""
    check_resume(read_json(path / CONFIG), cfg)
    check_steps(path, cfg.steps, "steps", at)
