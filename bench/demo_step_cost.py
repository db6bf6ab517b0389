"""What a change to the ``demo-cpu`` recipe costs per training step, measured side by side in one process.

    python bench/demo_step_cost.py [--threads 2] [--rounds 4] [--preset demo-cpu] NAME=OVERRIDES [...]

Each ``NAME=k=v,k=v`` (``base=`` for the preset as it is) builds the preset's encoder, projector, objective and
optimiser with those overrides, and one batch of its views (made once, outside the timing: the data loader and
the photometric change are not in these numbers). The variants then take turns, two training steps each per
round, so the machine's drift falls on all of them alike; it prints each one's fastest and median ms per step
and its ratio to the first variant's fastest. Results: ``bench/quality.md`` § 9.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.data.loader import PretrainLoader
from levjepa.infer.cpu import cpu_info
from levjepa.objective import build_objective
from levjepa.presets import preset
from levjepa.rng import sample_keys
from levjepa.train.loop import build_models
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, train_step


def _variant(name: str, overrides: list[str]):
    cfg = apply_overrides(preset(name), ["data.num_workers=0", *overrides])
    model = Pretrainer(*build_models(cfg, seed=0))
    objective = build_objective(cfg.objective)
    optimizer = build_optimizer(model, cfg.optim)
    batch = next(iter(PretrainLoader(cfg.data, seed=0)))
    views, keys = batch.augment_to_device("cpu"), sample_keys(0, "drop", 0, positions=batch.index)
    step_no = [0]

    def step() -> None:
        lr, clip = cfg.optim.lr, cfg.optim.grad_clip
        out = train_step(model, objective, optimizer, [views], [keys], step=step_no[0], lr=lr, grad_clip=clip)
        float(out.loss)  # wait for the step
        step_no[0] += 1

    return step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", help="NAME=k=v,k=v (NAME= for the preset unchanged)")
    p.add_argument("--preset", default="demo-cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    steps = {}
    for spec in args.variants:
        name, sep, rest = spec.partition("=")
        if not sep or not name:
            p.error(f"variant {spec!r}: expected NAME=k=v,k=v (NAME= for the preset unchanged)")
        steps[name] = _variant(args.preset, [o for o in rest.split(",") if o])
        steps[name]()  # warm-up: first-touch allocations, the optimiser's state
        steps[name]()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            t = time.perf_counter()
            step()
            step()
            times[name].append((time.perf_counter() - t) / 2)
    first = min(next(iter(times.values())))
    print(f"{args.preset}, {args.threads} threads, {args.rounds} rounds of 2 steps each, interleaved")
    print("| variant | ms/step (fastest) | ms/step (median) | fastest / first's fastest |")
    print("| --- | ---: | ---: | ---: |")
    for name, ts in times.items():
        print(f"| {name} | {min(ts) * 1e3:.0f} | {statistics.median(ts) * 1e3:.0f} | {min(ts) / first:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
