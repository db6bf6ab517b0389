"""LocaLeJEPA over 2 real gloo processes equals one process on the concatenated batch.

The k-means runs on every rank's (detached) mean projections, gathered, and the regulariser's per-cluster
sums (cluster means, sizes, cos/sin statistics) are all-reduced, so the clusters, the kept groups and the
regulariser are those of the global batch: its strength does not change with the GPU count. The contract is
SIGReg's (``test_sigreg_distributed.py``): the regulariser equals the single-process one; each rank's loss
holds its own rows' prediction term (the loop logs the mean over ranks); each rank's input gradient is
world_size × the single-process gradient of its rows, so DDP's averaging gives the single-process gradients.
"""

from __future__ import annotations

import pytest
import torch

from dist_utils import run_gloo
from levjepa.objective import ObjectiveConfig, build_objective

WORLD = 2
STEP = 3
CFG = ObjectiveConfig(name="localejepa", local_directions=32, min_cluster_size=4)


def _clustered(generator: torch.Generator) -> torch.Tensor:
    """``[V=3, B=24, K=6]``: four well separated groups of six samples, interleaved over the batch so each
    rank's half holds three of every group (fewer than min_cluster_size: per rank, no cluster would be kept)."""
    centres = 4.0 * torch.randn(4, 6, generator=generator, dtype=torch.float64)
    group = torch.arange(24) % 4
    base = centres[group] + torch.randn(24, 6, generator=generator, dtype=torch.float64)
    return base + 0.3 * torch.randn(3, 24, 6, generator=generator, dtype=torch.float64)


def _worker(rank: int, world: int, z_full: torch.Tensor):
    z = z_full.chunk(world, dim=1)[rank].clone().requires_grad_(True)
    out = build_objective(CFG)(z, STEP)
    out.loss.backward()
    return {k: v.detach() for k, v in out.terms.items()}, out.loss.detach(), z.grad


@pytest.mark.distributed
def test_two_gloo_ranks_equal_one_process_on_the_global_batch():
    z_full = _clustered(torch.Generator().manual_seed(0))
    ranks = run_gloo(_worker, WORLD, z_full)
    z = z_full.clone().requires_grad_(True)
    ref = build_objective(CFG)(z, STEP)
    ref.loss.backward()
    assert float(ref.terms["kmeans_fallback"]) == 0.0 and float(ref.terms["clusters_used"]) == 4.0
    tol = {"rtol": 1e-9, "atol": 1e-12}
    for rank, (terms, _, grad) in enumerate(ranks):
        for key in ("localreg", "kmeans_fallback", "clusters_used"):  # the global clusters and regulariser
            torch.testing.assert_close(terms[key], ref.terms[key], **tol, msg=key)
        torch.testing.assert_close(grad, WORLD * z.grad.chunk(WORLD, dim=1)[rank], **tol)
    pred = sum(r[0]["pred"] for r in ranks) / WORLD  # each rank's rows; equal halves: the mean is the whole
    torch.testing.assert_close(pred, ref.terms["pred"], **tol)
    loss = sum(r[1] for r in ranks) / WORLD
    torch.testing.assert_close(loss, ref.loss.detach(), **tol)
