"""Deployment graphs, measured side by side in one run: PyTorch eager vs ONNX fp32 vs ONNX int8 (onnxruntime,
CPU), for ViT-Tiny at 224² and the demo encoder (``vit-demo``, 2-frame tubelets, 32² frames).

    python bench/deploy.py --out DIR                    # latency, throughput, file sizes (bench/deploy.md)
    python bench/deploy.py --out DIR --run RUN          # + the demo run's probes from int8 features
    python bench/deploy.py --out DIR --smoke            # a tiny encoder, a few repeats: does it run

Per-frame latency: the streaming step (one tubelet in, the window's KV cache updated), median over the
pushes of a stream of ``--frames`` frames after a warm-up window. Throughput: clips/s of the clip encoder
on a batch of ``--batch`` clips of ``--clip-frames`` frames. Every number of one table comes from one process,
the three backends interleaved round by round, so the machine's load hits them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from levjepa.formats.deploy import CLIP_ONNX, STREAM_ONNX, DeployConfig, OnnxStream, export_onnx
from levjepa.formats.load import load_encoder
from levjepa.infer.stream import StreamingEncoder
from levjepa.model import VideoEncoder, encoder_config
from levjepa.weights import CONFIG, write_json

MODELS = {  # name -> (encoder config, frame size, window)
    "vit-tiny 224²": (encoder_config("vit-tiny"), 224, 16),
    "demo encoder 32²": (encoder_config("vit-demo", tubelet=2), 32, 16),
    "smoke": (encoder_config("vit-test"), 16, 4),
}


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(name: str, out: Path, frames: int, batch: int, clip_frames: int, rounds: int) -> dict:
    import onnxruntime as ort

    cfg, size, window = MODELS[name]
    torch.manual_seed(0)
    enc = VideoEncoder(cfg).eval().requires_grad_(False)
    dirs = {q: out / f"{name.split()[0]}-{q}" for q in ("none", "int8")}
    t_export = {}
    for q, d in dirs.items():
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        record = export_onnx(enc, d, DeployConfig(window=window, height=size, width=size, quantize=q))
        t_export[q] = time.perf_counter() - t0
        write_json(d / CONFIG, {"deploy": record})  # what OnnxStream reads
    tau = cfg.tubelet
    video = torch.randn(1, 3, frames, size, size)
    clips = torch.randn(batch, 3, clip_frames, size, size)
    sessions = {q: ort.InferenceSession(str(d / CLIP_ONNX)) for q, d in dirs.items()}
    streams = {q: OnnxStream(d) for q, d in dirs.items()}
    ref = StreamingEncoder(enc, window=window)
    lat: dict[str, list[float]] = {"pytorch": [], "onnx fp32": [], "onnx int8": []}
    thr: dict[str, list[float]] = {k: [] for k in lat}
    for _ in range(rounds):  # interleaved: each round times every backend once
        ref.reset()
        for s in streams.values():
            s.reset()
        per = {k: [] for k in lat}
        for i in range(0, frames, tau):
            f = video[:, :, i : i + tau]
            t0 = time.perf_counter()
            with torch.no_grad():
                ref.push(f)
                ref.cls()
            per["pytorch"].append(time.perf_counter() - t0)
            for q, key in (("none", "onnx fp32"), ("int8", "onnx int8")):
                t0 = time.perf_counter()
                streams[q].push(f.numpy())
                per[key].append(time.perf_counter() - t0)
        warm = window // tau  # the cache is full from here on: the steady-state cost
        for k in lat:
            lat[k].append(1e3 * statistics.median(per[k][warm:] or per[k]))
        with torch.no_grad():
            thr["pytorch"].append(batch / (_median_ms(lambda: enc.forward_features(clips), 1) / 1e3))
        x = clips.numpy()
        for q, key in (("none", "onnx fp32"), ("int8", "onnx int8")):
            ms = _median_ms(lambda q=q, x=x: sessions[q].run(None, {"pixel_values": x}), 1)
            thr[key].append(batch / (ms / 1e3))
    sizes = {
        "pytorch": sum(p.numel() * 4 for p in enc.parameters()),
        "onnx fp32": sum(f.stat().st_size for f in dirs["none"].iterdir() if f.name.startswith(STREAM_ONNX[:-5])),
        "onnx int8": sum(f.stat().st_size for f in dirs["int8"].iterdir() if f.name.startswith(STREAM_ONNX[:-5])),
    }
    return {
        "model": name,
        "window": window,
        "frame": size,
        "latency_ms": {k: statistics.median(v) for k, v in lat.items()},
        "clips_per_s": {k: statistics.median(v) for k, v in thr.items()},
        "bytes": sizes,
        "export_s": t_export,
    }


def probe_delta(run: Path, out: Path) -> dict:
    """The demo run's probes from the fp32 encoder vs from its int8 ONNX clip encoder (same protocol)."""
    import onnxruntime as ort

    from levjepa.eval import EvalConfig, evaluate_benchmark
    from levjepa.formats.load import read_run_config
    from levjepa.model import EncoderOutput

    loaded = load_encoder(run)
    cfg = read_run_config(run)
    d = out / "run-int8"
    d.mkdir(parents=True, exist_ok=True)
    syn = cfg.data.synthetic
    export_onnx(
        loaded.encoder, d, DeployConfig(window=syn.num_frames, height=syn.size, width=syn.size, quantize="int8")
    )
    session = ort.InferenceSession(str(d / CLIP_ONNX))

    class OnnxEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cfg = loaded.encoder.cfg
            self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # device / dtype for callers

        def forward_features(self, video: torch.Tensor, **_: object) -> EncoderOutput:
            cls, patches = session.run(None, {"pixel_values": video.float().cpu().numpy()})
            n = patches.shape[1]
            return EncoderOutput(
                torch.from_numpy(cls), torch.from_numpy(patches), torch.zeros(1, n, 3, dtype=torch.long)
            )

        def forward(self, video: torch.Tensor) -> torch.Tensor:
            return self.forward_features(video).cls

    result = evaluate_benchmark(
        {"pytorch fp32": loaded.encoder, "onnx int8": OnnxEncoder()}, syn, EvalConfig(budget="demo", seed=0)
    )
    print(result.table())
    return result.to_json()


def table(rows: list[dict]) -> str:
    lines = [
        "| encoder | backend | per-frame latency (ms) | clips/s | stream step file (MB) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        for k in r["latency_ms"]:
            lines.append(
                f"| {r['model']} (window {r['window']}) | {k} | {r['latency_ms'][k]:.2f} | "
                f"{r['clips_per_s'][k]:.1f} | {r['bytes'][k] / 1e6:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--run", type=Path, default=None, help="a demo-cpu run: probes from int8 features")
    ap.add_argument("--frames", type=int, default=48)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--clip-frames", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    names = ["smoke"] if args.smoke else ["vit-tiny 224²", "demo encoder 32²"]
    rows = []
    for name in names:
        rows.append(
            measure(name, args.out, args.frames, args.batch, args.clip_frames, 1 if args.smoke else args.rounds)
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    result = {"rows": rows, "torch": torch.__version__, "threads": args.threads}
    if args.run is not None:
        result["probes"] = probe_delta(args.run, args.out)
    (args.out / "deploy.json").write_text(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
