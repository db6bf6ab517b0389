"""Clip-encoder throughput of exported graphs, interleaved run by run (a quieter, longer check of the clips/s
columns of bench/deploy.md; the first NAME=DIR is the reference).

    python bench/deploy_clip_rate.py --shape 8,3,16,32,32 --reps 30 fp32=DIR static=DIR2 ...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

from deploy_int8 import session_options
from levjepa.infer.cpu import cpu_info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="+", help="NAME=EXPORT_DIR (its clip_encoder.onnx)")
    ap.add_argument("--shape", default="8,3,16,32,32")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    shape = tuple(int(v) for v in args.shape.split(","))
    dirs = dict(g.split("=", 1) for g in args.graphs)
    opts = session_options(args.threads)
    sessions = {k: ort.InferenceSession(f"{d}/clip_encoder.onnx", opts) for k, d in dirs.items()}
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for s in sessions.values():
        s.run(None, {"pixel_values": x})  # warm-up
    for _ in range(args.reps):
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, {"pixel_values": x})
            times[k].append(time.perf_counter() - t0)
    base = statistics.median(times[next(iter(times))])
    for k, t in times.items():
        m = statistics.median(t)
        print(f"{k}: {shape[0] / m:.1f} clips/s ({base / m:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
