"""What an encoder computes, named by one short hash: the key of every feature cache and every compatibility check.

``levjepa.weights.weights_fingerprint`` names the weights alone (SHA-1 of the state dict). The same weights
compute another function under another config — ``levjepa import --heads`` or ``--attention`` changes the
attention mode, the head split or the RoPE layout without changing a weight — so a store, a cache or a kept
probe keyed by the weights would be shared by two different encoders. :func:`function_fingerprint` hashes the
weights' fingerprint together with the config fields that change what the frozen encoder computes: every
field of ``EncoderConfig`` but those of training alone (:data:`TRAINING_ONLY`: how tokens are dropped, how
weights start, activation checkpointing), which a frozen forward never reads (nothing is dropped there).

The readout layers (``EncoderConfig.readout_layers``, ``--layers``) are part of the function: two readouts of
the same weights at different blocks get different fingerprints, so different feature stores and caches, and a
kept probe of one is refused on the other. The default readout (the last block, ``None``) leaves the field out
of the hash, so an encoder read at its last block has the fingerprint it had before readout layers existed:
its stores, caches and kept probes stay valid.

Readers of records written before the function fingerprint (a 40-digit weights fingerprint, e.g. in an old
``classifier.json``) compare them as what they are: :func:`matches` checks such a record against the weights.
"""

from __future__ import annotations

import hashlib
import json

from torch import nn

from levjepa.config import to_dict
from levjepa.weights import weights_fingerprint

__all__ = ["TRAINING_ONLY", "function_fingerprint", "matches"]

# EncoderConfig fields a frozen forward never reads: dropping (nothing is dropped), initialisation, the start
# of a run, activation recomputation
TRAINING_ONLY = ("drop_ratio", "drop_mode", "init_std", "tubelet_init", "grad_checkpointing", "init_from")
_WEIGHTS_ONLY = 40  # hex digits of a weights fingerprint (SHA-1); a function fingerprint has 16


def function_fingerprint(encoder: nn.Module) -> str:
    """16 hex digits over ``encoder.cfg`` (less :data:`TRAINING_ONLY`, and the readout layers when they are the
    default) and its weights' fingerprint: equal for the same function from the same weights, different after
    any change of either."""
    config = {k: v for k, v in to_dict(encoder.cfg).items() if k not in TRAINING_ONLY}
    if config.get("readout_layers") is None:  # the last block: the fingerprint of before readout layers
        config.pop("readout_layers", None)
    text = json.dumps(config, sort_keys=True)
    return hashlib.sha256(f"{text}\n{weights_fingerprint(encoder)}".encode()).hexdigest()[:16]


def matches(recorded: str, encoder: nn.Module) -> tuple[bool, str]:
    """Whether ``encoder`` is the one a record names, and the encoder's fingerprint of the same kind: a function
    fingerprint, or (a record written before them) the weights fingerprint."""
    mine = weights_fingerprint(encoder) if len(recorded) == _WEIGHTS_ONLY else function_fingerprint(encoder)
    return mine == recorded, mine
