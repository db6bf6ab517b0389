"""Time the built-in benchmark evaluation at demo size: what the CPU demo's last step costs.

    PYTHONPATH=src python bench/eval.py [--encoders 3] [--budget demo] [--preset vit-demo] [--out bench/eval.json]
    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/eval.py --clip-timing     # the frozen forward alone

Builds ``--encoders`` random-init ``vit-demo`` encoders (dim 128, depth 4, patch 8) and runs
``levjepa.eval.evaluate_benchmark`` on the default built-in benchmark (16×64×64 clips, 1024 tokens each):
features once per encoder, then the attentive / linear / kNN probes of the three tasks. Prints the table
and the time split (features vs probes) per encoder. Random-init accuracies are a baseline, not a result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from levjepa.data import SyntheticConfig
from levjepa.eval import EvalConfig, compute_features, evaluate_benchmark
from levjepa.formats import random_encoder
from levjepa.infer.cpu import cpu_info
from levjepa.model import encoder_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoders", type=int, default=3)
    ap.add_argument("--budget", choices=("demo", "full"), default="demo")
    ap.add_argument("--preset", default="vit-demo")
    ap.add_argument("--out", default=None)
    ap.add_argument("--clip-timing", action="store_true", help="only time the frozen forward per clip")
    args = ap.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    cfg = encoder_config(args.preset)
    if args.clip_timing:
        enc = random_encoder(cfg, seed=0).encoder
        clips = torch.randint(0, 256, (32, 3, 16, 64, 64), dtype=torch.uint8)
        compute_features(enc, clips[:2])  # warm-up
        wall, cpu = time.perf_counter(), time.process_time()
        compute_features(enc, clips, batch_size=8)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(
            f"{args.preset}, 16x64x64 clips, {torch.get_num_threads()} threads: {1000 * wall / 32:.0f} ms wall, "
            f"{1000 * cpu / 32:.0f} ms CPU per clip"
        )
        return
    encoders = {f"random-{s}": random_encoder(cfg, seed=s).encoder for s in range(args.encoders)}
    start = time.perf_counter()
    res = evaluate_benchmark(encoders, SyntheticConfig(), EvalConfig(budget=args.budget, progress=True))
    total = time.perf_counter() - start
    print(res.table())
    for name, t in res.info["timings_s"].items():
        print(f"{name}: features {t['features_s']:.1f} s, probes {t['probes_s']:.1f} s")
    for enc_name, tasks in res.results.items():
        for task, probes in tasks.items():
            for probe, r in probes.items():
                print(f"  {enc_name} {task} {probe}: {r.seconds:.1f} s")
    print(f"total {total:.1f} s with {torch.get_num_threads()} threads")
    if args.out:
        Path(args.out).write_text(json.dumps({"total_s": total, **res.to_json()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
