"""``levjepa finetune SOURCE --task index:TRAIN,VAL[,TEST] --out DIR [key=value ...]``: encoder + head trained
end to end (``levjepa.finetune``: a subset of the VideoMAE / V-JEPA recipe, its defaults and the run directory).

``SOURCE`` is a levjepa run, checkpoint, export or imported official weights; ``--random-init`` starts the
same architecture from random weights (the baseline). ``--head attentive`` (default) or ``linear``;
``--protocol`` sets frames, stride, size and the val/test views as for ``levjepa probe``. Any
:class:`~levjepa.finetune.FinetuneConfig` field is ``key=value`` (``steps=2000 lr=1e-3 layer_decay=0.65
mixup=0.8 keep_ratio=0.5 micro_batch=4``). ``levjepa finetune --resume DIR`` continues ``DIR`` where its last
checkpoint stopped (everything else comes from ``DIR/config.json``; ``key=value`` may change only how long it
goes on and what it logs and keeps). Under ``torchrun`` each rank trains on its share of every batch.
``DIR/best`` is the classifier with the best validation accuracy: ``levjepa classify DIR/best VIDEOS`` runs
it, ``levjepa export DIR/best --out HUB`` writes it with ``id2label``.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from levjepa.commands._device import device_name
from levjepa.commands._outputs import claim_folder
from levjepa.config import ConfigError, apply_overrides
from levjepa.distributed import launch_rank
from levjepa.finetune import FinetuneConfig, finetune
from levjepa.finetune.config import RESUMABLE
from levjepa.finetune.loop import resume_config
from levjepa.model.probe_kinds import kind_names
from levjepa.train.checkpoint import checkpoint_run

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "items", nargs="*", metavar="SOURCE KEY=VALUE", help="the run, checkpoint, export or imported weights to "
        "start from, then FinetuneConfig fields"
    )  # fmt: skip
    parser.add_argument("--task", default=None, help="index:TRAIN,VAL[,TEST]")
    parser.add_argument("--out", default=None, help="the run directory (created; outside SOURCE)")
    parser.add_argument("--head", choices=kind_names(), default=None, help="(default: attentive)")
    parser.add_argument("--protocol", default=None, help="ssv2, k400, in1k, diving48 (levjepa.eval.protocols)")
    parser.add_argument("--weights", choices=("ema", "online"), default=None, help="which copy of a run (default: ema)")
    parser.add_argument("--random-init", action="store_true", help="the same architecture at random init")
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        metavar="DIR",
        help=f"continue DIR (or --out) from its last checkpoint; key=value may change {', '.join(RESUMABLE)}",
    )
    parser.add_argument("--device", type=device_name, default=None, help="auto (the GPU when there is one), cpu, cuda")
    parser.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")


def _given(args: argparse.Namespace, source: str | None) -> dict[str, Any]:
    """The config fields the command line sets itself (an option left out sets nothing)."""
    given: dict[str, Any] = {}
    if source is not None:
        given["source"] = source
    if args.task is not None:
        if not args.task.startswith("index:"):
            raise ConfigError(f"--task {args.task!r}: fine-tuning needs index:TRAIN,VAL[,TEST]")
        given["task"] = tuple(args.task[len("index:") :].split(","))
    for name in ("head", "protocol", "weights", "device", "random_init"):  # --random-init: False when left out
        if getattr(args, name) not in (None, False):
            given[name] = getattr(args, name)
    return given


def main(args: argparse.Namespace) -> int:
    items = list(args.items)
    if isinstance(args.resume, str) and "=" in args.resume:  # `--resume steps=20`: a bare --resume, then a key
        items, args.resume = [args.resume, *items], True
    sources = [a for a in items if "=" not in a]
    overrides = [a for a in items if "=" in a]
    if len(sources) > 1:
        raise ConfigError(f"one SOURCE to fine-tune, got {len(sources)}: {' '.join(sources)}")
    given = _given(args, sources[0] if sources else None)
    resume = args.resume is not None
    named = isinstance(args.resume, str) and args.out is not None
    if named and Path(args.out).resolve() != Path(args.resume).resolve():
        raise ConfigError(
            f"--out {args.out} and --resume {args.resume}: a resume continues the run it names, in its own folder; "
            "drop --out (or give --out DIR --resume to continue DIR)"
        )
    out = args.resume if isinstance(args.resume, str) else args.out
    if out is None:
        raise ConfigError("--out DIR: where the run goes (or --resume DIR to continue one)")
    claim_folder(checkpoint_run(Path(out))[0] if resume else out, "--out", "finetune", resumes=True)
    if resume:
        base = dataclasses.replace(resume_config(out), **given)  # what the command leaves out: the run's own
    else:
        if "source" not in given or "task" not in given:
            raise ConfigError("a new fine-tuning run needs SOURCE and --task index:TRAIN,VAL[,TEST]")
        base = FinetuneConfig(**given)
    cfg = apply_overrides(base, overrides)
    res = finetune(cfg, out, resume=resume, progress=not args.no_progress)
    test = "" if res.test is None else f", test {res.test:.1f} %"
    if launch_rank() == 0:  # once per job under torchrun / srun
        print(f"best: step {res.best_step}, val {res.best_val:.1f} %{test} -> {res.out / 'best'}")
    return 0
