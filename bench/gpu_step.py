"""GPU benchmark of the ρ = 0.95 ViT-Tiny step: eager, compiled blocks (static shapes), and compiled with CUDA
graphs; each one's share of matmul and attention kernels from the profiler (issue 28), < 90 s on one H200.

    python bench/gpu_step.py --out DIR            # writes DIR/gpu_step.json, prints a summary
    python bench/gpu_step.py --out DIR --smoke    # on the CPU at tiny sizes: checks the script, no numbers

The step is ``train_step`` on the ``vit-tiny-consumer`` preset (1 × 16×224² + 4 × 16×96² views, 158 + 4 × 30
tokens, block-causal, RoPE, projector 2048 → 256, SIGReg M = 1024, fused AdamW) at B = 128, bf16 autocast,
normalised float views already on the GPU. Variants:

* ``eager``;
* ``compiled``: ``train.compile=true`` (``VideoEncoder.compile_blocks()``: the block stack as one region,
  forward and backward, static shapes — one graph per view shape; each block on its own before 2026-12-04);
* ``cudagraphs``: the same with ``mode="reduce-overhead"`` (CUDA graphs over each compiled region: at 158-
  and 30-token sequences every kernel is small, and launch overhead is what a graph removes);
* ``captured``: ``train.compile`` on CUDA since issue 47 (``levjepa.train.step.compile_step``): each view
  group's whole forward, the projector and the loss as three CUDA graphs (dropping, patch embedding and
  SIGReg inside them).

Each reports ms/step, clips/s, peak ``max_memory_allocated``, compile/warm-up time, its first losses against
eager's (same weights, same keys), and from ``torch.profiler``: the CUDA time of GEMM kernels and attention
kernels (by kernel name) against the step's wall time, ``step ÷ (matmul + attention)`` — the ratio the CPU
rows of ``bench/train.md`` report. Each variant is saved as soon as it ends; a failure is recorded and the
next still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.infer.cpu import cpu_info
from levjepa.objective import build_objective
from levjepa.presets import preset
from levjepa.rng import sample_keys
from levjepa.train.loop import build_models
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, compile_regions, compile_step, train_step

GEMM = ("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "ampere", "hopper", "nvjet", "cublas")
ATTENTION = ("fmha", "flash", "attention", "efficient")
SMOKE = ["model.dim=32", "model.depth=2", "model.heads=2", "data.num_frames=4", "objective.num_directions=64"]
SMOKE += ["data.global_size=32", "data.local_size=16", "model.patch_size=8"]


def _setup(device: str, batch: int, smoke: bool, mode: str | None):
    overrides = ["data.sources=/unused", f"data.batch_size={batch}", f"train.batch_size={batch}"]
    cfg = apply_overrides(preset("vit-tiny-consumer"), overrides + (SMOKE if smoke else []))
    encoder, projector = build_models(cfg, seed=0)
    if mode not in (None, "step"):  # the smoke run checks the capture only (Inductor's CPU build takes minutes)
        encoder.compile_blocks(**({"backend": "aot_eager"} if smoke else {} if mode == "default" else {"mode": mode}))
    model = Pretrainer(encoder, projector).to(device)
    objective = build_objective(cfg.objective, check_finite=False).to(device)
    if mode == "step":
        if smoke:
            compile_regions(model, objective, backend="aot_eager")
        else:
            compile_step(model, objective, torch.device(device))
    opt = build_optimizer(model, cfg.optim)
    d = cfg.data
    g = torch.Generator().manual_seed(0)
    glob = torch.randn(d.num_global, batch, 3, d.num_frames, d.global_size, d.global_size, generator=g)
    local = torch.randn(d.num_local, batch, 3, d.num_frames, d.local_size, d.local_size, generator=g)
    views = [glob.to(device), local.to(device)]
    autocast = torch.bfloat16 if device == "cuda" else None

    def step(i: int):
        keys = sample_keys(0, "drop", i, positions=range(batch), device=device)
        return train_step(
            model, objective, opt, [views], [keys], step=i, lr=4e-4, grad_clip=1.0, autocast_dtype=autocast
        )

    return step


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _profile(step, device: str, start: int, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for i in range(steps):
            step(start + i)
        _sync(device)
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    gemm = attention = 0.0
    for e in prof.key_averages():
        t = e.self_device_time_total if device == "cuda" else e.self_cpu_time_total
        name = e.key.lower()
        if device != "cuda":
            gemm += t if e.key in ("aten::mm", "aten::addmm", "aten::bmm") else 0.0
            attention += t if e.key.startswith("aten::_scaled_dot_product") else 0.0
        elif any(s in name for s in ATTENTION):
            attention += t
        elif any(s in name for s in GEMM):
            gemm += t
    gemm, attention = gemm / 1e3 / steps, attention / 1e3 / steps
    return {
        "profiled_ms": wall_ms,
        "gemm_ms": gemm,
        "attention_ms": attention,
        "ratio": wall_ms / max(gemm + attention, 1e-9),
    }


def variant(device: str, batch: int, smoke: bool, mode: str | None, iters: int) -> dict:
    step = _setup(device, batch, smoke, mode)
    t0 = time.perf_counter()
    losses = [float(step(i).loss) for i in range(3)]  # compile / warm-up; the first losses
    warmup_s = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    t0 = time.perf_counter()
    for i in range(iters):
        out = step(3 + i)
    _sync(device)
    ms = (time.perf_counter() - t0) * 1e3 / iters
    res = {
        "batch": batch,
        "ms_per_step": ms,
        "clips_per_s": batch / (ms / 1e3),
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
        "warmup_s": warmup_s,
        "first_losses": losses,
        "last_loss": float(out.loss),
    }
    res.update(_profile(step, device, 3 + iters, 3))
    # the profiler slows a launch-bound GPU step ~3x: the unprofiled step against the kernels' time too
    res["ratio_unprofiled"] = ms / max(res["gemm_ms"] + res["attention_ms"], 1e-9)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: check the script")
    ap.add_argument("--budget-s", type=float, default=80.0)
    args = ap.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.smoke else "cuda"
    batch, iters = (4, 1) if args.smoke else (128, 20)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    results: dict[str, object] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    t_start = time.perf_counter()
    variants = (("eager", None), ("captured", "step"), ("compiled", "default"), ("cudagraphs", "reduce-overhead"))
    for name, mode in variants:
        if time.perf_counter() - t_start > args.budget_s:
            results[name] = {"skipped": "over the time budget"}
            continue
        if mode == "reduce-overhead" and device != "cuda":
            continue
        try:
            torch._dynamo.reset()
            results[name] = variant(device, batch, args.smoke, mode, iters)
        except Exception:  # record and go on: one failing variant must not lose the others
            results[name] = {"error": traceback.format_exc()[-2000:]}
        (args.out / "gpu_step.json").write_text(json.dumps(results, indent=1))
        row = results[name]
        if isinstance(row, dict) and "ms_per_step" in row:
            ms, clips, ratio, plain = row["ms_per_step"], row["clips_per_s"], row["ratio"], row["ratio_unprofiled"]
            print(
                f"{name:10s} {ms:7.1f} ms/step  {clips:7.0f} clips/s  step / (matmul + attention) {plain:.2f}"
                f" ({ratio:.2f} on the profiled step)"
            )
        else:
            print(f"{name:10s} {row}")


if __name__ == "__main__":
    main()
    # on the H200 the process did not exit within 70 s after its last row (CUDA-graph trees and compile workers
    # at interpreter teardown, bench/gpu.md); everything is written and flushed by now
    sys.stdout.flush()
    os._exit(0)
