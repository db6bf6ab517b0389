"""End-to-end fine-tuning of an encoder and a classification head (``levjepa finetune``).

Read ``loop.py`` first (the recipe's loop over the run directory), then the services it calls: ``data.py``
(the labelled task, a rank's training stream, the evaluation of a split), ``classifier.py`` (where the encoder
and the head start, and ``best/``), ``recipe.py`` (layer-wise learning rates, the schedule, drop-path, mixup
and label smoothing), ``clips.py`` (which clip each position of the stream is, and its augmentation) and
``config.py`` (:class:`FinetuneConfig`, the part of it each service receives, and what ``--resume`` may
change). The classifier it trains is ``levjepa.model.classifier``; ``levjepa classify`` runs the result.
"""

from __future__ import annotations

from levjepa.finetune.config import FinetuneConfig
from levjepa.finetune.loop import FinetuneResult, finetune

__all__ = ["FinetuneConfig", "FinetuneResult", "finetune"]
