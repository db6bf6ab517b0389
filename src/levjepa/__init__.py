"""levjepa: heuristic-free self-supervised pretraining of video encoders.

LeVJEPA (one shared ViT with per-frame patches, 95 % token dropping, 3D RoPE, block-causal attention;
loss = invariance + 0.02 * SIGReg), with the LeJEPA objective and LocaLeJEPA's local uniform-ball
regularizer beside it.

This package is a face: it imports nothing of its own at import time except the ground floor's
``levjepa.version`` (the version, the torch floor, checked here in one line without importing torch); every
other name below resolves on first use, so ``import levjepa`` is cheap. ``levjepa.load(PATH)`` gives a frozen
``VideoEncoder``; ``levjepa.from_pretrained(PATH_OR_REPO_ID)`` a ``LeVJEPAModel`` with the official calling
convention (``model(pixel_values=video).last_hidden_state``), or a ``LeVJEPAForVideoClassification`` for a
fine-tuned classifier.

**transformers, in either import order.** ``import levjepa`` asks ``wrapt`` for a post-import hook on
transformers' auto classes (``transformers.models.auto.configuration_auto``, what ``AutoConfig`` and every
``AutoModel*`` import first): the moment they are imported — before levjepa, after it, or never — the hook
resolves ``levjepa.register_transformers`` (``levjepa.formats.hub``) and registers the ``levjepa`` model type
with ``AutoConfig`` / ``AutoModel`` / ``AutoModelForVideoClassification`` / ``AutoImageProcessor``. So
``import levjepa, transformers`` and ``import transformers, levjepa`` both load levjepa exports and the
released official checkpoint without remote code, and a program that never touches transformers never
imports it. Without wrapt (it is a dependency), ``levjepa.register_transformers()`` does it by hand.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from levjepa.version import TORCH_FLOOR, __version__, check_torch, release

check_torch()

_LAZY = {
    "load": "levjepa.formats.load",
    "from_pretrained": "levjepa.formats.hub",
    "LeVJEPAModel": "levjepa.formats.hub",
    "LeVJEPAForVideoClassification": "levjepa.formats.hub",
    "register_transformers": "levjepa.formats.hub",
    "sigreg": "levjepa.objective",
    "SIGReg": "levjepa.objective",
    "VideoEncoder": "levjepa.model",
    "EncoderConfig": "levjepa.model",
}
TRANSFORMERS_AUTO = "transformers.models.auto.configuration_auto"  # imported before any Auto* class is usable

__all__ = ["TORCH_FLOOR", "__version__", "check_torch", "release", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'levjepa' has no attribute {name!r}")


def _on_transformers(module: ModuleType) -> None:
    """The post-import hook: transformers' auto classes exist now; register levjepa's types with them."""
    __getattr__("register_transformers")()


def _watch_transformers() -> None:
    try:
        import wrapt
    except ImportError:  # levjepa.register_transformers() by hand
        return
    wrapt.register_post_import_hook(_on_transformers, TRANSFORMERS_AUTO)


_watch_transformers()
