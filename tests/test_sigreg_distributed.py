"""SIGReg over 2 real gloo processes equals one process on the concatenated batch: loss and gradients.

Two public SIGReg implementations shipped this wrong (a gradient off by the world size; the reduced value
discarded). The contract: every rank's loss is the single-process loss on the global batch; every rank's
input gradient is world_size × the single-process gradient of its rows; after DDP averages parameter
gradients they equal the single-process ones.
"""

from __future__ import annotations

import pytest
import torch

from dist_utils import run_gloo
from levjepa.objective import sigreg

WORLD = 2


def _model(state: dict) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6)).double()
    model.load_state_dict(state)
    return model


def _rank_rows(x: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor:
    return x.split(sizes, dim=-2)[rank]


def _worker(rank: int, world: int, z_full, a, sizes_equal, sizes_unequal, x_full, state):
    from torch.nn.parallel import DistributedDataParallel

    out = {}
    for impl in ("reference", "chunked"):
        z = _rank_rows(z_full, sizes_equal, rank).clone().requires_grad_(True)
        loss = sigreg(z, a, impl=impl)
        loss.backward()
        out[impl] = (loss.detach(), z.grad)
    z = _rank_rows(z_full, sizes_unequal, rank).clone().requires_grad_(True)
    per_direction = sigreg(z, a, reduction="none")
    per_direction.mean().backward()
    out["unequal"] = (per_direction.detach(), z.grad)
    ddp = DistributedDataParallel(_model(state))
    x = _rank_rows(x_full, sizes_equal, rank)
    loss = sigreg(ddp(x), a)
    loss.backward()
    out["ddp"] = (loss.detach(), [p.grad for p in ddp.module.parameters()])
    return out


@pytest.mark.distributed
def test_two_gloo_ranks_equal_one_process_on_the_global_batch():
    g = torch.Generator().manual_seed(0)
    z_full = torch.randn(2, 12, 6, generator=g, dtype=torch.float64) * 1.3 + 0.2  # [V, N, K]
    a = torch.randn(6, 20, generator=g, dtype=torch.float64)
    x_full = torch.randn(12, 5, generator=g, dtype=torch.float64)
    shapes = {"0.weight": (8, 5), "0.bias": (8,), "2.weight": (6, 8), "2.bias": (6,)}
    state = {k: 0.5 * torch.randn(*s, generator=g, dtype=torch.float64) for k, s in shapes.items()}
    equal, unequal = [6, 6], [8, 4]
    results = run_gloo(_worker, WORLD, z_full, a, equal, unequal, x_full, state)

    tol = {"rtol": 1e-9, "atol": 1e-12}
    for impl in ("reference", "chunked"):
        z = z_full.clone().requires_grad_(True)
        ref = sigreg(z, a, impl=impl)
        ref.backward()
        for rank, res in enumerate(results):
            loss, grad = res[impl]
            torch.testing.assert_close(loss, ref.detach(), **tol)
            torch.testing.assert_close(grad, WORLD * _rank_rows(z.grad, equal, rank), **tol)

    # unequal per-rank batches: the statistics are weighted by the local batch sizes, still exact
    z = z_full.clone().requires_grad_(True)
    ref_pd = sigreg(z, a, reduction="none")
    ref_pd.mean().backward()
    for rank, res in enumerate(results):
        per_direction, grad = res["unequal"]
        torch.testing.assert_close(per_direction, ref_pd.detach(), **tol)
        torch.testing.assert_close(grad, WORLD * _rank_rows(z.grad, unequal, rank), **tol)

    # a tiny DDP model: parameter gradients after DDP's averaging equal the single-process ones
    model = _model(state)
    loss = sigreg(model(x_full), a)
    loss.backward()
    for _rank, res in enumerate(results):
        ddp_loss, grads = res["ddp"]
        torch.testing.assert_close(ddp_loss, loss.detach(), **tol)
        for got, want in zip(grads, model.parameters(), strict=True):
            torch.testing.assert_close(got, want.grad, **tol)
