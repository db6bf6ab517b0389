"""The outer training loop: ``pretrain(cfg, run_dir)`` — the Python API behind ``levjepa pretrain``.

``_pretrain`` reads like the recipe: open the run directory (``levjepa.train.run_dir``), build encoder +
projector + objective + AdamW + EMA (a :class:`Trainer`: what is fixed for the run), resume if asked, then
for each optimizer step fetch ``micro_batches`` micro-batches and call
:func:`levjepa.train.step.train_step` (``_step``, which also updates the EMA every ``ema_every`` steps) and
log label-free monitors every ``log_every`` steps (``_log``, shown and written by ``levjepa.train.report``).
The rest of a run's life — the skip flags read and a run of non-finite steps stopped, a checkpoint every
``checkpoint_every`` steps (``_checkpoint`` says what it holds), pruned, a failed write reported, a SIGTERM
or SIGUSR1 (a scheduler's pre-emption) ending the run after the step it is in with a checkpoint and
:class:`levjepa.train.preemption.Preempted`, Ctrl-C naming the last checkpoint — is
``levjepa.train.lifecycle``'s, shared with fine-tuning. What changes from step to step is a small
:class:`TrainState`. Only the main rank writes. The loop knows nothing of evaluation: ``levjepa pretrain``
reads the run back to evaluate it (``train.eval_at_end``).

Nothing in the step waits for the device; the loop reads device values (losses, skip flags) only on logging
and skip-check steps. Logged: the loss and its terms as the objective computed them, the gradient norm, and
the label-free monitors of ``embedding_diagnostics`` on the projections the loss saw (its fixed-direction
SIGReg as ``monitor/sigreg/view{v}``). A non-finite loss or gradient skips that update (on the device), is
logged with its step number, and ``max_consecutive_skips`` skips in a row stop the run with a message.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from levjepa import distributed
from levjepa.config import ConfigError, to_dict
from levjepa.data import BadFileReport, DataConfig, FrameBatch, PretrainLoader, ViewBatch
from levjepa.model import Projector, VideoEncoder
from levjepa.objective import Objective, build_objective, embedding_diagnostics, shift_invariant
from levjepa.rng import sample_keys, seeded_init
from levjepa.threads import allowed_cpus, torch_threads
from levjepa.train import checkpoint as ckpt
from levjepa.train.config import PretrainConfig, fit_micro_batch
from levjepa.train.ema import EMA
from levjepa.train.lifecycle import Lifecycle, TrainingStopped, due
from levjepa.train.optim import build_optimizer, lr_at
from levjepa.train.report import MetricsLogger, Progress, RunSummary, check_loggers, format_summary, start_banner
from levjepa.train.run_dir import (
    check_pretrain_resume,
    default_run_dir,
    read_bad_files,
    run_directory,
    write_run_info,
)
from levjepa.train.start import StartWeights, load_start_weights
from levjepa.train.step import Pretrainer, StepOutput, compile_step, train_step
from levjepa.weights import BAD_FILES

__all__ = ["TrainState", "Trainer", "TrainingStopped", "build_models", "pretrain"]


def build_models(cfg: PretrainConfig, seed: int) -> tuple[VideoEncoder, Projector]:
    """Encoder and projector initialised from ``seed`` (the same weights on every rank).

    Under a shift-invariant objective (LocaLeJEPA) the projector's output bias would get an exactly zero
    gradient, so it is frozen at zero (``levjepa.objective.shift_invariant``); no trained parameter is dead.
    """
    with seeded_init(seed):
        encoder = VideoEncoder(cfg.model)
        projector = Projector.from_config(cfg.model)
    if shift_invariant(cfg.objective):
        projector.net[-1].bias.requires_grad_(False)
    return encoder, projector


def _device(cfg: PretrainConfig) -> str | None:
    return None if cfg.train.device == "auto" else cfg.train.device


def _autocast_dtype(cfg: PretrainConfig, device: torch.device) -> torch.dtype | None:
    if cfg.train.precision == "fp16":
        return torch.float16
    if cfg.train.precision == "bf16" or (cfg.train.precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _grad_scaler(
    cfg: PretrainConfig, device: torch.device, saved: dict[str, Any] | None
) -> torch.amp.GradScaler | None:
    """fp16's loss scaler (``levjepa.train.step``), restored from the checkpoint's state when there is one (the
    scale is part of the trajectory: a resume continues it bit-exactly)."""
    if cfg.train.precision != "fp16":
        return None
    scaler = torch.amp.GradScaler(device.type)
    if saved:
        scaler.load_state_dict(saved)
    return scaler


@dataclass(kw_only=True)
class Trainer:
    """What one run trains, and with what: the objects fixed for the whole run."""

    cfg: PretrainConfig
    info: distributed.DistInfo
    path: Path  # the run directory
    model: Pretrainer  # encoder + projector (what checkpoints hold)
    module: torch.nn.Module  # what train_step runs: the model, or DDP around it
    ema: EMA
    optimizer: torch.optim.Optimizer
    objective: Objective
    micro_batches: int  # micro-batches per optimizer step on each rank
    autocast_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None = None  # train.precision=fp16: the loss scale


@dataclass
class TrainState:
    """What the loop carries from one step to the next (the skips and checkpoints: ``Lifecycle``)."""

    step: int  # optimizer steps done
    consecutive_skips: int = 0  # non-finite steps in a row at the checkpoint the run resumed from
    metrics: dict[str, float] = field(default_factory=dict)  # the last logged metrics
    bad_files: int = 0  # unreadable files met by every rank, as of the last checkpoint


def pretrain(
    cfg: PretrainConfig,
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    start_weights: StartWeights | None = None,
) -> RunSummary:
    """Pretrain an encoder as ``cfg`` says, writing everything to ``run_dir``; returns a summary.

    ``start_weights`` (``levjepa.formats.load_init_weights(cfg.model.init_from)``, what ``levjepa pretrain``
    passes when ``model.init_from`` is set) are the encoder and projector weights of step 0 of a fresh run
    (``levjepa.train.start``); a resume continues from the run's own checkpoints and ignores them: its latest, or,
    when ``run_dir`` names one of them (``RUN/checkpoints/step_N``), that one (the later ones are set aside).

    The process is left as it was found: the torch thread count (``train.threads`` changes it for the run),
    the global RNG state (which nothing in the run draws from; forked all the same) and the process group (torn
    down) are restored on return or error, so a caller (a notebook, a test suite) sees no state leak from the run.
    """
    with torch_threads(cfg.train.threads):
        info = distributed.setup(device=_device(cfg))
        rng_devices = [info.device.index or 0] if info.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=rng_devices):
                return _pretrain(
                    cfg, run_dir, info, resume=resume, overwrite=overwrite, progress=progress, start=start_weights
                )
        finally:
            distributed.teardown()


def _pretrain(
    cfg: PretrainConfig,
    run_dir: str | Path | None,
    info: distributed.DistInfo,
    *,
    resume: bool,
    overwrite: bool,
    progress: bool,
    start: StartWeights | None = None,
) -> RunSummary:
    """The recipe: a run directory, the models, the state to start from, then for every optimizer step one
    train step (and EMA update), a skip check, a log line and a checkpoint when each is due.

    ``config.json`` is (re)written only once the models are built and the checkpoint has loaded, so a resume
    that is refused leaves the run as it was; a start that fails before the first log line or checkpoint
    removes the directory it created (``run_directory``), so the same command can simply be run again."""
    check_loggers(cfg.train.loggers)
    if cfg.model.init_from and not resume and start is None:
        raise ConfigError(
            f"model.init_from={cfg.model.init_from}: pass its weights, pretrain(cfg, start_weights="
            "levjepa.formats.load_init_weights(cfg.model.init_from)) (`levjepa pretrain` does it)"
        )
    cfg = fit_micro_batch(cfg, info.world_size, say=info.is_main)  # a train.batch_size below one micro-batch
    path = Path(run_dir) if run_dir is not None else default_run_dir(cfg.preset)
    path, at = ckpt.checkpoint_run(path) if resume else (path, None)
    check = functools.partial(check_pretrain_resume, cfg=cfg, world_size=info.world_size, at=at)
    with run_directory(path, info, resume=resume, overwrite=overwrite, check=check) as path:
        trainer, state = _build(cfg, info, path, resume=resume, start=None if resume else start, at=at)
        if info.is_main:
            write_run_info(path, to_dict(cfg), info.world_size)
        return _train(trainer, state, resume=resume, progress=progress)


def _train(trainer: Trainer, state: TrainState, *, resume: bool, progress: bool) -> RunSummary:
    """The loop proper: batches from the step the run stands at, one optimizer step each, logs and checkpoints."""
    cfg, info, path, tc = trainer.cfg, trainer.info, trainer.path, trainer.cfg.train
    bad_files = read_bad_files(path, resume)
    state.bad_files = bad_files.total
    loader = PretrainLoader(
        _capped_workers(cfg.data, info),
        seed=tc.seed,
        rank=info.rank,
        world_size=info.world_size,
        start_step=state.step * trainer.micro_batches,  # the step is the data position (train/checkpoint.py)
        bad_files=bad_files,
        micro_batches=trainer.micro_batches,
    )
    if info.is_main:
        print(_banner(trainer, state, sum(len(s) for s in loader.dataset.sources)), file=sys.stderr, flush=True)
    batches = iter(loader)
    # a resume hides the TensorBoard events logged after its checkpoint (metrics.jsonl is truncated to it)
    purge = state.step + 1 if resume else None
    logger = MetricsLogger(path, loggers=tc.loggers, config=to_dict(cfg), purge_step=purge) if info.is_main else None
    report = Progress(total=tc.steps, start_step=state.step, batch_size=tc.batch_size, device=info.device,
                      logger=logger, is_main=info.is_main, show=progress)  # fmt: skip
    check_every = min(tc.log_every, tc.max_consecutive_skips)
    start = state.step
    life = Lifecycle(
        path,
        info,
        command="levjepa pretrain",
        steps=tc.steps,
        checkpoint_every=tc.checkpoint_every,
        keep_last=tc.keep_last,
        keep_every=tc.keep_every,
        max_consecutive_skips=tc.max_consecutive_skips,
        consecutive_skips=state.consecutive_skips,
        after_checkpoint=functools.partial(_gather_bad_files, trainer, state, bad_files),
    )
    life.step = state.step
    write = functools.partial(_checkpoint, trainer, state, life)
    try:
        with life:
            while state.step < tc.steps:
                out = _step(trainer, state, life, batches)
                if due(state.step, check_every, tc.steps):
                    life.check()
                if due(state.step, tc.log_every, tc.steps):
                    _log(trainer, state, life, out, report)
                report.advance()
                life.end_of_step(state.step, write)
    finally:
        report.close()
        loader.close()  # its workers end here, not whenever the loader is collected
    return _finish(trainer, state, life, start, report.elapsed())


def _banner(trainer: Trainer, state: TrainState, items: int) -> str:
    cfg, model = trainer.cfg, trainer.model
    names = {torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast"}
    precision = names.get(trainer.autocast_dtype, "fp32") if trainer.autocast_dtype is not None else "fp32"
    return start_banner(
        run_dir=trainer.path,
        start_step=state.step,
        steps=cfg.train.steps,
        device=trainer.info.device,
        world_size=trainer.info.world_size,
        encoder_params=sum(p.numel() for p in model.encoder.parameters()),
        projector_params=sum(p.numel() for p in model.projector.parameters()),
        items=items,
        sources=cfg.data.sources,
        batch_size=cfg.train.batch_size,
        micro_batch=cfg.data.batch_size,
        micro_batches=trainer.micro_batches,
        precision=precision + (" + loss scaling" if trainer.scaler is not None else ""),
    )


def _capped_workers(data: DataConfig, info: distributed.DistInfo) -> DataConfig:
    """``data.num_workers`` capped at this rank's share of the available cores (the processes of one node
    share them: ``LOCAL_WORLD_SIZE`` under torchrun, ``SLURM_NTASKS_PER_NODE`` under srun); more loader
    processes than cores only thrash. The data each step sees does not depend on the worker count."""
    per_node = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    local = int(per_node) if per_node.isdigit() and int(per_node) > 0 else 1
    cap = max(1, len(allowed_cpus()) // local)
    if data.num_workers <= cap:
        return data
    if info.is_main:
        print(f"data.num_workers={data.num_workers} capped at {cap}: the cores this process may use", file=sys.stderr)
    return dataclasses.replace(data, num_workers=cap)


def _build(
    cfg: PretrainConfig,
    info: distributed.DistInfo,
    path: Path,
    *,
    resume: bool,
    start: StartWeights | None = None,
    at: Path | None = None,
) -> tuple[Trainer, TrainState]:
    """Encoder + projector (the same initial weights on every rank, or ``start``'s), EMA copy, AdamW and
    objective, restored from the latest checkpoint when resuming, then wrapped for training (DDP, compiled
    blocks)."""
    micro_batches = cfg.micro_batches(info.world_size)  # fails early on a batch that does not split over ranks
    encoder, projector = build_models(cfg, cfg.train.seed)
    if start is not None:
        said = load_start_weights(encoder, projector, start, str(cfg.model.init_from))
        if info.is_main:
            print(said, flush=True)
    model = Pretrainer(encoder, projector).to(info.device)
    if info.world_size > 1:
        distributed.convert_sync_batchnorm(model)  # the projector's BatchNorm over every rank's rows
    tc = cfg.train
    ema = EMA(model.encoder, decay=tc.ema_decay, every=tc.ema_every, warmup=tc.ema_warmup)
    optimizer = build_optimizer(model, cfg.optim)
    objective = build_objective(cfg.objective, check_finite=False).to(info.device)  # non-finite: the step is skipped
    saved = (
        ckpt.resume_latest(path, model=model, ema=ema, optimizer=optimizer, is_main=info.is_main, at=at)
        if resume
        else ckpt.TrainerState(step=0)
    )
    trainer = Trainer(
        cfg=cfg,
        info=info,
        path=path,
        model=model,
        module=_training_module(model, objective, info, micro_batches, tc.accumulation, tc.compile),
        ema=ema,
        optimizer=optimizer,
        objective=objective,
        micro_batches=micro_batches,
        autocast_dtype=_autocast_dtype(cfg, info.device),
        scaler=_grad_scaler(cfg, info.device, (saved.extra or {}).get("grad_scaler")),
    )
    return trainer, TrainState(step=saved.step, consecutive_skips=saved.consecutive_skips)


def _step(
    trainer: Trainer, state: TrainState, life: Lifecycle, batches: Iterator[ViewBatch | FrameBatch]
) -> StepOutput:
    """One optimizer step on this rank's micro-batches, then the EMA update when it is due."""
    cfg, step = trainer.cfg, state.step
    micro, drops = _next_micro_batches(batches, trainer.micro_batches, cfg.train.seed, trainer.info.device)
    out = train_step(
        trainer.module,
        trainer.objective,
        trainer.optimizer,
        micro,
        drops,
        step=step,
        lr=lr_at(step, cfg.optim, cfg.train.steps),
        grad_clip=cfg.optim.grad_clip,
        autocast_dtype=trainer.autocast_dtype,
        accumulation=cfg.train.accumulation,
        scaler=trainer.scaler,
    )
    # under fp16 an overflow of the scaled gradients is the scaler's business (it skips the step and halves
    # the scale, counted with the skips); only a non-finite loss counts towards stopping the run
    life.record(step, out.skipped, out.skipped if trainer.scaler is None else ~torch.isfinite(out.loss))
    state.step = step + 1
    if trainer.ema.due(state.step):
        trainer.ema.update(trainer.model.encoder)
    return out


def _log(trainer: Trainer, state: TrainState, life: Lifecycle, out: StepOutput, report: Progress) -> None:
    """The loss and its terms as the objective computed them, the gradient norm and the label-free monitors of
    the projections the loss saw, averaged over ranks; the learning rate and the skips (``report`` adds the
    rate and peak memory, and shows and writes the record)."""
    cfg = trainer.cfg
    metrics = {"loss": out.loss, "grad_norm": out.grad_norm, **out.terms}
    # the monitors' fixed-direction SIGReg must not overwrite the loss's own sigreg/view{v} terms
    monitors = embedding_diagnostics(out.z)
    metrics.update({(f"monitor/{k}" if k in metrics else k): v for k, v in monitors.items()})
    reduced = distributed.reduce_scalars(metrics)
    reduced["lr"] = lr_at(state.step - 1, cfg.optim, cfg.train.steps)
    reduced["skipped_total"] = float(len(life.skipped))
    state.metrics = report.log(state.step, reduced)


def _finish(trainer: Trainer, state: TrainState, life: Lifecycle, start: int, wall: float) -> RunSummary:
    tc = trainer.cfg.train
    summary = RunSummary(
        run_dir=trainer.path,
        steps=tc.steps,
        wall_s=wall,
        clips_per_s=(tc.steps - start) * tc.batch_size / max(wall, 1e-9),
        final=state.metrics,
        skipped_steps=life.skipped,
        bad_files=state.bad_files,
        checkpoint=life.checkpoint,
        rank=trainer.info.rank,
    )
    if trainer.info.is_main:
        print(format_summary(summary), file=sys.stderr)
    return summary


def _training_module(
    model: Pretrainer,
    objective: Objective,
    info: distributed.DistInfo,
    micro_batches: int,
    accumulation: str,
    compile_: bool,
) -> torch.nn.Module:
    """The module ``train_step`` runs: DDP around ``model`` when each rank runs one pass per micro-batch on
    several ranks (it averages gradients overlapped with the backward); ``model`` itself for GradCache
    accumulation, whose gradients ``train_step`` averages over ranks with one explicit all-reduce.

    ``train.compile``: ``levjepa.train.step.compile_step`` compiles in place (the state-dict keys do not
    change): on CUDA each view group's forward, the projector and the loss as CUDA graphs; on the CPU the
    encoder's block stack as one region.
    """
    if compile_:
        compile_step(model, objective, info.device)
    if info.world_size > 1 and (micro_batches == 1 or accumulation == "local"):
        return distributed.wrap_ddp(model, info)
    return model


def _next_micro_batches(
    batches: Iterator[ViewBatch | FrameBatch], count: int, seed: int, device: torch.device
) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """This rank's ``count`` micro-batches on ``device`` (augmented there) and their dropping keys, one per clip.

    A clip's key is ``derive_seed(seed, "drop", epoch, position)``: the tokens a view drops depend on the
    sample alone, not on the rank or micro-batch that holds it, so any split of the effective batch into
    ranks × micro-batches trains identically (and a run can resume on another number of GPUs). The loader
    adds each batch's unreadable files to the run's report.
    """
    micro, drops = [], []
    for _ in range(count):
        batch = next(batches)
        micro.append(batch.augment_to_device(device))
        drops.append(sample_keys(seed, "drop", batch.epoch, positions=batch.index, device=device))
    return micro, drops


def _checkpoint(trainer: Trainer, state: TrainState, life: Lifecycle) -> Path:
    """Write the checkpoint of the step the run stands at (the main rank; ``Lifecycle.save`` prunes and reports
    a failed write): online and EMA weights, optimizer, the skip count, the last metrics and fp16's scale."""
    extra: dict[str, Any] = {"metrics": state.metrics}
    if trainer.scaler is not None:
        extra["grad_scaler"] = trainer.scaler.state_dict()
    return ckpt.save_checkpoint(
        trainer.path,
        model=trainer.model,
        ema=trainer.ema,
        optimizer=trainer.optimizer,
        state=ckpt.TrainerState(step=state.step, consecutive_skips=int(life.consecutive), extra=extra),
        encoder_config=to_dict(trainer.cfg.model),
    )


def _gather_bad_files(trainer: Trainer, state: TrainState, bad_files: BadFileReport) -> None:
    """After every checkpoint, on every rank (a collective): every rank's unreadable files into the run's report."""
    every_rank = bad_files.gather()
    state.bad_files = every_rank.total
    if trainer.info.is_main:
        every_rank.write(trainer.path / BAD_FILES)
