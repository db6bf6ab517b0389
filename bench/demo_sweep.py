"""Sweep variants of the ``demo-cpu`` preset: pretrain each, then frozen probes against random init.

    python bench/demo_sweep.py --out DIR [--device cuda --jobs 4] [--budget-s 120] [--only NAME ...]

The demo must show that pretraining helps on the built-in benchmark (appearance, motion direction, arrow of
time) within ~10 CPU minutes. Each variant is the demo preset plus a few overrides; it runs the real
``levjepa.train.pretrain`` (same steps and batch as on the CPU, so the numbers transfer) and the real
``evaluate_benchmark`` (budget "demo"). On a GPU a variant takes seconds and ``--jobs`` runs several at
once (small models leave the GPU mostly idle); on the CPU, minutes. Writes ``DIR/demo_sweep.json`` after
each variant (overrides, losses, wall time, the accuracy table).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.eval import EvalConfig, evaluate_benchmark
from levjepa.infer.cpu import cpu_info
from levjepa.presets import preset
from levjepa.train.loop import build_models, pretrain
from levjepa.weights import load_tensors, prefixed

# the benchmark made easier for a 10-minute demo: fainter background texture, a larger object, a static
# background; and augmentations that suit it: no flips (they reverse motion), larger local crops (they
# must contain the object), strong hue change and grayscale (colour is a per-clip nuisance here)
EASY = [
    "data.synthetic.texture_contrast=0.15",
    "data.synthetic.object_scale=0.55",
    "data.synthetic.background_motion_p=0",
]
AUG = ["data.flip_p=0", "data.local_scale=0.15,0.5", "data.hue=0.5", "data.grayscale_p=0.5"]
K32 = ["model.proj_dim=32"]
# 32-px clips: 4x fewer tokens than the 64-px default
MINI = ["data.synthetic.size=32", "data.global_size=32", "data.local_size=16", "model.drop_ratio=0.75"]

VARIANTS: dict[str, list[str]] = {
    "base": [],
    "aug_k32": [*AUG, *K32],
    "easy": EASY,
    "easy_aug_k32": [*EASY, *AUG, *K32],
    "easy_aug_k32_lr3": [*EASY, *AUG, *K32, "optim.lr=3e-3"],
    "easy_aug_k32_600": [*EASY, *AUG, *K32, "train.steps=600"],
    "easy_aug_k32_rho90": [*EASY, *AUG, *K32, "model.drop_ratio=0.9"],
    "easy_aug_k32_lam05": [*EASY, *AUG, *K32, "objective.lam=0.05"],
    "easy_aug_k32_v8": [*EASY, *AUG, *K32, "data.num_local=8"],
    "mini_easy_aug_k32": [*MINI, *EASY, *AUG, *K32],
    "mini_easy_aug_k32_600": [*MINI, *EASY, *AUG, *K32, "train.steps=600"],
    "mini_easy_aug_k32_600_lr3": [*MINI, *EASY, *AUG, *K32, "train.steps=600", "optim.lr=3e-3"],
    "mini_easy_aug_k32_1200": [*MINI, *EASY, *AUG, *K32, "train.steps=1200"],
    "mini_easy_aug_k32_lam10": [*MINI, *EASY, *AUG, *K32, "objective.lam=0.1"],
    "mini_easy_aug_k32_lam30": [*MINI, *EASY, *AUG, *K32, "objective.lam=0.3"],
    "mini_aug_k32_lam30": [*MINI, *AUG, *K32, "objective.lam=0.3"],
    "mini_easy_aug_k32_lam10_600": [*MINI, *EASY, *AUG, *K32, "objective.lam=0.1", "train.steps=600"],
    "mini_easy_aug_k32_lam05_600": [*MINI, *EASY, *AUG, *K32, "objective.lam=0.05", "train.steps=600"],
    "mini_easy_aug_k32_lam10_600_lr3": [
        *MINI,
        *EASY,
        *AUG,
        *K32,
        "objective.lam=0.1",
        "train.steps=600",
        "optim.lr=3e-3",
    ],
    "easy_aug_k32_lam10": [*EASY, *AUG, *K32, "objective.lam=0.1"],
    "mini_flat_aug_k32_lam10": [*MINI, *EASY, "data.synthetic.texture_contrast=0", *AUG, *K32, "objective.lam=0.1"],
}
GPU_SET = [
    "easy_aug_k32",
    "easy_aug_k32_600",
    "easy_aug_k32_lr3",
    "easy_aug_k32_rho90",
    "mini_easy_aug_k32_600",
    "mini_easy_aug_k32_600_lr3",
    "mini_easy_aug_k32_1200",
    "aug_k32",
]
SMOKE = [
    "model.dim=32",
    "model.depth=1",
    "model.heads=2",
    "train.steps=4",
    "data.batch_size=16",
    "train.batch_size=16",
    "data.num_workers=0",
    "data.synthetic.num_train=64",
    "data.synthetic.num_val=32",
    "data.synthetic.num_test=32",
    "data.synthetic.num_frames=4",
    "data.num_frames=4",
    "data.synthetic.size=32",
    "data.global_size=32",
    "data.local_size=16",
]


def run_variant(name: str, overrides: list[str], device: str, extra: list[str], tmp: Path) -> dict:
    base = ["train.eval_at_end=false", f"train.device={device}", "train.log_every=10"]
    if device == "cuda":
        base += ["train.precision=fp32", "train.threads=none", "data.num_workers=4"]
    cfg = apply_overrides(preset("demo-cpu"), [*base, *overrides, *extra])
    t0 = time.perf_counter()
    summary = pretrain(cfg, tmp / name, overwrite=True, progress=False)
    train_s = time.perf_counter() - t0
    lines = [json.loads(x) for x in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    encoders = {}
    for label, file in (("ema", "ema.safetensors"), ("online", "model.safetensors")):
        tensors, _ = load_tensors(summary.checkpoint / file)
        encoders[label], _ = build_models(cfg, seed=cfg.train.seed)
        encoders[label].load_state_dict(prefixed(tensors, "encoder."))
    encoders["random"], _ = build_models(cfg, seed=cfg.train.seed)
    t1 = time.perf_counter()
    evaluation = EvalConfig(device=device, budget="demo", seed=0, batch_size=64 if device == "cuda" else 8)
    res = evaluate_benchmark(encoders, cfg.data.synthetic, evaluation)
    keys = ("loss", "invariance", "sigreg", "effective_rank", "std/mean")
    return {
        "overrides": overrides,
        "train_s": train_s,
        "eval_s": time.perf_counter() - t1,
        "first": {k: lines[0].get(k) for k in keys},
        "last": {k: lines[-1].get(k) for k in keys},
        "accuracy": res.to_json()["accuracy"],
        "chance": res.chance,
        "table": res.table(),
    }


def _parallel(args: argparse.Namespace, names: list[str]) -> int:
    """Each variant in its own process; results merged into one JSON (the per-variant files are removed)."""
    start = time.perf_counter()
    pending, running = list(names), {}
    results: dict = {"device": args.device, "jobs": args.jobs}
    parts = args.out / "parts"
    while pending or running:
        while pending and len(running) < args.jobs and time.perf_counter() - start < args.budget_s:
            name = pending.pop(0)
            cmd = [sys.executable, __file__, "--out", str(parts / name), "--device", args.device, "--only", name]
            cmd += ["--budget-s", "1e9", *(["--smoke"] if args.smoke else [])]
            cmd += ["--workers", str(args.workers)] if args.workers is not None else []
            cmd += ["--threads", str(args.threads)] if args.threads is not None else []
            running[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if pending and time.perf_counter() - start >= args.budget_s:
            results.update({n: {"skipped": "time budget"} for n in pending})
            pending = []
        for name, proc in list(running.items()):
            if proc.poll() is None:
                continue
            log = proc.stdout.read() if proc.stdout else ""
            part = parts / name / "demo_sweep.json"
            results[name] = json.loads(part.read_text()).get(name) if part.is_file() else {"error": log[-3000:]}
            print(f"== {name} exit {proc.returncode}\n" + "\n".join(log.splitlines()[-14:]), flush=True)
            del running[name]
            (args.out / "demo_sweep.json").write_text(json.dumps(results, indent=1, default=str))
        time.sleep(0.5)
    shutil.rmtree(parts, ignore_errors=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--budget-s", type=float, default=120.0, help="no variant starts after this")
    p.add_argument("--only", nargs="*", default=None, help=f"variants among {', '.join(VARIANTS)}")
    p.add_argument("--jobs", type=int, default=1, help="variants run at once, each in its own process")
    p.add_argument("--workers", type=int, default=None, help="data-loader workers per variant")
    p.add_argument("--threads", type=int, default=None, help="torch threads per variant (CPU)")
    p.add_argument("--smoke", action="store_true", help="tiny model and data on the CPU: checks the script")
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.only or (GPU_SET if args.device == "cuda" else list(VARIANTS))
    if args.jobs > 1:
        return _parallel(args, names)
    extra = [
        *(SMOKE if args.smoke else []),
        *([f"data.num_workers={args.workers}"] if args.workers is not None else []),
    ]
    start = time.perf_counter()
    results: dict = {"device": args.device}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if time.perf_counter() - start > args.budget_s:
                results[name] = {"skipped": "time budget"}
                continue
            try:
                results[name] = run_variant(name, VARIANTS[name], args.device, extra, Path(tmp))
                print(f"== {name} {VARIANTS[name]} train {results[name]['train_s']:.0f}s", flush=True)
                print(results[name]["table"], flush=True)
            except Exception:
                results[name] = {"error": traceback.format_exc()}
                print(f"== {name} failed\n{results[name]['error']}", flush=True)
            (args.out / "demo_sweep.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
