"""The outer training loop: ``pretrain(cfg, run_dir)`` — the Python API behind ``levjepa pretrain``.

It reads like the recipe: set up ranks and the run directory, build encoder + projector + objective + AdamW
+ EMA, resume if asked, then for each optimizer step fetch ``accum`` micro-batches, call
:func:`levjepa.train.step.train_step`, update the EMA every ``ema_every`` steps, log label-free monitors
every ``log_every`` steps and checkpoint every ``checkpoint_every`` steps. Only the main rank writes.

Nothing in the step waits for the device; the loop reads device values (losses, skip flags) only on logging
and skip-check steps. Logged: the loss and its terms as the objective computed them, the gradient norm, and
the label-free monitors of ``embedding_diagnostics`` on the projections the loss saw (its fixed-direction
SIGReg as ``monitor/sigreg/view{v}``). A non-finite loss or gradient skips that update (on the device), is
logged with its step number, and ``max_consecutive_skips`` skips in a row stop the run with a message.
"""

from __future__ import annotations

import dataclasses
import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from levjepa import distributed
from levjepa.config import to_dict
from levjepa.data import BadFileReport, build_pretrain_loader
from levjepa.model import Projector, VideoEncoder
from levjepa.objective import build_objective, embedding_diagnostics, shift_invariant
from levjepa.rng import sample_keys
from levjepa.train import checkpoint as ckpt
from levjepa.train.config import PretrainConfig
from levjepa.train.ema import EMA
from levjepa.train.optim import build_optimizer, lr_at
from levjepa.train.run_dir import MetricsLogger, default_run_dir, prepare_run_dir, write_run_info
from levjepa.train.step import Pretrainer, train_step
from levjepa.weights import BAD_FILES, truncate_metrics

__all__ = ["pretrain", "RunSummary", "TrainingStopped", "build_models"]


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the message says why and what to do."""


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    wall_s: float
    clips_per_s: float
    final: dict[str, float] = field(default_factory=dict)
    skipped_steps: list[int] = field(default_factory=list)
    bad_files: int = 0
    checkpoint: Path | None = None
    rank: int = 0  # the process that returned this summary (only rank 0 writes the run directory)
    probe_results: dict[str, Any] | None = None  # filled by `levjepa pretrain` when train.eval_at_end


def build_models(cfg: PretrainConfig, seed: int) -> tuple[VideoEncoder, Projector]:
    """Encoder and projector initialised from ``seed`` (the same weights on every rank).

    Under a shift-invariant objective (LocaLeJEPA) the projector's output bias would get an exactly zero
    gradient, so it is frozen at zero (``levjepa.objective.shift_invariant``); no trained parameter is dead.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = VideoEncoder(cfg.model)
        projector = Projector.from_config(cfg.model)
    if shift_invariant(cfg.objective):
        projector.net[-1].bias.requires_grad_(False)
    return encoder, projector


def _device(cfg: PretrainConfig) -> str | None:
    return None if cfg.train.device == "auto" else cfg.train.device


def _autocast_dtype(cfg: PretrainConfig, device: torch.device) -> torch.dtype | None:
    if cfg.train.precision == "bf16" or (cfg.train.precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss_kb / 2**20  # Linux reports KiB


def pretrain(
    cfg: PretrainConfig,
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> RunSummary:
    """Pretrain an encoder as ``cfg`` says, writing everything to ``run_dir``; returns a summary.

    The process is left as it was found: the torch thread count (``train.threads`` changes it for the run),
    the global RNG state (a resume restores the checkpoint's) and the process group (torn down) are
    restored on return or error, so a caller (a notebook, a test suite) sees no state leak from the run.
    """
    threads = torch.get_num_threads()
    info = distributed.setup(device=_device(cfg))
    rng_devices = [info.device.index or 0] if info.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=rng_devices):
            return _pretrain(cfg, run_dir, info, resume=resume, overwrite=overwrite, progress=progress)
    finally:
        distributed.teardown()
        torch.set_num_threads(threads)


def _pretrain(cfg, run_dir, info, *, resume, overwrite, progress) -> RunSummary:
    tc = cfg.train
    if tc.threads:
        torch.set_num_threads(tc.threads)
    path = Path(run_dir) if run_dir is not None else default_run_dir(cfg.preset)
    path = Path(distributed.broadcast_object(str(path)))
    if info.is_main:
        prepare_run_dir(path, resume=resume, overwrite=overwrite)
        write_run_info(path, to_dict(cfg), info.world_size)
    distributed.barrier()
    device = info.device
    accum = cfg.accumulation(info.world_size)

    encoder, projector = build_models(cfg, tc.seed)
    model = Pretrainer(encoder, projector).to(device)
    if info.world_size > 1:
        distributed.convert_sync_batchnorm(model)  # the projector's BatchNorm over every rank's rows
    ema = EMA(model.encoder, decay=tc.ema_decay, every=tc.ema_every)
    optimizer = build_optimizer(model, cfg.optim)
    objective = build_objective(cfg.objective).to(device)
    objective.check_finite = False  # a non-finite batch skips its step (below) instead of raising

    state = ckpt.TrainerState(step=0)
    if resume:
        latest = ckpt.latest_checkpoint(path)
        if latest is not None:
            state = ckpt.load_checkpoint(latest, model=model, ema=ema, optimizer=optimizer)
        if info.is_main:
            where = f"{latest.name} (step {state.step})" if latest else "the start (no checkpoint was written)"
            print(f"resuming {path} from {where}", file=sys.stderr)
            truncate_metrics(path, state.step)
    train_model = _training_module(model, info, accum, tc.accumulation, tc.compile)
    autocast_dtype = _autocast_dtype(cfg, device)

    bad_files = BadFileReport()
    if resume and (path / BAD_FILES).is_file():  # what the run met before it stopped stays reported
        bad_files.merge(BadFileReport.read(path / BAD_FILES))
    loader = iter(
        build_pretrain_loader(
            cfg.data,
            seed=tc.seed,
            rank=info.rank,
            world_size=info.world_size,
            start_step=state.step * accum,
            bad_files=bad_files,
            micro_batches=accum,
        )
    )
    logger = MetricsLogger(path) if info.is_main else None
    bar = None
    if progress and info.is_main:
        from tqdm import tqdm

        bar = tqdm(total=tc.steps, initial=state.step, desc="pretrain", unit="step", dynamic_ncols=True)

    consecutive = torch.tensor(state.consecutive_skips, device=device)
    pending_flags: list[tuple[int, torch.Tensor]] = []
    skipped_steps: list[int] = []
    last_metrics: dict[str, float] = {}
    last_ckpt: Path | None = None
    bad_total = bad_files.total
    check_every = min(tc.log_every, tc.max_consecutive_skips)
    t_start = time.perf_counter()
    t_log, steps_since_log = t_start, 0
    start_step = state.step

    for step in range(start_step, tc.steps):
        micro, drops = _next_micro_batches(loader, accum, tc.seed, device, bad_files)
        out = train_step(
            train_model,
            objective,
            optimizer,
            micro,
            drops,
            step=step,
            lr=lr_at(step, cfg.optim, tc.steps),
            grad_clip=cfg.optim.grad_clip,
            autocast_dtype=autocast_dtype,
            accumulation=tc.accumulation,
        )
        consecutive = torch.where(out.skipped, consecutive + 1, torch.zeros_like(consecutive))
        pending_flags.append((step, out.skipped))
        done = step + 1
        steps_since_log += 1
        if ema.due(done):
            ema.update(model.encoder)

        if done % check_every == 0 or done == tc.steps:
            flags = torch.stack([f for _, f in pending_flags]).tolist()  # the one sync per check
            newly = [s for (s, _), bad in zip(pending_flags, flags, strict=True) if bad]
            pending_flags.clear()
            if newly and info.is_main:
                print(f"step(s) {newly}: non-finite loss or gradient, update skipped", file=sys.stderr)
            skipped_steps.extend(newly)
            if int(consecutive) >= tc.max_consecutive_skips:
                raise TrainingStopped(
                    f"{int(consecutive)} consecutive optimizer steps (up to step {step}) had a non-finite loss "
                    f"or gradient; stopping. The last good checkpoint is {ckpt.latest_checkpoint(path)}. "
                    "Lower optim.lr, check the data (bad_files.json) or use train.precision=fp32."
                )

        if done % tc.log_every == 0 or done == tc.steps:
            now = time.perf_counter()
            metrics = {"loss": out.loss, "grad_norm": out.grad_norm, **out.terms}
            # the monitors' fixed-direction SIGReg must not overwrite the loss's own sigreg/view{v} terms
            monitors = embedding_diagnostics(out.z)
            metrics.update({(f"monitor/{k}" if k in metrics else k): v for k, v in monitors.items()})
            reduced = distributed.reduce_scalars(metrics)
            reduced["lr"] = lr_at(step, cfg.optim, tc.steps)
            reduced["clips_per_s"] = steps_since_log * tc.batch_size / max(now - t_log, 1e-9)
            reduced["peak_mem_gb"] = _peak_memory_gb(device)
            reduced["skipped_total"] = float(len(skipped_steps))
            t_log, steps_since_log = now, 0
            last_metrics = reduced
            if logger is not None:
                logger.log(done, reduced)
            if bar is not None:
                bar.set_postfix(
                    loss=f"{reduced['loss']:.4f}",
                    inv=f"{reduced.get('invariance', reduced.get('pred', math.nan)):.4f}",
                    sigreg=f"{reduced.get('sigreg', reduced.get('localreg', math.nan)):.3f}",
                    clips_s=f"{reduced['clips_per_s']:.1f}",
                    refresh=False,
                )
        if bar is not None:
            bar.update(1)

        if done % tc.checkpoint_every == 0 or done == tc.steps:
            last_ckpt = _checkpoint(path, info, model, ema, optimizer, cfg, done, int(consecutive), accum, last_metrics)
            every_rank = bad_files.gather()  # a collective: all ranks call it
            bad_total = every_rank.total
            if info.is_main:
                every_rank.write(path / BAD_FILES)

    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t_start
    summary = RunSummary(
        run_dir=path,
        steps=tc.steps,
        wall_s=wall,
        clips_per_s=(tc.steps - start_step) * tc.batch_size / max(wall, 1e-9),
        final=last_metrics,
        skipped_steps=skipped_steps,
        bad_files=bad_total,
        checkpoint=last_ckpt,
        rank=info.rank,
    )
    if logger is not None:
        logger.close()
    if info.is_main:
        print(format_summary(summary), file=sys.stderr)
    return summary


def _training_module(model: Pretrainer, info, accum: int, accumulation: str, compile_: bool) -> torch.nn.Module:
    """The module ``train_step`` runs: DDP around ``model`` when each rank runs one pass per micro-batch on
    several ranks (it averages gradients overlapped with the backward); ``model`` itself for GradCache
    accumulation, whose gradients ``train_step`` averages over ranks with one explicit all-reduce.

    ``train.compile``: each encoder block is compiled in place (``VideoEncoder.compile_blocks``: the
    state-dict keys do not change, identical blocks share their graphs — one per view shape and grad mode —
    and the keyed token dropping, the loop over view groups and the small projector, whose BatchNorm
    all-reduces over ranks, stay eager).
    """
    if compile_:
        model.encoder.compile_blocks()
    if info.world_size > 1 and (accum == 1 or accumulation == "local"):
        return distributed.wrap_ddp(model, info)
    return model


def _next_micro_batches(loader, accum: int, seed: int, device: torch.device, bad_files: BadFileReport):
    """This rank's ``accum`` micro-batches on ``device`` and their dropping keys, one per clip.

    A clip's key is ``derive_seed(seed, "drop", epoch, position)``: the tokens a view drops depend on the
    sample alone, not on the rank or micro-batch that holds it, so any split of the effective batch into
    ranks × micro-batches trains identically (and a run can resume on another number of GPUs).
    """
    micro, drops = [], []
    for _ in range(accum):
        batch = next(loader)
        bad_files.extend(batch.bad_files)
        micro.append(batch.augment_to_device(device))
        drops.append(sample_keys(seed, "drop", batch.epoch, positions=batch.index, device=device))
    return micro, drops


def _checkpoint(path, info, model, ema, optimizer, cfg, step, consecutive, accum, metrics) -> Path | None:
    saved = None
    if info.is_main:
        state = ckpt.TrainerState(step=step, consecutive_skips=consecutive, extra={"metrics": metrics})
        try:
            saved = ckpt.save_checkpoint(
                path, model=model, ema=ema, optimizer=optimizer, state=state, encoder_config=to_dict(cfg.model)
            )
            ckpt.prune(path, cfg.train.keep_last, cfg.train.keep_every)
        except OSError as err:
            previous = ckpt.latest_checkpoint(path)
            print(
                f"checkpoint at step {step} FAILED ({err}); the previous checkpoint "
                f"{previous if previous else '(none)'} is intact. Training continues; free space and it will "
                "be retried at the next checkpoint.",
                file=sys.stderr,
            )
            if step == cfg.train.steps:
                raise
    distributed.barrier()
    return saved


def format_summary(s: RunSummary) -> str:
    lines = [
        f"run directory : {s.run_dir}",
        f"steps         : {s.steps}   wall {s.wall_s:.1f} s   {s.clips_per_s:.1f} clips/s",
    ]
    if s.final:
        keys = [k for k in ("loss", "invariance", "pred", "sigreg", "localreg") if k in s.final]
        lines.append("final losses  : " + "  ".join(f"{k} {s.final[k]:.4f}" for k in keys))
        if "effective_rank" in s.final:
            lines.append(f"effective rank: {s.final['effective_rank']:.1f}")
    lines.append(f"skipped steps : {len(s.skipped_steps)}{' ' + str(s.skipped_steps[:10]) if s.skipped_steps else ''}")
    lines.append(f"bad files     : {s.bad_files}" + (" (see bad_files.json)" if s.bad_files else ""))
    if s.checkpoint:
        lines.append(f"checkpoint    : {s.checkpoint}")
    return "\n".join(lines)


def summary_json(s: RunSummary) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    d["run_dir"] = str(s.run_dir)
    d["checkpoint"] = str(s.checkpoint) if s.checkpoint else None
    return d
