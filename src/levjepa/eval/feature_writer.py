"""The one way features reach the disk: arrays written atomically through ``levjepa.weights``' writers.

Feature sets (``feature_set.py``: the stores of ``feature_store.py`` and extraction's, ``extract.py``) write
here: a ``.npy`` array (:func:`save_npy`, plain ``numpy.save`` bytes, so ``numpy.load(path, mmap_mode="r")``
maps it) or a shard of several named arrays (:func:`write_shard`: one ``.npy`` per array, or one
``.safetensors`` file). Every file goes to a temporary name, is synced and renamed
(``levjepa.weights.atomic_write_bytes``), so a killed job leaves either the old file or the whole new one,
never half of it.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from torch import Tensor

from levjepa.weights import atomic_write_bytes, save_tensors

__all__ = ["save_npy", "write_shard"]


def save_npy(path: Path, array: np.ndarray) -> None:
    """``numpy.save(path, array)``, atomically."""
    buf = io.BytesIO()
    np.save(buf, array)
    atomic_write_bytes(path, buf.getvalue())


def write_shard(
    out: Path,
    unit: str,
    arrays: Mapping[str, Tensor],
    fmt: Literal["npy", "safetensors"],
    metadata: Mapping[str, Any] | None = None,
) -> list[str]:
    """Shard ``unit`` (``KKKKK``, the shard number in five digits) of ``arrays`` in ``out``: ``<name>-KKKKK.npy``
    per array, or ``features-KKKKK.safetensors`` holding them all (with ``metadata``); returns the file names
    written."""
    if fmt == "safetensors":
        name = f"features-{unit}.safetensors"
        save_tensors(out / name, arrays, metadata)
        return [name]
    names = []
    for a, t in arrays.items():
        names.append(f"{a}-{unit}.npy")
        save_npy(out / names[-1], t.numpy())
    return names
