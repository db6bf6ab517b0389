"""AdamW with decoupled weight decay, and the one learning-rate schedule.

Weight decay (0.04 by default) applies to every parameter but those :func:`no_decay_biases_norms` keeps out —
biases, norm parameters and any other 1-D parameter — as the official LeVJEPA code's ``main.py`` does
(``"bias" in name or "norm" in name or param.ndim == 1``): the CLS token (``[1, 1, D]``) is decayed there and
here. Fine-tuning keeps the CLS token and the head's query out as well (``levjepa.train.finetune_recipe``).

:func:`warmup_cosine` is the schedule of every loop of levjepa — pretraining (:func:`lr_at`), fine-tuning and
the probe trainer: a plain function of the optimizer step, so resuming at step ``s`` needs no schedule state:
linear from ``start`` at step 0 to ``peak`` at step ``warmup``, then ``peak`` (flat, the official pretraining
code) or a cosine decay to ``final`` at step ``total``.

AdamW is the fused implementation (CPU and CUDA): a non-finite step is skipped *on the device* by
handing it a ``found_inf`` flag, so the loop never waits for the GPU to decide whether to step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from levjepa.train.config import OptimConfig

__all__ = [
    "build_optimizer",
    "lr_at",
    "no_decay_biases_norms",
    "param_groups",
    "step_unless_nonfinite",
    "warmup_cosine",
]


def no_decay_biases_norms(name: str, param: torch.Tensor) -> bool:
    """Whether ``param`` stays out of weight decay: a bias, a norm parameter or any other 1-D parameter (the
    official code's rule; the CLS token is decayed)."""
    lower = name.lower()
    return param.ndim < 2 or "bias" in lower or "norm" in lower


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if no_decay_biases_norms(name, p) else decay).append(p)
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


def warmup_cosine(
    step: int, *, peak: float, total: int, warmup: int, start: float = 0.0, final: float = 0.0, flat: bool = False
) -> float:
    """The value at optimizer step ``step`` (0-based) of the one schedule (module doc): linear from ``start`` at
    step 0 to ``peak`` at step ``warmup``, then ``peak`` (``flat``) or a cosine from ``peak`` to ``final`` at
    step ``total`` (and ``final`` after it)."""
    if step < warmup:
        return start + (peak - start) * step / warmup
    if flat:
        return peak
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return final + 0.5 * (peak - final) * (1.0 + math.cos(math.pi * progress))


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Pretraining's learning rate for optimizer step ``step`` (0-based): :func:`warmup_cosine` of ``cfg``."""
    return warmup_cosine(
        step,
        peak=cfg.lr,
        total=total_steps,
        warmup=cfg.warmup_steps,
        start=cfg.start_lr,
        final=cfg.final_lr,
        flat=cfg.schedule == "flat",
    )


def step_unless_nonfinite(
    optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_norm: torch.Tensor
) -> torch.Tensor:
    """Step the fused AdamW ``optimizer`` unless ``loss`` or ``grad_norm`` is not finite, decided on the device:
    fused AdamW reads ``found_inf`` and skips the update there, so the host never waits. Returns the skip flag
    (a device bool) for ``levjepa.train.lifecycle.Lifecycle.record``."""
    skipped = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
    device = next(p.device for g in optimizer.param_groups for p in g["params"])
    optimizer.grad_scale = None  # type: ignore[attr-defined]
    optimizer.found_inf = skipped.to(device=device, dtype=torch.float32)  # type: ignore[attr-defined]
    optimizer.step()
    return skipped
