"""The official model's outputs: ``last_hidden_state`` (CLS first, then every patch token in ``(t, y, x)``
order, after the final norm), ``pooler_output`` (the CLS) and optionally ``hidden_states``, computed by
:func:`hub_forward` for ``levjepa.LeVJEPAModel`` and for transformers' ``AutoModel`` alike."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from levjepa.model import VideoEncoder

__all__ = ["LeVJEPAOutput", "as_clips", "hub_forward"]


@dataclass
class LeVJEPAOutput:
    """``last_hidden_state`` ``[B, 1+N, D]``, ``pooler_output`` ``[B, D]``, ``hidden_states`` (or ``None``)."""

    last_hidden_state: Tensor
    pooler_output: Tensor
    hidden_states: tuple[Tensor, ...] | None = None

    def to_tuple(self) -> tuple[Any, ...]:
        fields = (self.last_hidden_state, self.pooler_output, self.hidden_states)
        return tuple(f for f in fields if f is not None)

    def __getitem__(self, key: int | str) -> Any:
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]

    def keys(self) -> Iterator[str]:
        return iter(k for k in ("last_hidden_state", "pooler_output", "hidden_states") if getattr(self, k) is not None)


def as_clips(pixel_values: Tensor) -> Tensor:
    """``[B, C, T, H, W]`` as it is, ``[B, C, H, W]`` as one-frame clips; anything else a ``ValueError``."""
    if not isinstance(pixel_values, Tensor):
        raise ValueError(f"pixel_values: expected a float tensor [B, C, T, H, W], got {type(pixel_values).__name__}")
    if pixel_values.dim() == 4:
        return pixel_values[:, :, None]
    return pixel_values


def hub_forward(encoder: VideoEncoder, pixel_values: Tensor, output_hidden_states: bool = False) -> LeVJEPAOutput:
    """The official outputs of ``encoder`` on ``pixel_values`` (see the module docstring)."""
    video = as_clips(pixel_values)
    if output_hidden_states:
        outs = encoder.get_intermediate_layers(video, list(range(encoder.cfg.depth)), norm=False)
        hidden = tuple(o.tokens for o in outs)
        last = encoder.norm(hidden[-1])
        return LeVJEPAOutput(last, last[:, 0], hidden)
    tokens = encoder.forward_features(video).tokens
    return LeVJEPAOutput(tokens, tokens[:, 0])
