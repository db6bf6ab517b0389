"""levjepa: heuristic-free self-supervised pretraining of video encoders.

LeVJEPA (one shared ViT with per-frame patches, 95 % token dropping, 3D RoPE, block-causal attention;
loss = invariance + 0.02 * SIGReg), with the LeJEPA objective and LocaLeJEPA's local uniform-ball
regularizer beside it. Heavy submodules are imported on first use: ``import levjepa`` is cheap.

``levjepa.load(PATH)`` gives a frozen ``VideoEncoder``; ``levjepa.from_pretrained(PATH_OR_REPO_ID)`` a
``LeVJEPAModel`` with the official calling convention (``model(pixel_values=video).last_hidden_state``).
When ``transformers`` is already imported, ``import levjepa`` registers the ``levjepa`` model type with its
``AutoConfig`` / ``AutoModel``; otherwise ``levjepa.register_transformers()`` does.

The oldest torch levjepa runs on is :data:`TORCH_FLOOR` (pyproject.toml says the same), found from the APIs
it calls, each with the release that brought it: ``torch.onnx.export(dynamo=True)`` (2.5, ``export --format
onnx``), fused AdamW on the CPU (2.4, every run's optimizer), ``torch.amp.GradScaler(device)`` and
``init_process_group(device_id=)`` (2.3), ``torch.export`` with ``Dim`` and ``strict=False`` (2.2-2.3);
``F.scaled_dot_product_attention`` with a float mask and ``torch.compile`` (2.0) are older. 2.13 is the
oldest version the tests ran on. ``import levjepa`` refuses an older torch in one line (read from the
installed package's metadata, without importing torch).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.1.0"
TORCH_FLOOR = (2, 5)


def release(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the numeric release of a version string (pre-release tags dropped)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
        if not part.isdigit():
            break
    return tuple(numbers)


def check_torch(found: str | None = None) -> None:
    """Refuse a torch older than :data:`TORCH_FLOOR` with one line (``found``: the installed version)."""
    if found is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("torch")
        except PackageNotFoundError:
            return  # no torch: the first `import torch` says so
    if release(found) < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        raise ImportError(
            f"levjepa needs torch>={floor}, found torch {found}: pip install 'torch>={floor}' (on a CPU-only machine "
            "with --index-url https://download.pytorch.org/whl/cpu)"
        )


check_torch()

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

__all__ = ["TORCH_FLOOR", "__version__", "check_torch", "release", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'levjepa' has no attribute {name!r}")


if "transformers" in sys.modules:  # the user has it imported already: make AutoModel know levjepa exports
    importlib.import_module("levjepa.formats.hub")
