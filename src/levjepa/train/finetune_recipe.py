"""The pieces of the fine-tuning recipe (VideoMAE, Tong et al. 2022; BEiT's layer-wise decay, Bao et al. 2022):
layer-wise learning rates, the schedule, drop-path, and label-smoothed mixup targets.

* **Layer-wise lr decay** (:func:`param_groups`): layer ``l`` of ``L + 1`` (0: the patch embedding and CLS,
  ``i + 1``: block ``i``, ``L + 1``: the final norm and the head) trains at ``lr · decay^(L + 1 − l)``, so
  the layers near the input move least. No weight decay on what :func:`no_decay_biases_norms_tokens` keeps
  out: biases, norms, the CLS token and the head's query (timm / VideoMAE's ``no_weight_decay``).
* **Schedule** (:func:`lr_at`): levjepa's one schedule (``levjepa.train.optim.warmup_cosine``), linear from 0
  at step 0 to ``lr`` at ``warmup_steps`` (VideoMAE's warm-up starts at 0), then cosine to ``min_lr``.
* **Drop-path** (:class:`DropPath`): stochastic depth per sample, rate rising linearly with depth to
  ``drop_path`` at the last block. The encoder's blocks (``levjepa.model.vit``, left untouched) are wrapped
  from outside by a forward hook: with probability ``rate`` a sample's block update ``f(x) − x`` is dropped,
  otherwise scaled by ``1 / (1 − rate)`` — the block as one residual branch (timm drops its two branches
  independently). Draws come from a generator the loop seeds per micro-batch.
* **Targets** (:func:`soft_targets`): one-hot smoothed by ``label_smoothing``; with mixup (``alpha > 0``) a
  batch is mixed with its reverse, ``x = λ x + (1 − λ) x.flip(0)``, targets alike, ``λ ~ Beta(α, α)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from levjepa.model.classifier import VideoClassifier
from levjepa.rng import derive_seed
from levjepa.train.optim import no_decay_biases_norms, warmup_cosine

__all__ = [
    "DropPath",
    "Schedule",
    "StepRecipe",
    "layer_id",
    "lr_at",
    "mix",
    "no_decay_biases_norms_tokens",
    "param_groups",
    "soft_targets",
]


@dataclass(frozen=True)
class Schedule:
    """The learning rate over the run: ``lr`` after ``warmup_steps`` of ``steps``, cosine down to ``min_lr``."""

    lr: float
    min_lr: float
    warmup_steps: int
    steps: int


@dataclass(frozen=True)
class StepRecipe:
    """What one training step needs of the recipe: its schedule, the seed its draws are keyed by, the targets'
    label smoothing and mixup, and the fraction of tokens the encoder keeps."""

    schedule: Schedule
    seed: int
    label_smoothing: float
    mixup: float
    keep_ratio: float


_BLOCK = re.compile(r"^encoder\.blocks\.(\d+)\.")


def layer_id(name: str, depth: int) -> int:
    """0 for the embedding and CLS, ``i + 1`` for block ``i``, ``depth + 1`` for the final norm and the head."""
    m = _BLOCK.match(name)
    if m:
        return int(m.group(1)) + 1
    if name.startswith("encoder.") and not name.startswith("encoder.norm"):
        return 0
    return depth + 1


def no_decay_biases_norms_tokens(name: str, p: Tensor) -> bool:
    """Whether ``p`` stays out of fine-tuning's weight decay: a bias, a norm parameter or any 1-D parameter
    (pretraining's rule, ``levjepa.train.optim.no_decay_biases_norms``) and the CLS token and the attentive
    head's query."""
    return no_decay_biases_norms(name, p) or name.endswith(("cls_token", "query"))


def param_groups(model: VideoClassifier, layer_decay: float, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups, one per (layer, decay or not), each with its ``lr_scale`` (see the module doc)."""
    depth = len(model.encoder.blocks)
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        lid, nd = layer_id(name, depth), no_decay_biases_norms_tokens(name, p)
        g = groups.setdefault(
            (lid, nd),
            {
                "params": [],
                "lr_scale": layer_decay ** (depth + 1 - lid),
                "weight_decay": 0.0 if nd else weight_decay,
            },
        )
        g["params"].append(p)
    return [groups[k] for k in sorted(groups)]


def lr_at(step: int, s: Schedule) -> float:
    """The base learning rate of optimizer step ``step`` (0-based): warm-up from 0, then cosine to ``min_lr``."""
    return warmup_cosine(step, peak=s.lr, total=s.steps, warmup=s.warmup_steps, final=s.min_lr)


class DropPath:
    """Stochastic depth on every block of ``model.encoder`` through forward hooks (see the module doc)."""

    def __init__(self, model: VideoClassifier, rate: float) -> None:
        blocks = list(model.encoder.blocks)
        self.rates = [rate * i / max(1, len(blocks) - 1) for i in range(len(blocks))]
        self.generator: torch.Generator | None = None  # set per micro-batch; None: nothing dropped
        self.handles = [b.register_forward_hook(self._hook(r)) for b, r in zip(blocks, self.rates, strict=True)]

    def _hook(self, rate: float) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor | None:
            if self.generator is None or rate == 0 or not module.training:
                return None
            x = args[0]  # [B, L, D]: one draw per sample
            keep = torch.rand(x.shape[0], generator=self.generator) >= rate
            scale = keep.to(x.device, x.dtype)[:, None, None] / (1 - rate)
            return x + (out - x) * scale

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def soft_targets(labels: Tensor, num_classes: int, smoothing: float) -> Tensor:
    """One-hot ``[B, C]`` smoothed: ``1 − ε + ε / C`` on the label, ``ε / C`` elsewhere."""
    y = torch.full((len(labels), num_classes), smoothing / num_classes, device=labels.device)
    return y.scatter_(1, labels[:, None], 1 - smoothing + smoothing / num_classes)


def mix(x: Tensor, y: Tensor, alpha: float, *parts: object) -> tuple[Tensor, Tensor]:
    """Mixup of a batch with its reverse (``λ ~ Beta(α, α)`` drawn from ``derive_seed(*parts)``); α = 0: as is."""
    if alpha <= 0 or len(x) < 2:
        return x, y
    lam = float(np.random.default_rng(derive_seed(*parts)).beta(alpha, alpha))
    return lam * x + (1 - lam) * x.flip(0), lam * y + (1 - lam) * y.flip(0)
