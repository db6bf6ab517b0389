"""Clips per second per worker process: naive full-resolution decoding vs the prepared pipeline.

    PYTHONPATH=src python bench/data.py [--clips 200] [--naive-clips 30] [--workdir DIR] [--json PATH]

Writes (once, into --workdir) a 10 s 1280x720 30 fps H.264 file of moving texture (x264 defaults: a key frame
every 250 frames, as most downloaded videos) and its prepared copy (``levjepa data prepare`` settings: short
side 256, a key frame every 16 frames, fastdecode). Then, in this one process with one thread (what one
DataLoader worker has), it times the work of one training sample — decode 16 frames at stride 2 from a
random window, then cut 1 global (224) + 4 local (96) views:

  (a) naive     the 720p original, frames decoded and cropped at full resolution
  (a') resized  the 720p original, frames scaled to short side 256 inside FFmpeg while converting
  (b) ours      the prepared file (decode-time resize is then a no-op)
  (b') loader   (b) through build_pretrain_loader with num_workers=0 (plan, generators, collate included)
  (c) at rate   prepared at 15 fps (``--fps 15``) and read at stride 1: the same clip timing as (b), but
                the frames that stride 2 would skip are never decoded

and prints ms per clip (decode / views), clips per second, and the ratio (b)/(a). The machine is shared:
each figure is the best of ``--repeats`` passes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np
import torch

from levjepa.data import DataConfig, build_pretrain_loader, decode_clip
from levjepa.data.encode import VideoWriter
from levjepa.data.prepare import PrepareOptions, prepare_file
from levjepa.data.sources import MediaItem
from levjepa.data.video import probe_video
from levjepa.data.views import make_views


def write_source(path: Path, seconds: float = 10.0, fps: int = 30, width: int = 1280, height: int = 720) -> None:
    """A camera panning over a smooth colour texture with sharp-edged objects crossing it (so H.264 has
    natural-looking work: gradients, edges, motion), encoded with x264 defaults (key frame every 250
    frames, crf 23, preset medium), as most downloaded videos."""
    from PIL import Image

    rng = np.random.default_rng(0)
    coarse = rng.integers(0, 256, (height // 40 + 8, width // 40 + 8, 3), dtype=np.uint8)
    big = (coarse.shape[1] * 40, coarse.shape[0] * 40)
    texture = np.asarray(Image.fromarray(coarse).resize(big, Image.Resampling.BICUBIC))
    boxes = [(rng.integers(0, height - 120), rng.integers(0, width), rng.integers(40, 120), rng.integers(2, 9),
              rng.integers(0, 256, 3, dtype=np.uint8)) for _ in range(6)]  # fmt: skip
    with VideoWriter(path, width=width, height=height, fps=fps) as writer:
        for i in range(int(seconds * fps)):
            dy, dx = (i * 2) % 200, (i * 3) % 200
            frame = np.ascontiguousarray(texture[dy : dy + height, dx : dx + width])
            for y, x, side, speed, colour in boxes:
                left = int(x + speed * i) % (width - side)
                frame[y : y + side, left : left + side] = colour
            writer.write(frame)


def time_pipeline(
    path: Path, clips: int, short_side: int | None, cfg: DataConfig, seed: int, stride: int = 2
) -> dict[str, float]:
    decode_s = views_s = 0.0
    for i in range(clips):
        g = torch.Generator().manual_seed(seed * 100_003 + i)
        t0 = time.perf_counter()
        frames = decode_clip(path, num_frames=16, frame_stride=stride, short_side=short_side, generator=g)
        t1 = time.perf_counter()
        make_views(frames.permute(0, 3, 1, 2), cfg, g)
        t2 = time.perf_counter()
        decode_s += t1 - t0
        views_s += t2 - t1
    total = decode_s + views_s
    return {
        "clips_per_s": clips / total,
        "ms_per_clip": 1000 * total / clips,
        "decode_ms": 1000 * decode_s / clips,
        "views_ms": 1000 * views_s / clips,
    }


def time_loader(folder: Path, clips: int) -> dict[str, float]:
    cfg = DataConfig(sources=(str(folder),), batch_size=8, num_workers=0, samples_per_epoch=1024)
    loader = build_pretrain_loader(cfg, seed=0)
    next(loader)  # plan + first batch
    batches = max(1, clips // cfg.batch_size)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(loader)
    dt = time.perf_counter() - t0
    return {"clips_per_s": batches * cfg.batch_size / dt, "ms_per_clip": 1000 * dt / (batches * cfg.batch_size)}


def best(fn, repeats: int) -> dict[str, float]:
    runs = [fn() for _ in range(repeats)]
    return min(runs, key=lambda r: r["ms_per_clip"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=200, help="clips per pass for the prepared file")
    parser.add_argument("--naive-clips", type=int, default=30, help="clips per pass for the 720p file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/levjepa-bench-data"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one DataLoader worker = one thread
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")

    args.workdir.mkdir(parents=True, exist_ok=True)
    source = args.workdir / "source_720p.mp4"
    prepared_dir = args.workdir / "prepared"
    prepared = prepared_dir / "source_720p.mp4"
    at_rate = args.workdir / "prepared_15fps" / "source_720p.mp4"
    if not source.exists():
        write_source(source.with_suffix(".tmp.mp4"))
        source.with_suffix(".tmp.mp4").rename(source)
    if not prepared.exists():
        prepared_dir.mkdir(exist_ok=True)
        prepare_file(MediaItem(str(source), None, "video"), prepared, PrepareOptions(short_side=256, keyint=16))
    if not at_rate.exists():
        opts = PrepareOptions(short_side=256, keyint=16, fps=15.0)
        prepare_file(MediaItem(str(source), None, "video"), at_rate, opts)
    for p in (source, prepared, at_rate):
        info = probe_video(p)
        print(
            f"{p.parent.name}/{p.name}: {info.width}x{info.height}, {info.fps:g} fps, {info.num_frames} frames, "
            f"{p.stat().st_size} B"
        )

    views_cfg = DataConfig()  # 1 global 224 (scale 0.8-1), 4 local 96 (scale 0.02-0.4)
    results = {
        "naive_720p": best(lambda: time_pipeline(source, args.naive_clips, None, views_cfg, 1), args.repeats),
        "resized_720p": best(lambda: time_pipeline(source, args.naive_clips, 256, views_cfg, 1), args.repeats),
        "prepared_256": best(lambda: time_pipeline(prepared, args.clips, 256, views_cfg, 2), args.repeats),
        "loader_prepared_256": best(lambda: time_loader(prepared_dir, args.clips), args.repeats),
        "prepared_256_15fps_stride1": best(
            lambda: time_pipeline(at_rate, args.clips, 256, views_cfg, 3, stride=1), args.repeats
        ),
    }
    results["ratio_prepared_over_naive"] = results["prepared_256"]["clips_per_s"] / results["naive_720p"]["clips_per_s"]
    print(f"{'pipeline':<22} {'clips/s':>8} {'ms/clip':>8} {'decode':>8} {'views':>8}")
    for name, r in results.items():
        if isinstance(r, dict):
            parts = [f"{r.get(k, float('nan')):8.1f}" for k in ("clips_per_s", "ms_per_clip", "decode_ms", "views_ms")]
            print(f"{name:<22} " + " ".join(parts))
    print(f"ratio (b)/(a): {results['ratio_prepared_over_naive']:.1f}x  (target: >= 100 clips/s per core for (b))")
    results["load_average_after"] = os.getloadavg()[0]
    print(f"load average after: {results['load_average_after']:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
