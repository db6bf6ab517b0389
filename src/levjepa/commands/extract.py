"""``levjepa extract CKPT SOURCE [SOURCE ...] --out DIR``: CLS / mean-pooled / patch features per time window.

SOURCE: a folder of videos and images (recursive), a V-JEPA index file (``path label`` rows), or single
files. See ``levjepa.features.extract`` for the windows and ``levjepa.features.feature_set`` for the output files
(one feature-set format, shared with the probes' feature stores) and the index. ``--format per_video``
writes one ``<video>.npy`` ``[windows, D]`` per video (temporal-action-detection layout), resumes a killed
job, and splits the videos over ``torchrun`` ranks. Run again into the same ``--out``, a job continues only
features of the same encoder and settings, and refuses others in one line (``--overwrite`` deletes them
first). ``--device auto`` (default) uses the GPU when there is one, under bf16 autocast. The window, the
frame size and the sampling default to the model's own (its frames, size and stride or rate,
``levjepa.formats.reading.views``); the command says which it used. ``--readout frames,last`` and ``--tokens CODEC``
add per-frame, last-slot and compact-token readouts (``levjepa.features.readout``); ``--image-frames one`` reads an
image as one temporal slot instead of repeating it to the window. ``--layers`` reads other blocks than the last
(``5,11,17,23``: concatenated on channels, V-JEPA 2.1's hierarchical readout; ``levjepa.model.readout_layers``):
every array then has ``len(layers) · D`` channels, and ``store.json`` records the blocks.
"""

from __future__ import annotations

import argparse

from levjepa import distributed
from levjepa.commands._device import add_device_argument, setup_device
from levjepa.commands._images import add_image_frames_argument, image_frames
from levjepa.commands._layers import add_layers_argument, with_layers
from levjepa.commands._numbers import positive, whole
from levjepa.commands._outputs import claim_folder
from levjepa.config import ConfigError
from levjepa.features.extract import ExtractConfig, extract
from levjepa.features.feature_set import INDEX, MANIFEST
from levjepa.features.readout import READOUTS, Readout
from levjepa.formats.reading.load import LoadedEncoder, load_encoder
from levjepa.formats.reading.views import model_views
from levjepa.weights import BAD_FILES

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ExtractConfig()  # the settings that do not come from the model
    parser.add_argument("checkpoint", help="run directory, checkpoint or export")
    parser.add_argument("sources", nargs="+", help="folder(s), V-JEPA index file(s) or media files")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema")
    parser.add_argument(
        "--window", type=whole(1, 4096), default=None, help="frames per row (default: the model's clip length)"
    )
    parser.add_argument(
        "--stride", type=whole(1, 4096), default=None, help="frames between windows (default: half a window)"
    )
    parser.add_argument(
        "--frame-stride",
        type=whole(1, 10_000),
        default=None,
        help="keep every n-th frame (default: the model's sampling)",
    )
    parser.add_argument(
        "--fps",
        "--target-fps",
        dest="target_fps",
        type=positive,
        default=None,
        help="frames per second instead of a stride (default: the model's rate, when it records one)",
    )
    parser.add_argument(
        "--size", type=whole(8, 4096), default=None, help="short side + centre crop (default: the model's)"
    )
    parser.add_argument("--patch", action="store_true", help="also store every patch token (float16)")
    parser.add_argument(
        "--readout",
        default=None,
        help=f"also store pooled readouts, comma-separated: {', '.join(READOUTS)} — frames: [T', D] each temporal "
        "slot's patch tokens averaged; last: [D] the last slot's (levjepa.features.readout)",
    )
    parser.add_argument(
        "--tokens",
        default=None,
        help="also store CLS + the patch tokens as a compact store keeps them: last (the last temporal slot), "
        "pool2 / pool<k> (k×k spatial pooling), tpool<k>, int8, int4g32, joined by '-' (pool2-last, "
        "tpool3-int4g32); the probes' codecs (levjepa.features.compact)",
    )
    add_image_frames_argument(parser)
    add_layers_argument(parser)
    parser.add_argument(
        "--format",
        choices=("safetensors", "npy", "per_video"),
        default=d.format,
        help="shards of rows (safetensors, npy) or one <video>.npy [windows, D] per video (per_video)",
    )
    parser.add_argument(
        "--per-video-feature",
        choices=("mean", "cls"),
        default=None,
        help=f"with --format per_video: what <video>.npy holds (default: {d.per_video_feature})",
    )
    parser.add_argument("--workers", type=whole(0, 1024), default=d.workers, help="decoding processes (0: in this one)")
    parser.add_argument("--stream", action="store_true", help="KV-cache streaming encoder with a sliding window")
    parser.add_argument("--batch-size", type=whole(1, 1 << 16), default=d.batch_size, help="windows per forward pass")
    parser.add_argument("--shard-rows", type=whole(1), default=d.shard_rows, help="rows per output file")
    add_device_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="no bar and no progress lines")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the features of another encoder or settings found in --out (refused without it)",
    )


def main(args: argparse.Namespace) -> int:
    info, device = setup_device(args.device)
    try:
        return _run(args, device, info.is_main)
    finally:
        distributed.teardown()


def _config(args: argparse.Namespace, loaded: LoadedEncoder) -> tuple[ExtractConfig, str]:
    """The extraction's settings: the windows, size and sampling of the model unless given (and the line that
    says which), the rest as given. ``--window`` is the views' ``frames``, ``--fps`` their ``fps``."""
    views, said = model_views(
        loaded,
        size=args.size,
        frames=args.window,
        frame_stride=args.frame_stride,
        fps=args.target_fps,
        frames_option="--window",
    )
    views = image_frames(views, args.image_frames, loaded.config.tubelet)
    cfg = ExtractConfig(
        views=views,
        readout=Readout.parse(args.readout, args.tokens),
        stride=args.stride if args.stride is not None else max(loaded.config.tubelet, views.frames // 2),
        patches=args.patch,
        batch_size=args.batch_size,
        stream=args.stream,
        format=args.format,
        shard_rows=args.shard_rows,
        per_video_feature=args.per_video_feature,
        workers=args.workers,
    )
    said = f"{said.replace('views: ', 'windows: ', 1)}{views.image_text}; a window starts every {cfg.stride} frames"
    kept = ", ".join(cfg.arrays()) + (f" (tokens: {cfg.readout.codec.name})" if cfg.readout.codec else "")
    return cfg, f"{said}; arrays: {kept}"


def _run(args: argparse.Namespace, device: str, main: bool) -> int:
    if args.per_video_feature is not None and args.format != "per_video":
        raise ConfigError(
            f"--per-video-feature {args.per_video_feature}: what <video>.npy holds, which only --format per_video "
            f"writes (not --format {args.format}); drop it or give --format per_video"
        )
    args.per_video_feature = args.per_video_feature or ExtractConfig().per_video_feature
    claim_folder(args.out, "--out", "features", writes=(INDEX, MANIFEST, BAD_FILES), resumes=True)
    loaded = with_layers(load_encoder(args.checkpoint, weights=args.weights, device=device), args.layers)
    cfg, said = _config(args, loaded)
    if main:
        print(f"encoder: {loaded.describe()}")
        print(said)
    sources = args.sources if len(args.sources) > 1 else args.sources[0]
    res = extract(
        loaded.encoder, sources, args.out, cfg, device=device, progress=not args.no_progress, overwrite=args.overwrite
    )
    if not main:
        return 0
    print(
        f"{res.rows} rows from {res.files} file(s) in {res.seconds:.1f} s -> {res.out_dir} "
        f"({', '.join(res.shards)}, index.jsonl, store.json); {res.bad_files} bad file(s) in bad_files.json"
    )
    return 0
