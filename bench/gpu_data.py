"""GPU side of the data pipeline: augment_to_device (transfer, views cut on the device, photometric change,
normalisation) and NVDEC decoding.

    python bench/gpu_data.py --out DIR [--batch 64] [--iters 20] [--budget-s 30]

On a paper-sized per-GPU batch (B clips of 16 frames: 1 global 224 view + 4 local 96 views, uint8, pinned)
it measures, with CUDA events, (1) the host-to-device copy, (2) the batched photometric change of the local
views (colour jitter + grayscale, ``views.apply_photometric``) and normalisation, (3) the whole
``augment_to_device``; and, for comparison, the same photometric change on one CPU core for one clip's 4 local
views (what a loader worker would pay per clip if it did it there). It checks that the GPU result equals
the CPU one (max abs difference).

Then (issue 15) the fast path's device side: ``FrameBatch.augment_to_device`` on the same batch size, from
16 × 256 × 454 frames with the paper's crop boxes (crop + antialiased resize as float16 matrix products,
``data/resize.py``), its time per clip, and its agreement with the worker's uint8 cut of the same boxes
(max and mean difference in uint8 levels). Last, NVDEC through PyAV (``data.decode_device=cuda``): whether
FFmpeg can decode on the GPU here (and why not), and the clips/s of ``decode_windows`` and of the real
loader (``num_workers=0``) with hardware vs CPU decoding on a prepared 454x256 clip. Each section writes
``DIR/gpu_data.json`` as it ends; ``--budget-s`` skips what would not fit. ``--device cpu`` is a dry run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from levjepa.data.loader import FrameBatch, ViewBatch
from levjepa.data.views import apply_photometric, cut_view, normalize, sample_photometric
from levjepa.infer.cpu import cpu_info


def make_batch(b: int, v: int, t: int, seed: int) -> ViewBatch:
    g = torch.Generator().manual_seed(seed)
    glob = torch.randint(0, 256, (1, b, 3, t, 224, 224), dtype=torch.uint8, generator=g)
    local = torch.randint(0, 256, (v, b, 3, t, 96, 96), dtype=torch.uint8, generator=g)
    kw = dict(jitter_p=0.8, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, grayscale_p=0.2)
    photo = torch.stack([torch.stack([sample_photometric(g, **kw) for _ in range(b)]) for _ in range(v)])
    return ViewBatch([glob, local], photo, torch.arange(b), 0, 0, [])


def device_ms(fn, iters: int, dev: torch.device) -> float:
    if dev.type != "cuda":  # a CPU dry run (to check the script before spending GPU time)
        fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters * 1000
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run")
    parser.add_argument("--budget-s", type=float, default=30.0, help="skip the sections that would not fit")
    args = parser.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    t_start = time.perf_counter()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("gpu_data: CUDA is not available", file=sys.stderr)
        return 1
    batch = make_batch(args.batch, 4, 16, 0)
    batch = batch.pin_memory() if dev.type == "cuda" else batch
    local = batch.views[1]
    local_dev = local.to(dev)
    params_dev = batch.photometric.reshape(-1, 6).to(dev)
    nbytes = sum(v.numel() for v in batch.views)

    def h2d() -> None:
        for view in batch.views:
            view.to(dev, non_blocking=True)

    def photometric_gpu() -> None:
        x = local_dev.reshape(-1, *local_dev.shape[2:]).float() / 255.0
        normalize(apply_photometric(x, params_dev))

    def whole() -> None:
        batch.augment_to_device(dev)

    results = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "batch": args.batch,
        "uint8_mb": nbytes / 1e6,
        "h2d_ms": device_ms(h2d, args.iters, dev),
        "photometric_normalize_local_gpu_ms": device_ms(photometric_gpu, args.iters, dev),
        "to_device_ms": device_ms(whole, args.iters, dev),
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if dev.type == "cuda" else 0.0,
    }
    results["h2d_gb_per_s"] = nbytes / 1e6 / results["h2d_ms"]

    # the same on one CPU core, one clip's 4 local views (what a worker would pay per clip)
    torch.set_num_threads(1)
    one = local[:, 0].float() / 255.0
    p_one = batch.photometric[:, 0]
    apply_photometric(one, p_one)
    t0 = time.perf_counter()
    for _ in range(5):
        apply_photometric(one, p_one)
    results["photometric_cpu_ms_per_clip"] = (time.perf_counter() - t0) / 5 * 1000
    results["photometric_gpu_ms_per_clip"] = results["photometric_normalize_local_gpu_ms"] / args.batch

    # correctness: GPU equals CPU on a few clips
    k = 4
    x = local[:, :k].reshape(-1, 3, 16, 96, 96).float() / 255.0
    p = batch.photometric[:, :k].reshape(-1, 6)
    cpu = apply_photometric(x, p)
    gpu = apply_photometric(x.to(dev), p.to(dev)).cpu()
    results["max_abs_diff_gpu_vs_cpu"] = float((cpu - gpu).abs().max())

    save(args.out, results)
    if time.perf_counter() - t_start < args.budget_s * 0.4:
        results.update(frame_batch_section(args.batch if dev.type == "cuda" else 2, args.iters, dev))
        save(args.out, results)
    if time.perf_counter() - t_start < args.budget_s * 0.6:
        results.update(nvdec_section(args.out, clips=48 if dev.type == "cuda" else 8))
        save(args.out, results)
    for key, value in results.items():
        print(f"{key:>40}: {value:.4g}" if isinstance(value, float) else f"{key:>40}: {value}")
    return 0


def save(out: Path, results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_data.json").write_text(json.dumps(results, indent=2) + "\n")


def frame_batch_section(b: int, iters: int, dev: torch.device) -> dict:
    """FrameBatch.augment_to_device (views cut on the device) vs the worker's uint8 cut of the same boxes."""
    from levjepa.data import DataConfig
    from levjepa.data.views import sample_view_params

    cfg = DataConfig()
    g = torch.Generator().manual_seed(0)
    coarse = torch.rand(16, 3, 40, 70, generator=g) * 255  # one smooth clip, repeated over the batch
    clip = torch.nn.functional.interpolate(coarse, size=(256, 454), mode="bicubic").clamp(0, 255).round()
    frames = clip.to(torch.uint8).permute(0, 2, 3, 1).unsqueeze(0).repeat(b, 1, 1, 1, 1)  # [B, 16, 256, 454, 3]
    params = [sample_view_params(256, 454, cfg, g) for _ in range(b)]
    batch = FrameBatch(
        frames=frames, span=torch.arange(b), frame_index=torch.arange(16).repeat(b, 1),
        boxes=torch.stack([p[0] for p in params], 1), flips=torch.stack([p[1] for p in params], 1),
        photometric=torch.stack([p[2] for p in params], 1), sizes=(1, 224, 96), index=torch.arange(b), epoch=0,
        step=0,
    )  # fmt: skip
    batch = batch.pin_memory() if dev.type == "cuda" else batch
    out = {
        "frame_batch_mb": frames.numel() / 1e6,
        "frame_batch_to_device_ms": device_ms(lambda: batch.augment_to_device(dev), iters, dev),
    }
    out["frame_batch_to_device_ms_per_clip"] = out["frame_batch_to_device_ms"] / b
    # agreement with the worker path on 2 clips, colours untouched: undo the normalisation, compare levels
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1, 1)
    small = FrameBatch(batch.frames[:2].cpu(), torch.arange(2), batch.frame_index[:2], batch.boxes[:, :2],
                       batch.flips[:, :2], torch.zeros(4, 2, 6), (1, 224, 96), torch.arange(2), 0, 0)  # fmt: skip
    glob, local = (v.cpu() * std + mean for v in small.augment_to_device(dev))
    worst, total, count = 0.0, 0.0, 0
    for n, (view, size) in enumerate([(glob, 224)] + [(local[v : v + 1], 96) for v in range(4)]):
        for k in range(2):
            t = small.frames[k].permute(0, 3, 1, 2)
            flip = bool(small.flips[n - 1, k]) if n else False
            ref = cut_view(t, tuple(small.boxes[n, k].tolist()), size, flip).float()
            d = (view[0, k] * 255 - ref).abs()
            worst, total, count = max(worst, float(d.max())), total + float(d.sum()), count + d.numel()
    out["device_cut_vs_worker_max_levels"] = worst
    out["device_cut_vs_worker_mean_levels"] = total / count
    return out


def nvdec_section(out_dir: Path, clips: int) -> dict:
    """NVDEC through PyAV: available here or not (and why), and clips/s hardware vs CPU."""
    try:
        import av  # noqa: F401
    except ImportError as exc:
        return {"nvdec": f"PyAV missing: {exc}"}
    from levjepa.data import DataConfig, PretrainLoader
    from levjepa.data.encode import write_video
    from levjepa.data.prepare import PrepareOptions, prepare_file
    from levjepa.data.sources import MediaItem
    from levjepa.data.video import DecodeOptions, decode_windows, hwaccel_status

    reason = hwaccel_status("cuda")
    out: dict = {"nvdec": "available" if reason is None else f"unavailable: {reason}"}
    work = out_dir / "nvdec_clip"
    work.mkdir(parents=True, exist_ok=True)
    src, clip = work / "src.mp4", work / "prepared" / "clip.mp4"
    if not clip.exists():
        g = torch.Generator().manual_seed(0)
        base = torch.randint(0, 256, (1, 3, 72, 128), dtype=torch.uint8, generator=g).float()
        big = torch.nn.functional.interpolate(base, size=(300, 600), mode="bicubic").clamp(0, 255).to(torch.uint8)
        frames = torch.stack([big[0, :, 20:276, 2 * i : 2 * i + 454].permute(1, 2, 0) for i in range(60)])
        write_video(src, frames.repeat(3, 1, 1, 1).numpy(), fps=30)  # 180 frames of a panning texture
        clip.parent.mkdir(exist_ok=True)
        prepare_file(MediaItem(str(src), None, "video"), clip, PrepareOptions())
    for name, hw in (("cpu", None), ("nvdec", "cuda")):
        if hw and reason is not None:
            continue
        opts = DecodeOptions(hwaccel=hw)
        decode_windows(clip, opts, generator=torch.Generator().manual_seed(0))  # warm-up
        t0 = time.perf_counter()
        for i in range(clips):
            decode_windows(clip, opts, generator=torch.Generator().manual_seed(i))
        out[f"decode_clips_per_s_{name}"] = clips / (time.perf_counter() - t0)
        cfg = DataConfig(sources=(str(clip.parent),), batch_size=8, num_workers=0, samples_per_epoch=1024,
                         resize_on="device", decode_device="cuda" if hw else "cpu")  # fmt: skip
        loader = PretrainLoader(cfg, seed=0)
        next(loader)
        t0 = time.perf_counter()
        for _ in range(max(1, clips // 8)):
            next(loader)
        out[f"loader_clips_per_s_{name}"] = max(1, clips // 8) * 8 / (time.perf_counter() - t0)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
