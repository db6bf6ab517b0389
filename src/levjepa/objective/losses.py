"""The LeVJEPA and LeJEPA losses on the projections of all views, ``z`` of shape ``[V, B, K]``.

``V`` view slots (global views first), ``B`` clips (per rank), ``K`` projection dims (256).

LeVJEPA (one global view ``z_0`` and ``V−1`` local views, all from the same 16 frames):

    L_inv  = mean over view slots v = 0..V−1, batch b and coordinates k of (z_0 − z_v)²
             (the paper's 1/(V+1) Σ_v ‖z_0 − z_v‖², with the pinned code's ``.pow(2).mean()`` scale:
             averaged over the slots (the v = 0 term is zero), the batch **and** the K coordinates)
    L      = L_inv + λ · SIGReg,       SIGReg = mean over view slots of SIGReg(z_v),   λ = 0.02

LeJEPA (``V_g`` global views first, then ``V_l`` local ones; ``μ_b`` = mean of the global views):

    L_pred = mean over views v, batch b and coordinates k of (μ_b − z_{v,b})²
    L      = (1 − λ) · L_pred + λ · SIGReg,    λ = 0.05 (paper's recommended start; V_g = 2, V_l = 8)

SIGReg is computed per view slot (each slot's B clips form one population, statistics over the global
batch when distributed) with the same directions for every slot, then averaged; see
:mod:`levjepa.objective.sigreg`. Every loss is computed in float32 (float64 for float64 input), also under
bf16 autocast. No view is detached: gradients reach every branch.

Each function returns an :class:`ObjectiveOutput`: the differentiable total and detached 0-dim terms for
logging (``invariance`` or ``pred``, ``sigreg``, ``sigreg/view{v}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sigreg import Impl, check_embeddings, sigreg

__all__ = ["ObjectiveOutput", "check_views", "lejepa_loss", "levjepa_loss", "loss_dtype", "per_view_sigreg"]


@dataclass
class ObjectiveOutput:
    """``loss``: scalar, differentiable. ``terms``: detached 0-dim tensors for logging."""

    loss: torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


def loss_dtype(z: torch.Tensor) -> torch.Tensor:
    """``z`` in float32, or float64 if it is float64 (losses never run in bf16/fp16)."""
    return z.double() if z.dtype == torch.float64 else z.float()


def check_views(z: torch.Tensor, name: str = "z", *, min_views: int = 1, check_finite: bool | None = None) -> None:
    """``z`` must be a floating ``[V, B, K]`` tensor with ``V >= min_views`` and ``B >= 2``."""
    if isinstance(z, torch.Tensor) and z.dim() != 3:
        raise ValueError(f"{name} must have shape [V, B, K] (views, batch, projection dim), got {tuple(z.shape)}")
    check_embeddings(z, name, check_finite=check_finite)
    if z.shape[0] < min_views:
        raise ValueError(f"{name} has {z.shape[0]} view slots (shape {tuple(z.shape)}); need at least {min_views}")


def per_view_sigreg(
    z: torch.Tensor,
    directions: torch.Tensor | None,
    *,
    num_directions: int,
    num_nodes: int,
    t_max: float,
    generator: torch.Generator | None,
    impl: Impl,
    check_finite: bool | None,
) -> torch.Tensor:
    """SIGReg of each view slot of ``z`` ``[V, B, K]`` (mean over directions): ``[V]``."""
    per_direction = sigreg(
        z,
        directions,
        num_directions=num_directions,
        num_nodes=num_nodes,
        t_max=t_max,
        generator=generator,
        reduction="none",
        impl=impl,
        check_finite=check_finite,
    )
    return per_direction.mean(-1)


def _sigreg_terms(per_view: torch.Tensor) -> dict[str, torch.Tensor]:
    detached = per_view.detach()
    terms = {"sigreg": detached.mean()}
    terms.update({f"sigreg/view{v}": detached[v] for v in range(detached.shape[0])})
    return terms


def levjepa_loss(
    z: torch.Tensor,
    lam: float = 0.02,
    *,
    directions: torch.Tensor | None = None,
    num_directions: int = 1024,
    num_nodes: int = 17,
    t_max: float = 3.0,
    generator: torch.Generator | None = None,
    impl: Impl = "auto",
    check_finite: bool | None = None,
) -> ObjectiveOutput:
    """LeVJEPA: ``L_inv + λ·SIGReg`` on ``z`` ``[V+1, B, K]`` (``z[0]`` the global view); module doc."""
    check_views(z, check_finite=check_finite)
    zf = loss_dtype(z)
    invariance = (zf[:1] - zf).square().mean()
    per_view = per_view_sigreg(
        zf,
        directions,
        num_directions=num_directions,
        num_nodes=num_nodes,
        t_max=t_max,
        generator=generator,
        impl=impl,
        check_finite=check_finite,
    )
    reg = per_view.mean()
    loss = invariance + lam * reg
    return ObjectiveOutput(loss=loss, terms={"invariance": invariance.detach(), **_sigreg_terms(per_view)})


def lejepa_loss(
    z: torch.Tensor,
    lam: float = 0.05,
    *,
    num_global_views: int = 1,
    directions: torch.Tensor | None = None,
    num_directions: int = 1024,
    num_nodes: int = 17,
    t_max: float = 3.0,
    generator: torch.Generator | None = None,
    impl: Impl = "auto",
    check_finite: bool | None = None,
) -> ObjectiveOutput:
    """LeJEPA: ``(1−λ)·L_pred + λ·SIGReg`` on ``z`` ``[V, B, K]``, ``z[:num_global_views]`` global."""
    check_views(z, check_finite=check_finite)
    if not 1 <= num_global_views <= z.shape[0]:
        raise ValueError(
            f"num_global_views={num_global_views} but z has {z.shape[0]} view slots (shape {tuple(z.shape)})"
        )
    zf = loss_dtype(z)
    mu = zf[:num_global_views].mean(0, keepdim=True)
    pred = (mu - zf).square().mean()
    per_view = per_view_sigreg(
        zf,
        directions,
        num_directions=num_directions,
        num_nodes=num_nodes,
        t_max=t_max,
        generator=generator,
        impl=impl,
        check_finite=check_finite,
    )
    reg = per_view.mean()
    loss = (1.0 - lam) * pred + lam * reg
    return ObjectiveOutput(loss=loss, terms={"pred": pred.detach(), **_sigreg_terms(per_view)})
