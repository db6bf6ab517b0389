"""GPU side of the data pipeline: ViewBatch.to_device (transfer, photometric change, normalisation).

    python bench/gpu_data.py --out DIR [--batch 64] [--iters 20]

On a paper-sized per-GPU batch (B clips of 16 frames: 1 global 224 view + 4 local 96 views, uint8, pinned)
it measures, with CUDA events, (1) the host-to-device copy, (2) the batched photometric change of the local
views (colour jitter + grayscale, ``views.apply_photometric``) and normalisation, (3) the whole
``to_device``; and, for comparison, the same photometric change on one CPU core for one clip's 4 local
views (what a loader worker would pay per clip if it did it there). It checks that the GPU result equals
the CPU one (max abs difference) and writes ``DIR/gpu_data.json``. Runs in well under a minute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from levjepa.data.loader import ViewBatch
from levjepa.data.views import apply_photometric, normalize, sample_photometric


def make_batch(b: int, v: int, t: int, seed: int) -> ViewBatch:
    g = torch.Generator().manual_seed(seed)
    glob = torch.randint(0, 256, (1, b, 3, t, 224, 224), dtype=torch.uint8, generator=g)
    local = torch.randint(0, 256, (v, b, 3, t, 96, 96), dtype=torch.uint8, generator=g)
    kw = dict(jitter_p=0.8, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, grayscale_p=0.2)
    photo = torch.stack([torch.stack([sample_photometric(g, **kw) for _ in range(b)]) for _ in range(v)])
    return ViewBatch([glob, local], photo, torch.arange(b), 0, 0, [])


def cuda_ms(fn, iters: int) -> float:
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
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_data: CUDA is not available", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    batch = make_batch(args.batch, 4, 16, 0).pin_memory()
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
        batch.to_device(dev)

    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "batch": args.batch,
        "uint8_mb": nbytes / 1e6,
        "h2d_ms": cuda_ms(h2d, args.iters),
        "photometric_normalize_local_gpu_ms": cuda_ms(photometric_gpu, args.iters),
        "to_device_ms": cuda_ms(whole, args.iters),
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
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

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_data.json").write_text(json.dumps(results, indent=2) + "\n")
    for key, value in results.items():
        print(f"{key:>36}: {value:.4g}" if isinstance(value, float) else f"{key:>36}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
