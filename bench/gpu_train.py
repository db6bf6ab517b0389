"""GPU benchmark of the whole training step, and a short real run (one H200, torch 2.11, bf16), < 4 minutes.

    python bench/gpu_train.py --out DIR            # writes DIR/gpu_train.json, prints a summary

Sections, each saved as soon as it ends (a failure is recorded and the next section still runs):

1. ``vit_b_step``: the ``vit-b-paper`` step exactly as ``levjepa pretrain`` runs it — uint8 clips already on
   the GPU (B = 256: 1 × 16×224² global view + 4 × 16×96² local views), photometric change + normalisation
   (``ViewBatch.augment_to_device``), patch embedding of the kept patches, uniform dropping (ρ = 0.95: 157 + 4 × 29
   tokens), 3D RoPE, block-causal attention, projector, SIGReg (M = 1024) + invariance, fused AdamW, bf16
   autocast. Eager, then with ``encoder.compile_blocks()``. Reports clips/s, model TFLOP/s and MFU against
   the H200's dense bf16 peak (989 TFLOP/s datasheet; ~790 measured for a large GEMM here).
   Targets (issue): ≥ 2,300 clips/s. Reference: bare encoder 2,447 clips/s compiled; a straightforward
   eager step 1,321 clips/s at 27.9 GB.
2. ``accumulation``: the ``vit-b-paper`` step with 4 micro-batches of 64 clips, GradCache (one loss on the
   whole batch, the default) against plain accumulation (one loss per micro-batch): ms per step of each,
   their ratio (CPU: 1.28× in CPU time, ``bench/train.md``; expected ``1 + ¾ · fwd/(fwd+bwd)``), peak
   ``max_memory_allocated`` and saved-activation bytes of each (``bench/accumulation.py``).
3. ``vit_tiny_memory``: ``vit-tiny-consumer`` step at B = 128: peak memory (target ≤ 3 GB; the paper: < 8 GB
   on a 16 GB RTX 5080) and clips/s.
4. ``real_run``: ``levjepa.train.pretrain`` for ~75 s on the built-in benchmark (vit-demo, batch 256,
   64/32-px views) on the GPU: first and last logged losses, to show they fall.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.data.loader import ViewBatch
from levjepa.data.views import sample_photometric
from levjepa.infer.cpu import cpu_info
from levjepa.objective import build_objective
from levjepa.presets import preset
from levjepa.rng import sample_keys
from levjepa.tools.flops import training_flops_per_clip
from levjepa.train.loop import build_models
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, train_step

PEAK_BF16 = 989e12


def _batch(cfg, b: int, device: str) -> ViewBatch:
    d = cfg.data
    g = torch.Generator().manual_seed(0)
    glob = torch.randint(0, 256, (d.num_global, b, 3, d.num_frames, d.global_size, d.global_size), dtype=torch.uint8)
    local = torch.randint(0, 256, (d.num_local, b, 3, d.num_frames, d.local_size, d.local_size), dtype=torch.uint8)
    kw = {k: getattr(d, k) for k in ("jitter_p", "brightness", "contrast", "saturation", "hue", "grayscale_p")}
    photo = torch.stack([sample_photometric(g, **kw) for _ in range(d.num_local * b)]).reshape(d.num_local, b, -1)
    return ViewBatch([glob.to(device), local.to(device)], photo.to(device), torch.arange(b), 0, 0)


DEVICE = "cuda"  # "cpu" under --smoke (tiny sizes: checks the script, gives no numbers)
SMOKE = ["model.dim=32", "model.depth=2", "model.heads=2", "data.num_frames=4", "objective.num_directions=64"]


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _step_bench(cfg, b: int, iters: int, compile_blocks: bool) -> dict:
    device = DEVICE
    encoder, projector = build_models(cfg, seed=0)
    if compile_blocks:
        encoder.compile_blocks()
    model = Pretrainer(encoder, projector).to(device)
    objective = build_objective(cfg.objective, check_finite=False).to(device)
    opt = build_optimizer(model, cfg.optim)
    batch = _batch(cfg, b, device)

    def one(step: int):
        views = batch.augment_to_device(device)
        return train_step(
            model,
            objective,
            opt,
            [views],
            [sample_keys(0, "drop", step, positions=batch.index, device=device)],  # per-clip dropping keys
            step=step,
            lr=4e-4,
            grad_clip=cfg.optim.grad_clip,
            autocast_dtype=torch.bfloat16,
        )

    t0 = time.perf_counter()
    for s in range(3):
        out = one(s)
    _sync()
    warmup_s = time.perf_counter() - t0
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for s in range(iters):
        out = one(3 + s)
    _sync()
    ms = (time.perf_counter() - t0) * 1e3 / iters
    flops = training_flops_per_clip(cfg.model, frames=cfg.data.num_frames).training_total
    clips_s = b / (ms / 1e3)
    return {
        "batch": b,
        "ms_per_step": ms,
        "clips_per_s": clips_s,
        "train_flops_per_clip": flops,
        "tflops": flops * clips_s / 1e12,
        "mfu_vs_989": flops * clips_s / PEAK_BF16,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None,
        "warmup_s": warmup_s,
        "loss": float(out.loss),
        "skipped": bool(out.skipped),
    }


def _smoke(overrides: list[str]) -> list[str]:
    return [*overrides, *SMOKE] if DEVICE == "cpu" else overrides


def vit_b_step(budget_s: float) -> dict:
    cfg = apply_overrides(preset("vit-b-paper"), _smoke(["data.sources=/unused"]))
    b = 256 if DEVICE == "cuda" else 4
    res = {"eager": _step_bench(cfg, b, 10 if DEVICE == "cuda" else 1, compile_blocks=False)}
    if budget_s > 120 and DEVICE == "cuda":
        res["compiled_blocks"] = _step_bench(cfg, b, 20, compile_blocks=True)
    return res


def accumulation() -> dict:
    from accumulation import compare  # bench/accumulation.py, beside this script

    b, rounds = (64, 5) if DEVICE == "cuda" else (2, 1)
    case = ("vit-b-paper", _smoke(["data.sources=/unused"]), b, 4)
    return compare(case, DEVICE, rounds, autocast=DEVICE == "cuda")


def vit_tiny_memory() -> dict:
    cfg = apply_overrides(preset("vit-tiny-consumer"), _smoke(["data.sources=/unused"]))
    return _step_bench(cfg, 128 if DEVICE == "cuda" else 4, 10 if DEVICE == "cuda" else 1, compile_blocks=False)


def real_run(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        from levjepa.train.loop import pretrain

        gpu = [
            "train.device=cuda",
            "train.precision=bf16",
            "train.threads=none",
            "train.steps=300",
            "train.batch_size=256",
            "data.batch_size=256",
            "data.num_workers=12",
            "train.log_every=20",
            "train.checkpoint_every=300",
        ]
        cpu = ["train.steps=4", "train.batch_size=8", "data.batch_size=8", "data.num_workers=0", "train.log_every=2"]
        cpu += ["data.synthetic.num_train=32", "data.synthetic.num_val=8", "data.synthetic.num_test=8"]
        cfg = apply_overrides(preset("demo-cpu"), [*(gpu if DEVICE == "cuda" else cpu), "train.eval_at_end=false"])
        t0 = time.perf_counter()
        summary = pretrain(cfg, Path(tmp) / "run", progress=False)
        wall = time.perf_counter() - t0
        lines = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    keys = ("step", "loss", "invariance", "sigreg", "effective_rank", "clips_per_s")
    return {
        "wall_s": wall,
        "budget_s": seconds,
        "first": {k: lines[0].get(k) for k in keys},
        "last": {k: lines[-1].get(k) for k in keys},
        "curve": [(x["step"], x["loss"], x["invariance"], x["sigreg"]) for x in lines],
        "clips_per_s": summary.clips_per_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--budget-s", type=float, default=230.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: checks the script runs")
    args = parser.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    global DEVICE
    DEVICE = "cpu" if args.smoke else "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    t_start = time.perf_counter()
    results: dict = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__}

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    for name, fn in (
        ("vit_b_step", lambda: vit_b_step(left() - 60)),
        ("accumulation", accumulation),
        ("vit_tiny_memory", vit_tiny_memory),
        ("real_run", lambda: real_run(75)),
    ):
        if left() < 20:
            results[name] = {"skipped": "time budget"}
            continue
        t0 = time.perf_counter()
        try:
            results[name] = fn()
        except Exception:  # record and go on: one broken section must not lose the others
            results[name] = {"error": traceback.format_exc()}
        results[name + "_s"] = time.perf_counter() - t0
        (args.out / "gpu_train.json").write_text(json.dumps(results, indent=2, default=str))
        print(name, json.dumps(results[name], default=str)[:600], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
