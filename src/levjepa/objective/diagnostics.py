"""Label-free monitors of the embedding distribution, for training logs.

SIGReg's target is ``N(0, I_K)``: every coordinate with unit spread, no direction collapsed. For
projections ``z`` ``[N, K]`` (or ``[V, N, K]``: computed per view slot, then averaged over slots, except the
minimum which is taken over all of them):

* ``std/mean``, ``std/min``: per-coordinate standard deviation over the N samples (target 1), averaged
  over coordinates / its minimum.
* ``effective_rank``: ``exp(H(p))`` with ``p = λ / Σλ`` the normalised eigenvalues of the batch covariance
  (Roy & Vetterli's effective rank, as in RankMe): ``K`` for isotropic embeddings (a little less at finite
  N), ``r`` for embeddings spread evenly over an r-dimensional subspace, 1 at complete collapse.
* ``dead_fraction``: fraction of coordinates whose std is below ``dead_threshold`` (default 0.01, i.e.
  1 % of the target spread).
* ``sigreg`` (``[N, K]``) or ``sigreg/view{v}`` (``[V, N, K]``): SIGReg with ``num_directions`` directions
  from a fixed seed, so successive logs compare like with like (0 turns it off). The null value for
  Gaussian embeddings is 1.0524642; the training loss reports the same per view with that step's
  directions.

All values are detached 0-dim float32 tensors of this rank's samples (no collective). The eigenvalues
are computed in float64; on a GPU that is a host–device synchronisation, so call this on logging steps
only (it is not part of the loss).
"""

from __future__ import annotations

import torch

from .sigreg import check_embeddings, draw_directions, sigreg

__all__ = ["effective_rank", "embedding_diagnostics"]


def effective_rank(z: torch.Tensor) -> torch.Tensor:
    """``exp(entropy)`` of the normalised covariance eigenvalues of ``z`` ``[N, K]`` (0-dim float64)."""
    x = z.detach().to(torch.float64)
    x = x - x.mean(0, keepdim=True)
    cov = x.T @ x / max(x.shape[0] - 1, 1)
    eig = torch.linalg.eigvalsh(cov).clamp_min(0.0)
    p = eig / eig.sum().clamp_min(torch.finfo(torch.float64).tiny)
    entropy = -(p * torch.log(p.clamp_min(torch.finfo(torch.float64).tiny))).sum()
    return torch.exp(entropy)


@torch.no_grad()
def embedding_diagnostics(
    z: torch.Tensor, *, dead_threshold: float = 1e-2, num_directions: int = 256, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Monitors of ``z`` ``[N, K]`` or ``[V, N, K]`` (see the module docstring); detached 0-dim tensors."""
    check_embeddings(z, "z")
    views = (z if z.dim() == 3 else z.unsqueeze(0)).detach()
    vf = views.double() if views.dtype == torch.float64 else views.float()
    std = vf.std(dim=1)  # [V, K]
    out = {
        "std/mean": std.mean(),
        "std/min": std.min(),
        "effective_rank": torch.stack([effective_rank(v) for v in vf]).mean(),
        "dead_fraction": (std < dead_threshold).to(vf.dtype).mean(),
    }
    if num_directions > 0:
        a = draw_directions(z.shape[-1], num_directions, seed=seed, device=z.device)
        per_view = sigreg(vf, a, reduction="none", all_reduce=False).mean(-1)
        if z.dim() == 2:
            out["sigreg"] = per_view[0]
        else:
            out.update({f"sigreg/view{v}": per_view[v] for v in range(per_view.shape[0])})
    return {k: v.float() for k, v in out.items()}
