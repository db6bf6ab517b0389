"""GPU benchmark of the encoder (one H200, torch 2.11 + triton 3.6, bf16 autocast), < 4 minutes:

    python bench/gpu_encoder.py --out DIR          # writes DIR/gpu_encoder.json, prints a summary

Sections, each timed and saved as soon as it ends (a failure is recorded and the next section still runs):

1. ``equivalence``: the CUDA path equals the CPU path (float32, TF32 off): ``forward_views`` CLS and every
   parameter gradient of a small encoder, with the same ``keep_idx`` (one CPU generator); streaming on
   CUDA equals the full forward for every prefix; bf16 autocast vs float32 (informational).
2. ``vit_b_eager``: ViT-B/16 training step of the encoder, ``forward_views`` on B = 256 clips (1 × 16×224²
   view -> 158 tokens, 4 × 16×96² views -> 30 tokens each) + backward, bf16 autocast, fp32 weights,
   block-causal mask + 3D RoPE: clips/s and TFLOP/s (FLOPs from ``levjepa.tools.flops``, encoder terms
   only), plus the top CUDA kernels of one profiled step.
3. ``vit_tiny_memory``: ViT-Tiny at B = 128, same views: peak memory and clips/s.
4. ``vit_b_bidirectional_eager``: the same step without a mask (flash kernel), to price the mask.
5. ``attention_kernels``: the attention op alone (fwd+bwd, bf16) at the global and local shapes with a
   boolean block-causal mask per SDPA backend, a float mask, and no mask: what the mask costs.
6. ``vit_b_compiled``: ``compile_blocks()`` (the block stack as one compiled region; each block on its own
   before 2026-12-04),
   compile time, clips/s, TFLOP/s, and compiled-vs-eager CLS agreement.
7. ``pytest_gpu``: ``pytest -m gpu tests/test_attention.py`` (the CUDA-vs-CPU test), if pytest is there.

Reference from the issue (bare encoder, one H200): 1,932 clips/s eager, 2,447 compiled (354 TFLOP/s);
target for ours with block-causal masking and RoPE: >= 2,400 clips/s.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.infer import StreamingEncoder
from levjepa.infer.cpu import cpu_info
from levjepa.model import EncoderConfig, VideoEncoder, encoder_config
from levjepa.tools.flops import training_flops_per_clip

ROOT = Path(__file__).resolve().parents[1]
T_START = time.time()
RESULTS: dict = {}


def elapsed() -> float:
    return time.time() - T_START


def section(name: str, out: Path) -> Callable:
    def wrap(fn: Callable) -> Callable:
        def run(*args, **kwargs):
            t0 = time.time()
            print(f"[{elapsed():6.1f}s] {name} ...", flush=True)
            try:
                RESULTS[name] = fn(*args, **kwargs)
            except Exception as exc:  # record and go on: one failure must not lose the other numbers
                RESULTS[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                print(RESULTS[name]["traceback"], flush=True)
            RESULTS[name]["seconds"] = round(time.time() - t0, 2)
            RESULTS["elapsed_s"] = round(elapsed(), 1)
            (out / "gpu_encoder.json").write_text(json.dumps(RESULTS, indent=2))
            print(f"[{elapsed():6.1f}s] {name}: {json.dumps(_brief(RESULTS[name]))}", flush=True)
            return RESULTS[name]

        return run

    return wrap


def _brief(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("traceback", "top_kernels")}


def encoder_train_flops(cfg: EncoderConfig, num_local: int = 4, **views) -> float:
    fl = training_flops_per_clip(cfg, num_local=num_local, **views).training
    return sum(v for k, v in fl.items() if k not in ("projector", "objective"))


def make_views(batch: int, device: torch.device, dtype: torch.dtype, frames: int, gsize: int, lsize: int):
    g = torch.Generator(device=device).manual_seed(0)
    glob = torch.randn(1, batch, 3, frames, gsize, gsize, device=device, dtype=dtype, generator=g)
    loc = torch.randn(4, batch, 3, frames, lsize, lsize, device=device, dtype=dtype, generator=g)
    return glob, loc


def train_step(enc: VideoEncoder, views, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    enc.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        cls = enc.forward_views(*views, generator=gen)  # [5, B, D]
    loss = cls.float().square().mean()
    loss.backward()
    return cls.detach()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def throughput(enc, views, batch: int, device, warmup: int, steps: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    t0 = time.time()
    for _ in range(warmup):
        train_step(enc, views, gen, device)
    sync(device)
    warm = time.time() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(enc, views, gen, device)
    sync(device)
    dt = (time.perf_counter() - t0) / steps
    return {"step_ms": round(dt * 1e3, 2), "clips_per_s": round(batch / dt, 1), "warmup_s": round(warm, 1)}


def attention_step(q, k, v, attn_mask, backend) -> None:
    """fwd+bwd of one ``scaled_dot_product_attention`` call, on ``backend`` (``None``: PyTorch's choice)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    if backend is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    else:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    out.sum().backward()


def top_kernels(enc, views, device, n: int = 15) -> list[str]:
    """The ``n`` most expensive kernels (CUDA) or ops (CPU) of one step, as '% of time, calls, name'."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    attr = "device_time_total" if cuda else "cpu_time_total"
    gen = torch.Generator(device=device).manual_seed(0)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        train_step(enc, views, gen, device)
        sync(device)
    events = list(prof.key_averages())
    total = sum(getattr(e, attr, 0.0) for e in events) or 1.0
    rows = sorted(events, key=lambda e: -getattr(e, attr, 0.0))[:n]
    return [f"{100 * getattr(e, attr, 0.0) / total:5.1f}% {e.count:4d}x {e.key[:110]}" for e in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for gpu_encoder.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on any device (checks the script runs)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile section (minutes on CPU)")
    parser.add_argument("--budget-s", type=float, default=200.0, help="skip sections that would start after this")
    args = parser.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = args.smoke or device.type != "cuda"
    RESULTS["env"] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "smoke": smoke,
    }
    try:
        import triton

        RESULTS["env"]["triton"] = triton.__version__
    except ImportError:
        RESULTS["env"]["triton"] = None
    # per-block compile: identical blocks x 2 shapes must not hit the recompile limit
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))

    big = encoder_config("vit-test", patch_size=16) if smoke else encoder_config("vit-base")
    tiny = encoder_config("vit-test", patch_size=16, dim=48, heads=3) if smoke else encoder_config("vit-tiny")
    batch_b, batch_t = (2, 2) if smoke else (256, 128)
    frames, gsize, lsize = (4, 64, 32) if smoke else (16, 224, 96)
    steps, warmup = (2, 1) if smoke else (10, 3)
    view_kw = {"frames": frames, "global_size": gsize, "local_size": lsize}

    @section("equivalence", out)
    def equivalence() -> dict:
        if device.type != "cuda" and not smoke:
            return {"skipped": "no CUDA device"}
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.manual_seed(0)
        cpu = VideoEncoder(encoder_config("vit-test", patch_size=16, dim=64, heads=2))
        gpu = copy.deepcopy(cpu).to(device)
        views = (torch.randn(1, 3, 3, 16, 64, 64), torch.randn(2, 3, 3, 16, 32, 32))
        cls_cpu = cpu.forward_views(*views, generator=torch.Generator().manual_seed(5))
        cls_gpu = gpu.forward_views(*(v.to(device) for v in views), generator=torch.Generator().manual_seed(5))
        cls_cpu.square().sum().backward()
        cls_gpu.square().sum().backward()
        cls_diff = float((cls_gpu.detach().cpu() - cls_cpu.detach()).abs().max())
        grad_diff = max(
            float((q.grad.cpu() - p.grad).abs().max() / (p.grad.abs().max() + 1e-12))
            for p, q in zip(cpu.parameters(), gpu.parameters(), strict=True)
        )
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            cls_bf16 = gpu.forward_views(*(v.to(device) for v in views), generator=torch.Generator().manual_seed(5))
        bf16_rel = float((cls_bf16.float().cpu() - cls_cpu.detach()).norm() / cls_cpu.detach().norm())
        # streaming on CUDA == full forward on CUDA, every prefix
        gpu.eval()
        video = torch.randn(1, 3, 6, 96, 96, device=device)
        stream, seen, stream_diff = StreamingEncoder(gpu), [], 0.0
        with torch.no_grad():
            for t in range(6):
                seen.append(stream.push(video[:, :, t : t + 1]))
                full = gpu.forward_features(video[:, :, : t + 1])
                stream_diff = max(
                    stream_diff,
                    float((torch.cat(seen, 1) - full.patches).abs().max()),
                    float((stream.cls() - full.cls).abs().max()),
                )
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        ok = cls_diff < 1e-4 and grad_diff < 1e-3 and stream_diff < 1e-5
        return {
            "pass": ok,
            "cls_max_abs_diff": cls_diff,
            "grad_max_rel_diff": grad_diff,
            "stream_vs_full_max_abs_diff": stream_diff,
            "bf16_autocast_rel_err": bf16_rel,
        }

    def bench_model(cfg: EncoderConfig, batch: int, profile_kernels: bool) -> tuple[dict, VideoEncoder, tuple]:
        torch.manual_seed(0)
        enc = VideoEncoder(cfg).to(device).train()
        views = make_views(batch, device, torch.bfloat16, frames, gsize, lsize)
        r = throughput(enc, views, batch, device, warmup, steps)
        flops = encoder_train_flops(cfg, **view_kw)
        r["encoder_train_flops_per_clip"] = flops
        r["tflops"] = round(flops * r["clips_per_s"] / 1e12, 1)
        r["tokens_per_view"] = training_flops_per_clip(cfg, **view_kw).tokens
        if profile_kernels:
            r["top_kernels"] = top_kernels(enc, views, device)
        return r, enc, views

    state: dict = {}

    @section("vit_b_eager", out)
    def vit_b_eager() -> dict:
        torch.set_float32_matmul_precision("high")
        r, enc, views = bench_model(big, batch_b, profile_kernels=True)
        state["enc"], state["views"] = enc, views
        return {"model": "vit-base" if not smoke else "vit-test", "batch": batch_b, **r}

    @section("vit_tiny_memory", out)
    def vit_tiny_memory() -> dict:
        torch.manual_seed(0)
        enc = VideoEncoder(tiny).to(device).train()
        views = make_views(batch_t, device, torch.bfloat16, frames, gsize, lsize)
        gen = torch.Generator(device=device).manual_seed(0)
        train_step(enc, views, gen, device)  # warm-up: allocator, kernels
        sync(device)
        r: dict = {"model": "vit-tiny" if not smoke else "vit-test-48", "batch": batch_t}
        if device.type == "cuda":
            enc.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            train_step(enc, views, gen, device)
            sync(device)
            r["inputs_weights_gib"] = round(before / 2**30, 3)
            r["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            r["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        r.update(throughput(enc, views, batch_t, device, 1, steps))
        r["tflops"] = round(encoder_train_flops(tiny, **view_kw) * r["clips_per_s"] / 1e12, 1)
        return r

    @section("vit_b_bidirectional_eager", out)
    def vit_b_bidirectional() -> dict:
        cfg = encoder_config("vit-base", attention="bidirectional") if not smoke else big
        r, _, _ = bench_model(cfg, batch_b, profile_kernels=False)
        return {"batch": batch_b, **r}

    @section("attention_kernels", out)
    def attention_kernels() -> dict:
        """fwd+bwd of the attention op alone at the ViT-B training shapes, bf16, per SDPA backend and mask."""
        from torch.nn.attention import SDPBackend

        from levjepa.model.attention import TokenMeta, build_attn_mask
        from levjepa.model.tokens import num_kept

        heads, hd = (12, 64) if not smoke else (2, 16)
        res: dict = {}
        for label, b, n_grid in (("global", batch_b, 3136), ("local", 4 * batch_b, 576)):
            n = num_kept(n_grid, 0.95) + 1
            frames = torch.randint(0, 16, (b, n), device=device).sort(dim=1).values
            frames[:, 0] = 15
            is_cls = torch.zeros(1, n, dtype=torch.bool, device=device)
            is_cls[:, 0] = True
            meta = TokenMeta(frames, is_cls)
            mask = build_attn_mask("block_causal", meta, meta)
            fmask = torch.zeros(mask.shape, dtype=torch.bfloat16, device=device).masked_fill(~mask, float("-inf"))
            q, k, v = (
                torch.randn(b, heads, n, hd, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in "qkv"
            )
            variants = {
                "bool_mask_default": (mask, None),
                "bool_mask_efficient": (mask, SDPBackend.EFFICIENT_ATTENTION),
                "bool_mask_cudnn": (mask, SDPBackend.CUDNN_ATTENTION),
                "float_mask_default": (fmask, None),
                "no_mask_default": (None, None),
            }
            for name, (m, backend) in variants.items():
                try:
                    attention_step(q, k, v, m, backend)
                    sync(device)
                    t0 = time.perf_counter()
                    for _ in range(20):
                        attention_step(q, k, v, m, backend)
                    sync(device)
                    res[f"{label}_{name}_ms"] = round((time.perf_counter() - t0) / 20 * 1e3, 3)
                except Exception as exc:  # e.g. a backend that refuses arbitrary masks
                    res[f"{label}_{name}_ms"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        return res

    @section("vit_b_compiled", out)
    def vit_b_compiled() -> dict:
        if args.no_compile:
            return {"skipped": "--no-compile"}
        if elapsed() > args.budget_s - 90:
            return {"skipped": f"budget: {elapsed():.0f}s elapsed of {args.budget_s:.0f}s"}
        enc, views = state["enc"], state["views"]
        eager_cls = train_step(enc, views, torch.Generator(device=device).manual_seed(11), device)
        enc.compile_blocks(dynamic=False)
        t0 = time.time()
        compiled_cls = train_step(enc, views, torch.Generator(device=device).manual_seed(11), device)
        sync(device)
        first = time.time() - t0
        rel = float((compiled_cls.float() - eager_cls.float()).norm() / eager_cls.float().norm())
        r = throughput(enc, views, batch_b, device, 2, steps)
        flops = encoder_train_flops(big, **view_kw)
        r.update(
            {
                "batch": batch_b,
                "first_step_compile_s": round(first, 1),
                "tflops": round(flops * r["clips_per_s"] / 1e12, 1),
                "compiled_vs_eager_cls_rel_err": rel,
                "target_clips_per_s": 2400,
            }
        )
        r["top_kernels"] = top_kernels(enc, views, device)
        return r

    @section("pytest_gpu", out)
    def pytest_gpu() -> dict:
        if device.type != "cuda":
            return {"skipped": "no CUDA device"}
        try:
            import pytest  # noqa: F401
        except ImportError:
            return {"skipped": "pytest is not installed (section 1 ran the same check)"}
        left = max(30, int(args.budget_s + 30 - elapsed()))
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_attention.py"]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=left)
        return {"returncode": proc.returncode, "tail": (proc.stdout + proc.stderr)[-1500:]}

    equivalence()
    vit_b_eager()
    vit_tiny_memory()
    vit_b_bidirectional()
    attention_kernels()
    vit_b_compiled()
    pytest_gpu()

    print("\nsummary")
    names = ("equivalence", "vit_b_eager", "vit_b_bidirectional_eager", "attention_kernels", "vit_b_compiled")
    for name in (*names, "vit_tiny_memory"):
        print(f"  {name}: {json.dumps(_brief(RESULTS.get(name, {})))}")
    for name in ("vit_b_eager", "vit_b_compiled"):
        for line in RESULTS.get(name, {}).get("top_kernels", [])[:8]:
            print(f"  {name} kernel: {line}")
    print(f"total {elapsed():.1f}s -> {out / 'gpu_encoder.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
