"""Pretraining: configs, the step, the loop, EMA, optimiser, checkpoints, the run directory and the reporting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from levjepa.train.config import OptimConfig, PretrainConfig, TrainConfig

if TYPE_CHECKING:
    from levjepa.train.report import RunSummary

__all__ = ["OptimConfig", "PretrainConfig", "TrainConfig", "pretrain"]


def pretrain(*args: Any, **kwargs: Any) -> RunSummary:
    """``levjepa.train.loop.pretrain`` (imported lazily): run a pretraining job from a PretrainConfig."""
    from levjepa.train.loop import pretrain as _pretrain

    return _pretrain(*args, **kwargs)
