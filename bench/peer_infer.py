"""Clip inference beside the reference LeVJEPA forward on the CPU: ms per clip and peak memory, interleaved.

    python bench/peer_infer.py --reference PATH/TO/module.py                      # ViT-Tiny and ViT-B, 16 and 64 frames
    python bench/peer_infer.py --reference PATH --models vit-tiny --frames 16,64 --rounds 3 --dense

The reference code (``MLO-lab/LeVJEPA`` ``module.py``, CC BY-NC 4.0) is never shipped with levjepa:
``--reference`` names the user's copy, loaded at run time. Per setting (model, frames), one process builds the
reference encoder as its factories do (``vit_tiny`` / ``vit_base``: 16×16 patches, τ = 1, ``use_rope=True``,
``attn_mode="block_causal"``, ``eval()``) with its own random initialisation (seed 0), and levjepa's encoder
from those weights through ``levjepa import``'s reader (``levjepa.formats.reading.official``): the same function, which
the process checks (the largest difference of any output token, CLS and every patch, is printed). Then it
times ``forward`` (the reference: its ``last_hidden_state``; levjepa: ``forward_features``) on one
``[B, 3, T, 224, 224]`` clip under ``torch.inference_mode``, float32, ``--threads`` threads, the sides
alternating (ABBA: the order flips every round) after one warm-up call each. ``--dense`` adds levjepa with its
dense additive mask (the path before ``KeySpans``: ``attention.MAX_SPANS = 0``), so the table shows what
the mask-free path buys.

Memory: the peak resident set size *added by one forward* — the process's RSS before the call, its peak
during it (Linux ``VmHWM``, reset through ``/proc/self/clear_refs`` before every call), the difference: the
activations, the attention masks and scratch of that call alone, beside the weights both sides hold. The
process runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so that every large buffer is returned to the system when
freed, and one side's freed memory cannot hide the next side's peak.

A setting's ms/clip is the fastest call of each side (the least disturbed on a shared machine), its peak the
largest; the ratio is reference ms / levjepa ms. Rate: the matrix-product FLOPs each side computes
(``levjepa.tools.flops.encoder_flops``; the reference every attention score under its mask, levjepa the
block-causal ones only, ``(S + 1) / 2S`` of them) over its time, and that rate as a share of this machine's
**sgemm peak**, measured in the same process (the best of ``torch.mm`` on 2048² float32 matrices, ``--threads``
threads). The first line printed names the CPU (``levjepa.infer.cpu``). With ``--threads 1`` the same table by
process CPU time follows: the compute of each call, which other processes on a shared machine disturb far less
than its wall time. Results and the commands that made them: ``bench/encoder.md``
(Clip inference beside the reference).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.formats.reading.official import Overrides, read_official
from levjepa.infer.cpu import cpu_info
from levjepa.model import VideoEncoder, attention
from levjepa.tools.flops import encoder_flops

FACTORIES = {"vit-tiny": "vit_tiny", "vit-small": "vit_small", "vit-base": "vit_base", "vit-large": "vit_large"}
SIZE, PATCH = 224, 16


def load_reference(path: str) -> Any:
    """The user's reference ``module.py`` as a module (never part of levjepa)."""
    spec = importlib.util.spec_from_file_location("levjepa_reference_module", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--reference {path}: not a Python module")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    return ref


def reference_encoder(ref: Any, model: str, frames: int, size: int = SIZE, seed: int = 0) -> torch.nn.Module:
    """The reference encoder, as its factory builds it, with its own random initialisation, in eval mode."""
    torch.manual_seed(seed)
    factory = getattr(ref, FACTORIES[model])
    return factory(
        img_size=size, patch_size=PATCH, num_frames=frames, tubelet_size=1, use_rope=True, attn_mode="block_causal"
    ).eval()


def imported(official: torch.nn.Module) -> VideoEncoder:
    """levjepa's encoder from the reference encoder's weights, through ``levjepa import``'s reader."""
    heads = official.num_heads
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "model.safetensors"
        save_file({k: v.contiguous() for k, v in official.state_dict().items()}, str(src))
        m = read_official(src, Overrides(heads=heads, attention="block_causal"))
    enc = VideoEncoder(m.config).eval()
    enc.load_state_dict(m.encoder)
    return enc


def _status_mib(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert found is not None, f"/proc/self/status has no {field}"
    return int(found.group(1)) / 1024


def measured(fn: Any) -> tuple[float, float, float]:
    """``(ms, CPU ms, MiB)``: wall and process CPU time of ``fn()`` and the peak RSS it added (module docstring)."""
    before = _status_mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from the current RSS
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    ms, cpu_ms = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    return ms, cpu_ms, _status_mib("VmHWM") - before


def worker(ref_path: str, model: str, frames: int, batch: int, rounds: int, dense: bool) -> dict[str, Any]:
    """One setting, every side in this process (module docstring); its timings, peaks and the check."""
    ref = load_reference(ref_path)
    official = reference_encoder(ref, model, frames)
    ours = imported(official)
    clip = torch.randn(batch, 3, frames, SIZE, SIZE, generator=torch.Generator().manual_seed(1))

    def run_dense() -> torch.Tensor:
        saved, attention.MAX_SPANS = attention.MAX_SPANS, 0  # KeySpans refused: the dense additive mask
        try:
            return ours.forward_features(clip).tokens
        finally:
            attention.MAX_SPANS = saved

    sides = {"reference": lambda: official(clip), "levjepa": lambda: ours.forward_features(clip).tokens}
    if dense:
        sides["levjepa-dense"] = run_dense
    res: dict[str, Any] = {"model": model, "frames": frames, "batch": batch, "threads": torch.get_num_threads()}
    res["gflop"] = side_gflop(ours.cfg, frames, sides)
    res["sgemm_gflops"] = sgemm_peak()
    res |= {"ms": {}, "cpu_ms": {}, "peak_mib": {}, "diff": {}}
    with torch.inference_mode():
        want = official(clip)  # the warm-up of the reference, and the check
        for name, fn in sides.items():
            if name != "reference":
                res["diff"][name] = float((fn() - want).abs().max())  # levjepa's warm-up
        del want
        names = list(sides)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                ms, cpu_ms, peak = measured(sides[name])
                res["ms"].setdefault(name, []).append(ms)
                res["cpu_ms"].setdefault(name, []).append(cpu_ms)
                res["peak_mib"].setdefault(name, []).append(peak)
                line = f"  {model} {frames} frames round {r} {name:14s} {ms:9.0f} ms {cpu_ms:9.0f} CPU ms"
                line += f"  +{peak:6.0f} MiB"
                print(line, file=sys.stderr, flush=True)
    return res


def sgemm_peak(n: int = 2048, reps: int = 10) -> float:
    """This machine's float32 matrix-product rate (GFLOP/s) at the process's thread count: the best of ``reps``
    products of ``n × n`` matrices (module docstring)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def side_gflop(cfg: Any, frames: int, sides: dict[str, Any]) -> dict[str, float]:
    """GFLOP per clip each side computes (module docstring): dense attention for the reference and levjepa's dense
    path, block-causal spans for levjepa."""
    terms = encoder_flops(cfg, frames, SIZE)
    dense = sum(terms.values()) / 1e9
    slots = frames // cfg.tubelet
    spans = (sum(terms.values()) - terms["attention"] * (1 - (slots + 1) / (2 * slots))) / 1e9
    return {name: spans if name == "levjepa" else dense for name in sides}


def _run_worker(args: argparse.Namespace, model: str, frames: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", model, str(frames), "--reference", args.reference]
    cmd += ["--threads", str(args.threads), "--rounds", str(args.rounds), "--batch", str(args.batch)]
    cmd += ["--dense"] if args.dense else []
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    sys.stderr.write(done.stderr)
    if done.returncode:
        raise SystemExit(f"worker {model} {frames} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]], key: str = "ms") -> str:
    """The markdown table of ``rows`` by wall (``key="ms"``) or process CPU time (``"cpu_ms"``) per clip."""
    sides = [s for s in rows[0]["ms"] if s != "reference"]
    unit = "ms/clip" if key == "ms" else "CPU ms/clip"
    cols = [f"reference {unit}"] + [f"{s} {unit}" for s in sides] + [f"reference / {s}" for s in sides]
    cols += ["peak added, reference MiB"] + [f"{s} MiB" for s in sides] + [f"max abs diff, {s}" for s in sides]
    cols += [f"{s} GFLOP/s (% of sgemm peak)" for s in ["reference", *sides]] + ["sgemm peak GFLOP/s"]
    out = ["| model, clip | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    for row in rows:
        b = row["batch"]
        ms = {s: min(v) / b for s, v in row[key].items()}
        peak = {s: max(v) for s, v in row["peak_mib"].items()}
        cells = [f"{ms['reference']:.0f}"] + [f"{ms[s]:.0f}" for s in sides]
        cells += [f"**{ms['reference'] / ms[s]:.2f}×**" for s in sides]
        cells += [f"{peak['reference']:.0f}"] + [f"{peak[s]:.0f}" for s in sides]
        cells += [f"{row['diff'][s]:.1e}" for s in sides]
        peak_rate = row["sgemm_gflops"]
        for s in ["reference", *sides]:
            rate = row["gflop"][s] / (ms[s] / 1e3)
            cells.append(f"{rate:.0f} ({100 * rate / peak_rate:.0f} %)")
        cells.append(f"{peak_rate:.0f}")
        label = f"{row['model']}, {b} × {row['frames']}×{SIZE}² ({1 + row['frames'] * (SIZE // PATCH) ** 2} tokens)"
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", required=True, help="path to the reference LeVJEPA module.py (never shipped)")
    ap.add_argument("--models", default="vit-tiny,vit-base", help=f"comma-separated among {', '.join(FACTORIES)}")
    ap.add_argument("--frames", default="16,64", help="comma-separated clip lengths")
    ap.add_argument("--batch", type=int, default=1, help="clips per call")
    ap.add_argument("--rounds", type=int, default=2, help="timed calls per side, alternating (after a warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dense", action="store_true", help="also time levjepa with its dense mask (the path before)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "FRAMES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not args.worker:
        print(f"CPU: {cpu_info().describe()}; torch {torch.__version__}; {args.threads} thread(s)")
    if args.worker:
        model, frames = args.worker
        print(json.dumps(worker(args.reference, model, int(frames), args.batch, args.rounds, args.dense)))
        return
    rows = [_run_worker(args, m, int(f)) for m in args.models.split(",") for f in args.frames.split(",")]
    print(table(rows))
    if args.threads == 1:  # one thread: the process's CPU time is its compute, which other load disturbs least
        print("\n" + table(rows, "cpu_ms"))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
