"""End-to-end fine-tuning of an encoder and a classification head (``levjepa finetune``).

Read ``loop.py`` first (the recipe's loop over the run directory), then ``config.py`` (:class:`FinetuneConfig`,
the part of it each service receives, and what ``--resume`` may change). The services the loop calls live on
their own floors: a rank's stream of augmented training clips in ``levjepa.data.labelled_stream``, the recipe's
pieces (layer-wise learning rates, the schedule, drop-path, mixup and label smoothing) in
``levjepa.train.finetune_recipe``, where the encoder and the head start and ``best/`` in
``levjepa.formats.writing.finetuned``, the labelled splits and a split's accuracy in ``levjepa.eval.labelled`` and
``levjepa.eval.predict``. The classifier it trains is ``levjepa.model.classifier``; ``levjepa classify`` runs
the result."""

from __future__ import annotations

from levjepa.finetune.config import FinetuneConfig
from levjepa.finetune.loop import FinetuneResult, finetune

__all__ = ["FinetuneConfig", "FinetuneResult", "finetune"]
