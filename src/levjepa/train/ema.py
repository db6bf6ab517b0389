"""The Polyak / EMA evaluation copy of the encoder: a weighted average of the weights actually trained.

Update ``n`` (``n = 0, 1, …`` counts the updates done before it; one update every ``every = 32`` optimizer
steps, paper appendix B) is

    θ̄ ← β_n θ̄ + (1 − β_n) θ,        β_n = min(β, n / (n + c)),   β = 0.9999,  c = ``warmup`` = 10.

The paper's ``β = 0.9999`` every 32 steps is the asymptote. Started from the random initialisation with
``β`` fixed, the copy would still be 96.8 % initial weights at the end of ``vit-b-paper`` (10.3k steps,
322 updates: ``0.9999^322``) and 88.5 % for ``vit-tiny-consumer`` — an evaluation of an almost random
encoder. With the warm-up (the decay schedule of TensorFlow's ``ExponentialMovingAverage(num_updates)``,
shifted so that ``β_0 = 0``) the first update copies the online weights, the initialisation has weight
0, and after ``k`` updates, while ``n / (n + c) < β`` (``n < c·β/(1 − β)``: 99,990 updates at the paper's
β, i.e. for every run that fits a cluster allocation):

    θ̄_k = Σ_{m=1..k} w_m θ_m,   w_m ∝ m (m+1) ⋯ (m+c−2)   (a degree-9 polynomial, ≈ m⁹; Σ w_m = 1),

θ_m the online weights at update ``m``: the average leans on the recent weights (its last 20 % of
updates carry 89 % of the weight) and widens as training goes on. Beyond that point the recursion is the
paper's EMA. ``tests/test_optim_ema.py`` checks this closed form; :meth:`EMA.weights` returns the weights
``w_m`` of any schedule. ``c = 0`` (``train.ema_warmup=0``) is the paper's EMA taken literally: ``β`` from
the first update, starting from the initialisation (readers then say how much of the copy is still
initial).

The copy is kept in float32 whatever the training precision, is never used by the loss, and is saved beside
the online weights with its update count and schedule; evaluation and extraction choose either. Buffers are
copied, not averaged.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["EMA"]


class EMA:
    def __init__(self, module: nn.Module, decay: float = 0.9999, every: int = 32, warmup: float = 10.0) -> None:
        if not 0.0 <= decay < 1.0 or every < 1 or warmup < 0:
            raise ValueError(f"EMA: need 0 <= decay < 1, every >= 1, warmup >= 0; got {decay}, {every}, {warmup}")
        self.decay = decay
        self.every = every
        self.warmup = warmup
        self.updates = 0  # updates done so far (n of the next one)
        self.params = {k: v.detach().float().clone() for k, v in module.named_parameters()}
        self.buffers = {k: v.detach().clone() for k, v in module.named_buffers()}

    def due(self, step: int) -> bool:
        """Whether the update after optimizer step number ``step`` (1-based count of steps done) is due."""
        return step % self.every == 0

    def decay_at(self, n: int) -> float:
        """``β_n = min(β, n / (n + c))``: the decay of update ``n`` (0-based); ``β`` itself when ``c = 0``."""
        return self.decay if self.warmup == 0 else min(self.decay, n / (n + self.warmup))

    def weights(self, k: int) -> torch.Tensor:
        """float64 ``[k + 1]``: the weight of the initial copy (index 0) and of the online weights at each of
        the ``k`` updates (index ``m``) in the average after ``k`` updates; they sum to 1."""
        w = torch.zeros(k + 1, dtype=torch.float64)
        w[0] = 1.0
        for n in range(k):
            beta = self.decay_at(n)
            w[: n + 1] *= beta
            w[n + 1] = 1.0 - beta
        return w

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        names, online = zip(*module.named_parameters(), strict=True)
        averaged = [self.params[n] for n in names]
        torch._foreach_lerp_(averaged, [p.detach().float() for p in online], 1.0 - self.decay_at(self.updates))
        for name, buf in module.named_buffers():
            self.buffers[name].copy_(buf)
        self.updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors in the encoder's own ``state_dict`` naming (parameters float32); the update count is
        saved beside them (``levjepa.train.checkpoint``: the ``ema_updates`` metadata)."""
        return {**self.buffers, **self.params}

    def load_state_dict(self, state: dict[str, torch.Tensor], updates: int) -> None:
        for name, value in state.items():
            target = self.params.get(name, self.buffers.get(name))
            if target is None:
                raise KeyError(f"EMA state has an unexpected entry {name!r}")
            target.copy_(value)
        self.updates = int(updates)

    def copy_to(self, module: nn.Module) -> nn.Module:
        """Load the averaged weights into ``module`` (e.g. a fresh encoder for evaluation)."""
        module.load_state_dict({k: v.to(module.state_dict()[k].dtype) for k, v in self.state_dict().items()})
        return module
