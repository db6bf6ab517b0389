"""levjepa: heuristic-free self-supervised pretraining of video encoders.

LeVJEPA (one shared ViT with per-frame patches, 95 % token dropping, 3D RoPE, block-causal attention;
loss = invariance + 0.02 * SIGReg), with the LeJEPA objective and LocaLeJEPA's local uniform-ball
regularizer beside it. Heavy submodules are imported on first use: ``import levjepa`` is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load": "levjepa.formats.load",
    "sigreg": "levjepa.objective",
    "SIGReg": "levjepa.objective",
    "VideoEncoder": "levjepa.model",
    "EncoderConfig": "levjepa.model",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'levjepa' has no attribute {name!r}")
