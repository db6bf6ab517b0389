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
``batch / 256`` (``lr`` here is the rate of the effective batch as given). The pieces are in ``recipe.py``
(lrs, drop-path, targets) and ``clips.py`` (which clip each position of the stream is, and its augmentation).

**Start**: the encoder of a levjepa run, checkpoint, export or imported weights (``levjepa.formats.load``),
or, for the baseline, the same architecture at random initialisation (``random_init``); the head
(``levjepa.model.classifier``, the probe's attentive or linear head) is initialised from ``(seed, "head")``,
or from a kept probe (``head_from``) — refused unless that probe was trained on this very encoder (the
function it computes, ``levjepa.model.fingerprint``).

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa import distributed
from levjepa.config import ConfigError, from_dict, to_dict
from levjepa.data import BadFileReport, DataError, normalize
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.workers import safe_map
from levjepa.eval.labelled import LabelledTask, read_task
from levjepa.eval.predict import accuracy, predict
from levjepa.finetune.clips import TrainClips, rank_positions
from levjepa.finetune.config import FinetuneConfig, check_resume
from levjepa.finetune.recipe import DropPath, lr_at, mix, param_groups, soft_targets
from levjepa.formats.classifier import (
    HEAD_WEIGHTS,
    ClassifierRecord,
    load_classifier,
    read_classifier,
)
from levjepa.formats.export import weights_lineage, write_export
from levjepa.formats.load import LoadedEncoder, load_encoder, random_like
from levjepa.model.classifier import HeadConfig, VideoClassifier, build_head
from levjepa.model.fingerprint import function_fingerprint, matches
from levjepa.rng import make_generator
from levjepa.train.checkpoint import TrainerState, checkpoint_run, resume_latest, save_checkpoint
from levjepa.train.lifecycle import Lifecycle, due
from levjepa.train.optim import step_unless_nonfinite
from levjepa.train.report import MetricsLogger, Progress
from levjepa.train.run_dir import check_steps, run_directory, write_run_info
from levjepa.weights import CONFIG, load_tensors, read_json, write_json

__all__ = ["FinetuneResult", "finetune", "resume_config", "train_step"]

BEST = "best"
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
class _Task:
    """The labelled files and their class names, and the views validation and test files are cut into."""

    files: LabelledTask
    views: ViewSpec

    @property
    def labels(self) -> tuple[str, ...]:
        return self.files.label_names

    @property
    def splits(self) -> dict[str, list[Any]]:
        return self.files.splits


@dataclass
class _Best:
    """The best validation accuracy so far and its step (what a checkpoint carries besides the weights)."""

    val: float = -1.0
    step: int = 0


def resume_config(out: str | Path) -> FinetuneConfig:
    """The config of the fine-tuning run in ``out`` (its ``config.json``; ``out`` may name one of its
    checkpoints): what ``finetune --resume OUT`` starts from, before the overrides it is given."""
    path = checkpoint_run(Path(out))[0] / CONFIG
    if not path.is_file():
        raise ConfigError(f"{out}: nothing to resume (no {CONFIG}); start without --resume")
    return from_dict(FinetuneConfig, read_json(path))


def _read_task(cfg: FinetuneConfig, loaded: LoadedEncoder) -> tuple[_Task, str]:
    """The splits and class names of ``cfg.task`` (``levjepa.eval.labelled.read_task``: one class, or a VAL /
    TEST label TRAIN never has, is refused) and the views of ``cfg`` for this encoder (the model's clips, or
    its protocol's views), with the line that says which."""
    views, said = cfg.views(loaded)
    return _Task(read_task(cfg.task), views), said


def _start_encoder(cfg: FinetuneConfig, device: str) -> LoadedEncoder:
    loaded = load_encoder(cfg.source, weights=cfg.weights, device="cpu")
    if cfg.random_init:
        loaded = random_like(loaded, seed=cfg.seed)
    for p in loaded.encoder.parameters():
        p.requires_grad_(True)
    loaded.encoder = loaded.encoder.to(device)
    return loaded


def _head(cfg: FinetuneConfig, loaded: LoadedEncoder, num_classes: int) -> tuple[HeadConfig, torch.nn.Module]:
    """A fresh head from ``(seed, "head")``, or the head of the kept probe ``head_from`` (LP-FT: Kumar et al.,
    ICLR 2022, fine-tune from a trained probe), read in float32 — refused unless it is a head of the same kind
    and size for the same classes, trained on this encoder's weights."""
    want = HeadConfig(
        kind=cfg.head,
        input="tokens" if cfg.head == "attentive" else "mean",
        dim=loaded.config.dim,
        num_classes=num_classes,
        depth=cfg.head_depth,
    )
    if cfg.head_from is None:
        return want, build_head(want, make_generator(cfg.seed, "head"))
    rec = read_classifier(cfg.head_from)
    got = HeadConfig(**{**to_dict(rec.head), "token_dtype": "float32"})
    if (got.kind, got.dim, got.num_classes) != (want.kind, want.dim, want.num_classes):
        raise ConfigError(
            f"head_from={cfg.head_from}: a {got.kind} head of width {got.dim} for {got.num_classes} classes; this "
            f"fine-tuning needs a {want.kind} head of width {want.dim} for {want.num_classes} (--head, the task's "
            "classes)"
        )
    start = "random init" if cfg.random_init else f"the {cfg.weights} weights of {cfg.source}"
    same, fingerprint = matches(rec.encoder_fingerprint, loaded.encoder)
    if not same:
        raise ConfigError(
            f"head_from={cfg.head_from}: its head was trained on the encoder {rec.encoder_fingerprint[:12]} "
            f"({rec.encoder_weights} weights of {rec.encoder_source}), but fine-tuning starts from {start} "
            f"({fingerprint[:12]}): a head reads only the encoder it was trained on"
        )
    head = build_head(got)
    head.load_state_dict(load_tensors(Path(cfg.head_from) / HEAD_WEIGHTS)[0])
    return got, head


def _check_out(cfg: FinetuneConfig, out: Path) -> None:
    src = Path(cfg.source).resolve()
    o = out.resolve()
    if o == src or (src.is_dir() and src in o.parents) or (o in src.parents):
        raise ConfigError(f"--out {out} is inside (or holds) the source {cfg.source}: choose a folder outside it")


def _check_resume(path: Path, cfg: FinetuneConfig, at: Path | None = None) -> None:
    """What a fine-tuning ``--resume`` must not change, and a length that ends before the checkpoint it resumes
    from (``at``, else the run's latest)."""
    check_resume(read_json(path / CONFIG), cfg)
    check_steps(path, cfg.steps, "steps", at)


def _evaluate(model: VideoClassifier, task: _Task, split: str, cfg: FinetuneConfig, device: str) -> float:
    model.eval()
    preds = list(predict(model, task.labels, task.views, task.splits[split], top_k=1, workers=cfg.workers,
                         device=device))  # fmt: skip
    model.train()
    acc = accuracy(preds)
    if acc is None:
        raise DataError(f"unreadable: no file of the {split} split could be read")
    return acc


def _save_best(
    model: VideoClassifier,
    task: _Task,
    cfg: FinetuneConfig,
    out: Path,
    trained: dict[str, Any],
    loaded: LoadedEncoder,
) -> None:
    """``OUT/best``: the classifier's export in one piece (``write_export`` with its record and head: the
    classifier's card, ``architectures`` / ``head`` / ``id2label`` in ``config.json`` for
    ``AutoModelForVideoClassification`` and ``levjepa.from_pretrained``, ``classifier.json`` + ``head.safetensors``
    for ``levjepa classify``), with the licence and origin of the weights it started from (a classifier
    fine-tuned from the released checkpoint, or from a run continued from it, keeps its CC BY-NC licence) and
    their preprocessing."""
    enc = model.encoder
    state = {k: v.detach().cpu().clone() for k, v in enc.state_dict().items()}
    record = ClassifierRecord(
        model.head_cfg, task.labels, task.views, ".", "finetuned", function_fingerprint(enc), trained=trained
    )
    license, derived = weights_lineage(cfg.source, loaded)
    write_export(
        out / BEST,
        config=enc.cfg,
        encoder_state=state,
        weights="finetuned",
        note=f"fine-tuned from {cfg.source} ({'random init' if cfg.random_init else cfg.weights})",
        step=trained["step"],
        source=str(Path(cfg.source).resolve()),
        run_config=None,
        preprocessing=loaded.preprocessing,
        imported_from=loaded.imported_from,
        license=license,
        derived_from=derived,
        classifier=record,
        head_state={k: v.detach().cpu().clone() for k, v in model.head.state_dict().items()},
    )


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
    device = str(info.device)
    _check_out(cfg, out)
    micro, accum = cfg.batch_layout(info.world_size)
    loaded = _start_encoder(cfg, device)
    task, said = _read_task(cfg, loaded)
    head_cfg, head = _head(cfg, loaded, len(task.labels))
    out, at = checkpoint_run(out) if resume else (out, None)
    check = functools.partial(_check_resume, cfg=cfg, at=at)
    with run_directory(out, info, resume=resume, overwrite=False, check=check) as path:
        if info.is_main:
            print(said, file=sys.stderr)
        model = VideoClassifier(loaded.encoder, head_cfg, head).to(device).train()
        return _train(cfg, path, info, task, model, loaded, micro, accum, resume=resume, progress=progress, at=at)


def _train(
    cfg: FinetuneConfig,
    out: Path,
    info: distributed.DistInfo,
    task: _Task,
    model: VideoClassifier,
    loaded: LoadedEncoder,
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
    # fused: a non-finite step is skipped on the device (train.optim.step_unless_nonfinite)
    opt = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
    state = (
        resume_latest(out, model=model, ema=None, optimizer=opt, is_main=info.is_main, at=at, command=COMMAND)
        if resume
        else None
    )
    state = state or TrainerState(step=0)
    best = _Best(float((state.extra or {}).get("best_val", -1.0)), int((state.extra or {}).get("best_step", 0)))
    if info.is_main:
        write_run_info(out, to_dict(cfg), info.world_size)
    drop_path = DropPath(model, cfg.drop_path)
    module = distributed.wrap_ddp(model, info)
    logger = MetricsLogger(out, cfg.loggers, to_dict(cfg), purge_step=state.step + 1) if info.is_main else None
    report = Progress(total=cfg.steps, start_step=state.step, batch_size=cfg.batch_size, device=info.device,
                      logger=logger, is_main=info.is_main, show=progress, desc="finetune")  # fmt: skip
    life = Lifecycle(
        out,
        info,
        command=COMMAND,
        steps=cfg.steps,
        checkpoint_every=cfg.checkpoint_every,
        keep_last=cfg.keep_last,
        max_consecutive_skips=cfg.max_consecutive_skips,
        consecutive_skips=state.consecutive_skips,
        stop_hint="Lower lr, or check the training split's files.",
    )
    life.step = state.step
    bad = BadFileReport()
    positions = rank_positions(range(state.step, cfg.steps), cfg.batch_size, micro, accum, info.rank, info.world_size)
    clips = TrainClips(task.splits["train"], cfg, model.encoder.cfg.patch_size, task.views)
    stream = safe_map(clips, positions, cfg.workers)
    ctx = StepContext(device, info.rank, info.world_size, model.head_cfg.num_classes, drop_path)
    write = functools.partial(_checkpoint, out, model, opt, life, best)
    check_every = min(cfg.log_every, cfg.max_consecutive_skips)
    try:
        with life:
            for step in range(state.step, cfg.steps):
                batches = _micro_batches(stream, micro, accum, clips, bad)
                loss, skipped = train_step(module, opt, batches, cfg, step, ctx)
                life.record(step, skipped)
                done = step + 1
                if due(done, check_every, cfg.steps):
                    life.check()
                if due(done, cfg.log_every, cfg.steps):
                    total = distributed.reduce_scalars({"loss": float(loss)})["loss"]  # the global batch's
                    report.log(done, {"loss": total, "lr": lr_at(step, cfg)})
                report.advance()
                if due(done, cfg.eval_every, cfg.steps) and info.is_main:
                    _validate(model, task, cfg, out, done, best, logger, loaded)
                life.end_of_step(done, write)
    finally:
        stream.close()  # its workers end here, before the test evaluation or the error's report
        report.close()
        drop_path.remove()
        if logger is not None:
            logger.close()
    return _finish(cfg, out, info, task, best, bad, device)


def _validate(
    model: VideoClassifier,
    task: _Task,
    cfg: FinetuneConfig,
    out: Path,
    step: int,
    best: _Best,
    logger: MetricsLogger | None,
    loaded: LoadedEncoder,
) -> None:
    """Validation accuracy after ``step`` steps (main rank), logged; a new best is written to ``OUT/best``."""
    val = _evaluate(model, task, "val", cfg, str(next(model.parameters()).device))
    if logger is not None:
        logger.log(step, {"val_acc": val})
    print(f"step {step}/{cfg.steps}  val_acc {val:.1f}", file=sys.stderr)
    if val > best.val:
        best.val, best.step = val, step
        _save_best(model, task, cfg, out, {"step": step, "val_acc": val, **_recipe(cfg)}, loaded)


def _checkpoint(out: Path, model: VideoClassifier, opt: torch.optim.Optimizer, life: Lifecycle, best: _Best) -> Path:
    """The checkpoint of the step the run stands at (main rank; ``Lifecycle.save`` prunes and reports)."""
    return save_checkpoint(
        out,
        model=model,
        ema=None,
        optimizer=opt,
        state=TrainerState(
            step=life.step,
            consecutive_skips=int(life.consecutive),
            extra={"best_val": best.val, "best_step": best.step},
        ),
        encoder_config=to_dict(model.encoder.cfg),
    )


def _finish(
    cfg: FinetuneConfig,
    out: Path,
    info: distributed.DistInfo,
    task: _Task,
    best: _Best,
    bad: BadFileReport,
    device: str,
) -> FinetuneResult:
    test = None
    if info.is_main and "test" in task.splits:
        classifier = load_classifier(out / BEST, device=device)
        test = _evaluate(classifier.model, task, "test", cfg, device)
    if info.is_main:
        result = {"best_step": best.step, "best_val_acc": best.val, "test_acc": test, "steps": cfg.steps}
        write_json(out / RESULTS, result)
        print(json.dumps(result), file=sys.stderr)
        if bad.total:
            bad.write(out / "bad_files.json")
    return FinetuneResult(out, best.step, best.val, test, cfg.steps)


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
    stream: Iterator[tuple[int, Tensor | None, str]], micro: int, accum: int, clips: TrainClips, bad: BadFileReport
) -> list[tuple[Tensor, Tensor]]:
    """The next ``accum`` micro-batches of ``micro`` clips (uint8 [B, C, T, S, S], labels [B]); an unreadable
    training file is reported and its micro-batch is one clip short."""
    out = []
    for _ in range(accum):
        xs, ys = [], []
        for _ in range(micro):
            p, clip, err = next(stream)
            if clip is None:
                bad.add(clips.items[clips.item_at(p)].path, err)
                continue
            xs.append(clip)
            ys.append(clips.label(p))
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
) -> tuple[Tensor, Tensor]:
    """One optimizer step over ``batches`` (the micro-batches of this rank): soft-target cross-entropy of the
    mixed, label-smoothed targets, gradients summed over micro-batches (each loss divided by their count)
    and averaged over ranks by DDP; the update is skipped on the device when the loss or the gradient norm is
    not finite. Returns this rank's loss and the skip flag (device tensors).

    The draws of micro-batch ``m`` (its mixup λ, drop-path and token drop) are keyed by ``(seed, purpose,
    step, g)``, ``g = m · ranks + rank`` its index among the step's global micro-batches, whose clips are
    fixed by ``g`` alone (``clips.rank_positions``): ``R`` ranks accumulating ``A`` micro-batches compute the
    step of 1 rank accumulating ``R · A`` of the same size. The token keep ratio reaches the encoder as an
    argument (``drop_ratio = 1 − keep_ratio``), never through its config."""
    lr = lr_at(step, cfg)
    for group in opt.param_groups:
        group["lr"] = lr * group["lr_scale"]
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), device=ctx.device)
    cuda = torch.device(ctx.device).type == "cuda"
    for m, (clips, labels) in enumerate(batches):
        g = m * ctx.world_size + ctx.rank  # the global micro-batch (see the docstring)
        x = normalize(clips.to(ctx.device, non_blocking=True))
        y = soft_targets(labels.to(ctx.device), ctx.num_classes, cfg.label_smoothing)
        x, y = mix(x, y, cfg.mixup, cfg.seed, "mixup", step, g)
        ctx.drop_path.generator = make_generator(cfg.seed, "drop_path", step, g)
        keys = make_generator(cfg.seed, "drop_tokens", step, g)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = module(x, drop_ratio=1.0 - cfg.keep_ratio, generator=keys)
        loss = torch.sum(-y * F.log_softmax(logits.float(), -1), -1).mean() / len(batches)
        loss.backward()
        total = total + loss.detach()
    ctx.drop_path.generator = None
    grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
    skipped = step_unless_nonfinite(opt, total, torch.nn.utils.get_total_norm(grads))
    return total, skipped


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
