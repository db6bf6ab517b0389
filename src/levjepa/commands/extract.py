"""``levjepa extract CKPT SOURCE [SOURCE ...] --out DIR``: CLS / mean-pooled / patch features per time window.

SOURCE: a folder of videos and images (recursive), a V-JEPA index file (``path label`` rows), or single
files. See ``levjepa.eval.extract`` for the windows, the output files and the index. ``--format per_video``
writes one ``<video>.npy`` ``[windows, D]`` per video (temporal-action-detection layout), resumes a killed
job, and splits the videos over ``torchrun`` ranks. Run again into the same ``--out``, a job continues only
features of the same encoder and settings, and refuses others in one line (``--overwrite`` deletes them
first). ``--device auto`` (default) uses the GPU when there is one, under bf16 autocast.
"""

from __future__ import annotations

import argparse

from levjepa import distributed
from levjepa.commands._device import add_device_argument, setup_device
from levjepa.eval.extract import ExtractConfig, extract
from levjepa.formats.load import load_encoder

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ExtractConfig()
    parser.add_argument("checkpoint", help="run directory, checkpoint or export")
    parser.add_argument("sources", nargs="+", help="folder(s), V-JEPA index file(s) or media files")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema")
    parser.add_argument("--window", type=int, default=d.window, help=f"frames per row (default {d.window})")
    parser.add_argument("--stride", type=int, default=d.stride, help=f"frames between windows (default {d.stride})")
    parser.add_argument(
        "--frame-stride", type=int, default=d.frame_stride, help=f"keep every n-th frame (default {d.frame_stride})"
    )
    parser.add_argument("--target-fps", type=float, default=None, help="sample at this rate instead of a stride")
    parser.add_argument("--size", type=int, default=d.size, help=f"short side + centre crop (default {d.size})")
    parser.add_argument("--patch", action="store_true", help="also store every patch token (float16)")
    parser.add_argument(
        "--format",
        choices=("safetensors", "npy", "per_video"),
        default=d.format,
        help="shards of rows (safetensors, npy) or one <video>.npy [windows, D] per video (per_video)",
    )
    parser.add_argument(
        "--per-video-feature", choices=("mean", "cls"), default=d.per_video_feature, help="what <video>.npy holds"
    )
    parser.add_argument("--workers", type=int, default=d.workers, help="decoding processes (0: in this one)")
    parser.add_argument("--stream", action="store_true", help="KV-cache streaming encoder with a sliding window")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="windows per forward pass")
    parser.add_argument("--shard-rows", type=int, default=d.shard_rows, help="rows per output file")
    add_device_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="no bar and no progress lines")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the features of another encoder or settings found in --out (refused without it)",
    )


def main(args: argparse.Namespace) -> int:
    cfg = ExtractConfig(
        window=args.window,
        stride=args.stride,
        frame_stride=args.frame_stride,
        target_fps=args.target_fps,
        size=args.size,
        patches=args.patch,
        batch_size=args.batch_size,
        stream=args.stream,
        format=args.format,
        shard_rows=args.shard_rows,
        per_video_feature=args.per_video_feature,
        workers=args.workers,
    )
    info, device = setup_device(args.device)
    try:
        return _run(args, cfg, device, info.is_main)
    finally:
        distributed.teardown()


def _run(args: argparse.Namespace, cfg: ExtractConfig, device: str, main: bool) -> int:
    loaded = load_encoder(args.checkpoint, weights=args.weights, device=device)
    if main:
        print(f"encoder: {loaded.describe()}")
    sources = args.sources if len(args.sources) > 1 else args.sources[0]
    res = extract(
        loaded.encoder, sources, args.out, cfg, device=device, progress=not args.no_progress, overwrite=args.overwrite
    )
    if not main:
        return 0
    print(
        f"{res.rows} rows from {res.files} file(s) in {res.seconds:.1f} s -> {res.out_dir} "
        f"({', '.join(res.shards)}, index.jsonl); {res.bad_files} bad file(s) in bad_files.json"
    )
    return 0
