"""A feature set checks itself: no unit is written with non-finite rows, and no file is read that changed since.

**Written** (:func:`refuse_nonfinite`). Before a unit reaches the disk every float array of it is checked for
NaN and ±inf (an encoder that diverged, float16 tokens past 65504): such a unit is refused in one line naming
the array and the source files of its bad rows, and nothing of it is written. Each file the unit writes comes
with its size and CRC-32 (``writer.file_checksum``), recorded in ``sums-U.json`` beside it and, when the set
is complete, in the manifest (``checksums``: unit -> file -> size and CRC; ``index``: ``index.jsonl``'s).

**Read** (:func:`verify`). The reader (``feature_set.FeatureSet``) checks ``index.jsonl`` when it opens a set
and each array file the first time this process reads it (``(path, size, mtime)`` remembered after: a reader
opened again, or the next epoch, reads without checking; measured in ``bench/eval.md``, "Checksums"). A file
of another size is named as truncated, one of another CRC as changed, each in one line with the way to rebuild
it: delete the unit's index file and run the command that wrote the set again — a unit whose index is missing
is computed again, and the set finished again (``feature_set.open_for_writing``).

**Sets written before checksums** (a version 1 store, or version 2 before this check) are re-verified instead
of refused, since recomputing a dataset's store costs hours of encoder time: each array file's size must match
what its header says, and every row must be finite, checked on the first read of each file (:func:`verify_old`);
a note says once per set and process that it is checked without checksums (rebuilding it adds them).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from levjepa.data import DataError
from levjepa.features.writer import file_checksum

__all__ = [
    "nonfinite_rows",
    "note_unchecked",
    "refuse_nonfinite",
    "rebuild_hint",
    "sums_file",
    "verify",
    "verify_old",
    "write_sums",
]

_verified: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) of files this process checked
_noted: set[str] = set()  # sets without checksums this process said so of


def sums_file(out: Path, unit: str) -> Path:
    """Where a unit's checksums wait for the manifest (written before its index, so a done unit has them)."""
    return out / f"sums-{unit}.json"


def write_sums(out: Path, unit: str, sums: Mapping[str, Mapping[str, Any]]) -> None:
    from levjepa.weights import atomic_write_text

    atomic_write_text(sums_file(out, unit), json.dumps(dict(sums), sort_keys=True) + "\n")


# float dtype -> (its bits as an unsigned integer, the mask without the sign, the smallest non-finite pattern)
_BITS = {np.dtype(np.float16): (np.uint16, 0x7FFF, 0x7C00), np.dtype(np.float32): (np.uint32, 0x7FFFFFFF, 0x7F800000)}


def nonfinite_rows(a: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``a`` [n, ...] holding a NaN or an infinity. On the bits for float16 and float32: an
    exponent of all ones, whatever the sign (a row's largest such pattern), several times faster than
    ``isfinite`` on float16 (``bench/eval.md``, "Checksums")."""
    if a.dtype.kind != "f" or a.size == 0:
        return np.zeros(0, np.int64)
    rows = a.reshape(len(a), -1)
    if rows.dtype in _BITS:
        uint, mask, inf = _BITS[rows.dtype]
        return np.nonzero((rows.view(uint) & mask).max(axis=1) >= inf)[0]
    return np.nonzero(~np.isfinite(rows).all(axis=1))[0]


def _bad_rows(t: Tensor) -> np.ndarray:
    if not t.is_floating_point():
        return np.zeros(0, np.int64)
    return nonfinite_rows((t.float() if t.dtype == torch.bfloat16 else t).contiguous().numpy())


def refuse_nonfinite(out: Path, unit: str, rows: list[dict[str, Any]], arrays: Mapping[str, Tensor]) -> None:
    """Refuse (``DataError``, one line) a unit whose float arrays hold a non-finite row (module doc)."""
    for name, t in arrays.items():
        bad = _bad_rows(t)
        if len(bad):
            files = sorted({str(rows[int(i)].get("file")) for i in bad[:1000]})
            shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
            raise DataError(
                f"the encoder gave non-finite {name!r} features (NaN or inf) in {len(bad)} of {len(t)} rows of unit "
                f"{unit} of {out}, for {shown}; nothing of that unit was written: check the weights (levjepa probe "
                "reads them) and the precision (float16 tokens hold |x| <= 65504), then run the command again"
            )


def rebuild_hint(out: Path, index: Path) -> str:
    """How a unit of ``out`` whose index file is ``index`` is computed again (module doc)."""
    return f"delete {index} and run the command that wrote {out} again (it computes that unit again)"


def verify(path: Path, expected: Mapping[str, Any], hint: str) -> None:
    """Check ``path`` against its recorded size and CRC-32 once per process (module doc); ``hint`` says how to
    rebuild it."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _verified:
        return
    if stat.st_size != expected["bytes"]:
        raise DataError(f"truncated: {path} has {stat.st_size} bytes, {expected['bytes']} when it was written; {hint}")
    got = file_checksum(path)
    if got["crc32"] != expected["crc32"]:
        raise DataError(
            f"unreadable: {path} changed since it was written (CRC-32 {got['crc32']}, recorded {expected['crc32']}: a "
            f"changed byte, a value written over it); {hint}"
        )
    _verified.add(key)


def verify_old(path: Path, offset: int, shape: tuple[int, ...], dtype: np.dtype, hint: str) -> None:
    """A file of a set without checksums: its size is what its header says (``offset`` + the array's bytes) and
    every row is finite, checked once per process (module doc)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _verified:
        return
    want = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if stat.st_size < want:
        raise DataError(f"truncated: {path} has {stat.st_size} bytes, its header says {want}; {hint}")
    if dtype.kind == "f" and shape and shape[0]:
        data = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
        bad = nonfinite_rows(data)
        del data
        if len(bad):
            rows = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise DataError(f"unreadable: {path}: rows {rows} (of its {shape[0]}) are not finite numbers; {hint}")
    _verified.add(key)


def note_unchecked(out: Path) -> None:
    """Say once per process that the set in ``out`` has no checksums (module doc)."""
    if str(out) not in _noted:
        _noted.add(str(out))
        print(
            f"note: {out} was written before feature sets carried checksums: its files are checked for their size "
            "and finite values only (computing it again adds them)",
            file=sys.stderr,
        )
