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

**transformers, in either import order.** ``import levjepa`` asks ``wrapt`` for post-import hooks on
transformers' auto modules (``configuration_auto``, where ``AutoConfig`` lives, ``modeling_auto``, the
``AutoModel*`` classes, and ``video_processing_auto``, ``AutoVideoProcessor``): the moment each is imported —
before levjepa, after it, or never — the hook resolves ``levjepa.register_transformers``
(``levjepa.formats.transformers.hub``) and registers the ``levjepa`` model type with it (``AutoConfig``; ``AutoModel``
and ``AutoModelForVideoClassification``; levjepa's video processor). So
``import levjepa, transformers`` and ``import transformers, levjepa`` both load levjepa exports and the
released official checkpoint without remote code, and a program that never touches transformers never
imports it. Without wrapt (it is a dependency), ``levjepa.register_transformers()`` does it by hand.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Any

from levjepa.version import TORCH_FLOOR, __version__, check_torch, release

check_torch()

_LAZY = {
    "load": "levjepa.formats.reading.load",
    "from_pretrained": "levjepa.formats.transformers.hub",
    "LeVJEPAModel": "levjepa.formats.transformers.hub",
    "LeVJEPAForVideoClassification": "levjepa.formats.transformers.hub",
    "register_transformers": "levjepa.formats.transformers.hub",
    "sigreg": "levjepa.objective",
    "SIGReg": "levjepa.objective",
    "VideoEncoder": "levjepa.model",
    "EncoderConfig": "levjepa.model",
}
# transformers' modules defining AutoConfig and the AutoModel* classes: imported before any of them is usable
TRANSFORMERS_AUTO = (
    "transformers.models.auto.configuration_auto",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.video_processing_auto",
)

__all__ = ["TORCH_FLOOR", "__version__", "check_torch", "release", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'levjepa' has no attribute {name!r}")


_HOOK_WARNED = False  # a failing registration is said once, not at each of transformers' auto modules


def _on_transformers(module: ModuleType) -> None:
    """The post-import hook: one of transformers' auto modules exists now; register levjepa's types with it.
    It runs inside the user's ``import transformers``: a failure here (levjepa.formats.transformers.hub or what it
    imports cannot be imported) is a warning, once, never an error of that import; levjepa's types are then not
    registered (``levjepa.register_transformers()`` by hand says why)."""
    global _HOOK_WARNED
    try:
        __getattr__("register_transformers")(module.__name__)
    except Exception as err:  # nothing may escape into the user's import of transformers
        if not _HOOK_WARNED:
            _HOOK_WARNED = True
            warnings.warn(
                f"levjepa could not register its model type with transformers ({type(err).__name__}: {err}); "
                "AutoModel will not read levjepa exports: call levjepa.register_transformers() to see why",
                RuntimeWarning,
                stacklevel=2,
            )


def _watch_transformers() -> None:
    try:
        import wrapt
    except ImportError:  # levjepa.register_transformers() by hand
        return
    for name in TRANSFORMERS_AUTO:
        wrapt.register_post_import_hook(_on_transformers, name)


_watch_transformers()
