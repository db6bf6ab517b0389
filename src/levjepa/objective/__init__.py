"""Self-supervised objectives: SIGReg, the LeVJEPA / LeJEPA losses, LocaLeJEPA's regularizer, monitors.

Read in this order: :mod:`.sigreg` (the Epps–Pulley statistic, its distributed reduction and the three
implementations: ``reference``, ``chunked`` in :mod:`._chunked`, ``triton`` in :mod:`.triton_sigreg`),
:mod:`.losses` (LeVJEPA, LeJEPA), :mod:`.localreg` (LocaLeJEPA), :mod:`.diagnostics`, :mod:`.build`
(``build_objective(cfg)``, the module the trainer calls as ``objective(z, step)``) and :mod:`.config`.
"""

from __future__ import annotations

from .build import (
    LeJEPAObjective,
    LeVJEPAObjective,
    LocaLeJEPAObjective,
    Objective,
    build_objective,
    shift_invariant,
)
from .config import DEFAULT_LAMBDA, ObjectiveConfig
from .diagnostics import effective_rank, embedding_diagnostics
from .localreg import cluster_labels, cosine_kmeans, local_ball_reg, localejepa_loss, uniform_ball_cf
from .losses import ObjectiveOutput, lejepa_loss, levjepa_loss
from .sigreg import SIGReg, draw_directions, epps_pulley_nodes, null_value, sigreg

__all__ = [
    "DEFAULT_LAMBDA",
    "LeJEPAObjective",
    "LeVJEPAObjective",
    "LocaLeJEPAObjective",
    "Objective",
    "ObjectiveConfig",
    "ObjectiveOutput",
    "SIGReg",
    "build_objective",
    "cluster_labels",
    "cosine_kmeans",
    "draw_directions",
    "effective_rank",
    "embedding_diagnostics",
    "epps_pulley_nodes",
    "lejepa_loss",
    "levjepa_loss",
    "local_ball_reg",
    "localejepa_loss",
    "null_value",
    "shift_invariant",
    "sigreg",
    "uniform_ball_cf",
]
