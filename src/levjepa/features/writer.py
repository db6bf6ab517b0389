"""The one way features reach the disk: arrays written atomically through ``levjepa.weights``' writers, each with
the checksum of the bytes written.

Feature sets (``feature_set.py``: the stores of ``store.py`` and extraction's, ``extract.py``) write
here: a ``.npy`` array (:func:`save_npy`, plain ``numpy.save`` bytes, so ``numpy.load(path, mmap_mode="r")``
maps it) or a shard of several named arrays (:func:`write_shard`: one ``.npy`` per array, or one
``.safetensors`` file). Every file goes to a temporary name, is synced and renamed
(``levjepa.weights.atomic_write_bytes``), so a killed job leaves either the old file or the whole new one,
never half of it.

**Checksums.** Each writer returns the size and the CRC-32 (:func:`checksum`) of the bytes it handed to the disk,
computed from memory before the write, which the feature set records with its unit (``feature_set.py``) and
verifies when the file is first read (:func:`file_checksum`). CRC-32 (zlib's) catches every single flipped bit,
every burst of up to 32, a truncation and a value written over — a changed store, not a forged one — at a
fraction of a cryptographic hash's cost (``bench/eval.md``, "Checksums").
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from torch import Tensor

from levjepa.weights import atomic_write_bytes, safetensors_bytes

__all__ = ["checksum", "file_checksum", "save_npy", "write_shard"]

_CHUNK = 8 << 20  # bytes read at a time when a file's checksum is computed


def checksum(data: bytes | memoryview) -> dict[str, Any]:
    """``{"bytes": size, "crc32": 8 hex digits}`` of ``data``: what a feature set records of each file."""
    return {"bytes": len(data), "crc32": f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"}


def file_checksum(path: Path) -> dict[str, Any]:
    """:func:`checksum` of the file at ``path``, read in chunks."""
    crc, size = 0, 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return {"bytes": size, "crc32": f"{crc & 0xFFFFFFFF:08x}"}


def save_npy(path: Path, array: np.ndarray) -> dict[str, Any]:
    """``numpy.save(path, array)``, atomically; returns the file's :func:`checksum`."""
    buf = io.BytesIO()
    np.save(buf, array)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    return checksum(data)


def write_shard(
    out: Path,
    unit: str,
    arrays: Mapping[str, Tensor],
    fmt: Literal["npy", "safetensors"],
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Shard ``unit`` (``KKKKK``, the shard number in five digits) of ``arrays`` in ``out``: ``<name>-KKKKK.npy``
    per array, or ``features-KKKKK.safetensors`` holding them all (with ``metadata``); returns each file name
    written with its :func:`checksum`."""
    if fmt == "safetensors":
        name = f"features-{unit}.safetensors"
        data = safetensors_bytes(arrays, metadata)
        atomic_write_bytes(out / name, data)
        return {name: checksum(data)}
    return {f"{a}-{unit}.npy": save_npy(out / f"{a}-{unit}.npy", t.numpy()) for a, t in arrays.items()}
