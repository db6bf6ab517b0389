"""The weights a pretraining run starts from at step 0 (``model.init_from``): continued pretraining.

A fresh run (step 0, a fresh optimiser and schedule, the EMA starting at these weights) from the encoder and,
when there is one that fits, the projector of a levjepa run, an export, imported official weights or a
checkpoint file. ``levjepa.formats.load_init_weights`` reads them (this floor cannot); ``levjepa pretrain``
passes them to :func:`levjepa.train.pretrain` as ``start_weights``. ``--resume`` keeps its meaning: the run's
own checkpoints, never these.

* The encoder loads **strictly**: a missing, unexpected or misshapen key is one error naming the first one.
* The projector loads when present and of the same shapes; otherwise it starts fresh, and the returned line
  (printed by the command, recorded in nothing else) says so.
* The architecture comes from the source (:func:`with_architecture`): every field that changes the function
  the encoder computes, so the continued run computes the same function at step 0; what only concerns
  training (token dropping, checkpointing, init) stays as the run's config says. A field the user set
  explicitly (on the command line or in a config file) to another value than the source's is refused in one
  line naming it and the source's value: the run could not honour it, and training silently at the source's
  width instead would be a wrong start. Defaults and presets do not count: they give way to the source.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from levjepa.config import ConfigError
from levjepa.model import EncoderConfig

__all__ = ["TRAINING_ONLY", "StartWeights", "load_start_weights", "with_architecture"]

# EncoderConfig fields a continued run keeps from its own config (they do not change the encoder's function;
# readout_layers says how a frozen reader reads it, which the new run's own config says)
TRAINING_ONLY = (
    *("drop_ratio", "drop_mode", "grad_checkpointing", "init_from", "tubelet_init", "init_std"),
    "readout_layers",
)


@dataclass
class StartWeights:
    """Encoder (and projector) state dicts to start from, their architecture, and what they are."""

    config: EncoderConfig
    encoder: dict[str, Tensor]
    projector: dict[str, Tensor] | None
    description: str  # which copy of what, from where


def with_architecture(model: EncoderConfig, start: StartWeights, explicit: Collection[str] = ()) -> EncoderConfig:
    """``model`` with every function-defining field taken from the start weights' architecture (the projector's
    sizes too when the source has a projector); :data:`TRAINING_ONLY` fields stay ``model``'s. ``explicit``:
    the ``model`` fields the user set; one of them that the source overrules with another value is a
    ``ConfigError``."""
    keep = set(TRAINING_ONLY) | (set() if start.projector is not None else {"proj_hidden", "proj_dim"})
    fields = {f.name: getattr(start.config, f.name) for f in dataclasses.fields(EncoderConfig) if f.name not in keep}
    for name in sorted(set(explicit) & set(fields)):
        if getattr(model, name) != fields[name]:
            raise ConfigError(
                f"model.{name}={getattr(model, name)}: model.init_from={model.init_from} has {name} = {fields[name]} "
                f"and a continued run keeps the source's architecture; drop model.{name}, or leave out "
                "model.init_from to train this architecture from scratch"
            )
    return dataclasses.replace(model, **fields)


def _first_misfit(module: nn.Module, state: dict[str, Tensor]) -> str | None:
    own = module.state_dict()
    for key, value in own.items():
        if key not in state:
            return f"missing key {key!r}"
        if tuple(state[key].shape) != tuple(value.shape):
            return f"{key!r} has shape {tuple(state[key].shape)}, the model's is {tuple(value.shape)}"
    extra = sorted(set(state) - set(own))
    return f"unexpected key {extra[0]!r}" if extra else None


@torch.no_grad()
def load_start_weights(encoder: nn.Module, projector: nn.Module, start: StartWeights, source: str) -> str:
    """Load ``start`` into the freshly built models; returns the line that says what was loaded."""
    misfit = _first_misfit(encoder, start.encoder)
    if misfit is not None:
        raise ConfigError(f"model.init_from={source}: the encoder does not fit this run's model: {misfit}")
    encoder.load_state_dict(start.encoder, strict=True)
    if start.projector is None:
        proj = "projector fresh (the source has none)"
    elif (why := _first_misfit(projector, start.projector)) is not None:
        proj = f"projector fresh (the source's does not fit: {why})"
    else:
        projector.load_state_dict(start.projector, strict=True)
        proj = "projector loaded"
    return f"init_from: encoder from {start.description}; {proj}"
