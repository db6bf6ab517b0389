"""AdamW with decoupled weight decay on weight matrices only, and its learning-rate schedule.

Weight decay (0.04 by default) applies to parameters with two or more dimensions (linear and patch
embedding weights); biases, norm scales and the CLS token (1-D or ``cls`` in the name) are excluded, as in
the official LeVJEPA code. The schedule is a plain function of the optimizer step, so resuming at step
``s`` needs no schedule state: linear warm-up from ``start_lr`` to ``lr`` over ``warmup_steps``, then
``lr`` (flat, the official code) or a cosine decay to ``final_lr`` at the last step.

AdamW is the fused implementation (CPU and CUDA): a non-finite step is skipped *on the device* by
handing it a ``found_inf`` flag, so the loop never waits for the GPU to decide whether to step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from levjepa.train.config import OptimConfig

__all__ = ["param_groups", "build_optimizer", "lr_at"]


def _no_decay(name: str, param: nn.Parameter) -> bool:
    return param.ndim < 2 or "cls" in name.split(".")[-1] or name.endswith(".bias")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if _no_decay(name, p) else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.start_lr if cfg.warmup_steps > 0 else cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        fused=True,
    )


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based)."""
    if step < cfg.warmup_steps:
        return cfg.start_lr + (cfg.lr - cfg.start_lr) * step / cfg.warmup_steps
    if cfg.schedule == "flat":
        return cfg.lr
    span = max(total_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.final_lr + 0.5 * (cfg.lr - cfg.final_lr) * (1.0 + math.cos(math.pi * progress))
