"""levjepa: heuristic-free self-supervised pretraining of video encoders.

LeVJEPA (one shared ViT with per-frame patches, 95 % token dropping, 3D RoPE, block-causal attention;
loss = invariance + 0.02 * SIGReg), with the LeJEPA objective and LocaLeJEPA's local uniform-ball
regularizer beside it. Heavy submodules are imported on first use: ``import levjepa`` is cheap.

``levjepa.load(PATH)`` gives a frozen ``VideoEncoder``; ``levjepa.from_pretrained(PATH_OR_REPO_ID)`` a
``LeVJEPAModel`` with the official calling convention (``model(pixel_values=video).last_hidden_state``).
When ``transformers`` is already imported, ``import levjepa`` registers the ``levjepa`` model type with its
``AutoConfig`` / ``AutoModel``; otherwise ``levjepa.register_transformers()`` does.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load": "levjepa.formats.load",
    "from_pretrained": "levjepa.formats.hub",
    "LeVJEPAModel": "levjepa.formats.hub",
    "register_transformers": "levjepa.formats.hub",
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


if "transformers" in sys.modules:  # the user has it imported already: make AutoModel know levjepa exports
    importlib.import_module("levjepa.formats.hub")
