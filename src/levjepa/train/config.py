"""Training configuration: the optimiser, the run, and the composed ``PretrainConfig``.

Each component receives only its own section (``model`` → the encoder, ``data`` → the loader,
``objective`` → the loss, ``optim`` → AdamW and its schedule, ``train`` → the loop). Presets are
functions in :mod:`levjepa.presets`; the command line changes any field with ``section.key=value``.

Batch sizes. ``train.batch_size`` is the *effective* global batch per optimizer step (3072 in the
paper). ``data.batch_size`` is the micro-batch each rank runs at once. Gradient accumulation makes up the
rest: ``micro_batches() = train.batch_size / (data.batch_size * world_size)`` per rank, a whole number.
With ``train.accumulation="global"`` (the default) the loss — invariance, SIGReg (whose statistic carries
the factor N = batch) and the projector's BatchNorm — sees the whole effective batch, whatever the split
into ranks × micro-batches (GradCache, see ``levjepa.train.step``), so a run trains the same objective on
1 GPU or 24 and can resume on another GPU count. ``"local"`` is the official code's accumulation: one loss
per micro-batch of ``data.batch_size × world_size`` clips, gradients averaged (N then depends on the
hardware).

A ``train.batch_size`` smaller than ``data.batch_size × world_size`` (a small dataset, a quick try) leaves
nothing to accumulate: :func:`fit_micro_batch` lowers ``data.batch_size`` to ``train.batch_size /
world_size`` and says so in one line, rather than asking for a second override; the run's ``config.json``
records the value it ran with.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from levjepa.config import MAX_SEED, ConfigError, check, check_range, flatten, to_dict
from levjepa.data import DataConfig
from levjepa.model import EncoderConfig
from levjepa.objective import ObjectiveConfig
from levjepa.threads import MAX_THREADS

__all__ = ["RESUMABLE", "OptimConfig", "PretrainConfig", "TrainConfig", "check_resume", "fit_micro_batch"]


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with a linear warm-up then a flat (default) or cosine rate.

    Defaults are the official LeVJEPA code's: lr 4e-4, betas (0.9, 0.95), weight decay 0.04 on weight
    matrices only (biases and norms excluded; the CLS token is decayed, as the official code does), warm-up
    from 1e-4 over 1200 steps, then flat.
    ``grad_clip`` is the max global gradient norm ([choice]: 1.0; ``None`` disables clipping).
    """

    lr: float = 4e-4
    start_lr: float = 1e-4
    final_lr: float = 1e-6
    warmup_steps: int = 1200
    schedule: Literal["flat", "cosine"] = "flat"
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.04
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        for name in ("lr", "start_lr", "final_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name, None)
            check(
                value is None or math.isfinite(value),
                f"optim.{name}={value}: must be a finite number (inf / nan would make every step non-finite)",
            )
        check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        check(self.start_lr >= 0 and self.final_lr >= 0, "optim.start_lr and optim.final_lr must be >= 0")
        check(self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        check(0 < self.eps <= 1, f"optim.eps must lie in (0, 1], got {self.eps}")
        check(all(0 <= b < 1 for b in self.betas), f"optim.betas must lie in [0, 1), got {self.betas}")
        check(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        check(
            self.grad_clip is None or self.grad_clip > 0, f"optim.grad_clip must be > 0 or none, got {self.grad_clip}"
        )


@dataclass(frozen=True)
class TrainConfig:
    """The loop: how long, how big, which device and precision, and what it leaves on disk."""

    steps: int = 10_000  # optimizer steps
    batch_size: int = 3072  # effective global clips per optimizer step
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: bf16 autocast on CUDA, fp32 on CPU; fp16: autocast with loss scaling (GPUs without bf16: V100, T4)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False  # torch.compile the encoder block stack (see levjepa.train.loop)
    accumulation: Literal["global", "local"] = "global"  # one loss on the effective batch, or one per micro-batch
    ema_decay: float = 0.9999  # Polyak copy: theta_bar <- decay * theta_bar + (1 - decay) * theta ...
    ema_every: int = 32  # ... every this many optimizer steps
    ema_warmup: float = 10.0  # decay of update n: min(ema_decay, n / (n + ema_warmup)); 0: the literal EMA
    checkpoint_every: int = 1000
    keep_last: int = 3  # checkpoints kept besides those at multiples of keep_every
    keep_every: int | None = None  # also keep every checkpoint at a multiple of this step (model selection)
    log_every: int = 20
    max_consecutive_skips: int = 5  # non-finite steps in a row before the run stops
    seed: int = 0
    # torch CPU threads; None: `levjepa pretrain` takes the CPUs free at its start (levjepa.threads), the Python
    # API the count the process has
    threads: int | None = None
    eval_at_end: bool = False  # run the built-in benchmark's frozen probes at the end (demo-cpu)
    eval_budget: Literal["demo", "full"] = "demo"
    # where metrics go besides metrics.jsonl and the log lines: TensorBoard event files (skipped with a note when
    # the `tensorboard` package is missing), Weights & Biases or MLflow (only when asked; their package must be
    # installed). `train.loggers=` (empty) writes metrics.jsonl alone.
    loggers: tuple[Literal["tensorboard", "wandb", "mlflow"], ...] = ("tensorboard",)

    def __post_init__(self) -> None:
        check(self.steps > 0, f"train.steps must be > 0, got {self.steps}")
        check(self.batch_size > 0, f"train.batch_size must be > 0, got {self.batch_size}")
        check(0.0 <= self.ema_decay < 1.0, f"train.ema_decay must lie in [0, 1), got {self.ema_decay}")
        check(self.ema_every > 0, f"train.ema_every must be > 0, got {self.ema_every}")
        check(
            self.ema_warmup >= 0,
            f"train.ema_warmup must be >= 0 (0: the paper's fixed decay from the first update), got {self.ema_warmup}",
        )
        check(self.checkpoint_every > 0, f"train.checkpoint_every must be > 0, got {self.checkpoint_every}")
        check(self.keep_last >= 1, f"train.keep_last must be >= 1, got {self.keep_last}")
        check(self.log_every > 0, f"train.log_every must be > 0, got {self.log_every}")
        check(
            self.max_consecutive_skips > 0,
            f"train.max_consecutive_skips must be > 0, got {self.max_consecutive_skips}",
        )
        check(
            self.keep_every is None or self.keep_every >= 1,
            f"train.keep_every must be >= 1 (or none), got {self.keep_every}",
        )
        check_range("train.seed", self.seed, 0, MAX_SEED)
        check(
            self.threads is None or 1 <= self.threads <= MAX_THREADS,
            f"train.threads={self.threads}: expected 1..{MAX_THREADS}, or none (the CPUs free at the start)",
        )
        check(
            self.accumulation in ("global", "local"),
            f"train.accumulation={self.accumulation!r}: valid choices are global (the loss sees the effective "
            "batch) and local (one loss per micro-batch, the official code's)",
        )


@dataclass(frozen=True)
class PretrainConfig:
    """Everything one pretraining run needs; ``config.json`` in the run directory is this, resolved."""

    preset: str = "custom"
    model: EncoderConfig = field(default_factory=EncoderConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        check(
            self.objective.num_global_views == self.data.num_global,
            f"objective.num_global_views ({self.objective.num_global_views}) must equal data.num_global "
            f"({self.data.num_global}): set both",
        )

    def micro_batches(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each rank (a count; ``train.accumulation`` is the mode)."""
        per_step = self.data.batch_size * world_size
        check(
            self.train.batch_size % per_step == 0,
            f"train.batch_size ({self.train.batch_size}) must be a multiple of data.batch_size "
            f"({self.data.batch_size}) x world size ({world_size}): set data.batch_size to a divisor of "
            f"train.batch_size / world size (a multiple of data.repeats = {self.data.repeats}), or train.batch_size "
            f"to a multiple of {per_step}",
        )
        return self.train.batch_size // per_step


def fit_micro_batch(cfg: PretrainConfig, world_size: int, *, say: bool = True) -> PretrainConfig:
    """``cfg`` with ``data.batch_size`` lowered to ``train.batch_size / world_size`` when the effective batch is
    smaller than one micro-batch on every rank and that split is whole (a multiple of ``data.repeats``);
    ``say``: print the one line that says so (stderr). Any other ``cfg`` is returned as it is."""
    train, data = cfg.train.batch_size, cfg.data
    per_rank, rest = divmod(train, world_size)
    if train >= data.batch_size * world_size or rest or per_rank == 0 or per_rank % data.repeats:
        return cfg
    if say:
        ranks = f" over {world_size} processes" if world_size > 1 else ""
        print(
            f"note: data.batch_size={data.batch_size} lowered to {per_rank}: train.batch_size={train} is the whole "
            f"batch of one optimizer step{ranks}",
            file=sys.stderr,
        )
    return dataclasses.replace(cfg, data=dataclasses.replace(data, batch_size=per_rank))


# What `--resume` may change: how long the run goes on, what it logs and keeps, where its data comes from and
# how fast the machine serves it. Everything else — the architecture, the objective, the optimiser, the seed,
# the effective batch and the geometry of the clips and views — is what the checkpoint was trained as; changing
# it would load weights into another model or continue another run. ``data.batch_size`` may change only under
# train.accumulation=global, where the loss sees the effective batch whatever the split (check_resume).
RESUMABLE: tuple[str, ...] = (
    "train.steps",
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_last",
    "train.keep_every",
    "train.max_consecutive_skips",
    "train.threads",
    "train.device",
    "train.precision",
    "train.compile",
    "train.eval_at_end",
    "train.eval_budget",
    "train.loggers",
    "data.sources",
    "data.weights",
    "data.samples_per_epoch",
    "data.batch_size",
    "data.num_workers",
    "data.pin_memory",
    "data.persistent_workers",
    "data.prefetch_factor",
    "data.decode_threads",
    "data.resize_on",
    "data.skip_nonref",
    "data.decode_device",
    "data.worker_start",
    "model.grad_checkpointing",
    "objective.impl",
)


def check_resume(saved: dict[str, Any], new: PretrainConfig) -> None:
    """Raise :class:`ConfigError` naming every key where ``new`` differs from the run's saved ``config.json``
    (``saved``, as read) and a resume may not change it (anything outside :data:`RESUMABLE`, and
    ``data.batch_size`` under ``train.accumulation=local``, where it sets the loss's batch). A key the saved
    file does not hold (added to levjepa after the run started) may be set: its old value is not known."""
    before, after = flatten(saved), flatten(to_dict(new))
    refused = [k for k in after if k in before and before[k] != after[k] and k not in RESUMABLE and k != "preset"]
    micro = "data.batch_size"
    if new.train.accumulation == "local" and micro in before and before[micro] != after[micro]:
        raise ConfigError(
            f"--resume cannot change {micro} ({before[micro]!r} -> {after[micro]!r}) under train.accumulation=local: "
            "there the loss sees data.batch_size x world size clips (SIGReg's N), so the run would continue "
            "another objective. Keep it, or start a new run (train.accumulation=global lets a resume re-split it)"
        )
    if refused:
        changes = ", ".join(f"{k} ({before.get(k)!r} -> {after[k]!r})" for k in refused)
        raise ConfigError(
            f"--resume cannot change {changes}: the checkpoint was trained with the saved value (architecture, "
            "objective, optimiser, seed, batch and clip geometry are fixed for a run). Start a new run with "
            "--run-dir instead; a resume may change only " + ", ".join(RESUMABLE)
        )
