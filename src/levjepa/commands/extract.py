"""``levjepa extract CKPT SOURCE [SOURCE ...] --out DIR``: CLS / mean-pooled / patch features per time window.

SOURCE: a folder of videos and images (recursive), a V-JEPA index file (``path label`` rows), or single
files. See ``levjepa.eval.extract`` for the windows, the output files and the index.
"""

from __future__ import annotations

import argparse

from levjepa.eval.extract import ExtractConfig, extract
from levjepa.eval.load import load_encoder

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
    parser.add_argument("--format", choices=("safetensors", "npy"), default=d.format)
    parser.add_argument("--stream", action="store_true", help="KV-cache streaming encoder with a sliding window")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="windows per forward pass")
    parser.add_argument("--shard-rows", type=int, default=d.shard_rows, help="rows per output file")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-progress", action="store_true")


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
    )
    loaded = load_encoder(args.checkpoint, weights=args.weights, device=args.device)
    print(f"encoder: {loaded.describe()}")
    sources = args.sources if len(args.sources) > 1 else args.sources[0]
    res = extract(loaded.encoder, sources, args.out, cfg, device=args.device, progress=not args.no_progress)
    print(
        f"{res.rows} rows from {res.files} file(s) in {res.seconds:.1f} s -> {res.out_dir} "
        f"({', '.join(res.shards)}, index.jsonl); {res.bad_files} bad file(s) in bad_files.json"
    )
    return 0
