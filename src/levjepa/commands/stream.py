"""``levjepa stream CHECKPOINT VIDEO`` — run a video through the KV-cache encoder, frame by frame.

Each decoded frame (resized so its short side is ``--size`` and centre-cropped to a multiple of the patch; the
size and the sampling — ``--frame-stride`` or ``--fps`` — default to the model's own, and the command says
which it used) is pushed into :class:`levjepa.infer.StreamingEncoder`; the past is never recomputed, and
``--window W`` bounds memory and per-frame cost to the last W frames. The CLS readout over the frames seen so
far is taken every ``--every`` frames and written, with the latency of each step (one tubelet of τ frames), to
``--out`` (safetensors: ``cls [R, D]``, ``frame [R]``, ``time_s [R]``, ``latency_ms [F / τ]``)::

    levjepa stream runs/demo VIDEO.mp4 --window 16 --every 4 --out stream.safetensors
    levjepa stream exports/demo VIDEO.mp4 --backend onnx --every 4     # the exported step, onnxruntime

The KV-cache encoder runs under the one precision rule of every frozen forward
(``levjepa.infer.encode.precision``: bf16 autocast on CUDA, float32 elsewhere), as ``extract --stream`` and
``encode()`` do, so a stream's CLS is the number a frozen probe reads.

``--backend onnx`` runs the streaming step that ``levjepa export RUN --out DIR --format onnx`` wrote: its
window and frame size are fixed by the export (``--window`` / ``--size`` must agree or be left out).

An image streams as the evaluation protocols read it, a clip of its frame repeated (``--max-frames`` times; by
default the in1k protocol's 8 temporal positions: 8 frames at tubelet 1, 16 at tubelet 2). Frames are pushed a
tubelet at a time: a video shorter than one tubelet is padded with its last frame (as evaluation clips are,
and said on stderr), frames past the last whole tubelet are left out, and ``--max-frames`` below the tubelet
is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from levjepa.commands._device import add_device_argument, local_device
from levjepa.commands._extras import require_extra
from levjepa.commands._numbers import whole
from levjepa.commands._outputs import claim_optional_file, is_safetensors
from levjepa.config import ConfigError
from levjepa.data.eval_clip import ViewSpec, load_eval_clip, load_eval_video
from levjepa.data.sources import media_kind
from levjepa.data.video import VideoFrames
from levjepa.eval.protocols import PROTOCOLS
from levjepa.formats.deployment.runner import read_deploy, stream_video_onnx
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.reading.views import model_views
from levjepa.infer.stream import stream_video
from levjepa.weights import save_tensors

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run directory, checkpoint directory or export")
    parser.add_argument("video", help="a video file, or an image (streamed as a clip of the repeated frame)")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema")
    parser.add_argument("--window", type=whole(1), default=None, help="sliding window in frames (default: unbounded)")
    parser.add_argument("--every", type=whole(1), default=1, help="read out CLS every this many frames")
    parser.add_argument(
        "--size",
        type=whole(16, 4096),
        default=None,
        help="short side of the frames fed to the encoder (default: the model's; onnx: the export's)",
    )
    parser.add_argument(
        "--frame-stride", type=whole(1, 1000), default=None, help="keep every n-th decoded frame (default: the model's)"
    )
    parser.add_argument(
        "--fps", type=float, default=None, help="frames per second instead of a stride (default: the model's rate)"
    )
    parser.add_argument(
        "--max-frames",
        type=whole(1, 10**7),
        default=None,
        help="stream at most this many frames (an image: its frame repeated this many times, default 8 slots)",
    )
    add_device_argument(parser)
    parser.add_argument("--out", type=Path, default=None, help="write CLS readouts + latencies (safetensors)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier stream's safetensors at --out")
    parser.add_argument(
        "--backend",
        choices=("torch", "onnx"),
        default="torch",
        help="torch: the KV-cache encoder (default); onnx: the export's stream_step.onnx through onnxruntime",
    )


def main(args: argparse.Namespace) -> int:
    args.device = local_device(args.device)
    claim_optional_file(args.out, "--out", "a stream's safetensors", is_own=is_safetensors, overwrite=args.overwrite)
    if args.backend == "onnx":
        require_extra("deploy", "--backend onnx", ("onnxruntime",))
    loaded = load_encoder(args.checkpoint, weights=args.weights, device=args.device)
    patch = loaded.encoder.cfg.patch_size
    if args.backend == "onnx":
        record = read_deploy(args.checkpoint)
        if args.window is not None and args.window != record["window"]:
            raise ConfigError(
                f"--window {args.window}: {args.checkpoint}'s streaming step was exported with a window of "
                f"{record['window']} frames (its cache holds no more); leave --window out or re-export"
            )
        args.window = record["window"]
        if args.size is not None and args.size != record["height"]:
            raise ConfigError(
                f"--size {args.size}: {args.checkpoint}'s streaming step takes {record['height']}-px frames "
                "(fixed at export); leave --size out or re-export with --size"
            )
        args.size = record["height"]
    views, said = model_views(loaded, size=args.size, frame_stride=args.frame_stride, fps=args.fps)
    args.size, args.frame_stride, args.fps = views.size, views.frame_stride, views.fps
    tau = loaded.encoder.cfg.tubelet
    if loaded.encoder.cfg.attention != "block_causal":
        raise ConfigError(
            f"{args.checkpoint} attends bidirectionally (model.attention={loaded.encoder.cfg.attention}), so a "
            "frame's features depend on later frames and cannot be streamed; `levjepa extract` reads whole clips"
        )
    if args.window is not None and args.window % tau:
        raise ConfigError(f"--window {args.window}: expected a multiple of the tubelet ({tau} frames)")
    if args.max_frames is not None and args.max_frames < tau:
        raise ConfigError(
            f"--max-frames {args.max_frames}: {args.checkpoint} reads tubelets of {tau} frames, so it streams at "
            f"least {tau}; give --max-frames {tau} or more"
        )
    video = _frames(args, patch, tau)
    print(said.replace(f"{views.frames} frames ", "frames "), file=sys.stderr)  # a stream has no fixed length
    frames = video.frames
    if args.backend == "onnx":
        out = stream_video_onnx(args.checkpoint, frames, every=args.every)
    else:
        out = stream_video(loaded.encoder, frames, window=args.window, every=args.every, device=args.device)
    lat = out["latency_ms"]
    summary = {
        "frames": int(lat.numel()) * tau,
        "readouts": int(out["cls"].shape[0]),
        "latency_ms_first": float(lat[0]),
        "latency_ms_median": float(lat.median()),
        "latency_ms_last": float(lat[-1]),
        "window": args.window,
        "backend": args.backend,
        "weights": loaded.describe(),
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        last = len(video.timestamps) - 1  # a padded frame has its source frame's time
        times = torch.tensor([float(video.timestamps[min(i, last)]) for i in out["frame"].tolist()])
        save_tensors(args.out, {**out, "time_s": times}, {"summary": summary, "video": str(args.video)})
    return 0


def _frames(args: argparse.Namespace, patch: int, tau: int) -> VideoFrames:
    """The frames to stream: the video's (up to ``--max-frames``; fewer than a tubelet padded with the last
    one), or an image repeated ``--max-frames`` times (default: the in1k protocol's 8 slots) at time 0."""
    if media_kind(args.video) == "image":
        repeats = args.max_frames or PROTOCOLS["in1k"].views(tau, ViewSpec()).frames
        clip = load_eval_clip(args.video, num_frames=repeats, size=args.size, patch=patch, kind="image")
        _say_whole_tubelets(args.video, repeats, tau)
        return VideoFrames(frames=clip, fps=1.0, timestamps=torch.zeros(repeats, dtype=torch.float64), source_fps=1.0)
    video = load_eval_video(
        args.video, size=args.size, patch=patch, frame_stride=args.frame_stride, target_fps=args.fps
    )
    frames = video.frames[: args.max_frames] if args.max_frames else video.frames
    if len(frames) < tau:
        sampling = f"{args.fps:g} fps" if args.fps is not None else f"a frame stride of {args.frame_stride}"
        print(
            f"note: {args.video} has {len(frames)} frame(s) at {sampling}, fewer than a tubelet ({tau}): padded "
            "with its last frame",
            file=sys.stderr,
        )
        frames = torch.cat([frames, frames[-1:].expand(tau - len(frames), -1, -1, -1)])
    _say_whole_tubelets(args.video, len(frames), tau)
    return dataclasses.replace(video, frames=frames)


def _say_whole_tubelets(source: str, frames: int, tau: int) -> None:
    """Frames are pushed a tubelet at a time: frames past the last whole one are left out, and said."""
    if frames > tau and frames % tau:
        kept = frames - frames % tau
        print(
            f"note: {source}: {frames} frames adjusted to {kept}, whole tubelets of {tau} (the last "
            f"{frames - kept} left out)",
            file=sys.stderr,
        )
