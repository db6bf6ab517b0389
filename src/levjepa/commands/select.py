"""``levjepa select RUN_DIR [RUN_DIR ...]``: label-free model selection — the training loss (and loss / λ^α)
near each checkpoint against a cheap probe accuracy, with their Spearman correlations. The method and its
caveats: :mod:`levjepa.eval.select`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from levjepa.eval.select import select

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories (several: compare runs with different λ)")
    parser.add_argument("--task", default="appearance", choices=("appearance", "motion", "arrow"))
    parser.add_argument("--probe", default="linear", choices=("linear", "knn", "attentive"))
    parser.add_argument("--alpha", type=float, default=0.4, help="exponent of the loss / λ^α scaling (0.4)")
    parser.add_argument("--window", type=int, default=None, help="steps of loss averaged before each checkpoint")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema")
    parser.add_argument("--budget", choices=("demo", "full"), default="demo", help="probe grid / split sizes")
    parser.add_argument(
        "--synthetic", action="append", default=[], metavar="KEY=VALUE", help="override the benchmark config"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help="feature cache folder (reused across calls)")
    parser.add_argument("--out", default=None, help="write the JSON result here")


def main(args: argparse.Namespace) -> int:
    result = select(
        args.runs,
        task=args.task,
        probe=args.probe,
        alpha=args.alpha,
        window=args.window,
        weights=args.weights,
        budget=args.budget,
        synthetic_overrides=args.synthetic,
        device=args.device,
        seed=args.seed,
        cache_dir=args.cache,
        progress=True,
    )
    print(result.table())
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result.to_json(), indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0
