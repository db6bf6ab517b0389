"""The Polyak / EMA evaluation copy of the encoder.

``θ̄ ← β θ̄ + (1 − β) θ`` with ``β = 0.9999``, applied once every ``every = 32`` optimizer steps (paper,
appendix B: the decay is per *update*, not per optimizer step). The copy is kept in float32 whatever the
training precision, starts equal to the initial weights, is never used by the loss, and is saved beside
the online weights; evaluation and extraction choose either. Buffers are copied, not averaged.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["EMA"]


class EMA:
    def __init__(self, module: nn.Module, decay: float = 0.9999, every: int = 32) -> None:
        self.decay = decay
        self.every = every
        self.params = {k: v.detach().float().clone() for k, v in module.named_parameters()}
        self.buffers = {k: v.detach().clone() for k, v in module.named_buffers()}

    def due(self, step: int) -> bool:
        """Whether the update after optimizer step number ``step`` (1-based count of steps done) is due."""
        return step % self.every == 0

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        names, online = zip(*module.named_parameters(), strict=True)
        averaged = [self.params[n] for n in names]
        torch._foreach_lerp_(averaged, [p.detach().float() for p in online], 1.0 - self.decay)
        for name, buf in module.named_buffers():
            self.buffers[name].copy_(buf)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors in the encoder's own ``state_dict`` naming (parameters float32)."""
        return {**self.buffers, **self.params}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, value in state.items():
            target = self.params.get(name, self.buffers.get(name))
            if target is None:
                raise KeyError(f"EMA state has an unexpected entry {name!r}")
            target.copy_(value)

    def copy_to(self, module: nn.Module) -> nn.Module:
        """Load the averaged weights into ``module`` (e.g. a fresh encoder for evaluation)."""
        module.load_state_dict({k: v.to(module.state_dict()[k].dtype) for k, v in self.state_dict().items()})
        return module
