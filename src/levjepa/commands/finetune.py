"""``levjepa finetune SOURCE --task index:TRAIN,VAL[,TEST] --out DIR [key=value ...]``: encoder + head trained
end to end (``levjepa.finetune``: the VideoMAE / V-JEPA recipe, its defaults and the run directory).

``SOURCE`` is a levjepa run, checkpoint, export or imported official weights; ``--random-init`` starts the
same architecture from random weights (the baseline). ``--head attentive`` (default) or ``linear``;
``--protocol`` sets frames, stride, size and the val/test views as for ``levjepa probe``. Any
:class:`~levjepa.finetune.FinetuneConfig` field is ``key=value`` (``steps=2000 lr=1e-3 layer_decay=0.65
mixup=0.8 keep_ratio=0.5 micro_batch=4``). ``--resume`` continues ``DIR`` where its last checkpoint stopped
and may change only how long it goes on and what it logs. Under ``torchrun`` each rank trains on its share
of every batch. ``DIR/best`` is the classifier with the best validation accuracy: ``levjepa classify
DIR/best VIDEOS`` runs it, ``levjepa export DIR/best --out HUB`` writes it with ``id2label``.
"""

from __future__ import annotations

import argparse

from levjepa.config import ConfigError, apply_overrides
from levjepa.distributed import launch_rank
from levjepa.finetune import FinetuneConfig, finetune
from levjepa.finetune.config import RESUMABLE

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a levjepa run, checkpoint, export or imported weights")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="FinetuneConfig fields")
    parser.add_argument("--task", required=True, help="index:TRAIN,VAL[,TEST]")
    parser.add_argument("--out", required=True, help="the run directory (created; outside SOURCE)")
    parser.add_argument("--head", choices=("attentive", "linear"), default="attentive")
    parser.add_argument("--protocol", default=None, help="ssv2, k400, in1k, diving48 (levjepa.eval.protocols)")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema", help="which copy of a run")
    parser.add_argument("--random-init", action="store_true", help="the same architecture at random init")
    parser.add_argument("--resume", action="store_true", help=f"continue --out (may change: {', '.join(RESUMABLE)})")
    parser.add_argument("--device", default="auto", help="auto (the GPU when there is one), cpu, cuda")
    parser.add_argument("--no-progress", action="store_true", help="(log lines are always printed)")


def main(args: argparse.Namespace) -> int:
    if not args.task.startswith("index:"):
        raise ConfigError(f"--task {args.task!r}: fine-tuning needs index:TRAIN,VAL[,TEST]")
    base = FinetuneConfig(
        source=args.source,
        weights=args.weights,
        random_init=args.random_init,
        task=tuple(args.task[len("index:") :].split(",")),
        protocol=args.protocol,
        head=args.head,
        device=args.device,
    )
    cfg = apply_overrides(base, args.overrides)
    res = finetune(cfg, args.out, resume=args.resume)
    test = "" if res.test is None else f", test {res.test:.1f} %"
    if launch_rank() == 0:  # once per job under torchrun / srun
        print(f"best: step {res.best_step}, val {res.best_val:.1f} %{test} -> {res.out / 'best'}")
    return 0
