"""Checkpoints that survive crashes and resume bit-exactly.

A checkpoint is a directory ``checkpoints/step_NNNNNN/`` (layout in :mod:`levjepa.weights`): online weights
(encoder, projector, BatchNorm buffers included), the EMA copy (its update count and schedule in the file's
metadata), the optimizer state, the step and the consecutive-skip count, plus the encoder config. It is
written into a temporary sibling directory, fsynced, renamed into place, and only then does
``checkpoints/latest`` (itself replaced atomically) name it. A crash or a full disk at any point leaves the
previous checkpoint, and ``latest``, intact (a resume deletes the half-written directory,
:func:`remove_partial`). Nothing is unpickled on load: tensors come from safetensors, the rest from JSON.

The learning-rate schedule is a function of the step and every stochastic choice is seeded from the step or
the sample (SIGReg directions and k-means from ``(seed, step)``; data order, augmentation and token dropping
from ``(seed, epoch, position)``), so the step *is* the schedule and sampler state, and no RNG state is saved
— whatever the number of ranks the run resumes on: the data stream restarts at global micro-batch ``step ×
micro-batches per step`` of the layout it resumes with (checkpoints written before this version also hold a
``data_position``, in the micro-batches of the layout that wrote them; it is ignored).

Nothing in a run draws from torch's global RNG (``tests/test_pretrain.py`` checks it): module initialisation is
seeded through ``levjepa.rng.seeded_init`` and the DataLoader's worker base seed comes from its own generator.
Checkpoints written before this version also hold ``rng.cpu`` / ``rng.cuda.N``, the global state at save
time; it differed between identical runs (torch seeds a process's global RNG at random, and the DataLoader
drew its base seed from it) and no computation read it, so it is ignored on load.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from levjepa.config import ConfigError
from levjepa.train.ema import EMA
from levjepa.weights import (
    CHECKPOINTS,
    EMA_WEIGHTS,
    LATEST,
    META,
    ONLINE_WEIGHTS,
    TRAINER_STATE,
    TRAINER_TENSORS,
    WeightsError,
    atomic_write_text,
    checkpoint_name,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_tensors,
    make_temp_dir,
    prefixed,
    read_json,
    save_tensors,
    tensor_names,
    truncate_metrics,
    write_json,
)

__all__ = [
    "TrainerState",
    "checkpoint_run",
    "intact",
    "ema_metadata",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "prune",
    "remove_partial",
    "resume_latest",
    "save_checkpoint",
]


@dataclass
class TrainerState:
    """What a checkpoint records of the loop besides weights: the step is also the data position (see above)."""

    step: int  # optimizer steps done
    consecutive_skips: int = 0
    extra: dict[str, Any] | None = None  # JSON-able: last losses, wall time so far, ...


def ema_metadata(ema: EMA) -> dict[str, Any]:
    """What ``ema.safetensors`` records about its average: the update count and the schedule's constants
    (readers such as ``levjepa.load`` describe the copy from them)."""
    return {"ema_updates": ema.updates, "ema_decay": ema.decay, "ema_every": ema.every, "ema_warmup": ema.warmup}


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{idx}.{key}"] = value
            else:
                plain.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "plain_state": plain}


def _load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    for idx, values in meta.get("plain_state", {}).items():
        state.setdefault(int(idx), {}).update(values)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(
    run_dir: str | Path,
    *,
    model: nn.Module,
    ema: EMA | None,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    encoder_config: dict[str, Any],
) -> Path:
    """Write ``checkpoints/step_NNNNNN`` completely, then point ``latest`` at it. Returns its path. ``ema=None``
    (fine-tuning, which keeps no Polyak copy): no ``ema.safetensors``."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(state.step)
    tmp = make_temp_dir(root, prefix=f".{final.name}.")  # mode as mkdir gives it under the umask
    try:
        meta = {"step": state.step, "encoder_config": encoder_config, **(state.extra or {})}
        save_tensors(tmp / ONLINE_WEIGHTS, model.state_dict(), {"step": state.step})
        if ema is not None:
            save_tensors(
                tmp / EMA_WEIGHTS,
                {f"encoder.{k}": v for k, v in ema.state_dict().items()},
                {"step": state.step, **ema_metadata(ema)},
            )
        opt_tensors, opt_meta = _optimizer_tensors(optimizer)
        save_tensors(tmp / TRAINER_TENSORS, opt_tensors)
        trainer_json = {"step": state.step, "consecutive_skips": state.consecutive_skips, "optimizer": opt_meta}
        write_json(tmp / TRAINER_STATE, trainer_json, indent=None)
        write_json(tmp / META, meta, indent=1)  # written last: marks completeness
        if final.exists():  # a checkpoint of the same step from an earlier attempt: replace it
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, final.name)
    return final


def load_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    ema: EMA | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> TrainerState:
    """Restore a checkpoint into the given objects (in place); returns the trainer state."""
    path = Path(path)
    weights, _ = load_tensors(path / ONLINE_WEIGHTS)
    expected = model.state_dict()
    stale = [k for k in weights if k not in expected and (k == "encoder.norm.bias" or k.endswith(".mlp.fc2.bias"))]
    if stale:
        raise ConfigError(
            f"{path} was written by a levjepa whose encoder had a bias just before the readout (the final "
            "LayerNorm's, or without it the last block's mlp.fc2 bias: it gets an exactly zero gradient and is "
            "gone now): resume it as it was with the override model.final_norm_bias=true"
        )
    model.load_state_dict(weights)
    trainer = read_json(path / TRAINER_STATE)
    if ema is not None:
        ema_tensors, ema_meta = load_tensors(path / EMA_WEIGHTS)
        # written before the EMA counted its updates (no warm-up then): one update every ``every`` steps
        updates = int(ema_meta["ema_updates"]) if "ema_updates" in ema_meta else trainer["step"] // ema.every
        ema.load_state_dict(prefixed(ema_tensors, "encoder."), updates=updates)
    tensors, _ = load_tensors(path / TRAINER_TENSORS)
    if optimizer is not None:
        device = next(model.parameters()).device
        _load_optimizer(optimizer, {k: v.to(device) for k, v in tensors.items()}, trainer["optimizer"])
    meta = read_json(path / META)
    extra = {k: v for k, v in meta.items() if k not in ("step", "encoder_config")}
    return TrainerState(step=trainer["step"], consecutive_skips=trainer["consecutive_skips"], extra=extra)


def resume_latest(
    run_dir: Path,
    *,
    model: nn.Module,
    ema: EMA | None,
    optimizer: torch.optim.Optimizer,
    is_main: bool,
    at: Path | None = None,
    command: str = "levjepa pretrain",
) -> TrainerState:
    """Restore the run's latest checkpoint — or ``at``, one of its checkpoints (``--resume RUN/checkpoints/step_N``)
    — in place (weights, EMA, optimizer) and return its state, or the start when none was written. The main rank
    says where the run resumes, drops the metric lines logged after that checkpoint (they will be logged again)
    and the remains of a checkpoint write that a crash interrupted; resuming from ``at``, the run's later
    checkpoints are set aside (``checkpoints/.abandoned-step_N``), never deleted. A checkpoint that cannot be read
    is refused in one line naming the newest intact one before it and the ``command`` that continues from it."""
    chosen = at if at is not None else latest_checkpoint(run_dir)
    saved = TrainerState(step=0)
    if chosen is not None:
        try:
            saved = load_checkpoint(chosen, model=model, ema=ema, optimizer=optimizer)
        except ConfigError:  # readable, but of another layout: its own message says what to do
            raise
        except (WeightsError, OSError, ValueError, KeyError, RuntimeError) as err:
            raise WeightsError(_unreadable(run_dir, chosen, err, command)) from err
    if is_main:
        where = f"{chosen.name} (step {saved.step})" if chosen else "the start (no checkpoint was written)"
        print(f"resuming {run_dir} from {where}", file=sys.stderr)
        if at is not None:
            _abandon_after(run_dir, at)
        truncate_metrics(run_dir, saved.step)
        remove_partial(run_dir)
    return saved


def intact(ckpt: Path) -> bool:
    """Whether every file of checkpoint ``ckpt`` reads: its JSON parses and its safetensors headers open."""
    try:
        for name in (META, TRAINER_STATE):
            read_json(ckpt / name)
        for name in (ONLINE_WEIGHTS, EMA_WEIGHTS, TRAINER_TENSORS):
            if (ckpt / name).is_file() or name != EMA_WEIGHTS:
                tensor_names(ckpt / name)
    except (WeightsError, OSError, ValueError):
        return False
    return True


def _unreadable(run_dir: Path, ckpt: Path, err: BaseException, command: str) -> str:
    """The one line for a checkpoint that cannot be read: why, and the newest intact one before it."""
    earlier = [c for c in list_checkpoints(run_dir) if _step(c) < _step(ckpt)]
    good = next((c for c in reversed(earlier) if intact(c)), None)
    head = f"{ckpt} cannot be read ({err})"
    if good is None:
        return f"{head}, and the run has no intact checkpoint before it: start the run again"
    return f"{head}; the newest intact checkpoint is {good}: continue from it with `{command} --resume {good}`"


def _abandon_after(run_dir: Path, ckpt: Path) -> None:
    """Set the checkpoints after ``ckpt`` aside (renamed ``.abandoned-step_N``, or ``.abandoned-step_N.K`` when
    an earlier rewind already set one of that step aside) and point ``latest`` at it."""
    for later in list_checkpoints(run_dir):
        if _step(later) > _step(ckpt):
            aside = later.with_name(f".abandoned-{later.name}")
            count = 0
            while aside.exists():
                count += 1
                aside = later.with_name(f".abandoned-{later.name}.{count}")
            later.rename(aside)
            print(f"{later.name} set aside as {aside.name}: the run continues from {ckpt.name}", file=sys.stderr)
    atomic_write_text(Path(run_dir) / CHECKPOINTS / LATEST, ckpt.name)


def checkpoint_run(path: Path) -> tuple[Path, Path | None]:
    """``(run directory, checkpoint)`` of a ``--resume`` argument: a run directory (its latest checkpoint, None
    here), or one of its checkpoints, ``RUN/checkpoints/step_N`` (that one)."""
    path = Path(path)
    if path.parent.name == CHECKPOINTS and _step(path) >= 0:
        return path.parent.parent, path
    return path, None


def checkpoint_step_or_none(path: Path) -> int | None:
    """The step of a checkpoint directory, or None when ``path`` is none (its name and meta.json say no step)."""
    try:
        return checkpoint_step(path)
    except ValueError:  # WeightsError included
        return None


def _step(path: Path) -> int:
    """A checkpoint's step from its name (``step_N``): readable even when its files are not."""
    name = path.name
    return int(name[len("step_") :]) if name.startswith("step_") and name[len("step_") :].isdigit() else -1


def remove_partial(run_dir: str | Path) -> list[Path]:
    """Delete the temporary directories of checkpoint writes that a crash interrupted (``checkpoints/.step_*``):
    they were never complete, and nothing reads them. Returns what was removed."""
    root = Path(run_dir) / CHECKPOINTS
    partial = sorted(p for p in root.glob(".step_*") if p.is_dir()) if root.is_dir() else []
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def prune(run_dir: str | Path, keep_last: int, keep_every: int | None) -> list[Path]:
    """Delete old checkpoints, keeping the newest ``keep_last`` and those at multiples of ``keep_every``."""
    found = list_checkpoints(run_dir)
    removed = []
    for p in found[:-keep_last] if keep_last > 0 else found:
        if keep_every and checkpoint_step(p) % keep_every == 0:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed
