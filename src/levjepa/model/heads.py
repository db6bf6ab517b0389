"""The projector head (training only): ``Linear(d, 2048) -> BatchNorm -> GELU -> Linear(2048, 256)``.

Paper fact (SPEC §2.8, LeVJEPA §3.6 and appendix B): every view's CLS goes through the same projector,
``z_v = h(E(x_v)[CLS]) ∈ R^K`` with ``K = 256``; the invariance loss and SIGReg act on ``z``, and the
projector is discarded after pretraining (the encoder's final LayerNorm puts its output on a sphere-like
set, the projector gives the Gaussian target its own space).

Design: the BatchNorm is a plain ``nn.BatchNorm1d`` whose statistics are taken over every row of one call
(the trainer projects all ``(V+1)·B`` view CLS tokens in one call, ``projector(cls.flatten(0, 1))``); under
DDP the trainer swaps it for ``levjepa.distributed.SyncBatchNorm1d`` so the statistics span the global
batch. Weights: truncated normal ``std = 0.02``, zero biases, BatchNorm (1, 0).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from levjepa.model.config import EncoderConfig

__all__ = ["Projector"]


class Projector(nn.Module):
    """``[N, in_dim] -> [N, out]``: Linear -> BatchNorm1d -> GELU -> Linear."""

    def __init__(self, in_dim: int, hidden: int = 2048, out: int = 256, init_std: float = 0.02) -> None:
        super().__init__()
        for name, value in (("in_dim", in_dim), ("hidden", hidden), ("out", out)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Projector: {name}={value!r}, expected a positive integer")
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.GELU(), nn.Linear(hidden, out))
        with torch.no_grad():
            for m in self.net:
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=init_std)
                    nn.init.zeros_(m.bias)

    @classmethod
    def from_config(cls, cfg: EncoderConfig) -> Projector:
        return cls(cfg.dim, cfg.proj_hidden, cfg.proj_dim, cfg.init_std)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.net[0].in_features:
            raise ValueError(
                f"Projector: expected input [N, {self.net[0].in_features}], got shape {tuple(x.shape)} "
                "(flatten the view and batch dims first: cls.flatten(0, 1))"
            )
        return self.net(x)
