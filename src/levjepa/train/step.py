"""One optimizer step: views → encoder (dropping on) → projector → objective → AdamW.

``train_step`` is module-level and free of loop state so it can be tested alone (STYLE 5). It runs
``len(micro_batches)`` forward/backward passes (gradient accumulation; DDP synchronises gradients on the
last one only), clips the global gradient norm, and steps the fused AdamW — which skips the update on
the device when the loss or the gradient norm is not finite. Nothing here waits for the device: the
returned loss, terms, norm and skip flag are device tensors the loop reads on logging steps.

Precision: under ``autocast_dtype=torch.bfloat16`` the encoder and projector run in bf16; the
projections are cast to float32 before the objective, whose characteristic-function statistics are
float32 anyway.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Pretrainer", "StepOutput", "train_step"]


class Pretrainer(nn.Module):
    """Encoder + projector: view groups → projections ``z`` of shape ``[V, B, K]`` (global views first).

    The projector's BatchNorm normalises the CLS embeddings of all ``V·B`` views of the (per-rank)
    micro-batch together, in one call ([choice]; under DDP the statistics cover the global micro-batch).
    """

    def __init__(self, encoder: nn.Module, projector: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.projector = projector

    def forward(self, views: Sequence[torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        cls = self.encoder.forward_views(*views, generator=generator)  # [V, B, D]
        v, b, d = cls.shape
        return self.projector(cls.reshape(v * b, d)).reshape(v, b, -1)


@dataclass
class StepOutput:
    loss: torch.Tensor  # mean over micro-batches, detached
    terms: dict[str, torch.Tensor]  # objective terms, mean over micro-batches, detached
    grad_norm: torch.Tensor  # global gradient norm before clipping
    skipped: torch.Tensor  # bool: the update was skipped (non-finite loss or gradient)
    z: torch.Tensor  # projections of the last micro-batch, detached (for label-free monitors)


def train_step(
    model: nn.Module,
    objective: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Sequence[torch.Tensor]],
    generators: Sequence[torch.Generator],
    *,
    step: int,
    lr: float,
    grad_clip: float | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> StepOutput:
    """Accumulate gradients over ``micro_batches`` (each a list of float view groups) and step once."""
    if len(micro_batches) != len(generators) or not micro_batches:
        raise ValueError(f"need one generator per micro-batch, got {len(micro_batches)} and {len(generators)}")
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    n = len(micro_batches)
    loss_sum: torch.Tensor | None = None
    terms_sum: dict[str, torch.Tensor] = {}
    z = torch.empty(0)
    for i, (views, gen) in enumerate(zip(micro_batches, generators, strict=True)):
        last = i == n - 1
        no_sync = model.no_sync() if (not last and hasattr(model, "no_sync")) else contextlib.nullcontext()
        device_type = views[0].device.type
        with no_sync:
            with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                z = model(views, gen)
            out = objective(z.float(), step)
            (out.loss / n).backward()
        loss = out.loss.detach()
        loss_sum = loss if loss_sum is None else loss_sum + loss
        for key, value in out.terms.items():
            terms_sum[key] = terms_sum[key] + value if key in terms_sum else value
    assert loss_sum is not None
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=grad_clip if grad_clip else math.inf, foreach=True)
    skipped = ~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm))
    # fused AdamW reads these two attributes and skips the update on the device when found_inf is 1
    optimizer.grad_scale = None  # type: ignore[attr-defined]
    optimizer.found_inf = skipped.to(device=params[0].device, dtype=torch.float32)  # type: ignore[attr-defined]
    optimizer.step()
    return StepOutput(
        loss=loss_sum / n,
        terms={k: v / n for k, v in terms_sum.items()},
        grad_norm=grad_norm.detach(),
        skipped=skipped,
        z=z.detach(),
    )
