"""How SIGReg's value and pull scale with the batch N, against the invariance term (the λ–N relation).

    python bench/lambda_n.py            # ~1 minute on one CPU thread; prints a table and the fitted slopes

The Epps–Pulley statistic is ``EP = N · Σ_j w_j |φ̂(t_j) − φ(t_j)|²``. For embeddings away from the target,
``|φ̂ − φ|²`` tends to a positive constant, so the value grows ∝ N; at the target it is a fluctuation of
order 1/N and the value stays at its null 1.0525 whatever N. The *pull* that λ weighs against invariance is
the gradient on shared weights: here ``z = x W`` with ``x ~ N(0, I)`` and a shared ``W`` ``[K, K]``, and
``‖∂SIGReg/∂W‖`` is compared with ``‖∂L_inv/∂W‖`` of the invariance term (a mean over the batch, so its
gradient does not grow with N; two views ``z_0 = x W``, ``z_1 = (x + 0.3 ε) W``). Three embedding
populations: Gaussian (``W = I``, at the target), shrunk (``W = 0.5 I``) and collapsed to 4 of ``K = 32``
dimensions. Each value is the mean over 8 seeds; M = 1024 directions, 17 nodes on [0, 3].

Results and what they mean for λ: ``bench/train.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.objective import sigreg

K = 32
POPULATIONS = {
    "gaussian": lambda: torch.eye(K, dtype=torch.float64),
    "shrunk x0.5": lambda: 0.5 * torch.eye(K, dtype=torch.float64),
    "rank 4 of 32": lambda: torch.diag(torch.tensor([1.0] * 4 + [0.0] * (K - 4), dtype=torch.float64)),
}


def measure(n: int, make_w, seeds: int = 8, directions: int = 1024) -> dict[str, float]:
    value = grad_sig = grad_inv = 0.0
    for seed in range(seeds):
        g = torch.Generator().manual_seed(1000 * n + seed)
        x = torch.randn(n, K, generator=g, dtype=torch.float64)
        noise = 0.3 * torch.randn(n, K, generator=g, dtype=torch.float64)
        w = make_w().requires_grad_(True)
        a = torch.randn(K, directions, generator=g, dtype=torch.float64)
        s = sigreg(x @ w, a / a.norm(dim=0), impl="chunked")
        (gs,) = torch.autograd.grad(s, w)
        inv = ((x @ w) - (x + noise) @ w).square().mean() / 2  # two view slots: the v = 0 term is zero
        (gi,) = torch.autograd.grad(inv, w)
        value += float(s.detach()) / seeds
        grad_sig += float(gs.norm()) / seeds
        grad_inv += float(gi.norm()) / seeds
    return {"sigreg": value, "grad_sigreg_W": grad_sig, "grad_invariance_W": grad_inv}


def slope(ns: list[int], ys: list[float]) -> float:
    """Least-squares slope of log y against log N."""
    lx = [math.log(n) for n in ns]
    ly = [math.log(max(y, 1e-300)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ns", default="16,64,256,1024,4096")
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ns = [int(v) for v in args.ns.split(",")]
    out: dict = {"K": K, "ns": ns, "populations": {}}
    print(f"{'population':>14} {'N':>6} {'SIGReg':>10} {'|dSIGReg/dW|':>13} {'|dL_inv/dW|':>12} {'ratio':>9}")
    for name, make_w in POPULATIONS.items():
        rows = [measure(n, make_w, args.seeds) for n in ns]
        for n, r in zip(ns, rows, strict=True):
            ratio = r["grad_sigreg_W"] / r["grad_invariance_W"] if r["grad_invariance_W"] > 0 else math.inf
            print(
                f"{name:>14} {n:>6} {r['sigreg']:>10.4g} {r['grad_sigreg_W']:>13.4g} "
                f"{r['grad_invariance_W']:>12.4g} {ratio:>9.4g}"
            )
        fits = {key: slope(ns, [r[key] for r in rows]) for key in rows[0]}
        print(f"{name:>14} slopes of log(.) vs log N: " + ", ".join(f"{k} {v:+.2f}" for k, v in fits.items()))
        out["populations"][name] = {"rows": rows, "slopes": fits}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
