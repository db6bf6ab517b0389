"""The paper's ablation orderings at the demo's scale (results: ``bench/quality.md``).

    python bench/ablations.py --out DIR [--steps 150] [--threads 1] [--only 0,1,...] [OVERRIDE ...]
    python bench/ablations.py --out DIR --table

Each variant is ``demo-cpu`` (with the command's ``OVERRIDE``s, if any, applied first) with a few overrides,
pretrained with the real ``levjepa.train.pretrain`` for ``--steps`` steps (the token-drop rows instead for the
baseline's *CPU time*: their step count is the baseline's trainer CPU seconds over their own CPU seconds per
step, measured on throw-away steps first), then frozen and read by every probe (attentive, linear on CLS,
linear on mean-pooled patches, kNN) on the built-in benchmark (demo probe budget, test split, the probe chosen
on validation; the table gives the best per task). The random-init row is the baseline's architecture at its
initialisation. Each row is written to ``DIR/NN.json`` as it ends (its run in ``DIR/runs/NN``), so an
interrupted sweep keeps its rows and two processes with disjoint ``--only`` lists can share a directory once
the baseline is done; ``--table`` prints the markdown table with the paper's direction.

Short runs on a shared 2-core machine: differences of a few points are noise (two seeds of the baseline
are in the table to show its size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.eval import EvalConfig, evaluate_benchmark
from levjepa.eval.synthetic_task import TASKS
from levjepa.formats.reading.load import load_encoder, random_encoder
from levjepa.infer.cpu import cpu_info
from levjepa.presets import preset
from levjepa.train.loop import pretrain

PROBES = ("attentive", "linear_cls", "linear", "knn")
# name, overrides, which ordering it belongs to, equal CPU time with the baseline (else equal steps)
VARIANTS: list[tuple[str, list[str], str, bool]] = [  # in order of interest: a cut-short sweep keeps the first
    ("baseline", [], "", False),
    ("τ = 1 (ρ = 0.75, same tokens)", ["model.tubelet=1", "model.drop_ratio=0.75"], "tubelet", False),
    ("ρ = 0", ["model.drop_ratio=0.0"], "token drop", True),
    ("ρ = 0.75", ["model.drop_ratio=0.75"], "token drop", True),
    ("ρ = 0.9", ["model.drop_ratio=0.9"], "token drop", True),
    ("bidirectional", ["model.attention=bidirectional"], "attention", False),
    ("tube dropping", ["model.drop_mode=tube"], "dropping", False),
    ("V = 2", ["data.num_local=2"], "local views", False),
    ("V = 8", ["data.num_local=8"], "local views", False),
    ("λ = 0.02", ["objective.lam=0.02"], "λ", False),
    ("λ = 1", ["objective.lam=1.0"], "λ", False),
    ("baseline seed 1", ["train.seed=1"], "noise", False),
    ("random tubelet init", ["model.tubelet_init=random"], "tubelet init", False),
]
# the paper's direction for each ordering (SPEC §6; LeJEPA notes §5.1 for λ)
PAPER = {
    "tubelet": "τ = 1 (ρ .95) > τ = 2 (ρ .90): IN1K 50.7 vs 47.4, SSv2 30.4 vs 28.8",
    "token drop": "ρ 0 < 0.6 < 0.9 (IN1K at ρ 0 / 0.6 / 0.9: 33.9 / 44.8 / 47.4, same epochs)",
    "attention": "block-causal ≥ bidirectional (51.2 vs 50.7)",
    "dropping": "uniform > tube (50.7 vs 39.6)",
    "local views": "V 2 < 4 < 8 (4: 47.6, 8: 49.2)",
    "λ": "a wide plateau; too small collapses, too large weakens invariance (0.5: −7 points)",
    "noise": "—",
    "tubelet init": "— (left open; V-JEPA draws every Conv3d weight)",
}


def _cpu_per_step(cfg, tmp: Path) -> float:
    """Trainer-process CPU seconds per step: two throw-away runs of 4 and 16 steps, the difference over 12
    (start-up — building the model, rendering the clips, starting the loader — cancels; 2 and 8 steps once
    gave a third of the real cost per step)."""
    cpu = []
    for steps in (4, 16):
        start = time.process_time()
        pretrain(apply_overrides(cfg, [f"train.steps={steps}", "train.checkpoint_every=1000"]), tmp, overwrite=True,
                 progress=False)  # fmt: skip
        cpu.append(time.process_time() - start)
    return (cpu[1] - cpu[0]) / 12


def run_variant(
    index: int, name: str, overrides: list[str], equal_time: bool, args: argparse.Namespace, base_cpu: float
) -> dict:
    base = apply_overrides(preset("demo-cpu"), args.overrides)
    cfg = apply_overrides(base, ["train.eval_at_end=false", "data.num_workers=1", *overrides])
    if args.threads:
        cfg = apply_overrides(cfg, [f"train.threads={args.threads}"])
    steps = args.steps
    if equal_time:
        per_step = _cpu_per_step(cfg, args.out / "runs" / f"{index:02d}-timing")
        steps = max(10, round(base_cpu / per_step))
    cfg = apply_overrides(cfg, [f"train.steps={steps}", f"train.checkpoint_every={steps}"])
    run = args.out / "runs" / f"{index:02d}"
    cpu0, wall0 = time.process_time(), time.perf_counter()
    summary = pretrain(cfg, run, overwrite=True, progress=False)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if args.threads:
        torch.set_num_threads(args.threads)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    encoders = {name: load_encoder(run, weights="ema").encoder}
    if name in ("baseline", "random tubelet init"):  # the init is what this row changes
        label = "random init" if name == "baseline" else f"random init ({cfg.model.tubelet_init} tubelets)"
        encoders[label] = random_encoder(cfg.model, seed=cfg.train.seed).encoder
    res = evaluate_benchmark(encoders, cfg.data.synthetic, EvalConfig(probes=PROBES, seed=0))
    print(res.table(), flush=True)
    acc = res.to_json()["accuracy"]
    return {
        "name": name,
        "overrides": overrides,
        "steps": steps,
        "train_cpu_s": cpu,
        "train_wall_s": wall,
        "clips_per_s": summary.clips_per_s,
        "loss": lines[-1]["loss"],
        "effective_rank": lines[-1]["effective_rank"],
        "accuracy": acc,
    }


def _best(per_probe: dict[str, float]) -> float:
    return max(per_probe.values())


def table(out: Path) -> None:
    files = {v[0]: out / f"{i:02d}.json" for i, v in enumerate(VARIANTS)}
    rows = {name: json.loads(f.read_text()) for name, f in files.items() if f.exists()}
    print(
        "| ordering | variant | steps | train CPU s | loss | eff. rank | appearance | motion | arrow | mean | paper |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, _, ordering, _ in VARIANTS:
        if name not in rows:
            continue
        r = rows[name]
        for enc, per_task in r["accuracy"].items():
            best = [_best(per_task[t]) for t in TASKS]
            label = name if enc == name else enc
            paper = PAPER.get(ordering, "") if enc == name else ""
            cells = " | ".join(f"{b:.1f}" for b in best)
            run = (  # the random-init row was not trained
                f"{r['steps']} | {r['train_cpu_s']:.0f} | {r['loss']:.3f} | {r['effective_rank']:.1f}"
                if enc == name
                else "— | — | — | —"
            )
            print(f"| {ordering or 'baseline'} | {label} | {run} | {cells} | {sum(best) / len(best):.1f} | {paper} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--only", default="", help="comma-separated row numbers, 0 = baseline (default: all not done)")
    p.add_argument("--table", action="store_true")
    p.add_argument("overrides", nargs="*", help="applied to demo-cpu before every row's own overrides")
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.table:
        table(args.out)
        return 0
    only = {int(i) for i in args.only.split(",")} if args.only else None
    base_file = args.out / "00.json"
    for i, (name, overrides, _, equal_time) in enumerate(VARIANTS):
        path = args.out / f"{i:02d}.json"
        if path.exists() or (only is not None and i not in only):
            continue
        base_cpu = json.loads(base_file.read_text())["train_cpu_s"] if base_file.exists() else 0.0
        if equal_time and not base_cpu:
            raise SystemExit("run the baseline first (its CPU time sets the budget of the token-drop rows)")
        path.write_text(json.dumps(run_variant(i, name, overrides, equal_time, args, base_cpu), indent=1))
    table(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
