"""One on-disk format for frozen features: a *feature set* — the manifest, the rows' index, the arrays in one of
three layouts, the rule for what is done, and the one reader.

Two row cutters write feature sets: the dataset-scale store of the probes (``store.py``, cutter
``store``: ``segments × crops`` views per file) and extraction (``extract.py``, cutter ``extract``: time
windows of every file). They share everything below and one fill job (``fill.py``); only what a row is differs.

**Units.** Rows are written in *units*, each written whole: a shard of a store (``shard_items`` files), a
shard of an extraction (``shard_rows`` rows), or one file's rows with the ``per_video`` layout. A unit's
files are written to a temporary name and renamed (``writer.py``), its arrays first, then
``bad-U.json`` (its unreadable files, only when there are some), then ``sums-U.json`` (each array file's size
and CRC-32), then its index; **a unit is done when its index file exists** — so a job killed at any point
(``kill -9`` included) and started again with the same command skips the done units and finishes with the files
of an uninterrupted run.

**Files** of a feature set in ``out/`` (``U`` is a unit: ``KKKKK``, the shard number in five digits, or, with
``per_video``, the file's output name):

* ``store.json`` — the manifest, written before any unit: ``version`` (:data:`VERSION`), ``cutter``
  (``store`` | ``extract``), ``layout`` (:data:`LAYOUTS`), ``config`` (the cutter's settings that change a
  byte: the frame taking, ``levjepa.data.eval_clip.ViewSpec``'s fields, and the rest), ``encoder`` (the
  encoder's function fingerprint, ``levjepa.model.fingerprint.function_fingerprint``), ``patch``, ``items``
  and ``items_sha1`` (number and hash of the files, ``levjepa.data.sources.items_hash``). A job into a
  folder whose manifest differs is refused in one line naming what differs. When every unit is done it
  also holds ``complete: true``, ``rows``, ``shard_rows`` (each unit's row count, in unit order), ``bad_files``,
  ``checksums`` (unit -> file -> ``bytes``, ``crc32``) and ``index`` (``index.jsonl``'s size and CRC-32);
* arrays, by ``layout``: ``npy`` — ``<array>-KKKKK.npy`` per array (plain ``numpy.save`` bytes,
  ``numpy.load(path, mmap_mode="r")`` maps them); ``safetensors`` — ``features-KKKKK.safetensors`` holding
  every array; ``per_video`` — ``<name>.npy`` (one chosen array, ``per_video_array`` in the config, float32)
  and ``<name>.<array>.npy`` for each other array (``<name>.patches.npy`` float16, ``<name>.frames.npy``,
  ...). Arrays: ``cls`` [n, D] and ``mean`` [n, D] float32 always; a store's ``tokens`` [n, 1+L, D] float16
  (CLS then the patch tokens, time-major) or a compact store's tokens with ``scales``
  (``levjepa.features.compact``); an extraction's ``patches`` [n, L, D] float16 and its readouts
  (``levjepa.features.readout``, recorded in the config as ``readout`` and ``token_codec``): ``frames`` [n, T', D],
  ``last_mean`` [n, D], a codec's ``tokens`` [n, kept, D] and ``scales``;
* ``index-KKKKK.jsonl`` (``<name>.jsonl`` with ``per_video``) — the unit's rows, one JSON object per row:
  the core fields every row has, ``file`` (the source file), ``label`` (an int or null), ``item`` (the
  file's position in the list of files), then the cutter's fields — a store's ``segment, crop``; an
  extraction's ``kind, window, start_frame, end_frame, start_time, end_time, num_frames, padded``;
* ``bad-U.json`` — ``[[path, reason], ...]``, the unit's unreadable files (reported and skipped, never fatal);
* ``sums-U.json`` — ``{file: {bytes, crc32}}`` of the unit's array files, what the manifest gathers;
* after the last unit: ``index.jsonl`` — every row in order with its place added first: ``row`` (its
  number), ``shard`` (its unit: the shard number, or the ``per_video`` name) and ``offset`` (its row in that
  unit's arrays); ``bad_files.json`` — every unreadable file (``levjepa.data.BadFileReport``).

**Reading.** :class:`FeatureSet` opens any complete feature set and reads any rows of any array with
``os.pread`` into a fresh buffer (``.npy`` and ``.safetensors`` alike; nothing stays memory-mapped) — an
extraction's array its manifest does not hold, or tokens of another codec than the reader expects, refused in
one line;
:func:`read_rows` returns its index as dicts. **Every file is checked** (``check.py``): no unit is written
with a non-finite row, ``index.jsonl`` is verified when a set is opened and each array file on the first read in
a process, and a file that changed is named in one line with the way to rebuild it (delete its unit's index and
run the command again: a complete set missing a unit's index computes that unit again). Folders written before
this format: a store (``store.json`` version 1, same files) and a set written before checksums are read with
their sizes and finite values re-verified instead; an extraction (``extract.json``) is refused in one line that
says to compute it again.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from levjepa import distributed
from levjepa.data import BadFileReport, DataError
from levjepa.features.check import (
    note_unchecked,
    rebuild_hint,
    refuse_nonfinite,
    sums_file,
    verify,
    verify_old,
    write_sums,
)
from levjepa.features.compact import TokenCodec
from levjepa.features.writer import file_checksum, save_npy, write_shard
from levjepa.weights import BAD_FILES, atomic_write_text

__all__ = [
    "CORE_FIELDS",
    "LAYOUTS",
    "INDEX",
    "MANIFEST",
    "OLD_MANIFEST",
    "VERSION",
    "FeatureSet",
    "Layout",
    "Unit",
    "finish",
    "open_for_writing",
    "read_rows",
    "unit_done",
]

MANIFEST = "store.json"
VERSION = 2  # 1: stores before extraction shared the format (same files, no cutter/layout: read as npy stores)
LAYOUTS = ("npy", "safetensors", "per_video")
Layout = Literal["npy", "safetensors", "per_video"]
CORE_FIELDS = ("file", "label", "item")
EXTRA_ARRAYS = ("frames", "last_mean", "tokens", "scales")  # an extraction's readouts (levjepa.features.readout)
INDEX = "index.jsonl"  # every row, in order: its presence marks the set complete
OLD_MANIFEST = "extract.json"  # an extraction written before it shared this format


def unit_index(out: Path, layout: str, unit: str) -> Path:
    """The index file of ``unit``: its presence marks the unit done."""
    return out / (f"{unit}.jsonl" if layout == "per_video" else f"index-{unit}.jsonl")


def unit_done(out: Path, layout: str, unit: str) -> bool:
    return unit_index(out, layout, unit).is_file()


class Unit:
    """The rows of one unit, kept until the cutter says it is whole, then written (arrays, bad files, index)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.arrays: dict[str, list[Tensor]] = {}
        self.rows: list[dict[str, Any]] = []
        self.bad: list[tuple[str, str]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: list[dict[str, Any]], arrays: Mapping[str, Tensor | None]) -> None:
        """``rows`` (each starting with the core fields) and their arrays ``[len(rows), ...]``."""
        self.rows.extend(rows)
        for name, t in arrays.items():
            if t is not None:
                self.arrays.setdefault(name, []).append(t)

    def write(self, out: Path, layout: str, per_video_array: str = "mean") -> int:
        """Write the unit (module doc: its rows checked for non-finite values, then arrays, ``bad-U.json``,
        ``sums-U.json`` and the index, each atomically)."""
        tensors = {name: torch.cat(parts) for name, parts in self.arrays.items() if parts}
        refuse_nonfinite(out, self.name, self.rows, tensors)  # before anything of the unit is written
        sums: dict[str, dict[str, Any]] = {}
        if layout == "per_video":
            if per_video_array in tensors:
                sums[f"{self.name}.npy"] = save_npy(out / f"{self.name}.npy", tensors[per_video_array].float().numpy())
            if "patches" in tensors:
                path = out / f"{self.name}.patches.npy"
                sums[path.name] = save_npy(path, tensors["patches"].half().numpy())
            for name in EXTRA_ARRAYS:  # the readouts (levjepa.features.readout), each in its own dtype
                if name in tensors:
                    sums[f"{self.name}.{name}.npy"] = save_npy(out / f"{self.name}.{name}.npy", tensors[name].numpy())
        elif tensors:
            sums = write_shard(out, self.name, tensors, "safetensors" if layout == "safetensors" else "npy")
        if self.bad:
            atomic_write_text(out / f"bad-{self.name}.json", json.dumps(self.bad) + "\n")
        write_sums(out, self.name, sums)  # the unit's checksums, then its index: a done unit has both
        text = "".join(json.dumps(r) + "\n" for r in self.rows)
        atomic_write_text(unit_index(out, layout, self.name), text)
        return len(self.rows)


def _unit_files(out: Path, layout: str, unit: str) -> list[Path]:
    """What a unit's arrays and report may have left (the index not included)."""
    if layout == "per_video":
        names = [f"{unit}.npy", f"{unit}.patches.npy", f"bad-{unit}.json", *(f"{unit}.{a}.npy" for a in EXTRA_ARRAYS)]
        return [out / n for n in names] + [sums_file(out, unit)]
    found = [out / f"bad-{unit}.json", out / f"features-{unit}.safetensors", sums_file(out, unit)]
    found += [p for p in out.glob(f"*-{unit}.npy")]
    return found + [p for p in out.glob(f".*-{unit}.*.tmp")]  # a killed job's half-written temporaries


def clear_unit(out: Path, layout: str, unit: str) -> None:
    """Delete what a unit that is not done left (an earlier job killed while writing it)."""
    for p in _unit_files(out, layout, unit):
        p.unlink(missing_ok=True)


def outputs(out: Path) -> list[Path]:
    """Every file of a feature set in ``out`` — of this format or of the older ones — and nothing else of the
    folder: what ``overwrite`` deletes."""
    names = (MANIFEST, OLD_MANIFEST, INDEX, BAD_FILES, "labels.json")
    found = [out / n for n in names if (out / n).is_file()]
    patterns = ("index-*.jsonl", "bad-*.json", "bad_files-*.json", "sums-*.json", "features-*.safetensors", "*.npy")
    for pattern in patterns:
        found += sorted(out.glob(pattern))
    found += sorted(p for p in out.glob("*.jsonl") if p.with_suffix(".npy").is_file() or p.stat().st_size == 0)
    found += sorted(p for p in out.glob("*.json") if p.with_suffix(".npy").is_file())  # older per-video rows
    return sorted(set(found))


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What differs between two manifests, in words: ``another setting (frames 8 -> 4)``, ``another encoder``,
    ``another list of files``."""
    if old.get("encoder") != new.get("encoder") or old.get("patch") != new.get("patch"):
        return "another encoder"
    o, n = old.get("config") or {}, new.get("config") or {}
    changed = [f"{k} {o.get(k)!r} -> {n.get(k)!r}" for k in {**o, **n} if o.get(k) != n.get(k)]
    if changed or old.get("cutter", "store") != new.get("cutter") or old.get("layout", "npy") != new.get("layout"):
        extra = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in ("cutter", "layout") if old.get(k) != new.get(k)]
        return f"another setting ({', '.join(changed + extra)})"
    return "another list of files (the source's files or their order changed)"


def _same(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the folder's manifest ``old`` describes the rows ``new`` would write (a version 1 store: the
    same files, so the same rows when its settings match)."""
    keys = [k for k in new if k not in ("version", "cutter", "layout")]
    if old.get("version") == 1:
        return new.get("cutter") == "store" and new.get("layout") == "npy" and all(old.get(k) == new[k] for k in keys)
    return all(old.get(k) == new[k] for k in new)


def _old_format(out: Path) -> str | None:
    """Why ``out`` holds features this levjepa does not read (None: it reads them)."""
    if (out / OLD_MANIFEST).is_file() and not (out / MANIFEST).is_file():
        return "features of an older levjepa extract (extract.json)"
    return None


def read_manifest(out: Path) -> dict[str, Any] | None:
    path = out / MANIFEST
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"unreadable: {path}: {err}; delete the folder to recompute its features") from None
    if not isinstance(meta, dict) or meta.get("version") not in (1, VERSION):
        got = meta.get("version") if isinstance(meta, dict) else None
        raise DataError(
            f"unreadable: {out} holds features of another format ({MANIFEST} version {got}, this levjepa "
            f"reads {VERSION}); delete it (or pass --overwrite) to compute them again"
        )
    return meta


def open_for_writing(out: Path, manifest: dict[str, Any], *, overwrite: bool, hint: str) -> dict[str, Any] | None:
    """Make ``out`` ready for a job writing ``manifest`` (every rank calls it): continue the same job, refuse
    another (``DataError``, one line ending in ``hint``), or — ``overwrite`` — delete the other's files first.
    Returns the folder's manifest when it already holds every row of this job (complete), else None."""
    out.mkdir(parents=True, exist_ok=True)
    refusal: str | None = None
    old: dict[str, Any] | None = None
    try:
        why = _old_format(out)
        old = read_manifest(out) if why is None else None
        if why is None and old is not None and not _same(old, manifest):
            why = f"features of {_differences(old, manifest)}"
        if why is None and old is not None and old.get("version") == 1 and not old.get("complete"):
            why = "an unfinished feature store of an older levjepa (store.json version 1)"
        if why is not None:
            refusal = f"{out} holds {why}: {hint}"
    except DataError as err:
        refusal = str(err)
    reopen = old is not None and old.get("complete") and _parts_missing(out, old)
    distributed.barrier()  # every rank has read the folder before rank 0 changes it
    if refusal is not None:
        if not overwrite:
            raise DataError(refusal)
        if distributed.is_main():
            for p in outputs(out):
                p.unlink()
        old = None
    if old is not None and old.get("complete") and not reopen:
        distributed.barrier()
        return old
    if distributed.is_main() and (old is None or reopen):  # reopen: the units deleted are computed again
        atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    distributed.barrier()
    return None


def _parts_missing(out: Path, meta: Mapping[str, Any]) -> bool:
    """Whether a complete set lost its index or a unit's index (deleted to rebuild it: ``check.py``)."""
    if "checksums" not in meta:
        return False
    layout = meta.get("layout", "npy")
    return not (out / INDEX).is_file() or any(not unit_done(out, layout, u) for u in meta["checksums"])


def _unit_sums(out: Path, layout: str, unit: str) -> dict[str, Any]:
    """The checksums of a done unit: its ``sums-U.json``, or — a unit an older levjepa wrote before a job was
    continued — computed from its files now."""
    path = sums_file(out, unit)
    if path.is_file():
        return dict(json.loads(path.read_text()))
    skip = {sums_file(out, unit).name, f"bad-{unit}.json"}
    files = [p for p in _unit_files(out, layout, unit) if p.is_file() and p.name not in skip and p.suffix != ".tmp"]
    return {p.name: file_checksum(p) for p in files}


def finish(out: Path, manifest: dict[str, Any], layout: str, units: Iterable[str]) -> dict[str, Any]:
    """Merge the units' indexes into ``index.jsonl`` and their reports into ``bad_files.json``; mark the feature
    set complete (rank 0, once every unit is done). Returns the complete manifest."""
    report = BadFileReport(warn=False)
    rows, counts, crc, size = 0, [], 0, 0
    sums: dict[str, dict[str, Any]] = {}
    tmp = out / "index.jsonl.tmp"
    with tmp.open("wb") as f:
        for unit in units:
            lines = unit_index(out, layout, unit).read_text().splitlines()
            shard: int | str = int(unit) if layout != "per_video" else unit
            for offset, line in enumerate(lines):
                row = {"row": rows + offset, "shard": shard, "offset": offset, **json.loads(line)}
                data = (json.dumps(row) + "\n").encode()
                f.write(data)
                crc, size = zlib.crc32(data, crc), size + len(data)
            rows += len(lines)
            counts.append(len(lines))
            sums[unit] = _unit_sums(out, layout, unit)
            bad = out / f"bad-{unit}.json"
            if bad.is_file():
                report.extend((p, r) for p, r in json.loads(bad.read_text()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out / INDEX)
    report.write(out / BAD_FILES)
    index = {"bytes": size, "crc32": f"{crc & 0xFFFFFFFF:08x}"}
    done = {**manifest, "complete": True, "rows": rows, "shard_rows": counts, "bad_files": report.total}
    done.update(index=index, checksums=sums)  # check.py: what the reader verifies
    atomic_write_text(out / MANIFEST, json.dumps(done, indent=2) + "\n")
    return done


_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "i1", "U8": "u1", "I64": "<i8"}  # safetensors' names


class _Rows:
    """Rows of one array in a ``.npy`` or ``.safetensors`` file, read with ``os.pread`` (the header parsed
    once; nothing memory-mapped)."""

    def __init__(self, path: Path, key: str | None = None) -> None:
        with path.open("rb") as f:
            if key is None:
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else None
                shape, fortran, npy_dtype = (read_header or np.lib.format.read_array_header_2_0)(f)
                if fortran:
                    raise DataError(f"unreadable: {path} is Fortran-ordered; feature sets are written in C order")
                self.offset, dtype = f.tell(), np.dtype(npy_dtype)
            else:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
                if key not in header:
                    raise DataError(f"missing: array {key!r} in {path} (has {', '.join(sorted(header))})")
                entry = header[key]
                shape, dtype = entry["shape"], np.dtype(_ST_DTYPES[entry["dtype"]])
                self.offset = 8 + n + int(entry["data_offsets"][0])
        self.shape, self.dtype = tuple(shape), dtype
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self.fd = os.open(path, os.O_RDONLY)

    def read(self, offsets: np.ndarray) -> np.ndarray:
        out = np.empty((len(offsets), *self.shape[1:]), dtype=self.dtype)
        flat = out.reshape(len(offsets), -1).view(np.uint8)
        for j, o in enumerate(offsets):
            flat[j] = np.frombuffer(os.pread(self.fd, self.row_bytes, self.offset + int(o) * self.row_bytes), np.uint8)
        return out

    def close(self) -> None:
        os.close(self.fd)


def _column(values: list[Any]) -> np.ndarray:
    """One index field as an array: int64 (null -> -1), float64, bool, or objects (strings)."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int}:
        return np.asarray([-1 if v is None else v for v in values], np.int64)
    if kinds <= {int, float}:
        return np.asarray([np.nan if v is None else v for v in values], np.float64)
    if kinds <= {bool}:
        return np.asarray(values, bool)
    return np.asarray(values, object)


class FeatureSet:
    """A complete feature set opened for reading (module doc): its index as arrays, any rows of any array.

    ``labels``, ``item`` — int64 [R] per row (a missing label is -1); ``files`` — the source file of each item
    id; :meth:`column` — any other index field (a store's ``segment``, ``crop``; an extraction's ``window``,
    ``start_time``, ...) as an array [R]; ``config`` — the cutter's settings; ``cutter``, ``layout``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.meta = _complete_manifest(self.path)
        self.config: dict[str, Any] = self.meta["config"]
        self.cutter: str = self.meta.get("cutter", "store")
        self.layout: str = self.meta.get("layout", "npy")
        cols: dict[str, list[Any]] = {}
        self.files: dict[int, str] = {}
        units: dict[Any, int] = {}
        unit_of: list[int] = []
        for r in _index_rows(self.path, self.meta):
            unit_of.append(units.setdefault(r["shard"], len(units)))
            self.files[int(r["item"])] = r["file"]
            for k, v in r.items():
                if k not in ("row", "shard", "file"):
                    cols.setdefault(k, []).append(v)
        self.units = [str(u) if isinstance(u, str) else f"{int(u):05d}" for u in units]
        self.unit = np.asarray(unit_of, np.int64)
        self._columns = {k: _column(v) for k, v in cols.items()}
        self.offset = self._columns.pop("offset", np.zeros(0, np.int64))
        self.labels = self.column("label")
        self.item = self.column("item")
        self._readers: dict[tuple[str, int], _Rows] = {}

    def __len__(self) -> int:
        return len(self.unit)

    def column(self, name: str) -> np.ndarray:
        """Index field ``name`` of every row (module doc); a set without rows (every file unreadable) has every
        field, empty."""
        if name not in self._columns and len(self) == 0:
            return np.zeros(0, np.int64)
        if name not in self._columns:
            raise KeyError(f"{self.path}: no index field {name!r} (has {', '.join(self._columns)})")
        return self._columns[name]

    @property
    def segment(self) -> np.ndarray:
        return self.column("segment")

    @property
    def crop(self) -> np.ndarray:
        return self.column("crop")

    def _file(self, name: str, unit: str) -> tuple[Path, str | None]:
        if self.layout == "safetensors":
            return self.path / f"features-{unit}.safetensors", name
        if self.layout == "per_video":
            if name == "patches" or name in EXTRA_ARRAYS:
                return self.path / f"{unit}.{name}.npy", None
            if name != self.config.get("per_video_array", "mean"):
                raise DataError(
                    f"missing: {self.path} holds {self.config.get('per_video_array')} per video, not {name}"
                )
            return self.path / f"{unit}.npy", None
        return self.path / f"{name}-{unit}.npy", None

    def has(self, name: str) -> bool:
        """Whether the feature set holds array ``name`` (its first unit with rows does). Only says what is there: a
        file that fails its check is refused when it is read, never taken for an array the set lacks."""
        if len(self) == 0:
            return False
        try:
            path, st_key = self._file(name, self.units[int(self.unit[0])])
        except DataError:
            return False
        if not path.is_file() or st_key is None:
            return path.is_file()
        try:
            with path.open("rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                return st_key in json.loads(f.read(n))
        except (OSError, ValueError, struct.error):
            return True  # unreadable: reading it says why

    def _reader(self, name: str, u: int) -> _Rows:
        key = (name, u)
        if key not in self._readers:
            path, st_key = self._file(name, self.units[u])
            if not path.is_file():
                raise DataError(f"missing: {path} (were the features computed without {name}? recompute with them)")
            self._readers[key] = self._checked(path, st_key, self.units[u])
        return self._readers[key]

    def _checked(self, path: Path, st_key: str | None, unit: str) -> _Rows:
        """The rows of ``path``, its bytes verified on this process's first read (``check.py``): against the
        checksums the set recorded, or — a set written before them — its size and finite values."""
        sums = self.meta.get("checksums")
        if sums is not None:
            recorded = sums.get(unit, {}).get(path.name)
            hint = rebuild_hint(self.path, unit_index(self.path, self.layout, unit))
            if recorded is None:
                raise DataError(f"unreadable: {path} is not among the files {self.path / MANIFEST} records; {hint}")
            verify(path, recorded, hint)
            return _Rows(path, st_key)
        note_unchecked(self.path)
        hint = f"delete {self.path} and run the command that wrote it again"
        try:
            rows = _Rows(path, st_key)
        except (ValueError, OSError, KeyError, struct.error, UnicodeDecodeError) as err:
            raise DataError(f"truncated: {path}: its header cannot be read ({err}); {hint}") from None
        verify_old(path, rows.offset, rows.shape, rows.dtype, hint)
        return rows

    @property
    def arrays(self) -> list[str] | None:
        """The arrays an extraction's manifest says it holds (``levjepa.features.extract.ExtractConfig.arrays``);
        None for a probes' store (its files say)."""
        if self.cutter != "extract":
            return None
        c = self.config
        main = [c.get("per_video_array", "mean")] if self.layout == "per_video" else ["cls", "mean"]
        out = main + (["patches"] if c.get("patches") else []) + list(c.get("readout", []))
        out = ["last_mean" if a == "last" else a for a in out]
        if "token_codec" in c:
            out += ["tokens"] + (["scales"] if TokenCodec.parse(c["token_codec"]).bits < 16 else [])
        return out

    def _check_readout(self, name: str, codec: str | None) -> None:
        """Refuse, in one line, an array or a token codec the manifest does not hold."""
        held = self.arrays
        if held is not None and name not in held:
            how = {
                "frames": "--readout frames",
                "last_mean": "--readout last",
                "tokens": "--tokens CODEC",
                "scales": "an int8 / int4 --tokens codec",
                "patches": "--patch",
            }.get(name, "--format safetensors or npy" if name in ("cls", "mean") else "")
            hint = f": extract again with {how}" if how else ""
            raise DataError(
                f"missing: {self.path} holds the readouts {', '.join(held)} ({MANIFEST}), not {name!r}{hint}"
            )
        stored = self.config.get("token_codec", "full")
        wanted = None if codec is None else TokenCodec.parse(codec)
        if wanted is not None and wanted != TokenCodec.parse(stored):
            raise DataError(
                f"mismatch: {self.path} holds tokens of codec {stored!r} ({MANIFEST}), not {wanted.name!r}: "
                "read them as they are, or extract again with that --tokens"
            )

    def read(self, name: str, rows: np.ndarray, *, codec: str | None = None) -> np.ndarray:
        """Rows ``rows`` (any order) of array ``name`` (``cls``, ``mean``, ``tokens``, ``patches``, an
        extraction's ``frames``, ``last_mean``) as a new array; a compact store's int8 and int4 tokens come back
        as float16 (scaled by their ``scales``). An array the manifest does not hold, or tokens of another
        ``codec`` than the one a caller expects, are refused in one line (``DataError``)."""
        self._check_readout(name, codec)
        codec_used = TokenCodec.parse(self.config.get("token_codec", "full"))
        if name == "tokens" and codec_used.bits < 16:  # restore: every codec's reader (a rotation undone, too)
            q = torch.from_numpy(self._read("tokens", rows))
            return codec_used.restore(q, torch.from_numpy(self._read("scales", rows))).numpy()
        return self._read(name, rows)

    def _read(self, name: str, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            raise ValueError(f"FeatureSet.read({name!r}): no rows asked for")
        unit = self.unit[rows]
        parts: list[np.ndarray] = []
        where: list[np.ndarray] = []
        for u in np.unique(unit):
            sel = np.nonzero(unit == u)[0]
            parts.append(self._reader(name, int(u)).read(self.offset[rows[sel]]))
            where.append(sel)
        out = np.empty((len(rows), *parts[0].shape[1:]), parts[0].dtype)
        for sel, part in zip(where, parts, strict=True):
            out[sel] = part
        return out

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()


def _complete_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the complete feature set in ``path``; anything else is refused in one line."""
    why = _old_format(path)
    if why is not None:
        raise DataError(
            f"unreadable: {path} holds {why}: delete it (or extract again with --overwrite) to compute them in "
            "this levjepa's format"
        )
    meta = read_manifest(path)
    if meta is None:
        raise DataError(f"missing: {path} is not a feature set (no {MANIFEST})")
    if not meta.get("complete"):
        raise DataError(f"unreadable: feature set {path} is incomplete; run the same command again")
    return meta


def _index_rows(path: Path, meta: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    """The rows of ``path/index.jsonl``, its CRC-32 checked against the manifest's when it has one (at the end of
    the file: a changed line is refused before the caller returns)."""
    index = path / INDEX
    crc, size = 0, 0
    with index.open("rb") as f:
        for line in f:
            crc, size = zlib.crc32(line, crc), size + len(line)
            if line.strip():
                yield json.loads(line)
    recorded = meta.get("index")
    if recorded is not None and (size != recorded["bytes"] or f"{crc & 0xFFFFFFFF:08x}" != recorded["crc32"]):
        raise DataError(
            f"unreadable: {index} changed since it was written ({size} bytes, CRC-32 {crc & 0xFFFFFFFF:08x}; "
            f"recorded {recorded['bytes']}, {recorded['crc32']}); delete it and run the command that wrote {path} "
            "again (it is made again from the units)"
        )


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of the complete feature set in ``path`` (its ``index.jsonl``: one dict per feature row, in
    row order, with ``row, shard, offset`` and the row's fields; module doc)."""
    meta = _complete_manifest(Path(path))
    return list(_index_rows(Path(path), meta))
