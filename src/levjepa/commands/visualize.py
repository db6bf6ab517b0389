"""``levjepa visualize CKPT VIDEO|IMAGE|synthetic[:i] --out DIR``: PCA → RGB and cosine-similarity maps of
the patch features of one clip, beside its frames (PNG, GIF, JSON). What the maps mean and how they are
drawn: :mod:`levjepa.tools.visualize`. The clip's frames, size and sampling default to the model's own
(``levjepa.formats.reading.views``); the command says which it used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from levjepa.commands._device import add_device_argument, local_device
from levjepa.commands._numbers import whole
from levjepa.commands._outputs import claim_folder, staged_folder
from levjepa.config import ConfigError
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.reading.views import model_views
from levjepa.tools.visualize import MAPS, SUMMARY, load_clip, visualize
from levjepa.weights import write_json

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run directory, checkpoint or export")
    parser.add_argument("source", help="a video, an image, or synthetic[:i] (clip i of the benchmark's test split)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--query", default=None, help="query patch t,y,x in token-grid units (default: centre)")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema")
    parser.add_argument("--frames", type=whole(1, 256), default=None, help="frames of the clip (default: the model's)")
    parser.add_argument(
        "--frame-stride",
        type=whole(1, 1000),
        default=None,
        help="keep every n-th frame (default: the model's sampling)",
    )
    parser.add_argument(
        "--fps", type=float, default=None, help="frames per second instead of a stride (default: the model's rate)"
    )
    parser.add_argument("--start", type=whole(0, 10**7), default=0, help="first source frame (default 0)")
    parser.add_argument(
        "--size", type=whole(16, 2048), default=None, help="short side, then centre crop (default: the model's)"
    )
    parser.add_argument("--scale", type=whole(0, 8), default=0, help="tile enlargement (default: 1, or 2 below 128 px)")
    parser.add_argument("--no-gif", action="store_true", help="only the PNG")
    parser.add_argument("--overwrite", action="store_true", help="replace the maps of an earlier visualize at --out")
    add_device_argument(parser)


def main(args: argparse.Namespace) -> int:
    claim_folder(args.out, "--out", "maps", writes=MAPS, overwrite=args.overwrite)
    args.device = local_device(args.device)
    loaded = load_encoder(args.checkpoint, weights=args.weights, device=args.device)
    cfg = loaded.config
    views, said = model_views(loaded, size=args.size, frames=args.frames, frame_stride=args.frame_stride, fps=args.fps)
    frames = load_clip(
        args.source,
        num_frames=views.frames,
        frame_stride=views.frame_stride,
        start=args.start,
        size=views.size,
        patch=cfg.patch_size,
        target_fps=views.fps,
    )
    if frames.shape[0] % cfg.tubelet:
        kept = frames.shape[0] - frames.shape[0] % cfg.tubelet
        if kept == 0:
            raise ConfigError(
                f"{args.source}: {frames.shape[0]} frame(s), fewer than one tubelet of {cfg.tubelet}; give a longer "
                "clip or a smaller --frame-stride"
            )
        print(
            f"note: {frames.shape[0]} frames adjusted to {kept}, a whole number of tubelets ({cfg.tubelet} frames)",
            file=sys.stderr,
        )
        frames = frames[:kept]
    query = None
    if args.query:
        try:
            parts = [int(v) for v in args.query.split(",")]
        except ValueError:
            parts = []
        if len(parts) != 3:
            raise ConfigError(f"--query {args.query!r}: expected t,y,x (three integers)")
        query = (parts[0], parts[1], parts[2])
    scale = args.scale or (2 if frames.shape[1] < 128 else 1)
    with staged_folder(args.out, replaces=MAPS, what="the maps", again="draws them again") as stage:
        summary = visualize(
            loaded.encoder,
            frames,
            stage,
            query=query,
            scale=scale,
            device=args.device,
            gif=not args.no_gif,
            source=f"{args.source} ({loaded.describe()})",
        )
        summary["files"] = {k: str(Path(args.out) / Path(v).name) for k, v in summary["files"].items()}
        write_json(stage / SUMMARY, summary)  # where they will be
    print(said, file=sys.stderr)  # once the maps are drawn: a mistake before stays one line
    print(json.dumps(summary, indent=2))
    return 0
