"""End-to-end fine-tuning of an encoder + head on a labelled index: ``levjepa finetune``.

The recipe of the video fine-tuning literature — VideoMAE (Tong et al., NeurIPS 2022, "VideoMAE: Masked
Autoencoders are Data-Efficient Learners for Self-Supervised Video Pre-Training", its fine-tuning
recipe) and V-JEPA (Bardes et al., 2024, "Revisiting Feature Prediction for Learning Visual Representations
from Video", its attentive classifier): AdamW, linear warm-up then cosine decay, layer-wise learning-rate
decay, drop-path, label smoothing, optional mixup, train-time augmentation of the clip, every token or a
kept fraction of them (``keep_ratio``: the encoder drops the rest at random, as in pretraining), bf16
autocast on GPU, gradient accumulation over micro-batches, and data parallelism under ``torchrun``
(``levjepa.distributed``). The pieces are in ``recipe.py`` (lrs, drop-path, targets) and ``clips.py``
(which clip each position of the stream is, and its augmentation).

**Start**: the encoder of a levjepa run, checkpoint, export or imported weights (``levjepa.formats.load``),
or, for the baseline, the same architecture at random initialisation (``random_init``); the head
(``levjepa.model.classifier``, the probe's attentive or linear head) is initialised from
``(seed, "head")``.

**The run directory** ``OUT``: ``config.json`` (the :class:`FinetuneConfig`), ``env.json`` / ``git.json``,
``metrics.jsonl`` (and TensorBoard events, ``train.report``), ``checkpoints/step_N`` (``train.checkpoint``:
online weights, optimizer state, step; written atomically), ``best/`` — the classifier with the best
validation accuracy so far (the encoder in the hub layout with ``id2label``, its head and
``classifier.json``: what ``levjepa classify`` runs and ``levjepa export`` writes again) — and
``results.json`` (best step, val and test accuracy of ``best``).

**Resume** (``resume=True``): the saved config may differ only in ``RESUMABLE`` keys; the latest checkpoint
is restored, the metrics logged after it dropped; since step ``s`` reads positions of the stream fixed by
``(seed, s)`` and every stochastic choice is keyed by the step and the position (the augmentation) or the
global micro-batch (mixup, drop-path, token drop: ``train_step``), the resumed run computes the same weights
as an uninterrupted one (bit-exact on the CPU).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa import distributed
from levjepa.config import ConfigError, to_dict
from levjepa.data import BadFileReport, DataError, MediaItem, normalize
from levjepa.data.workers import decode_in_workers
from levjepa.eval.predict import accuracy, predict
from levjepa.eval.protocols import PROTOCOLS, read_labelled
from levjepa.finetune.clips import TrainClips, rank_positions
from levjepa.finetune.config import FinetuneConfig, check_resume
from levjepa.finetune.recipe import DropPath, lr_at, mix, param_groups, soft_targets
from levjepa.formats.classifier import (
    HEAD_WEIGHTS,
    ClassifierRecord,
    Protocol,
    id2label,
    load_classifier,
    read_classifier,
    weights_fingerprint,
    write_classifier,
)
from levjepa.formats.export import write_export
from levjepa.formats.load import LoadedEncoder, load_encoder, random_encoder
from levjepa.model.classifier import HeadConfig, VideoClassifier, build_head
from levjepa.rng import make_generator
from levjepa.train.checkpoint import TrainerState, latest_checkpoint, load_checkpoint, save_checkpoint
from levjepa.train.ema import EMA
from levjepa.train.preemption import Preempted, StopSignals
from levjepa.train.report import MetricsLogger
from levjepa.train.run_dir import prepare_run_dir, write_run_info
from levjepa.weights import CONFIG, load_tensors, read_json, truncate_metrics, write_json

__all__ = ["FinetuneResult", "finetune"]

BEST = "best"
RESULTS = "results.json"


@dataclass
class FinetuneResult:
    out: Path
    best_step: int
    best_val: float
    test: float | None
    steps: int


@dataclass
class _Task:
    splits: dict[str, list[MediaItem]]
    labels: tuple[str, ...]
    protocol: Protocol


def read_task(cfg: FinetuneConfig) -> _Task:
    """The splits, class names and val/test views of ``cfg.task`` (``levjepa.eval.protocols``); a label of
    VAL/TEST that TRAIN never saw, or a single class, is refused."""
    splits: dict[str, list[MediaItem]] = {}
    names: dict[str, int] | None = None
    for split, path in zip(("train", "val", "test"), cfg.task, strict=False):
        splits[split], got = read_labelled(path, classes=names)
        names = names or got
    seen = {int(it.label or 0) for it in splits["train"]}
    if len(seen) < 2:
        raise DataError(f"unreadable: {cfg.task[0]}: every row has the label {seen.pop()}: need >= 2 classes")
    for split, path in zip(("val", "test"), cfg.task[1:], strict=False):
        unseen = sorted({int(it.label or 0) for it in splits[split]} - seen)
        if unseen:
            raise DataError(f"unreadable: {path}: label(s) {unseen[:5]} never occur in TRAIN {cfg.task[0]}")
    count = max(seen) + 1
    by_index = {i: n for n, i in (names or {}).items()}
    labels = tuple(by_index.get(i, str(i)) for i in range(count))
    if cfg.protocol is not None:
        if cfg.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol {cfg.protocol!r}: valid choices are {', '.join(PROTOCOLS)}")
        p = PROTOCOLS[cfg.protocol]
        protocol = Protocol(p.size, p.frames, p.frame_stride, p.segments, p.crops)
    else:
        protocol = Protocol(cfg.size, cfg.frames, cfg.frame_stride, 1, 1)
    return _Task(splits, labels, protocol)


def _start_encoder(cfg: FinetuneConfig, device: str) -> LoadedEncoder:
    loaded = load_encoder(cfg.source, weights=cfg.weights, device="cpu")
    if cfg.random_init:
        loaded = random_encoder(loaded.config, seed=cfg.seed)
    enc = loaded.encoder
    drop = dataclasses.replace(enc.cfg, drop_ratio=1.0 - cfg.keep_ratio)  # the kept fraction when training
    enc.cfg = drop
    for p in enc.parameters():
        p.requires_grad_(True)
    loaded.encoder = enc.to(device)
    return loaded


def _probe_head(path: str, want: HeadConfig) -> tuple[HeadConfig, torch.nn.Module]:
    """The head of the kept probe at ``path`` (LP-FT: Kumar et al., ICLR 2022, fine-tune from a trained
    probe), read in float32; refused unless it is a head of the same kind and size for the same classes."""
    rec = read_classifier(path)
    got = dataclasses.replace(rec.head, token_dtype="float32")
    if (got.kind, got.dim, got.num_classes) != (want.kind, want.dim, want.num_classes):
        raise ConfigError(
            f"head_from={path}: a {got.kind} head of width {got.dim} for {got.num_classes} classes; this fine-tuning "
            f"needs a {want.kind} head of width {want.dim} for {want.num_classes} (--head, the task's classes)"
        )
    head = build_head(got)
    head.load_state_dict(load_tensors(Path(path) / HEAD_WEIGHTS)[0])
    return got, head


def _check_out(cfg: FinetuneConfig, out: Path) -> None:
    src = Path(cfg.source).resolve()
    o = out.resolve()
    if o == src or (src.is_dir() and src in o.parents) or (o in src.parents):
        raise ConfigError(f"--out {out} is inside (or holds) the source {cfg.source}: choose a folder outside it")


def _evaluate(model: VideoClassifier, task: _Task, split: str, cfg: FinetuneConfig, device: str) -> float:
    model.eval()
    preds = list(
        predict(model, task.labels, task.protocol, task.splits[split], top_k=1, workers=cfg.workers, device=device)
    )
    model.train()
    acc = accuracy(preds)
    if acc is None:
        raise DataError(f"unreadable: no file of the {split} split could be read")
    return acc


def _save_best(
    model: VideoClassifier, loaded: LoadedEncoder, task: _Task, cfg: FinetuneConfig, out: Path, trained: dict[str, Any]
) -> None:
    enc = model.encoder
    cfg_enc = dataclasses.replace(enc.cfg, drop_ratio=loaded.config.drop_ratio)
    state = {k: v.detach().cpu().clone() for k, v in enc.state_dict().items()}
    dest = out / BEST
    write_export(
        dest,
        config=cfg_enc,
        encoder_state=state,
        weights="finetuned",
        note=f"fine-tuned from {cfg.source} ({'random init' if cfg.random_init else cfg.weights})",
        step=trained["step"],
        source=str(Path(cfg.source).resolve()),
        run_config=None,
        extra=id2label(task.labels),
        preprocessing=None,
    )
    record = ClassifierRecord(
        model.head_cfg, task.labels, task.protocol, ".", "finetuned", weights_fingerprint(enc), trained=trained
    )
    write_classifier(dest, record, model.head.state_dict())


def finetune(cfg: FinetuneConfig, out: str | Path, *, resume: bool = False, progress: bool = False) -> FinetuneResult:
    """Fine-tune as ``cfg`` says into ``out`` (see the module doc); returns where the best classifier is."""
    info = distributed.setup(None if cfg.device == "auto" else cfg.device)
    try:
        return _finetune(cfg, Path(out), info, resume=resume)
    finally:
        distributed.teardown()


def _finetune(cfg: FinetuneConfig, out: Path, info: distributed.DistInfo, *, resume: bool) -> FinetuneResult:
    device = str(info.device)
    _check_out(cfg, out)
    task = read_task(cfg)
    micro, accum = cfg.micro_batches(info.world_size)
    # the main rank reads and prepares OUT and every rank raises what it refuses (main_rank_decides): the
    # other ranks used to go on alone into DDP's first collective, to wait there or die of a gloo error
    with distributed.main_rank_decides():
        if resume and info.is_main:
            if not (out / CONFIG).is_file():
                raise ConfigError(f"{out}: nothing to resume (no config.json); start without --resume")
            check_resume(read_json(out / CONFIG), cfg)
    loaded = _start_encoder(cfg, device)  # before anything is written: a bad source leaves no folder
    created = False
    with distributed.main_rank_decides():
        if info.is_main:
            created = not out.exists()
            prepare_run_dir(out, resume=resume, overwrite=False)
            if not resume:
                write_run_info(out, to_dict(cfg), info.world_size)
    try:
        return _train(cfg, out, info, task, loaded, micro, accum, resume=resume)
    except Exception:
        if created and info.is_main and latest_checkpoint(out) is None:  # a start that failed leaves nothing
            shutil.rmtree(out, ignore_errors=True)
        raise


def _train(
    cfg: FinetuneConfig,
    out: Path,
    info: distributed.DistInfo,
    task: _Task,
    loaded: LoadedEncoder,
    micro: int,
    accum: int,
    *,
    resume: bool,
) -> FinetuneResult:
    device = str(info.device)
    head_cfg = HeadConfig(
        kind=cfg.head,
        input="tokens" if cfg.head == "attentive" else "mean",
        dim=loaded.config.dim,
        num_classes=len(task.labels),
        depth=cfg.head_depth,
    )
    head = build_head(head_cfg, make_generator(cfg.seed, "head"))
    if cfg.head_from is not None:
        head_cfg, head = _probe_head(cfg.head_from, head_cfg)
    model = VideoClassifier(loaded.encoder, head_cfg, head)
    model = model.to(device).train()
    groups = param_groups(model, cfg)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=False)
    ema = EMA(model, every=max(cfg.steps, 1))  # the checkpoint's Polyak slot; fine-tuning evaluates the online weights
    state = TrainerState(step=0, extra={"best_val": -1.0, "best_step": 0})
    latest = latest_checkpoint(out) if resume else None
    if latest is not None:
        state = load_checkpoint(latest, model=model, ema=ema, optimizer=opt)
        if info.is_main:
            print(f"resuming {out} from {latest.name} (step {state.step})", file=sys.stderr)
            truncate_metrics(out, state.step)
    kept = state.extra or {}
    best_val, best_step = float(kept.get("best_val", -1.0)), int(kept.get("best_step", 0))
    drop_path = DropPath(model, cfg.drop_path)
    module = distributed.wrap_ddp(model, info)
    logger = MetricsLogger(out, cfg.loggers, to_dict(cfg), purge_step=state.step + 1) if info.is_main else None
    bad = BadFileReport()
    positions = rank_positions(range(state.step, cfg.steps), cfg.batch_size, micro, accum, info.rank, info.world_size)
    clips = TrainClips(task.splits["train"], positions, cfg, loaded.config.patch_size)
    stream = decode_in_workers(clips, cfg.workers)
    ctx = StepContext(device, info.rank, info.world_size, head_cfg.num_classes, drop_path)
    t0, last = time.perf_counter(), state.step
    try:
        with StopSignals() as stop:
            for step in range(state.step, cfg.steps):
                lr = lr_at(step, cfg)
                total = train_step(module, opt, _micro_batches(stream, micro, accum, task, clips, bad), cfg, step, ctx)
                done = step + 1
                logged = done % cfg.log_every == 0 or done == cfg.steps
                if logged:
                    total = distributed.reduce_scalars({"loss": total})["loss"]  # over ranks: the global batch's
                if logger is not None and logged:
                    rate = (done - last) * cfg.batch_size / max(time.perf_counter() - t0, 1e-9)
                    t0, last = time.perf_counter(), done
                    rec = {"loss": total, "lr": lr, "clips_per_s": rate}
                    logger.log(done, rec)
                    print(
                        f"step {done}/{cfg.steps}  loss {total:.4f}  lr {lr:.2e}  {rate:.1f} clips/s", file=sys.stderr
                    )
                if (done % cfg.eval_every == 0 or done == cfg.steps) and info.is_main:
                    val = _evaluate(model, task, "val", cfg, device)
                    if logger is not None:
                        logger.log(done, {"val_acc": val})
                    print(f"step {done}/{cfg.steps}  val_acc {val:.1f}", file=sys.stderr)
                    if val > best_val:
                        best_val, best_step = val, done
                        _save_best(model, loaded, task, cfg, out, {"step": done, "val_acc": val, **_recipe(cfg)})
                due = done % cfg.checkpoint_every == 0 or done == cfg.steps
                stopped = done < cfg.steps and distributed.any_rank(stop.received is not None)  # pre-emption
                if (due or stopped) and info.is_main:
                    extra = {"best_val": best_val, "best_step": best_step}
                    save_checkpoint(
                        out,
                        model=model,
                        ema=ema,
                        optimizer=opt,
                        state=TrainerState(step=done, extra=extra),
                        encoder_config=to_dict(loaded.config),
                    )
                if stopped:  # as pretrain: the step done, a checkpoint, one line, exit 75 (train.preemption)
                    name = distributed.broadcast_object(stop.received or "a stop signal")
                    raise Preempted(name, done, latest_checkpoint(out), out, is_main=info.is_main)
    finally:
        drop_path.remove()
        if logger is not None:
            logger.close()
    test = None
    if info.is_main and "test" in task.splits:
        best = load_classifier(out / BEST, device=device)
        test = _evaluate(best.model, task, "test", cfg, device)
    if info.is_main:
        result = {"best_step": best_step, "best_val_acc": best_val, "test_acc": test, "steps": cfg.steps}
        write_json(out / RESULTS, result)
        print(json.dumps(result), file=sys.stderr)
        if bad.total:
            bad.write(out / "bad_files.json")
    return FinetuneResult(out, best_step, best_val, test, cfg.steps)


@dataclass
class StepContext:
    """What a step needs besides its batch: the device, the rank and world size, the class count and the
    drop-path hooks."""

    device: str
    rank: int
    world_size: int
    num_classes: int
    drop_path: DropPath


def _micro_batches(
    stream: Iterator[tuple[int, Tensor | None, int, str]],
    micro: int,
    accum: int,
    task: _Task,
    clips: TrainClips,
    bad: BadFileReport,
) -> list[tuple[Tensor, Tensor]]:
    """The next ``accum`` micro-batches of ``micro`` clips (uint8 [B, C, T, S, S], labels [B]); an unreadable
    training file is reported and its micro-batch is one clip short."""
    out = []
    for _ in range(accum):
        xs, ys = [], []
        for _ in range(micro):
            p, clip, label, err = next(stream)
            if clip is None:
                bad.add(task.splits["train"][clips.item_at(p)].path, err)
                continue
            xs.append(clip)
            ys.append(label)
        if not xs:
            raise DataError("unreadable: a whole micro-batch of training files could not be read")
        out.append((torch.stack(xs), torch.tensor(ys)))
    return out


def train_step(
    module: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: list[tuple[Tensor, Tensor]],
    cfg: FinetuneConfig,
    step: int,
    ctx: StepContext,
) -> float:
    """One optimizer step over ``batches`` (the micro-batches of this rank): soft-target cross-entropy of the
    mixed, label-smoothed targets, gradients summed over micro-batches (each loss divided by their count)
    and averaged over ranks by DDP; returns this rank's loss.

    The draws of micro-batch ``m`` (its mixup λ, drop-path and token drop) are keyed by ``(seed, purpose,
    step, g)``, ``g = m · ranks + rank`` its index among the step's global micro-batches, whose clips are
    fixed by ``g`` alone (``clips.rank_positions``): ``R`` ranks accumulating ``A`` micro-batches compute the
    step of 1 rank accumulating ``R · A`` of the same size."""
    lr = lr_at(step, cfg)
    for group in opt.param_groups:
        group["lr"] = lr * group["lr_scale"]
    opt.zero_grad(set_to_none=True)
    total = 0.0
    cuda = torch.device(ctx.device).type == "cuda"
    for m, (clips, labels) in enumerate(batches):
        g = m * ctx.world_size + ctx.rank  # the global micro-batch (see the docstring)
        x = normalize(clips.to(ctx.device, non_blocking=True))
        y = soft_targets(labels.to(ctx.device), ctx.num_classes, cfg.label_smoothing)
        x, y = mix(x, y, cfg.mixup, cfg.seed, "mixup", step, g)
        ctx.drop_path.generator = make_generator(cfg.seed, "drop_path", step, g)
        keys = make_generator(cfg.seed, "drop_tokens", step, g)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = module(x, drop=cfg.keep_ratio < 1, generator=keys)
        loss = torch.sum(-y * F.log_softmax(logits.float(), -1), -1).mean() / len(batches)
        loss.backward()
        total += float(loss.detach())
    ctx.drop_path.generator = None
    opt.step()
    return total


def _recipe(cfg: FinetuneConfig) -> dict[str, Any]:
    keys = (
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
    return {k: getattr(cfg, k) for k in keys}
