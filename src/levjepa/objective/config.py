"""``ObjectiveConfig``: which self-supervised objective, its weight and its statistic's settings.

* ``levjepa`` (default): ``L = L_inv + λ·SIGReg``, ``λ = 0.02`` (the LeVJEPA paper, fixed in all its runs).
* ``lejepa``: ``L = (1−λ)·L_pred + λ·SIGReg``, ``λ = 0.05`` (LeJEPA's recommended start).
* ``localejepa``: ``L = (1−λ)·L_pred + λ·LocaLeReg``, ``λ = 0.1`` (LocaLeJEPA's Table 2 setting).

``lam=None`` picks the objective's default (``ObjectiveConfig.lam_value``). SIGReg uses ``num_directions``
slices (1024, LeVJEPA) and ``num_nodes`` nodes on ``[0, t_max]`` (17 on [0, 3]); the LocaLeJEPA
regularizer uses ``local_directions`` (256) with the same nodes. Directions at step ``s`` come from a
generator seeded by ``(seed, s)``.

``kmeans_iters = 10`` ``[choice]``: the paper fixes cosine k-means but not its iteration count; ten Lloyd
iterations from a seeded random initialisation settle Q = 4 clusters on batches of a few hundred samples
(the cost, ``B·Q·K`` per iteration, is negligible next to the encoder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from levjepa.config import MAX_SEED, check, check_range

__all__ = ["DEFAULT_LAMBDA", "ObjectiveConfig"]

DEFAULT_LAMBDA = {"levjepa": 0.02, "lejepa": 0.05, "localejepa": 0.1}
_NAMES = tuple(DEFAULT_LAMBDA)
_IMPLS = ("auto", "reference", "chunked", "triton")


@dataclass(frozen=True)
class ObjectiveConfig:
    name: Literal["levjepa", "lejepa", "localejepa"] = "levjepa"
    lam: float | None = None  # None -> 0.02 (levjepa), 0.05 (lejepa), 0.1 (localejepa)
    num_directions: int = 1024  # SIGReg slices per step
    num_nodes: int = 17
    t_max: float = 3.0
    num_global_views: int = 1  # z[:num_global_views] are the global views (LeJEPA's mu uses them)
    num_clusters: int = 4  # LocaLeJEPA Q
    min_cluster_size: int = 4
    local_directions: int = 256  # LocaLeJEPA slices
    kmeans_iters: int = 10
    seed: int = 0  # directions at step s come from a generator seeded by (seed, s)
    impl: Literal["auto", "reference", "chunked", "triton"] = "auto"  # auto: triton on CUDA if importable

    def __post_init__(self) -> None:
        check(self.name in _NAMES, f"objective.name={self.name!r}: valid choices are {', '.join(_NAMES)}")
        check(self.impl in _IMPLS, f"objective.impl={self.impl!r}: valid choices are {', '.join(_IMPLS)}")
        if self.lam is not None:
            if self.name == "levjepa":
                check(self.lam >= 0.0, f"objective.lam={self.lam}: must be >= 0 (or None for 0.02)")
            else:
                check(
                    0.0 <= self.lam <= 1.0,
                    f"objective.lam={self.lam}: {self.name} weighs (1-lam)·pred + lam·reg, so lam must be in "
                    f"[0, 1] (or None for {DEFAULT_LAMBDA[self.name]})",
                )
        check(
            1 <= self.num_directions <= 1 << 20, f"objective.num_directions={self.num_directions}: must be 1..1048576"
        )
        check(2 <= self.num_nodes <= 4096, f"objective.num_nodes={self.num_nodes}: must be 2..4096")
        check(self.t_max > 0.0, f"objective.t_max={self.t_max}: must be > 0")
        check(self.num_global_views >= 1, f"objective.num_global_views={self.num_global_views}: must be >= 1")
        check(
            self.name != "levjepa" or self.num_global_views == 1,
            f"objective.num_global_views={self.num_global_views}: the LeVJEPA objective compares every view with "
            "its one global view z_0 (SPEC §1); for several global views use objective.name=lejepa, whose "
            "predictions target their mean",
        )
        check(self.num_clusters >= 1, f"objective.num_clusters={self.num_clusters}: must be >= 1")
        check(self.min_cluster_size >= 2, f"objective.min_cluster_size={self.min_cluster_size}: must be >= 2")
        check(
            1 <= self.local_directions <= 1 << 20,
            f"objective.local_directions={self.local_directions}: must be 1..1048576",
        )
        check(self.kmeans_iters >= 1, f"objective.kmeans_iters={self.kmeans_iters}: must be >= 1")
        check_range("objective.seed", self.seed, 0, MAX_SEED)

    @property
    def lam_value(self) -> float:
        """``lam``, or the objective's default weight when ``lam`` is None."""
        return DEFAULT_LAMBDA[self.name] if self.lam is None else float(self.lam)
