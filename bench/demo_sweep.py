"""Sweep variants of the ``demo-cpu`` preset: pretrain each, then frozen probes against random init.

    python bench/demo_sweep.py --out DIR [--device cuda] [--budget-s 120] [--only NAME ...]

The demo must show that pretraining helps on the built-in benchmark (appearance, motion direction, arrow of
time) within ~10 CPU minutes. Each variant is the demo preset plus a few overrides; it runs the real
``levjepa.train.pretrain`` (same steps and batch as on the CPU, so the numbers transfer) and the real
``evaluate_benchmark`` (budget "demo"). On a GPU every variant takes seconds; on the CPU, minutes. Writes
``DIR/demo_sweep.json`` after each variant (losses, wall time, the accuracy table).
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
from levjepa.eval import evaluate_benchmark
from levjepa.presets import preset
from levjepa.train.loop import build_models, pretrain
from levjepa.weights import load_tensors, prefixed

VARIANTS: dict[str, list[str]] = {
    "base": [],
    "steps600": ["train.steps=600"],
    "rho75": ["model.drop_ratio=0.75"],
    "rho90": ["model.drop_ratio=0.9"],
    "lr3e-3": ["optim.lr=3e-3"],
    "local_big": ["data.local_scale=0.1,0.5"],
    "patch16": ["model.patch_size=16"],
    "v8": ["data.num_local=8"],
    "nojitter": ["data.jitter_p=0", "data.grayscale_p=0"],
    "noflip": ["data.flip_p=0"],
    "lam05": ["objective.lam=0.05"],
    "steps1200": ["train.steps=1200"],
    "aug": ["data.flip_p=0", "data.local_scale=0.15,0.5", "data.hue=0.5", "data.grayscale_p=0.5"],
    "aug_k32": [
        "data.flip_p=0",
        "data.local_scale=0.15,0.5",
        "data.hue=0.5",
        "data.grayscale_p=0.5",
        "model.proj_dim=32",
    ],
    "k32": ["model.proj_dim=32"],
    "aug_k32_lr3": [
        "data.flip_p=0",
        "data.local_scale=0.15,0.5",
        "data.hue=0.5",
        "data.grayscale_p=0.5",
        "model.proj_dim=32",
        "optim.lr=3e-3",
    ],
    "easy": [
        "data.synthetic.texture_contrast=0.15",
        "data.synthetic.object_scale=0.55",
        "data.synthetic.background_motion_p=0",
    ],
    "easy_aug_k32": [
        "data.synthetic.texture_contrast=0.15",
        "data.synthetic.object_scale=0.55",
        "data.synthetic.background_motion_p=0",
        "data.flip_p=0",
        "data.local_scale=0.15,0.5",
        "data.hue=0.5",
        "data.grayscale_p=0.5",
        "model.proj_dim=32",
    ],
}
# 32-px clips: a 4x cheaper variant of the benchmark for quick CPU iterations (--base mini)
MINI = ["data.synthetic.size=32", "data.global_size=32", "data.local_size=16", "model.drop_ratio=0.75"]


def run_variant(name: str, overrides: list[str], device: str, smoke: list[str], tmp: Path) -> dict:
    base = ["train.eval_at_end=false", f"train.device={device}", "train.log_every=10"]
    if device == "cuda":
        base += ["train.precision=fp32", "train.threads=none", "data.num_workers=8"]
    cfg = apply_overrides(preset("demo-cpu"), [*base, *smoke, *overrides])
    t0 = time.perf_counter()
    summary = pretrain(cfg, tmp / name, overwrite=True, progress=False)
    train_s = time.perf_counter() - t0
    lines = [json.loads(x) for x in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    tensors, _ = load_tensors(summary.checkpoint / "model.safetensors")
    online, _ = build_models(cfg, seed=cfg.train.seed)
    online.load_state_dict(prefixed(tensors, "encoder."))
    ema_t, _ = load_tensors(summary.checkpoint / "ema.safetensors")
    averaged, _ = build_models(cfg, seed=cfg.train.seed)
    averaged.load_state_dict(prefixed(ema_t, "encoder."))
    random_init, _ = build_models(cfg, seed=cfg.train.seed)
    t1 = time.perf_counter()
    res = evaluate_benchmark(
        {"ema": averaged, "online": online, "random": random_init},
        cfg.data.synthetic,
        device=device,
        budget="demo",
        seed=0,
        batch_size=64 if device == "cuda" else 8,
    )
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--budget-s", type=float, default=120.0)
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny model and data on the CPU: checks the script")
    p.add_argument("--base", choices=("demo", "mini"), default="demo", help="mini: 32-px clips (quick CPU runs)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    smoke = []
    if args.smoke:
        smoke = ["model.dim=32", "model.depth=1", "model.heads=2", "train.steps=4", "data.batch_size=16"]
        smoke += ["train.batch_size=16", "data.num_workers=0", "data.synthetic.num_train=64"]
        smoke += ["data.synthetic.num_val=32", "data.synthetic.num_test=32", "data.synthetic.num_frames=4"]
        smoke += ["data.num_frames=4", "data.synthetic.size=32", "data.global_size=32", "data.local_size=16"]
    if args.base == "mini":
        smoke = [*MINI, *smoke]
    start = time.perf_counter()
    results: dict = {"device": args.device, "base": args.base}
    names = args.only or list(VARIANTS)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if time.perf_counter() - start > args.budget_s:
                results[name] = {"skipped": "time budget"}
                continue
            try:
                results[name] = run_variant(name, VARIANTS[name], args.device, smoke, Path(tmp))
                print(f"== {name} {VARIANTS[name]} train {results[name]['train_s']:.0f}s", flush=True)
                print(results[name]["table"], flush=True)
            except Exception:
                results[name] = {"error": traceback.format_exc()}
                print(f"== {name} failed\n{results[name]['error']}", flush=True)
            (args.out / "demo_sweep.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
