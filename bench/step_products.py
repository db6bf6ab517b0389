"""The training step's linear-layer products alone: how fast can they run on this machine, and in which form?

    python bench/step_products.py                   # ViT-Tiny, ρ = 0.95, batch 8, 2 threads, 3 rounds

The products of ``bench/peer_step.py``'s step (the ``vit-tiny-consumer`` encoder: 1 global view at 224 and
4 local at 96, 16 frames, 16×16 patches, ρ = 0.95, batch 8) are nearly all those of its linear layers:
``qkv``, ``attn.proj``, ``mlp.fc1`` and ``mlp.fc2`` of the blocks whose every token's output is used, each as
autograd runs it — forward ``x · Wᵀ``, input gradient ``g · W``, weight gradient ``gᵀ · x``. This script
times those three products of the four layers at the step's token counts, fp32, and sums them:

* **warm**: each product repeated on the same operands, which stay in the cache (the usual micro-benchmark);
* **cold**: a 16 MiB buffer is written before every repeat, as the step's elementwise kernels do between its
  products, so the operands come from memory;
* **groups apart / packed**: the global and the local group's tokens as two products (what the step does:
  one transformer call per view shape) or as one product over all tokens (what a step that packed both groups
  into one token stream, attention apart, would run).

It prints each form's time for one block and its rate in GFLOP/s, per round. The step's products run at the
rate ``bench/peer_step.py --profile --kernels`` reports; the cold rate here is what they could reach alone.
Results: ``bench/train.md`` (Where the two bounds stand).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.infer.cpu import cpu_info
from levjepa.model import EncoderConfig, encoder_config
from levjepa.model.tokens import num_kept
from peer_step import FRAMES, GLOBAL, LOCAL, NUM_LOCAL  # the views of the step this script takes apart


def token_counts(cfg: EncoderConfig, batch: int, rho: float) -> list[int]:
    """Tokens (CLS included) in each view group of ``peer_step``'s step: ``V · B · (1 + kept)``."""
    grid = FRAMES // cfg.tubelet
    return [
        v * batch * (1 + num_kept(grid * (size // cfg.patch_size) ** 2, rho))
        for v, size in ((1, GLOBAL), (NUM_LOCAL, LOCAL))
    ]


def time_it(fn: Callable[[], object], repeats: int, flush: torch.Tensor | None) -> float:
    """Median seconds of ``fn`` over ``repeats`` (after 3 warm-up calls); ``flush`` is written before each."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush.add_(1.0)
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def block_products(tokens: list, shapes: list, repeats: int, flush: torch.Tensor | None) -> tuple[float, float]:
    """Seconds and floating-point operations of one block's linear products (forward, input and weight
    gradient) over each entry of ``tokens`` as a product of its own."""
    seconds = flops = 0.0
    for m in tokens:
        for k, n in shapes:  # layer in -> out
            x, w, g = torch.randn(m, k), torch.randn(n, k), torch.randn(m, n)
            for fn in (lambda x=x, w=w: x @ w.t(), lambda g=g, w=w: g @ w, lambda g=g, x=x: g.t() @ x):
                seconds += time_it(fn, repeats, flush)
            flops += 3 * 2 * m * k * n
    return seconds, flops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="vit-tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rho", type=float, default=0.95)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = encoder_config(args.model)
    d, h = cfg.dim, cfg.mlp_hidden
    shapes = [(d, 3 * d), (d, d), (d, h), (h, d)]  # qkv, attn.proj, mlp.fc1, mlp.fc2
    groups = token_counts(cfg, args.batch, args.rho)
    flush = torch.zeros(4 * 1024 * 1024)  # 16 MiB: more than the L2 caches, half of a typical L3
    print(f"{args.model}, rho {args.rho}, batch {args.batch}: tokens per group {groups}, {args.threads} threads")
    forms = {
        "warm, groups apart": (groups, None),
        "cold, groups apart": (groups, flush),
        "cold, packed": ([sum(groups)], flush),
    }
    print("| round | " + " | ".join(forms) + " |")
    print("| ---: |" + " ---: |" * len(forms))
    for r in range(args.rounds):
        cells = []
        for tokens, buf in forms.values():
            seconds, flops = block_products(tokens, shapes, args.repeats, buf)
            cells.append(f"{seconds * 1e3:.2f} ms, {flops / seconds / 1e9:.0f} GFLOP/s")
        print(f"| {r + 1} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
