"""End-to-end fine-tuning of an encoder and a classification head (``levjepa finetune``).

Read ``loop.py`` first (the recipe and the run directory), then ``recipe.py`` (layer-wise learning rates,
the schedule, drop-path, mixup and label smoothing), ``clips.py`` (the training stream and its
augmentation) and ``config.py`` (:class:`FinetuneConfig` and what ``--resume`` may change). The classifier
it trains is ``levjepa.model.classifier``; ``levjepa classify`` runs the result.
"""

from __future__ import annotations

from levjepa.finetune.config import FinetuneConfig
from levjepa.finetune.loop import FinetuneResult, finetune

__all__ = ["FinetuneConfig", "FinetuneResult", "finetune"]
