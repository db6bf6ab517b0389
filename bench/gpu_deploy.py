"""GPU rows of bench/deploy.md: the ViT-Tiny deployment graphs on CUDA, PyTorch eager vs onnxruntime's CUDA
execution provider (TensorRT's when onnxruntime has it), fp32 and fp16, side by side in one process.

    python bench/gpu_deploy.py --out DIR [--budget-s 30]

onnxruntime with CUDA is not on the GPU image: carry the `onnxruntime-gpu` wheel in `.whl/` with the other
wheels (bench/gpu_all.sh installs them); without it the script records that and times PyTorch alone.
Writes DIR/gpu_deploy.json as it goes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from levjepa.formats.deployment.graphs import (
    CLIP_ONNX,
    STREAM_ONNX,
    DeployConfig,
    StreamStep,
    export_onnx,
    initial_cache,
)
from levjepa.infer.cpu import cpu_info
from levjepa.model import VideoEncoder, encoder_config


def _time(fn, n: int) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=30)
    args = ap.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"torch": torch.__version__}
    path = args.out / "gpu_deploy.json"
    enc = VideoEncoder(encoder_config("vit-tiny")).eval().requires_grad_(False).cuda()
    clips = torch.randn(8, 3, 16, 224, 224, device="cuda")
    step = StreamStep(enc, 16, 224, 224)
    k, v = (c.cuda() for c in initial_cache(step))
    frame = torch.randn(1, 3, 1, 224, 224, device="cuda")
    with torch.no_grad():
        result["pytorch_fp32_clip_ms"] = _time(lambda: enc.forward_features(clips), 10)
        result["pytorch_fp32_step_ms"] = _time(lambda: step(frame, torch.tensor([20], device="cuda"), k, v), 20)
        with torch.autocast("cuda", torch.bfloat16):
            result["pytorch_bf16_clip_ms"] = _time(lambda: enc.forward_features(clips), 10)
    path.write_text(json.dumps(result, indent=2))
    try:
        import onnxruntime as ort
    except ImportError:
        result["onnxruntime"] = "not installed (carry the onnxruntime-gpu wheel in .whl/)"
        path.write_text(json.dumps(result, indent=2))
        return 0
    providers = [
        p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if p in ort.get_available_providers()
    ]
    result["providers"] = ort.get_available_providers()
    start = time.perf_counter()
    for dtype in ("fp32", "fp16"):
        if not providers or time.perf_counter() - start > args.budget_s:
            break
        d = args.out / f"onnx-{dtype}"
        d.mkdir(exist_ok=True)
        export_onnx(enc.cpu(), d, DeployConfig(window=16, height=224, width=224, dtype=dtype))
        enc.cuda()
        np_dtype = "float16" if dtype == "fp16" else "float32"
        for provider in providers:
            clip_s = ort.InferenceSession(str(d / CLIP_ONNX), providers=[provider])
            step_s = ort.InferenceSession(str(d / STREAM_ONNX), providers=[provider])
            x = clips.cpu().numpy().astype(np_dtype)
            feeds = {
                "frames": frame.cpu().numpy().astype(np_dtype),
                "slot": torch.tensor([20]).numpy(),
                "cache_k": k.cpu().numpy().astype(np_dtype),
                "cache_v": v.cpu().numpy().astype(np_dtype),
            }
            result[f"{provider}_{dtype}_clip_ms"] = _time(lambda s=clip_s, x=x: s.run(None, {"pixel_values": x}), 10)
            result[f"{provider}_{dtype}_step_ms"] = _time(lambda s=step_s, f=feeds: s.run(None, f), 20)
            path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
