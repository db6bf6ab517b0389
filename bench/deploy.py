"""Deployment graphs, measured side by side in one run: can the stream keep up with the camera, and is the exported
graph as fast as PyTorch? PyTorch eager vs ONNX fp32 (opset 23: fused attention, the default; and opset 18: MatMul /
Softmax) vs ONNX int8 (dynamic, and static calibrated on clips) — onnxruntime on the CPU — and, with
``--openvino``, the same graphs under OpenVINO's CPU runtime, for ViT-Tiny at 224² and the demo encoder
(``vit-demo``, 2-frame tubelets, 32² frames; the trained run's with ``--run``), against re-encoding the whole
window for every new tubelet (what a stream without a KV cache does).

    python bench/deploy.py --out DIR --run RUN --openvino   # bench/deploy.md, "Real time"
    python bench/deploy.py --out DIR --smoke                # a tiny encoder, a few repeats: does it run

Per-step latency: one streaming step (one tubelet of τ frames in, the window's KV cache updated, CLS over the
window out), median over the steps of a stream of ``--frames`` frames once the window is full; re-encoding:
the clip encoder on the last ``window`` frames at each step. A step must finish within τ frame intervals at
the model's rate (``--fps``, 7.5: 133 ms a frame) for the stream to keep up: the table gives each step as a
fraction of that budget. Throughput: clips/s of the clip encoder on ``--batch`` clips of ``--clip-frames``
frames. Every number of one table comes from one process, the backends interleaved step by step, so the
machine's load hits them alike; onnxruntime's threads sleep between runs instead of spinning
(``deploy_int8.session_options``), or each session would run beside the previous one's spinning threads.
OpenVINO runs with ``INFERENCE_PRECISION_HINT=f32`` (on CPUs with bf16 it would otherwise compute fp32 graphs
in bf16) and ``--threads`` inference threads. The first line printed names the CPU (``levjepa.infer.cpu``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from deploy_int8 import session_options
from levjepa.formats.deployment.graphs import CLIP_ONNX, DEFAULT_OPSET, STREAM_ONNX, DeployConfig, export_onnx
from levjepa.formats.deployment.quantize import Int8Config, calibration_clips
from levjepa.formats.deployment.runner import OnnxStream
from levjepa.formats.reading.load import load_encoder
from levjepa.infer.cpu import cpu_info
from levjepa.infer.stream import StreamingEncoder
from levjepa.model import VideoEncoder, encoder_config
from levjepa.weights import CONFIG, write_json

MODELS = {  # name -> (encoder config, frame size, window)
    "vit-tiny 224²": (encoder_config("vit-tiny"), 224, 16),
    "demo encoder 32²": (encoder_config("vit-demo", tubelet=2), 32, 16),
    "smoke": (encoder_config("vit-test"), 16, 4),
}
# name -> (int8 or None, opset); + "onnx int8 static" with calibration clips
QUANT: dict[str, tuple[Int8Config | None, int]] = {
    "onnx fp32": (None, DEFAULT_OPSET),
    "onnx fp32 opset 18": (None, 18),
    "onnx int8 dynamic": (Int8Config("dynamic"), DEFAULT_OPSET),
}


class OpenVinoStream:
    """An exported streaming step compiled by OpenVINO for the CPU, pushed like ``OnnxStream``."""

    def __init__(self, export_dir: Path, threads: int) -> None:
        import openvino as ov

        self.inner = OnnxStream(export_dir)  # its record, shapes and state layout
        config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
        path = export_dir / self.inner.record["files"]["stream_step"]
        self.compiled = ov.Core().compile_model(str(path), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.names = [o.get_any_name() for o in self.compiled.outputs]

    def reset(self) -> None:
        self.inner.reset()

    def push(self, frames: np.ndarray) -> np.ndarray:
        st = self.inner
        feeds = {"frames": frames.astype(np.float32), "slot": np.array([st.slot], np.int64), **st.state}
        res = self.request.infer(feeds)
        out = {name: res[o] for name, o in zip(self.names, self.compiled.outputs, strict=True)}
        st.state = {k: out["new_" + k] for k in st.state}
        st.cls, st.slot = out["cls"], st.slot + 1
        return out["patches"]


def onnx_clip(path: Path, opts: object) -> Callable[[np.ndarray], object]:
    session = ort.InferenceSession(str(path), opts)
    return lambda x: session.run(None, {"pixel_values": x})


def openvino_clip(path: Path, threads: int) -> Callable[[np.ndarray], object]:
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    return lambda x: compiled({"pixel_values": x})


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(
    name: str, out: Path, args: argparse.Namespace, run: Path | None = None, calibrate: str | None = None
) -> dict:
    cfg, size, window = MODELS[name]
    torch.manual_seed(0)
    enc = VideoEncoder(cfg).eval().requires_grad_(False)
    if run is not None:  # the trained encoder
        enc = load_encoder(run).encoder.eval().requires_grad_(False)
        cfg = enc.cfg
    quant = dict(QUANT)
    clips = None
    if calibrate:
        clips = calibration_clips(calibrate, args.clips, frames=window, size=size, patch=cfg.patch_size)
        quant["onnx int8 static"] = (Int8Config("static", calibrate, args.clips), DEFAULT_OPSET)
    dirs, t_export = {}, {}
    for key, (int8, opset) in quant.items():
        d = out / f"{name.split()[0]}-{key.replace(' ', '-')}"
        d.mkdir(parents=True, exist_ok=True)
        dc = DeployConfig(window, size, size, "fp32", "none" if int8 is None else "int8", opset, int8 or Int8Config())
        t0 = time.perf_counter()
        record = export_onnx(enc, d, dc, calibration=clips if int8 is not None and int8.method == "static" else None)
        t_export[key] = time.perf_counter() - t0
        write_json(d / CONFIG, {"deploy": record})  # what OnnxStream reads
        dirs[key] = d
        print(f"{name}: exported {key} in {t_export[key]:.0f} s", file=sys.stderr, flush=True)
    tau = cfg.tubelet
    gen = torch.Generator().manual_seed(1)
    video = torch.randn(1, 3, args.frames, size, size, generator=gen)
    batch = torch.randn(args.batch, 3, args.clip_frames, size, size, generator=gen)
    opts = session_options(args.threads)
    sessions = {k: onnx_clip(d / CLIP_ONNX, opts) for k, d in dirs.items()}
    streams: dict[str, OnnxStream | OpenVinoStream] = {
        k: OnnxStream(d, options=session_options(args.threads)) for k, d in dirs.items()
    }
    if args.openvino:
        for k, d in dirs.items():
            if "opset 18" not in k:
                ov_key = k.replace("onnx", "openvino")
                streams[ov_key] = OpenVinoStream(d, args.threads)
                sessions[ov_key] = openvino_clip(d / CLIP_ONNX, args.threads)
    ref = StreamingEncoder(enc, window=window)
    keys = ["pytorch", *streams, "re-encode window: pytorch", "re-encode window: onnx fp32"]
    lat: dict[str, list[float]] = {k: [] for k in keys}
    thr: dict[str, list[float]] = {k: [] for k in ["pytorch", *sessions]}
    for _ in range(args.rounds):  # interleaved: each step times every backend once
        ref.reset()
        for st in streams.values():
            st.reset()
        per: dict[str, list[float]] = {k: [] for k in keys}
        for i in range(0, args.frames - tau + 1, tau):
            f = video[:, :, i : i + tau]
            t0 = time.perf_counter()
            with torch.no_grad():
                ref.push(f)
                ref.cls()
            per["pytorch"].append(time.perf_counter() - t0)
            for k, st in streams.items():
                t0 = time.perf_counter()
                st.push(f.numpy())
                per[k].append(time.perf_counter() - t0)
            clip = video[:, :, max(0, i + tau - window) : i + tau]  # the window as it stands: re-encoded whole
            t0 = time.perf_counter()
            with torch.no_grad():
                enc.forward_features(clip)
            per["re-encode window: pytorch"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sessions["onnx fp32"](clip.numpy())
            per["re-encode window: onnx fp32"].append(time.perf_counter() - t0)
        warm = window // tau  # the cache (and the re-encoded window) is full from here on: the steady state
        for k in keys:
            lat[k].append(1e3 * statistics.median(per[k][warm:] or per[k]))
        with torch.no_grad():
            thr["pytorch"].append(args.batch / (_median_ms(lambda: enc.forward_features(batch), 1) / 1e3))
        x = batch.numpy()
        for k, run_clip in sessions.items():
            ms = _median_ms(lambda run_clip=run_clip, x=x: run_clip(x), 1)
            thr[k].append(args.batch / (ms / 1e3))
    sizes = {"pytorch": sum(p.numel() * 4 for p in enc.parameters())}
    sizes.update({k: sum(f.stat().st_size for f in d.glob(STREAM_ONNX + "*")) for k, d in dirs.items()})
    return {
        "model": name + (" (trained)" if run is not None else ""),
        "window": window,
        "frame": size,
        "tubelet": tau,
        "budget_ms": 1e3 * tau / args.fps,
        "step_ms": {k: statistics.median(v) for k, v in lat.items()},
        "clips_per_s": {k: statistics.median(v) for k, v in thr.items()},
        "bytes": sizes,
        "export_s": t_export,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| encoder | backend | step (ms) | step × PyTorch | of the real-time budget | clips/s | clips/s × PyTorch | "
        "stream step file (MB) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        base, base_thr = r["step_ms"]["pytorch"], r["clips_per_s"]["pytorch"]
        where = f"{r['model']}, τ = {r['tubelet']}, window {r['window']} (budget {r['budget_ms']:.0f} ms a step)"
        for k, ms in r["step_ms"].items():
            thr = r["clips_per_s"].get(k)
            size = r["bytes"].get(k.replace("openvino", "onnx"))
            lines.append(
                f"| {where} | {k} | {ms:.2f} | {ms / base:.2f} | {100 * ms / r['budget_ms']:.1f} % | "
                f"{'' if thr is None else f'{thr:.2f}'} | {'' if thr is None else f'{thr / base_thr:.2f}'} | "
                f"{'' if size is None else f'{size / 1e6:.2f}'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--run", type=Path, default=None, help="a demo-cpu run: its trained encoder for the demo rows")
    ap.add_argument("--calibrate", default="/work/runs/eval_tasks/appearance/train.txt", help="static int8 clips")
    ap.add_argument("--clips", type=int, default=16, help="calibration clips")
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--clip-frames", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fps", type=float, default=7.5, help="the model's frame rate: the real-time budget")
    ap.add_argument("--models", default="vit-tiny 224²,demo encoder 32²")
    ap.add_argument("--openvino", action="store_true", help="also the same graphs under OpenVINO's CPU runtime")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_info().describe()}; {args.threads} threads", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    names = ["smoke"] if args.smoke else args.models.split(",")
    if args.smoke:
        args.rounds, args.frames, args.clips = 1, 8, 2
    rows = []
    for name in names:
        run = args.run if name.startswith("demo") else None
        rows.append(measure(name, args.out, args, run, args.calibrate or None))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    result = {"rows": rows, "torch": torch.__version__, "onnxruntime": ort.__version__, "threads": args.threads,
              "cpu": cpu_info().describe()}  # fmt: skip
    if args.openvino:
        import openvino as ov

        result["openvino"] = ov.__version__
    (args.out / "deploy.json").write_text(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
