"""CPU benchmark: SIGReg fwd+bwd, ours (chunked recurrence, analytic backward) vs the straightforward reference.

    python bench/sigreg.py                       # N in {256, 1024, 4096}, M = 1024, K = 256
    python bench/sigreg.py --sizes 1024 --repeats 3 --out /tmp/sigreg_cpu.json

Both implementations run side by side in one process, interleaved round by round, and the minimum over
rounds is reported (the machine is shared: the minimum is the least disturbed run; the median is printed
too). Each timed call is ``sigreg(z, A, impl=...)`` + ``backward()`` on ``z`` ``[N, K]`` with explicit unit
directions ``A`` ``[K, M]``: projection, statistics, loss and gradient.

Peak memory is measured in a fresh process per (implementation, N): the rise of the resident-set high-water
mark (``VmHWM``, reset through ``/proc/self/clear_refs``) over the resident size just before the call, i.e.
the extra memory one fwd+bwd needs beyond its inputs. The bytes autograd saves for backward are reported
as well (exact, from ``saved_tensors_hooks``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.infer.cpu import cpu_info
from levjepa.objective import draw_directions, sigreg

IMPLS = ("reference", "chunked")


def _inputs(n: int, m: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, k, generator=g), draw_directions(k, m, seed=1)


def _fwd_bwd(z: torch.Tensor, a: torch.Tensor, impl: str) -> None:
    zz = z.clone().requires_grad_(True)
    sigreg(zz, a, impl=impl).backward()


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_worker(impl: str, n: int, m: int, k: int) -> dict[str, float]:
    """Run in a fresh process: peak extra RSS of one fwd+bwd, and the bytes saved for backward."""
    z, a = _inputs(n, m, k)
    _fwd_bwd(z[:64], a[:, :64], impl)  # load kernels and lazily initialised state outside the measurement
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sigreg(z.clone().requires_grad_(True), a, impl=impl)
    base = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    _fwd_bwd(z, a, impl)
    peak = _status_kb("VmHWM")
    return {"peak_extra_mb": (peak - base) / 1024, "saved_for_backward_mb": sum(saved) / 2**20}


def measure_memory(impl: str, n: int, m: int, k: int, threads: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--memory-worker", impl, str(n), str(m), str(k), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256,1024,4096", help="comma-separated N (samples)")
    p.add_argument("--m", type=int, default=1024, help="directions")
    p.add_argument("--k", type=int, default=256, help="embedding dim")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds per size")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    p.add_argument("--memory-worker", nargs=4, metavar=("IMPL", "N", "M", "K"), help=argparse.SUPPRESS)
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        impl, n, m, k = args.memory_worker
        print(json.dumps(memory_worker(impl, int(n), int(m), int(k))))
        return 0

    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"SIGReg fwd+bwd on CPU, M={args.m}, K={args.k}, threads={args.threads}, torch {torch.__version__}")
    header = f"{'N':>6} | {'ref s (min/med)':>16} | {'ours s (min/med)':>16} | {'speed-up':>8} | "
    header += f"{'ref MB':>8} | {'ours MB':>8} | {'mem ratio':>9} | {'saved ref/ours MB':>17}"
    print(header)
    print("-" * len(header))
    results = []
    for n in sizes:
        z, a = _inputs(n, args.m, args.k)
        for impl in IMPLS:
            _fwd_bwd(z, a, impl)  # warm-up
        times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
        for _ in range(args.repeats):
            for impl in IMPLS:
                start = time.perf_counter()
                _fwd_bwd(z, a, impl)
                times[impl].append(time.perf_counter() - start)
        mem = {impl: measure_memory(impl, n, args.m, args.k, args.threads) for impl in IMPLS}
        row = {
            "n": n,
            "m": args.m,
            "k": args.k,
            **{f"{impl}_s_min": min(times[impl]) for impl in IMPLS},
            **{f"{impl}_s_median": statistics.median(times[impl]) for impl in IMPLS},
            **{f"{impl}_{key}": value for impl in IMPLS for key, value in mem[impl].items()},
        }
        row["speedup"] = row["reference_s_min"] / row["chunked_s_min"]
        row["memory_ratio"] = row["reference_peak_extra_mb"] / max(row["chunked_peak_extra_mb"], 1e-9)
        results.append(row)
        print(
            f"{n:>6} | {row['reference_s_min']:7.3f}/{row['reference_s_median']:7.3f} | "
            f"{row['chunked_s_min']:7.3f}/{row['chunked_s_median']:7.3f} | {row['speedup']:7.1f}x | "
            f"{row['reference_peak_extra_mb']:8.1f} | {row['chunked_peak_extra_mb']:8.1f} | "
            f"{row['memory_ratio']:8.1f}x | {row['reference_saved_for_backward_mb']:7.1f}/"
            f"{row['chunked_saved_for_backward_mb']:.1f}"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cpu_threads": args.threads, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
