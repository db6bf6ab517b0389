"""The reference LeVJEPA code beside levjepa on one GPU, in one process: training steps and ViT-L clip inference.

    python bench/gpu_peer.py --reference PATH/TO/module.py --out DIR            # < 4 minutes on one H200
    python bench/gpu_peer.py --reference PATH/TO/module.py --out DIR --smoke    # any device, tiny sizes: the code paths

The reference code (``MLO-lab/LeVJEPA`` ``module.py``, CC BY-NC 4.0) is never shipped with levjepa:
``--reference`` names the user's copy, read at run time (``bench/gpu_all.sh`` passes ``$REFERENCE``).

Rows, most important first (each saved to ``DIR/gpu_peer.json`` as soon as it is measured; a row that would
start past ``--budget-s`` is recorded as skipped, a failing one with its error, and the next still runs):

1. **ViT-B/16 training step, the paper's views** (1 × 16×224² + 10 × 16×96², ρ = 0.95, bf16 autocast):
   the reference step as its ``main.py`` assembles it (``bench/peer_step.py``'s ``reference_step``: its
   encoder in train mode with ``token_drop_rate``, one projector call, ``pred_loss + 0.02 · SIGReg``, backward,
   ``torch.optim.AdamW``; TF32 matmuls as ``main.py`` sets them, for both sides) against levjepa's
   ``train_step`` on ``vit-b-paper`` with ``data.num_local=10`` (fused AdamW, gradient clipping), eager. B is
   the largest of 256, 192, 128, 64 that fits both.
2. **ViT-L clip inference, 16×224², fp16**, B = 1 and 8: the reference encoder (its own random
   initialisation, ``eval()``) against levjepa's encoder imported from those weights (``levjepa import``'s
   reader), both under autocast; levjepa with whole frames unmasked (``KeySpans``, SDPA per frame: the
   default) and with its dense mask (``attention.MAX_SPANS = 0``: what it computed before). The relative
   difference of CLS between the two implementations is printed with each row.
3. the same in bf16;
4. row 1 with ``train.compile`` (``levjepa.train.step.compile_step``: three regions as CUDA graphs);
5. the ViT-Tiny consumer recipe's step (``vit-tiny-consumer``, B = 128, 1 + 4 views): reference, levjepa eager
   and compiled;
6. ViT-L inference at B = 8 with FlexAttention over the same spans (``frame_kernel("flex")``), fp16 and bf16.

Steps: the sides alternate step by step (the order flips every round) after ``--warmup`` steps each; a side's
ms/step is the median of ``--rounds`` timed steps (``torch.cuda.synchronize`` around each); its peak memory
the ``max_memory_allocated`` of its steps (both sides' weights and optimiser states are resident throughout).
Inference likewise with forwards. Ratios: reference ms / levjepa ms.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from levjepa.config import apply_overrides
from levjepa.infer.cpu import cpu_info
from levjepa.model import attention
from levjepa.objective import build_objective
from levjepa.presets import preset
from levjepa.rng import sample_keys
from levjepa.train.loop import build_models
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, compile_regions, compile_step, train_step
from peer_infer import imported, load_reference, reference_encoder
from peer_step import reference_step

# row -> (preset, reference factory, local views, batches to try)
STEPS = {
    "vitb_paper_step": ("vit-b-paper", "vit_base", 10, (256, 192, 128, 64)),
    "tiny_consumer_step": ("vit-tiny-consumer", "vit_tiny", 4, (128,)),
}
SMOKE = ["model.dim=64", "model.depth=2", "model.heads=2", "objective.num_directions=64"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def views(batch: int, num_local: int, device: torch.device, smoke: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised float views in levjepa's layout: global ``[1, B, 3, 16, 224, 224]``, local ``[V, B, 3, 16, 96, 96]``
    (smoke: 4 frames of 32² and 16²)."""
    frames, big, small = (4, 32, 16) if smoke else (16, 224, 96)
    g = torch.Generator().manual_seed(0)
    glob = torch.randn(1, batch, 3, frames, big, big, generator=g)
    local = torch.randn(num_local, batch, 3, frames, small, small, generator=g)
    return glob.to(device), local.to(device)


def levjepa_step(
    name: str, batch: int, num_local: int, grouped: tuple[torch.Tensor, torch.Tensor], compiled: bool, smoke: bool
) -> Callable[[int], Any]:
    """``step(i)``: levjepa's ``train_step`` on preset ``name`` (``train.compile``'s form when ``compiled``)."""
    device = grouped[0].device
    overrides = [f"data.batch_size={batch}", f"train.batch_size={batch}", f"data.num_local={num_local}"]
    cfg = apply_overrides(preset(name), overrides + (SMOKE if smoke else []))
    model = Pretrainer(*build_models(cfg, seed=0)).to(device)
    objective = build_objective(cfg.objective, check_finite=False).to(device)
    opt = build_optimizer(model, cfg.optim)
    if compiled:
        if device.type == "cuda":
            compile_step(model, objective, device)
        else:  # the smoke run checks the regions' capture only (Inductor's CPU build takes minutes)
            compile_regions(model, objective, backend="aot_eager")
    autocast = torch.bfloat16 if device.type == "cuda" else None
    keys = sample_keys(0, "drop", 0, positions=range(batch), device=device)
    clip = cfg.optim.grad_clip

    def step(i: int) -> Any:
        return train_step(
            model, objective, opt, [list(grouped)], [keys], step=i, lr=4e-4, grad_clip=clip, autocast_dtype=autocast
        )

    return step


def alternate(sides: dict[str, Callable[[int], Any]], device: torch.device, warmup: int, rounds: int) -> dict:
    """Each side ``warmup`` calls, then ``rounds`` rounds of one call each, the order flipping every round: per
    side the median and fastest ms and the peak memory (GB) of its calls."""
    for fn in sides.values():
        for i in range(warmup):
            fn(i)
    _sync(device)
    ms: dict[str, list[float]] = {n: [] for n in sides}
    peak: dict[str, float] = {}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            _reset_peak(device)
            t0 = time.perf_counter()
            sides[name](warmup + r)
            _sync(device)
            ms[name].append((time.perf_counter() - t0) * 1e3)
            peak[name] = max(peak.get(name, 0.0), _peak_gb(device) or 0.0)
    return {n: {"ms": statistics.median(v), "fastest_ms": min(v), "peak_gb": peak[n]} for n, v in ms.items()}


def step_row(row: str, args: argparse.Namespace, device: torch.device, variants: tuple[str, ...]) -> dict:
    """Row 1 or 4 (module docstring): the largest batch that fits, then the reference and levjepa's
    ``variants`` (``levjepa``: eager, ``levjepa_compiled``: ``train.compile``) alternated step by step."""
    name, factory, num_local, batches = STEPS[row]
    factory = "vit_tiny" if args.smoke else factory  # the smoke run checks the code paths, not the sizes
    autocast = torch.bfloat16 if device.type == "cuda" else None

    def measure(batch: int) -> dict:
        grouped = views(batch, num_local, device, args.smoke)
        sides = {
            "reference": reference_step(args.reference, 0.95, batch, factory=factory, views=grouped, autocast=autocast)
        }
        for v in variants:
            sides[v] = levjepa_step(name, batch, num_local, grouped, v == "levjepa_compiled", args.smoke)
        res = alternate(sides, device, args.warmup, args.rounds)
        for side in res.values():
            side["clips_per_s"] = batch / (side["ms"] / 1e3)
        return {"batch": batch, "num_local": num_local, "sides": res}

    for batch in (2,) if args.smoke else batches:
        try:
            return measure(batch)
        except torch.OutOfMemoryError:
            pass
        gc.collect()  # the failed attempt's models and optimiser states, now unreferenced
        torch.cuda.empty_cache()
    raise RuntimeError(f"{row}: no batch of {batches} fits both sides")


def infer_row(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, batch: int, flex: bool) -> dict:
    """Rows 2, 3, 5: ViT-L (smoke: ViT-Tiny at 4 × 32²) clip inference, the reference against levjepa."""
    model, frames, size = ("vit-tiny", 4, 32) if args.smoke else ("vit-large", 16, 224)
    key = (model, frames, size)
    if key not in _ENCODERS:
        ref = load_reference(args.reference)
        official = reference_encoder(ref, model, frames, size=size).to(device)
        _ENCODERS[key] = (official, imported(official.cpu()).to(device))
        official.to(device)
    official, ours = _ENCODERS[key]
    clip = torch.randn(batch, 3, frames, size, size, generator=torch.Generator().manual_seed(1)).to(device)

    def run(fn: Callable[[], torch.Tensor]) -> Callable[[int], torch.Tensor]:
        def call(i: int) -> torch.Tensor:
            with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
                return fn()

        return call

    def dense() -> torch.Tensor:
        saved, attention.MAX_SPANS = attention.MAX_SPANS, 0
        try:
            return ours.forward_features(clip).tokens
        finally:
            attention.MAX_SPANS = saved

    def spans() -> torch.Tensor:
        if not flex:
            return ours.forward_features(clip).tokens
        with attention.frame_kernel("flex"):
            return ours.forward_features(clip).tokens

    sides = {"reference": run(lambda: official(clip)), "levjepa": run(spans)}
    if not flex:
        sides["levjepa_dense"] = run(dense)
    want = sides["reference"](0)[:, 0].float()
    diff = {n: float((fn(0)[:, 0].float() - want).norm() / want.norm()) for n, fn in sides.items() if n != "reference"}
    res = alternate(sides, device, args.warmup, args.rounds)
    for side in res.values():
        side["clips_per_s"] = batch / (side["ms"] / 1e3)
    return {
        "model": model,
        "batch": batch,
        "dtype": str(dtype),
        "kernel": "flex" if flex else "sdpa",
        "cls_rel_diff": diff,
        "sides": res,
    }


_ENCODERS: dict[tuple[str, int, int], tuple[torch.nn.Module, torch.nn.Module]] = {}


def rows(args: argparse.Namespace, device: torch.device) -> list[tuple[str, Callable[[], dict]]]:
    """The rows in priority order (module docstring)."""
    out: list[tuple[str, Callable[[], dict]]] = [
        ("vitb_paper_step", lambda: step_row("vitb_paper_step", args, device, ("levjepa",)))
    ]
    for dtype in (torch.float16, torch.bfloat16):
        for batch in (1, 8):
            out.append(
                (f"vitl_infer_{str(dtype)[6:]}_b{batch}", lambda d=dtype, b=batch: infer_row(args, device, d, b, False))
            )
    out.append(("vitb_paper_step_compiled", lambda: step_row("vitb_paper_step", args, device, ("levjepa_compiled",))))
    out.append(
        ("tiny_consumer_step", lambda: step_row("tiny_consumer_step", args, device, ("levjepa", "levjepa_compiled")))
    )
    for dtype in (torch.float16, torch.bfloat16):
        out.append((f"vitl_infer_{str(dtype)[6:]}_b8_flex", lambda d=dtype: infer_row(args, device, d, 8, True)))
    return out


def _print(name: str, row: dict) -> None:
    if "sides" not in row:
        print(f"{name}: {row}", flush=True)
        return
    sides = row["sides"]
    ref = sides["reference"]["ms"]
    cells = [
        f"{n} {s['ms']:.1f} ms ({s['clips_per_s']:.0f} clips/s, peak {s['peak_gb']:.2f} GB, ratio {ref / s['ms']:.2f})"
        for n, s in sides.items()
    ]
    extra = f", CLS rel. diff {row['cls_rel_diff']}" if "cls_rel_diff" in row else ""
    print(f"{name} (B = {row['batch']}{extra}): " + "; ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", default=os.environ.get("REFERENCE"), help="the reference module.py ($REFERENCE)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget-s", type=float, default=200.0, help="no row starts after this many seconds")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per side (CUDA graphs record on the 2nd)")
    ap.add_argument("--only", help="comma-separated row names")
    ap.add_argument("--smoke", action="store_true", help="the code paths at tiny sizes, on whatever device there is")
    args = ap.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    if not args.reference or not Path(args.reference).is_file():
        raise SystemExit("gpu_peer.py: --reference PATH/TO/module.py (or $REFERENCE) must name the reference code")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke:
        args.rounds, args.warmup = min(args.rounds, 2), min(args.warmup, 2)
    elif device.type != "cuda":
        raise SystemExit("gpu_peer.py: no CUDA device (--smoke runs the code paths on the CPU)")
    torch.set_float32_matmul_precision("high")  # the reference main.py's setting, for both sides
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    t_start = time.perf_counter()
    only = set(args.only.split(",")) if args.only else None
    for name, fn in rows(args, device):
        if only is not None and name not in only:
            continue
        if time.perf_counter() - t_start > args.budget_s:
            results[name] = {"skipped": "over the time budget"}
        else:
            try:
                results[name] = fn()
            except Exception:  # record and go on: one failing row must not lose the others
                results[name] = {"error": traceback.format_exc()[-2000:]}
        results[name]["elapsed_s"] = time.perf_counter() - t_start
        (args.out / "gpu_peer.json").write_text(json.dumps(results, indent=1))
        _print(name, results[name])


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # CUDA-graph trees at interpreter teardown (bench/gpu_step.py)
