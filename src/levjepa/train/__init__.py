"""Pretraining: configs, the step, the loop, EMA, optimiser, checkpoints and the run directory."""

from levjepa.train.config import OptimConfig, PretrainConfig, TrainConfig

__all__ = ["OptimConfig", "PretrainConfig", "TrainConfig", "pretrain"]


def pretrain(*args, **kwargs):
    """``levjepa.train.loop.pretrain`` (imported lazily): run a pretraining job from a PretrainConfig."""
    from levjepa.train.loop import pretrain as _pretrain

    return _pretrain(*args, **kwargs)
