"""``levjepa select RUN_DIR [RUN_DIR ...]``: label-free model selection — every checkpoint ranked by its
training loss and loss / λ^α, without probing anything. ``--task index:TRAIN,VAL[,TEST]`` (your own labelled
split files; ``--protocol`` etc. as for ``levjepa probe``) or ``--task appearance|motion|arrow`` (the built-in
benchmark) also probes every checkpoint and reports how well the ranking predicts accuracy (Spearman ρ).
The method and its caveats: :mod:`levjepa.eval.select`.
"""

from __future__ import annotations

import argparse

from levjepa import distributed
from levjepa.commands._device import add_device_argument, setup_device
from levjepa.commands._numbers import whole
from levjepa.commands._outputs import claim_optional_file, is_json_with
from levjepa.eval.config import probe_names
from levjepa.eval.protocols import PROTOCOLS
from levjepa.eval.select import select
from levjepa.weights import write_json

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories (several: compare runs with different λ)")
    parser.add_argument(
        "--task",
        default=None,
        help="validate the ranking: index:TRAIN,VAL[,TEST] (your labelled files) or appearance|motion|arrow",
    )
    parser.add_argument("--probe", default="linear", choices=probe_names(), help="the probe that validates (linear)")
    parser.add_argument("--alpha", type=float, default=0.4, help="exponent of the loss / λ^α scaling (0.4)")
    parser.add_argument("--window", type=whole(1), default=None, help="steps of loss averaged before each checkpoint")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema")
    parser.add_argument("--budget", choices=("demo", "full"), default="demo", help="probe grid / split sizes")
    parser.add_argument(
        "--synthetic", action="append", default=[], metavar="KEY=VALUE", help="override the benchmark config"
    )
    parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default=None, help="index task: a standard protocol")
    parser.add_argument("--video-root", default=None, help="index task: folder of a K400 CSV's / SSv2 JSON's videos")
    parser.add_argument("--labels-file", default=None, help="index task: SSv2's something-something-v2-labels.json")
    parser.add_argument(
        "--frames", type=whole(1, 4096), default=None, help="index task: frames per clip (default: the model's)"
    )
    parser.add_argument(
        "--frame-stride",
        type=whole(1, 10_000),
        default=None,
        help="index task: keep every n-th frame (default: the model's)",
    )
    parser.add_argument(
        "--size", type=whole(8, 4096), default=None, help="index task: short side + crop (default: the model's)"
    )
    parser.add_argument("--workers", type=whole(0, 1024), default=2, help="index task: decoding processes")
    add_device_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache", default=None, help="feature cache (built-in task) or feature-store folder (index task)"
    )
    parser.add_argument("--out", default=None, help="write the JSON result here")
    parser.add_argument("--overwrite", action="store_true", help="replace the JSON result of an earlier run at --out")


def main(args: argparse.Namespace) -> int:
    claim_optional_file(
        args.out, "--out", "a selection result (JSON)", is_own=is_json_with("rows"), overwrite=args.overwrite
    )
    info, device = setup_device(args.device)
    try:
        result = select(
            args.runs,
            task=args.task,
            probe=args.probe,
            alpha=args.alpha,
            window=args.window,
            weights=args.weights,
            budget=args.budget,
            synthetic_overrides=args.synthetic,
            device=device,
            seed=args.seed,
            cache_dir=args.cache,
            progress=True,
            index_options={
                "protocol": args.protocol,
                "size": args.size,
                "frames": args.frames,
                "frame_stride": args.frame_stride,
                "video_root": args.video_root,
                "labels_file": args.labels_file,
                "workers": args.workers,
            },
        )
    finally:
        distributed.teardown()
    if not info.is_main:
        return 0
    print(result.table())
    if args.out:
        write_json(args.out, result.to_json())  # whole or not at all
        print(f"wrote {args.out}")
    return 0
