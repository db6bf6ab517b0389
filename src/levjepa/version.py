"""What levjepa is and what it runs on: its version and the oldest torch it accepts (the ground floor).

The oldest torch levjepa runs on is :data:`TORCH_FLOOR` (pyproject.toml says the same), found from the APIs
it calls, each with the release that brought it: ``torch.onnx.export(dynamo=True)`` (2.5, ``export --format
onnx``), fused AdamW on the CPU (2.4, every run's optimizer), ``torch.amp.GradScaler(device)`` and
``init_process_group(device_id=)`` (2.3), ``torch.export`` with ``Dim`` and ``strict=False`` (2.2-2.3);
``F.scaled_dot_product_attention`` with a float mask and ``torch.compile`` (2.0) are older. 2.13 is the
oldest version the tests ran on. :func:`check_torch` refuses an older torch in one line, read from the
installed package's metadata, without importing torch (``import levjepa`` calls it).
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

__all__ = ["TORCH_FLOOR", "__version__", "check_torch", "release"]

__version__ = "0.1.0"
TORCH_FLOOR = (2, 5)


def release(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the numeric release of a version string (pre-release tags dropped)."""
    numbers = []
    for part in text.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.end() < len(part):  # "1rc3": the release ends at its pre-release tag
            break
    return tuple(numbers)


def check_torch(found: str | None = None) -> None:
    """Refuse a torch older than :data:`TORCH_FLOOR` with one line (``found``: the installed version)."""
    if found is None:
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
