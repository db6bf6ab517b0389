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
from typing import Any

import torch

from .sigreg import Impl, check_embeddings, sigreg

__all__ = ["ObjectiveOutput", "check_views", "lejepa_loss", "levjepa_loss", "loss_dtype"]


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


def _predict_and_regularize(
    z: torch.Tensor, pred_name: str, pred_weight: float, lam: float, num_global_views: int, **sigreg_args: Any
) -> ObjectiveOutput:
    """``pred_weight · mean (μ − z)² + λ · SIGReg`` with ``μ`` the mean of ``z[:num_global_views]`` (both losses of
    the module doc; ``sigreg_args`` go to :func:`levjepa.objective.sigreg.sigreg`), its prediction term logged
    as ``pred_name``."""
    check_views(z, check_finite=sigreg_args["check_finite"])
    if not 1 <= num_global_views <= z.shape[0]:
        raise ValueError(
            f"num_global_views={num_global_views} but z has {z.shape[0]} view slots (shape {tuple(z.shape)})"
        )
    zf = loss_dtype(z)
    pred = (zf[:num_global_views].mean(0, keepdim=True) - zf).square().mean()
    per_view = sigreg(zf, reduction="none", **sigreg_args).mean(-1)  # [V]: each slot's mean over directions
    detached = per_view.detach()
    terms = {pred_name: pred.detach(), "sigreg": detached.mean()}
    terms.update({f"sigreg/view{v}": detached[v] for v in range(detached.shape[0])})
    return ObjectiveOutput(loss=pred_weight * pred + lam * per_view.mean(), terms=terms)


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
    return _predict_and_regularize(
        z,
        "invariance",
        1.0,
        lam,
        1,
        directions=directions,
        num_directions=num_directions,
        num_nodes=num_nodes,
        t_max=t_max,
        generator=generator,
        impl=impl,
        check_finite=check_finite,
    )


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
    return _predict_and_regularize(
        z,
        "pred",
        1.0 - lam,
        lam,
        num_global_views,
        directions=directions,
        num_directions=num_directions,
        num_nodes=num_nodes,
        t_max=t_max,
        generator=generator,
        impl=impl,
        check_finite=check_finite,
    )
