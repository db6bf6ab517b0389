"""SDPA against the explicit two-matmul attention on the CPU, by sequence length: where ``SHORT_KEYS`` sits.

    python bench/attention.py --threads 2
    python bench/attention.py --threads 1

Forward and backward of one attention call, float32, with a block-causal additive bias per clip (as a
training step with dropped tokens has), at the shapes of levjepa's steps (the demo's local and global views,
ViT-Tiny's at ρ = 0.95 and 0.75) and longer ones around the crossover. Both sides run interleaved in one
process, the fastest of ``--repeats`` timings each. ``levjepa.model.attention.attend`` takes the explicit path
up to ``SHORT_KEYS`` keys. Results: ``bench/train.md`` (Short sequences).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.infer.cpu import cpu_info
from levjepa.model import attention

# (clips, heads, tokens, head dim, what it is)
SHAPES = [
    (256, 4, 37, 32, "demo-cpu local views (4 × 64 clips)"),
    (64, 4, 65, 32, "demo-cpu global view"),
    (32, 3, 30, 64, "ViT-Tiny local, ρ = 0.95"),
    (8, 3, 158, 64, "ViT-Tiny global, ρ = 0.95"),
    (32, 3, 145, 64, "ViT-Tiny local, ρ = 0.75"),
    (16, 3, 256, 64, ""),
    (8, 3, 400, 64, ""),
    (8, 3, 785, 64, "ViT-Tiny global, ρ = 0.75"),
]


def _time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def _sdpa(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, grad: Tensor) -> None:
    F.scaled_dot_product_attention(q, k, v, attn_mask=bias).backward(grad)


def _explicit(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, grad: Tensor) -> None:
    saved, attention.SHORT_KEYS = attention.SHORT_KEYS, 1 << 30  # the explicit path at every length
    try:
        attention.attend(q, k, v, bias).backward(grad)
    finally:
        attention.SHORT_KEYS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    print(f"{args.threads} thread(s); attend() takes the explicit path up to {attention.SHORT_KEYS} keys")
    print("| shape [B, h, L, hd] | what | SDPA ms | explicit ms | SDPA ÷ explicit | attend() |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for b, h, n, hd, what in SHAPES:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(b, h, n, hd, generator=g, requires_grad=True) for _ in range(3))
        frames = torch.sort(torch.randint(0, 8, (b, n), generator=g), dim=1).values
        meta = attention.TokenMeta(frames, torch.zeros(b, n, dtype=torch.bool))
        bias = attention.attn_bias(attention.block_causal(meta, meta)[:, None], q)
        tensors = (q, k, v, bias, torch.randn(b, h, n, hd, generator=g))
        times: dict[str, list[float]] = {"sdpa": [], "explicit": []}
        for _ in range(2):  # interleaved
            times["sdpa"].append(_time(lambda: _sdpa(*tensors), args.repeats))  # noqa: B023 (called here)
            times["explicit"].append(_time(lambda: _explicit(*tensors), args.repeats))  # noqa: B023
        s, e = min(times["sdpa"]), min(times["explicit"])
        path = "explicit" if n <= attention.SHORT_KEYS else "SDPA"
        print(f"| [{b}, {h}, {n}, {hd}] | {what} | {s:.1f} | {e:.1f} | {s / e:.2f} | {path} |")


if __name__ == "__main__":
    main()
