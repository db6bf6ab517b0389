"""Gradient accumulation: GradCache (one loss on the whole batch) against plain accumulation, and keyed dropping.

    python bench/accumulation.py                      # CPU step time ratio and peak memory (~3 minutes)
    python bench/accumulation.py --drop               # cost of drawing keep indices: per-clip keys vs generators
    python bench/accumulation.py --device cuda        # the same step comparison on a GPU

``train_step`` with ``accumulation="global"`` (the default: the projector and the objective see the whole
batch, GradCache) and ``accumulation="local"`` (the official code's: one loss per micro-batch) on the same
model, batch and micro-batches, timed alternately in one process (median over rounds, so load on a shared
machine hits both alike): wall time, and on the CPU also this process's CPU time (one thread: the compute,
less disturbed by other processes on the machine). Peak memory: the peak of the bytes held by autograd
graphs (saved activations, counted per storage through ``torch.autograd.graph.saved_tensors_hooks``,
parameters excluded) on any device — what accumulation trades — and on a GPU also
``torch.cuda.max_memory_allocated`` of each mode after a reset. Expected ratio: GradCache adds one no-grad
encoder forward for ``A − 1`` of the ``A`` micro-batches, ``1 + (A−1)/A · fwd/(fwd+bwd)``.

``--drop`` times ``sample_keep_idx`` for 128 clips of the paper's views (1 × 16×224² + 4 × 16×96², ρ = 0.95:
3136 and 576 tokens): per-clip keys (``levjepa.rng.counter_hash``, what training uses), one generator for the
batch (not invariant to how the batch is split), one generator per clip.

Results and the commands that made them: ``bench/train.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import weakref
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.data.loader import ViewBatch
from levjepa.data.views import sample_photometric
from levjepa.infer.cpu import cpu_info
from levjepa.model.tokens import sample_keep_idx
from levjepa.objective import build_objective
from levjepa.presets import preset
from levjepa.rng import fold_keys, sample_keys
from levjepa.train.loop import build_models
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, train_step

# name -> (preset, overrides, clips per micro-batch, micro-batches per step)
CASES = {
    # the CPU demo's model and views, its batch of 64 as 4 micro-batches of 16
    "demo-cpu": ("demo-cpu", [], 16, 4),
    # ViT-Tiny with the paper's projector (2048 -> 256) and 1024 directions, 16x64² + 4 x 16x32² views, rho 0.9
    "vit-tiny-64px": (
        "vit-tiny-consumer",
        ["data.sources=/unused", "data.global_size=64", "data.local_size=32", "model.drop_ratio=0.9"],
        16,
        4,
    ),
}


def _batch(cfg, b: int, device: str, seed: int) -> ViewBatch:
    d = cfg.data
    g = torch.Generator().manual_seed(seed)
    shape_g = (d.num_global, b, 3, d.num_frames, d.global_size, d.global_size)
    shape_l = (d.num_local, b, 3, d.num_frames, d.local_size, d.local_size)
    glob = torch.randint(0, 256, shape_g, dtype=torch.uint8, generator=g)
    local = torch.randint(0, 256, shape_l, dtype=torch.uint8, generator=g)
    kw = {k: getattr(d, k) for k in ("jitter_p", "brightness", "contrast", "saturation", "hue", "grayscale_p")}
    photo = torch.stack([sample_photometric(g, **kw) for _ in range(d.num_local * b)]).reshape(d.num_local, b, -1)
    index = torch.arange(seed * b, (seed + 1) * b)
    return ViewBatch([glob.to(device), local.to(device)], photo.to(device), index, 0, 0)


class Setup:
    """One case: model, objective, optimizer and the micro-batches of one step (fixed data)."""

    def __init__(self, case: tuple[str, list[str], int, int], device: str, autocast: bool) -> None:
        name, overrides, self.micro, self.accum = case
        self.cfg = apply_overrides(preset(name), overrides)
        self.device = device
        self.model = Pretrainer(*build_models(self.cfg, seed=0)).to(device)
        self.objective = build_objective(self.cfg.objective, check_finite=False).to(device)
        self.opt = build_optimizer(self.model, self.cfg.optim)
        self.autocast = torch.bfloat16 if autocast else None
        batches = [_batch(self.cfg, self.micro, device, i) for i in range(self.accum)]
        self.views = [b.augment_to_device(device) for b in batches]
        self.keys = [sample_keys(0, "drop", 0, positions=b.index, device=device) for b in batches]

    def step(self, mode: str, step: int) -> None:
        out = train_step(
            self.model,
            self.objective,
            self.opt,
            self.views,
            self.keys,
            step=step,
            lr=1e-4,
            grad_clip=1.0,
            autocast_dtype=self.autocast,
            accumulation=mode,
        )
        float(out.loss)  # wait for the device


class SavedBytes:
    """Peak bytes of the tensors autograd graphs save for backward (each storage counted once, parameters
    excluded), tracked while the context is active."""

    def __init__(self, params) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.live: dict[int, list[int]] = {}  # storage -> [references, bytes]
        self.bytes = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.bytes -= entry[1]
            del self.live[key]

    def pack(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr()
        if key in self.params or t.device.type == "meta":
            return t
        entry = self.live.setdefault(key, [0, t.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.bytes += entry[1]
            self.peak = max(self.peak, self.bytes)
        entry[0] += 1
        box = _Box(t)
        weakref.finalize(box, self._release, key)
        return box

    @staticmethod
    def unpack(x):
        return x.tensor if isinstance(x, _Box) else x

    def __enter__(self) -> SavedBytes:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class _Box:
    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def compare(
    case: str | tuple[str, list[str], int, int], device: str = "cpu", rounds: int = 5, autocast: bool = False
) -> dict:
    """Median step time of each mode over ``rounds`` alternating rounds, their ratio, and peak memory.

    ``case``: a name of ``CASES`` or ``(preset, overrides, clips per micro-batch, micro-batches)``.
    """
    s = Setup(CASES[case] if isinstance(case, str) else case, device, autocast)
    for mode in ("local", "global"):  # warm-up: allocator, kernels
        s.step(mode, 0)
    times: dict[str, list[float]] = {"local": [], "global": []}
    cpu: dict[str, list[float]] = {"local": [], "global": []}
    for r in range(rounds):
        for mode in ("local", "global") if r % 2 == 0 else ("global", "local"):
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            s.step(mode, r + 1)
            _sync(device)
            times[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)
    res = {
        "case": case if isinstance(case, str) else case[0],
        "micro_batch": s.micro,
        "micro_batches": s.accum,
        "local_ms": 1e3 * statistics.median(times["local"]),
        "global_ms": 1e3 * statistics.median(times["global"]),
    }
    res["ratio_global_vs_local"] = res["global_ms"] / res["local_ms"]
    if device == "cpu":
        res["local_cpu_ms"] = 1e3 * statistics.median(cpu["local"])
        res["global_cpu_ms"] = 1e3 * statistics.median(cpu["global"])
        res["cpu_time_ratio"] = res["global_cpu_ms"] / res["local_cpu_ms"]
    for mode in ("local", "global"):
        with SavedBytes(s.model.parameters()) as saved:
            s.step(mode, 98)
        res[f"{mode}_saved_activations_mb"] = saved.peak / 2**20
    if device == "cuda":
        for mode in ("local", "global"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            s.step(mode, 99)
            res[f"{mode}_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return res


def drop_cost(device: str = "cpu", rounds: int = 5) -> dict:
    """ms to draw the keep indices of 128 clips × (1 global + 4 local views) of the paper's sizes."""
    b, views = 128, ((1, (16, 14, 14)), (4, (16, 6, 6)))
    keys = sample_keys(0, "drop", 0, positions=range(b), device=device)

    def keyed() -> None:
        slot = 0
        for v, grid in views:
            k = fold_keys(keys, slot, count=v).reshape(-1)
            slot += v
            sample_keep_idx(v * b, grid, 0.95, "uniform", keys=k)

    def one_generator() -> None:
        g = torch.Generator(device=device).manual_seed(0)
        for v, grid in views:
            sample_keep_idx(v * b, grid, 0.95, "uniform", g, device)

    def per_clip() -> None:
        for v, grid in views:
            gens = [torch.Generator(device=device).manual_seed(i) for i in range(v * b)]
            torch.cat([sample_keep_idx(1, grid, 0.95, "uniform", g, device) for g in gens])

    fns = {"keys_hash": keyed, "one_generator": one_generator, "per_clip_generators": per_clip}
    times: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    res = {f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()}
    if device == "cpu":
        res.update({f"{k}_cpu_ms": 1e3 * statistics.median(v) for k, v in cpu.items()})
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="default: every case")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    parser.add_argument("--drop", action="store_true", help="only the keep-index drawing cost")
    args = parser.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    if args.drop:
        print(json.dumps({"device": args.device, "threads": args.threads, **drop_cost(args.device)}, indent=1))
        return 0
    results = []
    for case in args.case or sorted(CASES):
        res = compare(case, args.device, args.rounds, autocast=args.device == "cuda")
        results.append(res)
        print(json.dumps(res), flush=True)
    print(json.dumps({"device": args.device, "threads": args.threads, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
