"""``build_objective(cfg)``: the training objective as a module ``(z [V, B, K], step) -> ObjectiveOutput``.

Each module draws that step's random directions from a generator seeded by ``(cfg.seed, step)`` on
``z``'s device: the same directions on every rank without communication, fresh every step, and the step is
a Python int, so nothing synchronises with the device. LocaLeJEPA seeds its k-means initialisation the same
way (a different purpose string, so its stream is independent of the directions'). The modules hold no
parameters and no state; the formulas live in :mod:`levjepa.objective.losses` and
:mod:`levjepa.objective.localreg`.

``build_objective(cfg, check_finite=...)`` says whether the module checks its input values: ``None`` (the
default) on CPU tensors only, where it is free; ``True`` on accelerators too (synchronises); ``False`` never
(the trainer: a non-finite batch skips its step instead of raising). It is fixed at construction
(``module.check_finite`` reads it).

``shift_invariant(cfg)`` says whether the objective is unchanged when every projection moves by one constant
vector (LocaLeJEPA: both its terms re-centre ``z``). Then the projector's output bias gets an exactly zero
gradient, and the trainer freezes it (``levjepa.train.loop.build_models``) rather than let AdamW step it on
rounding noise; SIGReg's ``N(0, I)`` target is not shift-invariant, so LeVJEPA and LeJEPA train it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from levjepa.rng import make_generator

from .config import ObjectiveConfig
from .localreg import cluster_labels, localejepa_loss
from .losses import ObjectiveOutput, check_views, lejepa_loss, levjepa_loss
from .sigreg import draw_directions

__all__ = [
    "LeJEPAObjective",
    "LeVJEPAObjective",
    "LocaLeJEPAObjective",
    "Objective",
    "build_objective",
    "shift_invariant",
]


class Objective(nn.Module):
    """The base of the objectives: ``module(z [V, B, K], step) -> ObjectiveOutput`` with that step's seeded
    directions (see the module doc).

    A call is two parts: :meth:`draw`, the step's random tensors (directions, LocaLeJEPA's clusters), drawn
    eagerly from seeded generators; and :meth:`terms`, the loss and its logged terms as a function of ``z`` and
    those tensors alone — no generator, no host read — which :meth:`compile_terms` compiles as one graph (with
    SIGReg's statistics inside it as one operator: ``levjepa.objective.sigreg``)."""

    shift_invariant = False  # whether z -> z + c (one constant vector) leaves the loss unchanged

    def __init__(self, cfg: ObjectiveConfig, *, check_finite: bool | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self._check_finite = check_finite
        self._compiled_terms: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]] | None = None

    @property
    def check_finite(self) -> bool | None:
        """Whether input values are checked (module docstring); set at construction."""
        return self._check_finite

    def generator(self, step: int, device: torch.device, purpose: str) -> torch.Generator:
        return make_generator(purpose, self.cfg.seed, step, device=device)  # derive_seed(purpose, seed, step)

    def directions(self, dim: int, step: int, device: torch.device, num: int) -> torch.Tensor:
        """The ``[dim, num]`` unit directions of ``step`` (float32, on ``device``)."""
        return draw_directions(dim, num, generator=self.generator(step, device, "sigreg"), device=device)

    def draw(self, z: torch.Tensor, step: int) -> tuple[torch.Tensor, ...]:
        """The random tensors :meth:`terms` takes at ``step`` (SIGReg's directions)."""
        return (self.directions(z.shape[-1], step, z.device, self.cfg.num_directions),)

    def terms(self, z: torch.Tensor, *drawn: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, detached terms)`` of ``z`` with the tensors :meth:`draw` made."""
        raise NotImplementedError

    def _sigreg_args(self, directions: torch.Tensor) -> dict[str, Any]:
        """SIGReg's settings for LeVJEPA's and LeJEPA's losses: the step's directions, the config's nodes and
        implementation, no value check (done once, in :meth:`forward`)."""
        cfg = self.cfg
        return dict(directions=directions, num_nodes=cfg.num_nodes, t_max=cfg.t_max, impl=cfg.impl, check_finite=False)

    def compile_terms(self, **kwargs: Any) -> Objective:
        """``torch.compile`` :meth:`terms` (``kwargs`` to it) for every later call; returns ``self``."""
        self._compiled_terms = torch.compile(self.terms, **kwargs)
        return self

    def forward(self, z: torch.Tensor, step: int) -> ObjectiveOutput:
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"step must be a Python int (the training step), got {type(step).__name__}")
        check_views(z, check_finite=self.check_finite)
        loss, terms = (self._compiled_terms or self.terms)(z, *self.draw(z, step))
        return ObjectiveOutput(loss=loss, terms=terms)

    def extra_repr(self) -> str:
        return f"lam={self.cfg.lam_value}, cfg={self.cfg}"


class LeVJEPAObjective(Objective):
    """``L_inv + λ·SIGReg`` (λ = 0.02) on ``z`` ``[V+1, B, K]``, ``z[0]`` the global view."""

    def terms(self, z: torch.Tensor, *drawn: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = levjepa_loss(z, self.cfg.lam_value, **self._sigreg_args(*drawn))
        return out.loss, out.terms


class LeJEPAObjective(Objective):
    """``(1−λ)·L_pred + λ·SIGReg`` (λ = 0.05), ``μ`` = mean of the first ``num_global_views`` views."""

    def terms(self, z: torch.Tensor, *drawn: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.cfg
        out = lejepa_loss(z, cfg.lam_value, num_global_views=cfg.num_global_views, **self._sigreg_args(*drawn))
        return out.loss, out.terms


class LocaLeJEPAObjective(Objective):
    """``(1−λ)·mean (z − z̄)² + λ·LocaLeReg`` (λ = 0.1), cosine k-means with Q = ``num_clusters``.

    Shift-invariant: ``z − z̄`` and the per-cluster re-centring both remove a constant shift of ``z``. Its
    cluster labels are drawn with the directions (k-means on the detached ``z̄``, seeded by the step)."""

    shift_invariant = True

    def draw(self, z: torch.Tensor, step: int) -> tuple[torch.Tensor, ...]:
        cfg = self.cfg
        zbar = z.detach().mean(0)
        labels = cluster_labels(
            zbar, cfg.num_clusters, cfg.kmeans_iters, generator=self.generator(step, z.device, "kmeans")
        )
        return self.directions(z.shape[-1], step, z.device, cfg.local_directions), labels

    def terms(self, z: torch.Tensor, *drawn: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.cfg
        directions, labels = drawn
        out = localejepa_loss(
            z,
            cfg.lam_value,
            num_clusters=cfg.num_clusters,
            min_cluster_size=cfg.min_cluster_size,
            directions=directions,
            num_nodes=cfg.num_nodes,
            t_max=cfg.t_max,
            labels=labels,
            check_finite=False,
        )
        return out.loss, out.terms


_OBJECTIVES: dict[str, type[Objective]] = {
    "levjepa": LeVJEPAObjective,
    "lejepa": LeJEPAObjective,
    "localejepa": LocaLeJEPAObjective,
}


def shift_invariant(cfg: ObjectiveConfig) -> bool:
    """Whether the objective named by ``cfg.name`` ignores one constant shift of every projection."""
    return _OBJECTIVES[cfg.name].shift_invariant


def build_objective(cfg: ObjectiveConfig, *, check_finite: bool | None = None) -> Objective:
    """The objective module named by ``cfg.name``; call it as ``module(z, step) -> ObjectiveOutput``.
    ``check_finite``: whether it checks its input values (module docstring)."""
    if not isinstance(cfg, ObjectiveConfig):
        raise ValueError(f"build_objective expects an ObjectiveConfig, got {type(cfg).__name__}")
    return _OBJECTIVES[cfg.name](cfg, check_finite=check_finite)
