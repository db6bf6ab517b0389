"""LocaLeJEPA's local uniform-ball regularizer (LocaLeReg), an alternative to SIGReg.

Instead of one global ``N(0, I)`` target, the batch is split into clusters and each cluster's re-centred
embeddings are matched to a uniform ball, so clusters may sit anywhere and only their local shape is
constrained. For projections ``z`` ``[V, B, K]`` (``d = K``):

1. ``z̄_b = mean_v z_{v,b}``; **cosine k-means** on the *detached* ``z̄`` of the global batch (pure torch,
   seeded generator, ``Q = 4`` clusters, ``kmeans_iters = 10`` Lloyd steps from ``Q`` distinct random
   samples): labels, shared by all views. The assignment receives no gradient.
2. Keep clusters with ``|C_q| ≥ 4``; if none is left, fall back to the whole batch as one cluster and
   **report** it (``kmeans_fallback`` = 1, ``clusters_used`` = number of groups averaged, ≥ 1). Fewer samples
   than clusters is an ordinary fallback, not an error.
3. Re-centre per view inside each cluster, gradients flowing through the mean:
   ``r_{v,b} = z_{v,b} − mean_{j ∈ C_q} z_{v,j}``.
4. Target ``Y ~ Uniform(ball of radius R = √(d+2))`` in ``R^d`` (covariance ``I``). Its 1-D projection has
   density ``∝ (R² − s²)^((d−1)/2)`` on ``[−R, R]``; ``φ_Y(t) = ∫ cos(ts) f(s) ds`` is integrated numerically
   (:func:`uniform_ball_cf`; the tests compare it with ``Γ(d/2+1) (2/(tR))^{d/2} J_{d/2}(tR)``).
   ``e^{−t²/2}`` stays only as the integration window.
5. ``D_{q,v} = |C_q| · mean_u Σ_j w_j |φ̂_{q,v,u}(t_j) − φ_Y(t_j)|²`` with 256 directions ``u``, 17 nodes on
   ``[0, 3]`` and the symmetric trapezoid weights of SIGReg; ``LocaLeReg = 1/(|Q|·V) Σ_q Σ_v D_{q,v}``
   (each cluster weighted by its size, then clusters averaged equally: changing ``Q`` changes the
   effective strength).
6. ``L = (1−λ) · mean_{b,v,k} (z_{v,b} − z̄_b)² + λ · LocaLeReg``, ``λ = 0.1``.

Distributed: the same objective on any number of GPUs. The k-means runs on every rank's detached ``z̄``,
gathered (``levjepa.distributed.all_gather_rows``; every rank runs the same seeded k-means, so all agree on
the labels), and the regulariser's per-group sums — the cluster sizes and sums of projections (for the
means), then the cos/sin sums — each go through one differentiable ``all_reduce_sum``, as SIGReg's
statistics do: clusters, kept groups, ``|C_q|`` and ``φ̂`` are the global batch's. Each rank's input gradient
is then ``world_size ×`` the single-process gradient of its rows, and DDP's averaging gives the
single-process parameter gradients (``tests/test_localreg_distributed.py``).

Implementation notes: every cluster (and the whole-batch group) is evaluated every step and the kept ones
are selected by weights computed on the device, so there is no data-dependent Python branching and no
host–device synchronisation. Re-centring is done on the projections (``(z − μ)·a = z·a − μ·a``). The
statistics use plain autograd over ``[V, B, M, J]`` tensors (M = 256; the clusters partition the batch so
this is the size of one SIGReg reference pass, twice with the whole-batch group).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from levjepa import distributed
from levjepa.rng import make_generator

from .losses import ObjectiveOutput, check_views, loss_dtype
from .sigreg import cached_epps_pulley_nodes, draw_directions, epps_pulley_from_stats

__all__ = ["cluster_labels", "cosine_kmeans", "local_ball_reg", "localejepa_loss", "uniform_ball_cf"]


def uniform_ball_cf(t: torch.Tensor, dim: int, radius: float | None = None, *, num_points: int = 2049) -> torch.Tensor:
    """Characteristic function at ``t`` of a 1-D projection of the uniform ball of radius ``radius``
    (default ``√(dim+2)``, unit covariance) in ``R^dim``, by numerical integration of the section density.

    ``φ(t) = ∫ cos(t R x) (1 − x²)^((d−1)/2) dx / ∫ (1 − x²)^((d−1)/2) dx`` over ``x = s/R ∈ (−1, 1)``, with the
    tanh–sinh substitution ``x = tanh(π/2 · sinh τ)`` (``1 − x² = sech²``, so the weight is
    ``cosh τ · sech^{d+1}(π/2 · sinh τ)``, computed in log space) and the trapezoid rule on ``τ ∈ [−4, 4]``:
    double-exponential convergence for every d, including the endpoint behaviour of small d (error ~1e-14
    against the Bessel closed form for d = 1..256). Float64 on ``t``'s device; returns ``t``'s shape and dtype.
    """
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    r = math.sqrt(dim + 2.0) if radius is None else float(radius)
    tau = torch.linspace(-4.0, 4.0, num_points, dtype=torch.float64, device=t.device)
    g = 0.5 * math.pi * torch.sinh(tau)
    log_weight = torch.log(torch.cosh(tau)) - (dim + 1) * torch.log(torch.cosh(g))
    weight = torch.exp(log_weight - log_weight.max())
    x = torch.tanh(g)
    tt = t.to(torch.float64).reshape(-1, 1)
    phi = (torch.cos(tt * (r * x)) * weight).sum(-1) / weight.sum()
    return phi.reshape(t.shape).to(t.dtype)


def _membership(labels: torch.Tensor, num_clusters: int, dtype: torch.dtype) -> torch.Tensor:
    """``[Q, B]`` 0/1 matrix, row q marking the members of cluster q (labels outside [0, Q) match none)."""
    return (labels[None, :] == torch.arange(num_clusters, device=labels.device)[:, None]).to(dtype)


def _row_sum(values: torch.Tensor) -> torch.Tensor:
    """``[V, B, M, J]`` summed over the batch as one group, ``[V, 1, J, M]``."""
    return values.sum(1).transpose(1, 2).unsqueeze(1)


@torch.no_grad()
def cosine_kmeans(x: torch.Tensor, num_clusters: int, iters: int = 10, *, generator: torch.Generator) -> torch.Tensor:
    """Cluster labels ``[B]`` (int64) of the rows of ``x`` ``[B, K]`` by cosine k-means.

    Rows are L2-normalised; centroids start at ``num_clusters`` distinct random rows (rows repeat when
    ``B < num_clusters``); each Lloyd step assigns by the largest cosine and re-normalises the member
    mean; an empty cluster keeps its centroid. ``x`` is detached: the assignment carries no gradient.
    """
    if x.dim() != 2 or x.shape[0] < 1:
        raise ValueError(f"x must be [B, K] with B >= 1, got shape {tuple(x.shape)}")
    xn = F.normalize(x.detach().to(loss_dtype(x).dtype), dim=-1, eps=1e-12)
    b = xn.shape[0]
    perm = torch.randperm(b, generator=generator, device=generator.device).to(xn.device)
    centroids = xn[perm[torch.arange(num_clusters, device=xn.device) % b]]
    for _ in range(iters):
        member = _membership((xn @ centroids.T).argmax(1), num_clusters, xn.dtype)  # [Q, B]
        moved = F.normalize(member @ xn, dim=-1, eps=1e-12)
        centroids = torch.where(member.sum(1)[:, None] > 0, moved, centroids)
    return (xn @ centroids.T).argmax(1)


def cluster_labels(
    zbar: torch.Tensor, num_clusters: int, iters: int = 10, *, generator: torch.Generator
) -> torch.Tensor:
    """Labels ``[B]`` of this rank's rows ``zbar`` ``[B, K]`` from one cosine k-means over every rank's rows.

    The detached rows of all ranks are gathered (rank order) and every rank runs the same k-means with the
    same generator, so the clusters are those of the global batch, whatever the number of GPUs.
    """
    rows = distributed.all_gather_rows(zbar.detach())
    start = distributed.rank() * zbar.shape[0]
    return cosine_kmeans(rows, num_clusters, iters, generator=generator)[start : start + zbar.shape[0]]


def local_ball_reg(
    z: torch.Tensor,
    labels: torch.Tensor,
    directions: torch.Tensor,
    *,
    num_clusters: int,
    min_cluster_size: int = 4,
    num_nodes: int = 17,
    t_max: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``LocaLeReg`` of ``z`` ``[V, B, K]`` for given cluster ``labels`` ``[B]`` and ``directions`` ``[K, M]``.

    Returns the differentiable regularizer and detached diagnostics: ``kmeans_fallback`` (1.0 when no
    cluster had ``min_cluster_size`` members and the whole batch was used), ``clusters_used`` (groups
    averaged, ≥ 1) and ``cluster_stats`` (``[Q]``, each cluster's ``mean_v D_{q,v}``; 0 for dropped ones).
    """
    check_views(z, check_finite=False)
    v, b, k = z.shape
    if labels.shape != (b,):
        raise ValueError(
            f"labels must have shape [{b}] (one per sample of z {tuple(z.shape)}), got {tuple(labels.shape)}"
        )
    if directions.dim() != 2 or directions.shape[0] != k:
        raise ValueError(f"directions must be [{k}, M] for z of shape {tuple(z.shape)}, got {tuple(directions.shape)}")
    zf = loss_dtype(z)
    with torch.autocast(device_type=z.device.type, enabled=False):
        a = F.normalize(directions.to(zf), dim=0, eps=1e-12)
        u = zf @ a  # [V, B, M]
        t, w, _ = cached_epps_pulley_nodes(num_nodes, t_max, zf.dtype, z.device)
        target = uniform_ball_cf(t, k)
        # groups 0..Q-1 are the clusters, group Q the whole batch (the fallback); every sum below is over this
        # rank's rows, then over every rank in one differentiable all-reduce: the global batch's groups
        member = torch.cat([_membership(labels.to(z.device), num_clusters, zf.dtype), zf.new_ones(1, b)])  # [Q+1, B]
        sums = torch.einsum("gb,vbm->vgm", member, u)  # [V, Q+1, M]
        packed = distributed.all_reduce_sum(torch.cat([sums.reshape(-1), member.sum(1)]))
        sizes = packed[-(num_clusters + 1) :]  # [Q+1]: global cluster sizes, then the global batch size
        inv_sizes = 1.0 / sizes.clamp_min(1.0)
        means = packed[: sums.numel()].view_as(sums) * inv_sizes[:, None]  # [V, Q+1, M]
        # each view re-centred in its cluster and in the batch (gradient flows through the means)
        x = (u - means[:, labels]).unsqueeze(-1) * t  # [V, B, M, J]
        x_all = (u - means[:, -1:]).unsqueeze(-1) * t
        cos_sum = torch.cat([torch.einsum("qb,vbmj->vqjm", member[:-1], torch.cos(x)), _row_sum(torch.cos(x_all))], 1)
        sin_sum = torch.cat([torch.einsum("qb,vbmj->vqjm", member[:-1], torch.sin(x)), _row_sum(torch.sin(x_all))], 1)
        local = torch.stack([cos_sum, sin_sum], dim=2)  # [V, Q+1, 2, J, M]
        stats = distributed.all_reduce_sum(local) * inv_sizes[:, None, None, None]  # global cos/sin means
        d = sizes * epps_pulley_from_stats(stats, 1.0, w, target).mean(-1)  # [V, Q+1]
        d_clusters, d_batch = d[:, :-1], d[:, -1]
        keep = (sizes[:-1] >= min_cluster_size).to(zf.dtype)
        fallback = (keep.sum() == 0).to(zf.dtype)
        groups = keep.sum() + fallback
        reg = ((d_clusters * keep).sum() + fallback * d_batch.sum()) / (v * groups)
    info = {
        "kmeans_fallback": fallback.detach(),
        "clusters_used": groups.detach(),
        "cluster_stats": (d_clusters.mean(0) * keep).detach(),
    }
    return reg, info


def localejepa_loss(
    z: torch.Tensor,
    lam: float = 0.1,
    *,
    num_clusters: int = 4,
    min_cluster_size: int = 4,
    directions: torch.Tensor | None = None,
    num_directions: int = 256,
    num_nodes: int = 17,
    t_max: float = 3.0,
    kmeans_iters: int = 10,
    generator: torch.Generator | None = None,
    labels: torch.Tensor | None = None,
    check_finite: bool | None = None,
) -> ObjectiveOutput:
    """LocaLeJEPA: ``(1−λ)·mean (z − z̄)² + λ·LocaLeReg`` on ``z`` ``[V, B, K]`` (module docstring).

    ``generator`` draws the directions (when not given) and the k-means initialisation
    (``levjepa.rng.make_generator("localejepa", 0)`` on ``z``'s device if ``None``); ``labels`` skips k-means.
    Terms: ``pred``, ``localreg``, ``kmeans_fallback``, ``clusters_used``.
    """
    check_views(z, check_finite=check_finite)
    zf = loss_dtype(z)
    if generator is None:
        generator = make_generator("localejepa", 0, device=z.device)
    if directions is None:
        directions = draw_directions(z.shape[-1], num_directions, generator=generator, device=z.device)
    zbar = zf.mean(0)  # [B, K]
    if labels is None:
        labels = cluster_labels(zbar, num_clusters, kmeans_iters, generator=generator)
    pred = (zf - zbar).square().mean()
    reg, info = local_ball_reg(
        zf,
        labels,
        directions,
        num_clusters=num_clusters,
        min_cluster_size=min_cluster_size,
        num_nodes=num_nodes,
        t_max=t_max,
    )
    loss = (1.0 - lam) * pred + lam * reg
    terms = {
        "pred": pred.detach(),
        "localreg": reg.detach(),
        "kmeans_fallback": info["kmeans_fallback"],
        "clusters_used": info["clusters_used"],
    }
    return ObjectiveOutput(loss=loss, terms=terms)
