"""End-to-end fine-tuning of an encoder + head on a labelled index: ``levjepa finetune``.

A subset of the recipe of the video fine-tuning literature — VideoMAE (Tong et al., NeurIPS 2022,
"VideoMAE: Masked Autoencoders are Data-Efficient Learners for Self-Supervised Video Pre-Training", its
fine-tuning recipe) and V-JEPA (Bardes et al., 2024, "Revisiting Feature Prediction for Learning Visual
Representations from Video", its attentive classifier). Implemented: AdamW, linear warm-up then cosine
decay, layer-wise learning-rate decay, drop-path, label smoothing, mixup (off by default), a random
temporal window + random resized crop + horizontal flip of the clip, every token or a kept fraction of
them (``keep_ratio``: the encoder drops the rest at random, as in pretraining), bf16 autocast on GPU,
gradient accumulation over micro-batches, and data parallelism under ``torchrun``. **Not implemented**:
VideoMAE's RandAugment, random erasing and CutMix, mixup on by default and the learning rate scaled by
``batch / 256`` (``lr`` here is the rate of the effective batch as given).

This module is the recipe's loop and little else; the rest is called from the floor it belongs to: the labelled
split files (``levjepa.eval.labelled.read_task``), a rank's stream of augmented training clips
(``levjepa.data.labelled_stream``), the pieces of the recipe (lrs, drop-path, targets:
``levjepa.train.finetune_recipe``), the accuracy of a split (``levjepa.eval.predict.split_accuracy``), where the
encoder and the head start and ``best/`` (``levjepa.formats.writing.finetuned``: the same architecture at random for the
baseline, or a kept probe's head (``head_from``), refused unless that probe was trained on this very encoder), the
run's life in ``levjepa.train``. Each receives only its part of :class:`FinetuneConfig` (``cfg.start``,
``cfg.augment``, ``cfg.step_recipe``, ...).

**The run** is pretraining's run skeleton (``levjepa.train``): the directory ``OUT`` opened and locked by
``run_dir.run_directory`` (a second ``--resume`` of a live run is refused; a start that fails leaves
nothing), ``config.json`` (the :class:`FinetuneConfig`), ``env.json`` / ``git.json``, ``metrics.jsonl`` (and
TensorBoard events), progress lines with the time left (``report.Progress``), and ``lifecycle.Lifecycle``:
``checkpoints/step_N`` every ``checkpoint_every`` steps (online weights of encoder + head, optimizer state,
step; no EMA copy: fine-tuning keeps none), pruned to the newest ``keep_last``, a failed write reported; a
non-finite loss or gradient skips the update on the device and ``max_consecutive_skips`` in a row stop the
run; SIGTERM / SIGUSR1 checkpoint and exit 75 naming ``levjepa finetune --resume OUT``. Beside them, ``best/``
— the classifier with the best validation accuracy so far (the encoder in the hub layout with ``id2label``,
its head and ``classifier.json``: what ``levjepa classify`` runs and ``levjepa export`` writes again) — and
``results.json`` (best step, val and test accuracy of ``best``).

**Resume** (``resume=True``; ``levjepa finetune --resume OUT`` reads the rest from ``OUT/config.json``): the
saved config may differ only in ``RESUMABLE`` keys; the latest checkpoint is restored, the metrics logged
after it dropped; since step ``s`` reads positions of the stream fixed by ``(seed, s)`` and every stochastic
choice is keyed by the step and the position (the augmentation) or the global micro-batch (mixup, drop-path,
token drop: :func:`train_step`), the resumed run computes the same weights as an uninterrupted one (bit-exact
on the CPU).
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa import distributed
from levjepa.config import ConfigError, from_dict, to_dict
from levjepa.data import normalize
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.labelled_stream import TrainStream
from levjepa.eval.labelled import LabelledTask, read_task
from levjepa.eval.predict import split_accuracy
from levjepa.finetune.config import FinetuneConfig, check_resume_dir
from levjepa.formats.reading.classifier import load_classifier
from levjepa.formats.writing.finetuned import BEST, BestExport, start_encoder, start_head
from levjepa.model.classifier import VideoClassifier
from levjepa.rng import make_generator
from levjepa.train.checkpoint import TrainerState, checkpoint_run, resume_latest, save_checkpoint
from levjepa.train.finetune_recipe import DropPath, StepRecipe, lr_at, mix, param_groups, soft_targets
from levjepa.train.lifecycle import Lifecycle, due
from levjepa.train.optim import step_unless_nonfinite
from levjepa.train.report import MetricsLogger, Progress
from levjepa.train.run_dir import run_directory, write_run_info
from levjepa.weights import BAD_FILES, CONFIG, read_json, write_json

__all__ = ["FinetuneResult", "finetune", "resume_config", "train_step"]

RESULTS = "results.json"
COMMAND = "levjepa finetune"


@dataclass
class FinetuneResult:
    out: Path
    best_step: int
    best_val: float
    test: float | None
    steps: int


@dataclass
class _Best:
    """The best validation accuracy so far and its step (what a checkpoint carries besides the weights)."""

    val: float = -1.0
    step: int = 0


@dataclass(frozen=True)
class _Data:
    """The labelled splits and the views validation and test files are cut into (the model's clips, or a
    protocol's views: ``FinetuneConfig.views``)."""

    task: LabelledTask
    views: ViewSpec

    def accuracy(self, model: VideoClassifier, split: str, *, workers: int, device: str) -> float:
        """Top-1 accuracy (%) of ``model`` on ``split``, every segment and crop of its views."""
        items = self.task.splits[split]
        return split_accuracy(model, self.task.label_names, self.views, items, split=split, workers=workers,
                              device=device)  # fmt: skip


@dataclass
class StepContext:
    """What a step needs besides its batch: the device, the rank and world size, the class count and the
    drop-path hooks."""

    device: str
    rank: int
    world_size: int
    num_classes: int
    drop_path: DropPath


def resume_config(out: str | Path) -> FinetuneConfig:
    """The config of the fine-tuning run in ``out`` (its ``config.json``; ``out`` may name one of its
    checkpoints): what ``finetune --resume OUT`` starts from, before the overrides it is given."""
    path = checkpoint_run(Path(out))[0] / CONFIG
    if not path.is_file():
        raise ConfigError(f"{out}: nothing to resume (no {CONFIG}); start without --resume")
    return from_dict(FinetuneConfig, read_json(path))


def _check_out(source: str, out: Path) -> None:
    src, o = Path(source).resolve(), out.resolve()
    if o == src or (src.is_dir() and src in o.parents) or (o in src.parents):
        raise ConfigError(f"--out {out} is inside (or holds) the source {source}: choose a folder outside it")


def finetune(cfg: FinetuneConfig, out: str | Path, *, resume: bool = False, progress: bool = False) -> FinetuneResult:
    """Fine-tune as ``cfg`` says into ``out`` (see the module doc); returns where the best classifier is."""
    info = distributed.setup(None if cfg.device == "auto" else cfg.device)
    try:
        return _finetune(cfg, Path(out), info, resume=resume, progress=progress)
    finally:
        distributed.teardown()


def _finetune(
    cfg: FinetuneConfig, out: Path, info: distributed.DistInfo, *, resume: bool, progress: bool
) -> FinetuneResult:
    """Everything that can be refused is refused before anything is written: the output folder, the task,
    the batch layout, the source encoder and the head; then the run directory (``run_dir.run_directory``)."""
    _check_out(cfg.source, out)
    micro, accum = cfg.batch_layout(info.world_size)
    loaded = start_encoder(cfg.start, str(info.device))
    views, said = cfg.views(loaded)
    task = read_task(cfg.task, allow_shared=cfg.allow_shared_files)
    head_cfg, head = start_head(cfg.head_start, loaded, len(task.label_names), cfg.start)
    out, at = checkpoint_run(out) if resume else (out, None)
    check = functools.partial(check_resume_dir, cfg=cfg, at=at)
    with run_directory(out, info, resume=resume, overwrite=False, check=check, flag="--out") as path:
        if info.is_main:
            print(said, file=sys.stderr)
            for pair, n in task.shared.items():
                said_shared = f"{pair.replace('/', ' and ')} share {n} file(s) (allow_shared_files=true)"
                print(f"warning: {said_shared}", file=sys.stderr)
        model = VideoClassifier(loaded.encoder, head_cfg, head).to(info.device).train()
        best = BestExport.of(path, cfg.start, loaded)
        data = _Data(task, views)
        return _train(cfg, path, info, data, model, best, micro, accum, resume=resume, progress=progress, at=at)


def _train(
    cfg: FinetuneConfig,
    out: Path,
    info: distributed.DistInfo,
    data: _Data,
    model: VideoClassifier,
    export: BestExport,
    micro: int,
    accum: int,
    *,
    resume: bool,
    progress: bool,
    at: Path | None = None,
) -> FinetuneResult:
    """The loop: one optimizer step per step, logs, validation (and ``best/``) when due, the run's life in
    ``Lifecycle``; then the test accuracy of ``best/`` and ``results.json``."""
    device = str(info.device)
    groups = param_groups(model, cfg.layer_decay, cfg.weight_decay)
    # fused: a non-finite step is skipped on the device (train.optim.step_unless_nonfinite)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
    state = resume_latest(out, model=model, ema=None, optimizer=opt, is_main=info.is_main, at=at, command=COMMAND
                          ) if resume else None  # fmt: skip
    state = state or TrainerState(step=0)
    extra = state.extra or {}
    best = _Best(float(extra.get("best_val", -1.0)), int(extra.get("best_step", 0)))
    if info.is_main:
        write_run_info(out, to_dict(cfg), info.world_size)
    drop_path = DropPath(model, cfg.drop_path)
    module = distributed.wrap_ddp(model, info)
    logger = MetricsLogger(out, cfg.loggers, to_dict(cfg), purge_step=state.step + 1) if info.is_main else None
    report = Progress(total=cfg.steps, start_step=state.step, batch_size=cfg.batch_size, device=info.device,
                      logger=logger, is_main=info.is_main, show=progress, desc="finetune")  # fmt: skip
    life = Lifecycle(
        out, info, command=COMMAND, steps=cfg.steps, checkpoint_every=cfg.checkpoint_every, keep_last=cfg.keep_last,
        max_consecutive_skips=cfg.max_consecutive_skips, consecutive_skips=state.consecutive_skips,
        stop_hint="Lower lr, or check the training split's files.",
    )  # fmt: skip
    life.step = state.step
    stream = TrainStream(
        data.task.splits["train"], cfg.augment, data.views, model.encoder.cfg.patch_size,
        steps=range(state.step, cfg.steps), batch_size=cfg.batch_size, micro=micro, accum=accum, rank=info.rank,
        world_size=info.world_size, workers=cfg.workers,
    )  # fmt: skip
    recipe = cfg.step_recipe
    ctx = StepContext(device, info.rank, info.world_size, model.head_cfg.num_classes, drop_path)
    write = functools.partial(_checkpoint, out, model, opt, life, best)
    check_every = min(cfg.log_every, cfg.max_consecutive_skips)
    try:
        with life:
            for step in range(state.step, cfg.steps):
                loss, skipped = train_step(module, opt, stream.next_step(), recipe, step, ctx)
                life.record(step, skipped)
                done = step + 1
                if due(done, check_every, cfg.steps):
                    life.check()
                if due(done, cfg.log_every, cfg.steps):
                    total = distributed.reduce_scalars({"loss": float(loss)})["loss"]  # the global batch's
                    report.log(done, {"loss": total, "lr": lr_at(step, recipe.schedule)})
                report.advance()
                if due(done, cfg.eval_every, cfg.steps) and info.is_main:
                    _validate(model, data, cfg, done, best, logger, export)
                life.end_of_step(done, write)
    finally:
        stream.close()  # its workers end here, before the test evaluation or the error's report
        report.close()
        drop_path.remove()
        if logger is not None:
            logger.close()
    return _finish(cfg, out, info, data, best, stream)


def _validate(
    model: VideoClassifier,
    data: _Data,
    cfg: FinetuneConfig,
    step: int,
    best: _Best,
    logger: MetricsLogger | None,
    export: BestExport,
) -> None:
    """Validation accuracy after ``step`` steps (main rank), logged; a new best is written to ``OUT/best``."""
    val = data.accuracy(model, "val", workers=cfg.workers, device=str(next(model.parameters()).device))
    if logger is not None:
        logger.log(step, {"val_acc": val})
    print(f"step {step}/{cfg.steps}  val_acc {val:.1f}", file=sys.stderr)
    if val > best.val:
        best.val, best.step = val, step
        export.save(model, data.task.label_names, data.views, {"step": step, "val_acc": val, **cfg.recipe_record()})


def _checkpoint(out: Path, model: VideoClassifier, opt: torch.optim.Optimizer, life: Lifecycle, best: _Best) -> Path:
    """The checkpoint of the step the run stands at (main rank; ``Lifecycle.save`` prunes and reports)."""
    extra = {"best_val": best.val, "best_step": best.step}
    state = TrainerState(step=life.step, consecutive_skips=int(life.consecutive), extra=extra)
    return save_checkpoint(out, model=model, ema=None, optimizer=opt, state=state,
                           encoder_config=to_dict(model.encoder.cfg))  # fmt: skip


def _finish(
    cfg: FinetuneConfig, out: Path, info: distributed.DistInfo, data: _Data, best: _Best, stream: TrainStream
) -> FinetuneResult:
    """The test accuracy of ``best/`` (read back as ``levjepa classify`` reads it) and ``results.json``."""
    test = None
    if info.is_main and "test" in data.task.splits:
        classifier = load_classifier(out / BEST, device=str(info.device))
        test = data.accuracy(classifier.model, "test", workers=cfg.workers, device=str(info.device))
    if info.is_main:
        result = {"best_step": best.step, "best_val_acc": best.val, "test_acc": test, "steps": cfg.steps}
        write_json(out / RESULTS, result)
        print(json.dumps(result), file=sys.stderr)
        if stream.bad.total:
            stream.bad.write(out / BAD_FILES)
    return FinetuneResult(out, best.step, best.val, test, cfg.steps)


def train_step(
    module: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: list[tuple[Tensor, Tensor]],
    recipe: StepRecipe,
    step: int,
    ctx: StepContext,
) -> tuple[Tensor, Tensor]:
    """One optimizer step over ``batches`` (the micro-batches of this rank): soft-target cross-entropy of the
    mixed, label-smoothed targets, gradients summed over micro-batches (each loss divided by their count)
    and averaged over ranks by DDP; the update is skipped on the device when the loss or the gradient norm is
    not finite. Returns this rank's loss and the skip flag (device tensors).

    The draws of micro-batch ``m`` (its mixup λ, drop-path and token drop) are keyed by ``(seed, purpose,
    step, g)``, ``g = m · ranks + rank`` its index among the step's global micro-batches, whose clips are
    fixed by ``g`` alone (``levjepa.data.labelled_stream.rank_positions``): ``R`` ranks accumulating ``A``
    micro-batches compute the step of 1 rank accumulating ``R · A`` of the same size. The token keep ratio
    reaches the encoder as an argument (``drop_ratio = 1 − keep_ratio``), never through its config."""
    lr = lr_at(step, recipe.schedule)
    for group in opt.param_groups:
        group["lr"] = lr * group["lr_scale"]
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), device=ctx.device)
    cuda = torch.device(ctx.device).type == "cuda"
    seed = recipe.seed
    for m, (clips, labels) in enumerate(batches):
        g = m * ctx.world_size + ctx.rank  # the global micro-batch (see the docstring)
        x = normalize(clips.to(ctx.device, non_blocking=True))
        y = soft_targets(labels.to(ctx.device), ctx.num_classes, recipe.label_smoothing)
        x, y = mix(x, y, recipe.mixup, seed, "mixup", step, g)
        ctx.drop_path.generator = make_generator(seed, "drop_path", step, g)
        keys = make_generator(seed, "drop_tokens", step, g)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = module(x, drop_ratio=1.0 - recipe.keep_ratio, generator=keys)
        loss = torch.sum(-y * F.log_softmax(logits.float(), -1), -1).mean() / len(batches)
        loss.backward()
        total = total + loss.detach()
    ctx.drop_path.generator = None
    grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
    skipped = step_unless_nonfinite(opt, total, torch.nn.utils.get_total_norm(grads))
    return total, skipped
