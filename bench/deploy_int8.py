"""Which int8 keeps the demo's accuracy and pays in speed: every choice of ``levjepa.formats.deployment.quantize``
measured side by side on a trained run (bench/deploy.md, "Calibrated int8").

    python bench/deploy_int8.py --run RUN --out DIR --calibrate /work/runs/eval_tasks/appearance/train.txt
    python bench/deploy_int8.py --run RUN --out DIR --smoke      # two variants, one probe seed: does it run
    python bench/deploy_int8.py --run RUN --out DIR --variants "onnx fp32,int8 dynamic,..."   # a subset

For each variant (fp32, dynamic int8, static int8 with different parts kept in float, QDQ vs QOperator,
per-channel vs per-tensor weight scales) the run's encoder is exported (``export_onnx``; static variants
calibrated on ``--clips`` clips of ``--calibrate``, which are not the benchmark's clips), then:

* accuracy: the demo's frozen evaluation (``evaluate_benchmark``, budget ``demo``, every probe of the demo's
  table) on features from the variant's ONNX clip encoder, ``--seeds`` probe seeds stacked, against the
  PyTorch fp32 encoder in the same call (the demo table's reference);
* the CPU's int8 kernels: the relative L2 error of CLS and patch features against ONNX fp32 on ``--held`` clips
  (not calibrated on), and, for QDQ graphs, against onnxruntime's reference path (DequantizeLinear, then float
  products: the integers without the int16 pair sums of a CPU without VNNI) — > 0 there is saturation;
* speed: clips/s of the clip encoder (a batch of ``--batch`` clips) and the median latency of a streaming step
  once the window is full, every variant timed once per round, rounds interleaved, so a shared machine's load
  hits them alike; the ratios to ONNX fp32 are what to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from levjepa.eval import EvalConfig, evaluate_benchmark
from levjepa.formats.deployment.graphs import CLIP_ONNX, STREAM_ONNX, DeployConfig, export_onnx
from levjepa.formats.deployment.quantize import Int8Config, calibration_clips
from levjepa.formats.deployment.runner import OnnxStream
from levjepa.formats.reading.load import load_encoder, read_run_config
from levjepa.infer.cpu import cpu_info
from levjepa.model import EncoderOutput
from levjepa.weights import CONFIG, write_json


def variants(calibrate: str, clips: int, smoke: bool) -> dict[str, Int8Config | None]:
    def static(**kw: object) -> Int8Config:
        return Int8Config("static", calibrate, clips, **kw)  # type: ignore[arg-type]

    if smoke:
        return {"onnx fp32": None, "int8 static (default)": static()}
    return {
        "onnx fp32": None,
        "int8 dynamic": Int8Config("dynamic"),
        "int8 static, every MatMul": static(keep_float=()),
        "int8 static, attention float (default)": static(),
        "int8 static, attention + patch embed + last block float": static(
            keep_float=("attention", "patch_embed", "last_block")
        ),
        "int8 static QOperator, attention float": static(format="qoperator"),
        "int8 static per-tensor, attention float": static(per_channel=False),
        "int8 dynamic, 8-bit weights": Int8Config("dynamic", reduce_range=False),
        "int8 static, 8-bit weights, attention float": static(reduce_range=False),
    }


def session_options(threads: int) -> object:
    """``threads`` intra-op threads that sleep, not spin, between runs: sessions timed one after the other on
    the same cores would otherwise each find the previous one's threads spinning (on this 2-core machine that
    made a static int8 streaming step read 10× slower than fp32, 18.9 vs 1.8 ms, instead of 1.3× faster)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


class OnnxEncoder(torch.nn.Module):
    """An exported clip encoder behind the encoder interface the evaluation reads (``forward_features``)."""

    def __init__(self, path: Path, cfg: object, threads: int) -> None:
        import onnxruntime as ort

        super().__init__()
        opts = session_options(threads)
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.cfg = cfg
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # device / dtype for callers

    def forward_features(self, video: torch.Tensor, **_: object) -> EncoderOutput:
        cls, patches = self.session.run(None, {"pixel_values": video.float().cpu().numpy()})
        n = patches.shape[1]
        return EncoderOutput(torch.from_numpy(cls), torch.from_numpy(patches), torch.zeros(1, n, 3, dtype=torch.long))

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.forward_features(video).cls


def export_variants(run: Path, out: Path, configs: dict[str, Int8Config | None], clips: torch.Tensor) -> dict:
    loaded = load_encoder(run)
    syn = read_run_config(run).data.synthetic
    dirs, seconds = {}, {}
    for i, (name, int8) in enumerate(configs.items()):
        d = out / f"v{i}"
        d.mkdir(parents=True, exist_ok=True)
        dc = DeployConfig(syn.num_frames, syn.size, syn.size, "fp32", "none" if int8 is None else "int8", 18,
                          int8 or Int8Config())  # fmt: skip
        t0 = time.perf_counter()
        record = export_onnx(loaded.encoder, d, dc, calibration=clips if int8 and int8.method == "static" else None)
        seconds[name] = time.perf_counter() - t0
        write_json(d / CONFIG, {"deploy": record})
        dirs[name] = d
        print(f"exported {name} in {seconds[name]:.0f} s", file=sys.stderr, flush=True)
    return {"dirs": dirs, "export_s": seconds, "loaded": loaded, "synthetic": syn}


def accuracy(exp: dict, seeds: int, threads: int) -> dict:
    loaded = exp["loaded"]
    encoders = {"pytorch fp32": loaded.encoder}
    encoders.update({k: OnnxEncoder(d / CLIP_ONNX, loaded.encoder.cfg, threads) for k, d in exp["dirs"].items()})
    result = evaluate_benchmark(encoders, exp["synthetic"], EvalConfig(budget="demo", seed=0, seeds=seeds))
    print(result.table(), file=sys.stderr, flush=True)
    return result.to_json()


def speed(exp: dict, rounds: int, batch: int, threads: int) -> dict:
    import onnxruntime as ort

    syn = exp["synthetic"]
    sessions = {k: ort.InferenceSession(str(d / CLIP_ONNX), session_options(threads)) for k, d in exp["dirs"].items()}
    streams = {k: OnnxStream(d, options=session_options(threads)) for k, d in exp["dirs"].items()}
    gen = torch.Generator().manual_seed(0)
    clips = torch.randn(batch, 3, syn.num_frames, syn.size, syn.size, generator=gen).numpy()
    video = torch.randn(1, 3, 3 * syn.num_frames, syn.size, syn.size, generator=gen)
    tau = exp["loaded"].encoder.cfg.tubelet
    warm = syn.num_frames // tau
    thr: dict[str, list[float]] = {k: [] for k in sessions}
    lat: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(rounds):
        for k, sess in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, {"pixel_values": clips})
            thr[k].append(batch / (time.perf_counter() - t0))
        per: dict[str, list[float]] = {k: [] for k in streams}
        for s in streams.values():
            s.reset()
        for i in range(0, video.shape[2], tau):
            f = video[:, :, i : i + tau].numpy()
            for k, s in streams.items():
                t0 = time.perf_counter()
                s.push(f)
                per[k].append(1e3 * (time.perf_counter() - t0))
        for k in streams:
            lat[k].append(statistics.median(per[k][warm:]))
    sizes = {k: sum(f.stat().st_size for f in d.glob(STREAM_ONNX + "*")) for k, d in exp["dirs"].items()}
    return {
        "clips_per_s": {k: statistics.median(v) for k, v in thr.items()},
        "step_ms": {k: statistics.median(v) for k, v in lat.items()},
        "stream_step_bytes": sizes,
    }


def kernel_errors(exp: dict, held: torch.Tensor, threads: int) -> dict[str, dict[str, float | None]]:
    """Per variant, the largest relative L2 error over ``held`` clips of CLS and patches: ``vs_fp32`` (this CPU's
    kernels against ONNX fp32) and ``vs_reference`` (against onnxruntime's reference path; None for graphs
    without QDQ pairs, which have none)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    def session(path: Path, reference: bool = False) -> ort.InferenceSession:
        opts = session_options(threads)
        if reference:
            opts.add_session_config_entry("session.disable_quant_qdq", "1")
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    fp32 = session(exp["dirs"]["onnx fp32"] / CLIP_ONNX)
    want = [fp32.run(None, {"pixel_values": c[None].numpy()}) for c in held]
    out: dict[str, dict[str, float | None]] = {}
    for name, d in exp["dirs"].items():
        path = d / CLIP_ONNX
        qdq = any(n.op_type == "DequantizeLinear" for n in onnx.load(str(path)).graph.node)
        kernels, ref = session(path), session(path, reference=True) if qdq else None
        vs_fp32, vs_ref = [], []
        for c, w in zip(held, want, strict=True):
            x = {"pixel_values": c[None].numpy()}
            got = kernels.run(None, x)
            vs_fp32 += [rel(g, v) for g, v in zip(got, w, strict=True)]
            if ref is not None:
                vs_ref += [rel(g, r) for g, r in zip(got, ref.run(None, x), strict=True)]
        out[name] = {"vs_fp32": max(vs_fp32), "vs_reference": max(vs_ref) if vs_ref else None}
    return out


def table(acc: dict, spd: dict, probes: list[str]) -> str:
    res, tasks = acc["accuracy"], list(acc["chance"])
    ref = "pytorch fp32"
    cols = [f"{t} {p}" for t in tasks for p in probes]
    lines = [
        "| variant | " + " | ".join(cols) + " | max drop | clips/s (× fp32) | step ms (× fp32) |",
        "| --- |" + " ---: |" * (len(cols) + 3),
    ]
    base_thr, base_lat = spd["clips_per_s"]["onnx fp32"], spd["step_ms"]["onnx fp32"]
    for name in res:
        cells, drops = [], []
        for t in tasks:
            for p in probes:
                v, r = res[name][t][p], res[ref][t][p]  # means over the probe seeds
                cells.append(f"{v:.1f}" if name == ref else f"{v:.1f} ({v - r:+.1f})")
                drops.append(r - v)
        speed_cells = ["", ""]
        if name in spd["clips_per_s"]:
            c, s = spd["clips_per_s"][name], spd["step_ms"][name]
            speed_cells = [f"{c:.1f} ({c / base_thr:.2f}×)", f"{s:.2f} ({base_lat / s:.2f}×)"]
        worst = "" if name == ref else f"{max(drops):+.1f}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {worst} | " + " | ".join(speed_cells) + " |")
    return "\n".join(lines)


def errors_table(errors: dict[str, dict[str, float | None]]) -> str:
    lines = ["| variant | features vs ONNX fp32 | this CPU's kernels vs the reference path |", "| --- | ---: | ---: |"]
    for name, e in errors.items():
        ref = "" if e["vs_reference"] is None else f"{e['vs_reference']:.4f}"
        lines.append(f"| {name} | {e['vs_fp32']:.4f} | {ref} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calibrate", default="/work/runs/eval_tasks/appearance/train.txt")
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--held", default=None, help="clips for the kernels' feature error (default: --calibrate's val)")
    ap.add_argument("--variants", default=None, help="comma-separated variant names (default: all)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip-accuracy", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    syn = read_run_config(args.run).data.synthetic
    patch = load_encoder(args.run).encoder.cfg.patch_size
    # the benchmark's clips are at its own rate: every frame (stride 1) of the calibration videos
    clips = calibration_clips(args.calibrate, args.clips, frames=syn.num_frames, size=syn.size, patch=patch)
    configs = variants(args.calibrate, args.clips, args.smoke)
    if args.variants:
        wanted = ["onnx fp32", *(v for v in args.variants.split(",") if v != "onnx fp32")]
        unknown = [v for v in wanted if v not in configs]
        if unknown:
            ap.error(f"--variants: unknown {unknown}; known: {list(configs)}")
        configs = {v: configs[v] for v in wanted}
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    exp = export_variants(args.run, args.out, configs, clips)
    held_src = args.held or args.calibrate.replace("train", "val")
    held = calibration_clips(held_src, args.clips, frames=syn.num_frames, size=syn.size, patch=patch)
    errors = kernel_errors(exp, held, args.threads)
    print(json.dumps(errors, indent=1), file=sys.stderr, flush=True)
    spd = speed(exp, 1 if args.smoke else args.rounds, args.batch, args.threads)
    print(json.dumps(spd, indent=1), file=sys.stderr, flush=True)
    result = {"speed": spd, "kernel_errors": errors, "export_s": exp["export_s"], "torch": torch.__version__,
              "threads": args.threads, "cpu": cpu_info().describe()}  # fmt: skip
    if not args.skip_accuracy:
        acc = accuracy(exp, 1 if args.smoke else args.seeds, args.threads)
        result["accuracy"] = acc
        probes = list(next(iter(next(iter(acc["accuracy"].values())).values())))
        print(table(acc, spd, probes))
    print(errors_table(errors))
    (args.out / "deploy_int8.json").write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
