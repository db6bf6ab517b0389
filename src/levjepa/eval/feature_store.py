"""Frozen features of a whole labelled dataset, computed in a stream and stored on disk in shards.

This is the dataset-scale path of ``levjepa probe --task index:...`` / ``--protocol``: nothing holds a split
in memory. Memory is bounded by the decode prefetch (``workers`` × 2 files), one forward batch and one
shard of features; the dataset's size only changes how many shards are written.

**Decoding** runs in ``workers`` worker processes (``levjepa.data.workers.safe_map``), each file cut into the
views of ``StoreConfig.views`` (a ``levjepa.data.eval_clip.ViewSpec``: ``segments`` clips of ``frames``
frames at ``frame_stride`` spread over the video × ``crops`` square crops, at short side ``size``). A file
that cannot be read (``DataError``, a decoder error) is reported — ``bad_files.json``, with the reason — and
skipped, never fatal; it contributes no row.

**The encoder** runs the one frozen forward, ``levjepa.infer.encode.encode`` (``eval()``, ``inference_mode``,
nothing dropped, its precision rule: bf16 autocast on CUDA, float32 elsewhere), so a store holds exactly the
features the in-memory path computes.

**Shards and ranks.** Item ``i`` of the list belongs to shard ``i // shard_items``; under ``torchrun`` shard
``k`` is computed by rank ``k mod world_size``. A forward batch never crosses a shard, so a shard's bytes
depend only on its items and the encoder — not on the rank count (``tests/test_feature_store.py``: 2 gloo
ranks give the same files as 1 process).

**Files** (``out/``), all written to a temporary name and renamed (``feature_writer.py``), a shard's index last:

* ``store.json`` — format version, settings, encoder fingerprint, number and hash of the items; a restart
  with different settings, encoder or items is refused (delete the folder or choose another). When every
  shard is done it also holds ``complete: true``, the row count and each shard's rows;
* ``cls-KKKKK.npy`` float32 [n, D] (CLS token), ``mean-KKKKK.npy`` float32 [n, D] (mean of the patch
  tokens), ``tokens-KKKKK.npy`` float16 [n, 1+L, D] (CLS then every patch token, time-major) when
  ``tokens`` — or, with a compact ``codec`` (``levjepa.eval.compact``: ``pool2``, ``int8``, ...), the tokens it
  keeps, int8 ones (int4: uint8, two a byte) with ``scales-KKKKK.npy`` float16 [n, kept]; plain ``.npy``, so
  ``numpy.load(path, mmap_mode="r")`` maps them;
* ``index-KKKKK.jsonl`` — one JSON object per row of shard K: ``file, label, item, segment, crop``
  (rows of an item are consecutive, segment-major); its presence marks the shard done;
* ``bad-KKKKK.json`` — the unreadable files of shard K; after the last shard ``index.jsonl`` (every row,
  with ``row, shard, offset`` added) and ``bad_files.json`` (all of them, ``BadFileReport`` format).

**Restart.** Shards whose index exists are skipped, so a job killed at any point (``kill -9`` included)
and started again with the same command finishes with the same files as an uninterrupted run.

**Reading back**: :class:`FeatureStore` reads any rows of any array with ``os.pread`` into a fresh buffer
(no memory map stays resident), which is how the probes train from disk (``levjepa.eval.source.StoreSource``).

Cost at ViT-B (D = 768) per 10k clips of 16×224² (8·14·14 = 1568 patch tokens + CLS): float16 tokens
10k × 1569 × 768 × 2 B = **24 GB of disk** per view (SSv2's 2 × 3 test views: 6 rows per video);
``cls`` + ``mean`` 61 MB. Probe memory is one batch of tokens (64 × 1569 × 768 × 4 B = 0.3 GB in fp32)
plus the probe, whatever the number of clips.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from levjepa import distributed
from levjepa.config import check
from levjepa.data import BadFileReport, DataError, MediaItem
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.progress import Progress
from levjepa.data.sources import items_hash
from levjepa.data.workers import safe_map
from levjepa.eval.compact import FULL, TokenCodec, grid_of
from levjepa.eval.feature_writer import write_shard
from levjepa.infer.encode import encode
from levjepa.model.fingerprint import function_fingerprint
from levjepa.model.vit import VideoEncoder
from levjepa.weights import atomic_write_text

__all__ = ["FeatureStore", "StoreConfig", "StoreResult", "build_store"]

STORE_VERSION = 1
ARRAYS = ("cls", "mean", "tokens", "scales")  # scales: the int8 tokens' (a compact store, eval/compact.py)


@dataclass(frozen=True)
class StoreConfig:
    """How each file becomes rows (``views``: one per segment × crop) and how the work is cut (module doc)."""

    views: ViewSpec = field(default_factory=ViewSpec)
    tokens: bool = True  # store the tokens the attentive probe reads
    codec: TokenCodec = FULL  # what of them: every token in float16, or a compact form (eval/compact.py)
    batch_size: int = 8  # views per encoder forward
    workers: int = 2  # decoding processes (0: decode in this process)
    shard_items: int = 256  # files per shard

    def __post_init__(self) -> None:
        check(self.batch_size >= 1, f"store.batch_size={self.batch_size}: must be >= 1")
        check(self.workers >= 0, f"store.workers={self.workers}: must be >= 0")
        check(self.shard_items >= 1, f"store.shard_items={self.shard_items}: must be >= 1")

    def storage(self) -> dict[str, Any]:
        """The settings that determine the stored bytes: the views, ``tokens`` and ``shard_items`` — not
        ``workers`` and ``batch_size``, which may change between a kill and a restart (a batch never crosses a
        shard, and per-row results do not depend on the batch on the CPU; on CUDA keep the batch size for
        bit-identical files). Keys in the order ``store.json`` has always written them."""
        v = self.views
        out: dict[str, Any] = {
            "frames": v.frames,
            "frame_stride": v.frame_stride,
            "size": v.size,
            "segments": v.segments,
            "crops": v.crops,
            "tokens": self.tokens,
            "shard_items": self.shard_items,
        }
        if v.fps is not None:  # a rate: written only when set, so a store computed before rates is reused
            out["fps"] = v.fps
        if self.tokens and not self.codec.lossless:  # likewise a compact form of the tokens
            out["token_codec"] = self.codec.name
        return out


@dataclass
class StoreResult:
    out_dir: str
    rows: int
    files: int
    bad_files: int
    shards_done: int  # computed by this process in this call
    shards_skipped: int  # already on disk
    seconds: float
    info: dict[str, Any] = field(default_factory=dict)


def _views(items: list[MediaItem], views: ViewSpec, patch: int, i: int) -> Tensor:
    """Item ``i``'s views ``[segments·crops, C, T, S, S]`` (uint8), in a decoding worker."""
    return views.load(items[i].path, patch, items[i].kind)


class _Shard:
    """Rows of one shard, kept until its last item is seen, then written."""

    def __init__(self, k: int, first_item: int, num_items: int) -> None:
        self.k, self.first, self.remaining = k, first_item, num_items
        self.arrays: dict[str, list[Tensor]] = {name: [] for name in ARRAYS}
        self.meta: list[dict[str, Any]] = []
        self.bad: list[tuple[str, str]] = []

    def write(self, out: Path) -> int:
        write_shard(out, self.k, {name: torch.cat(parts) for name, parts in self.arrays.items() if parts}, "npy")
        atomic_write_text(out / f"bad-{self.k:05d}.json", json.dumps(self.bad) + "\n")
        atomic_write_text(out / f"index-{self.k:05d}.jsonl", "".join(json.dumps(m) + "\n" for m in self.meta))
        return len(self.meta)


def _check_manifest(out: Path, manifest: dict[str, Any]) -> None:
    path = out / "store.json"
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"unreadable: {path}: {err}; delete the folder to recompute its features") from None
    old = {k: v for k, v in old.items() if k in manifest}
    if old != manifest:
        diff = sorted(k for k in manifest if old.get(k) != manifest[k])
        raise DataError(
            f"unreadable: {out} holds features of other {', '.join(diff)} (store.json); delete it or choose "
            "another folder"
        )


def build_store(
    encoder: VideoEncoder,
    items: list[MediaItem],
    out_dir: str | Path,
    cfg: StoreConfig = StoreConfig(),
    *,
    device: str = "cpu",
    progress: bool = False,
    desc: str = "features",
) -> StoreResult:
    """Compute (or finish computing) the feature store of ``items`` in ``out_dir``; every rank of a
    ``torchrun`` job calls it with the same arguments (see the module doc)."""
    start = time.perf_counter()
    if not items:
        raise DataError(f"unreadable: no file to compute features of for {out_dir}")
    device = distributed.resolve_device(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "version": STORE_VERSION,
        "config": cfg.storage(),
        "encoder": function_fingerprint(encoder),
        "patch": encoder.cfg.patch_size,
        "items": len(items),
        "items_sha1": items_hash(items),
    }
    _check_manifest(out, manifest)
    rank, world = distributed.rank(), distributed.world_size()
    if rank == 0 and not (out / "store.json").is_file():
        atomic_write_text(out / "store.json", json.dumps(manifest, indent=2) + "\n")
    n_shards = math.ceil(len(items) / cfg.shard_items)
    mine = [k for k in range(rank, n_shards, world)]
    todo = [k for k in mine if not (out / f"index-{k:05d}.jsonl").is_file()]
    for k in todo:  # a killed job's half-written temporaries of this rank's shards (atomic writes never finished)
        for stale in out.glob(f".*-{k:05d}.*.tmp"):
            stale.unlink(missing_ok=True)
    shards = {k: _Shard(k, k * cfg.shard_items, min(cfg.shard_items, len(items) - k * cfg.shard_items)) for k in todo}
    order = [i for k in todo for i in range(shards[k].first, shards[k].first + shards[k].remaining)]
    bar = Progress(len(order), desc, "file", show=progress and rank == 0)
    pending: list[tuple[dict[str, Any], Tensor]] = []  # (row meta, one view) of the current shard

    def run(shard: _Shard) -> None:
        while pending:
            chunk, pending[:] = pending[: cfg.batch_size], pending[cfg.batch_size :]
            enc = encode(encoder, torch.stack([v for _, v in chunk]), device, tokens=cfg.tokens)
            feats: dict[str, Tensor | None] = {"cls": enc.cls, "mean": enc.mean}
            if enc.tokens is not None:
                feats.update(cfg.codec.encode(cfg.codec.reduce(enc.tokens, grid_of(enc.positions))))
            for name, t in feats.items():
                if t is not None:
                    shard.arrays[name].append(t)
            shard.meta.extend(m for m, _ in chunk)

    load = functools.partial(_views, items, cfg.views, encoder.cfg.patch_size)
    for i, views, reason in safe_map(load, order, cfg.workers):
        shard = shards[i // cfg.shard_items]
        it = items[i]
        if views is None:
            shard.bad.append((it.path, reason))
        else:
            for v in range(len(views)):
                seg, crop = divmod(v, cfg.views.crops)
                meta = {"file": it.path, "label": it.label, "item": i, "segment": seg, "crop": crop}
                pending.append((meta, views[v]))
                if len(pending) >= cfg.batch_size:
                    run(shard)
        shard.remaining -= 1
        if shard.remaining == 0:
            run(shard)
            shard.write(out)
            del shards[shard.k]
        bar.update(1)
    bar.close()
    distributed.barrier()
    if rank == 0:
        _finish(out, manifest, n_shards)
    distributed.barrier()
    store = json.loads((out / "store.json").read_text())
    return StoreResult(
        out_dir=str(out),
        rows=store["rows"],
        files=len(items) - store["bad_files"],
        bad_files=store["bad_files"],
        shards_done=len(todo),
        shards_skipped=len(mine) - len(todo),
        seconds=time.perf_counter() - start,
        info={"device": device, "rank": rank, "world_size": world},
    )


def _finish(out: Path, manifest: dict[str, Any], n_shards: int) -> None:
    """Merge the shard indexes into ``index.jsonl`` and ``bad_files.json``; mark the store complete."""
    report = BadFileReport(warn=False)
    rows, counts = 0, []
    tmp = out / "index.jsonl.tmp"
    with tmp.open("w") as f:
        for k in range(n_shards):
            lines = (out / f"index-{k:05d}.jsonl").read_text().splitlines()
            for offset, line in enumerate(lines):
                f.write(json.dumps({"row": rows + offset, "shard": k, "offset": offset, **json.loads(line)}) + "\n")
            rows += len(lines)
            counts.append(len(lines))
            report.extend((p, r) for p, r in json.loads((out / f"bad-{k:05d}.json").read_text()))
    os.replace(tmp, out / "index.jsonl")
    report.write(out / "bad_files.json")
    done = {**manifest, "complete": True, "rows": rows, "shard_rows": counts, "bad_files": report.total}
    atomic_write_text(out / "store.json", json.dumps(done, indent=2) + "\n")


class _NpyRows:
    """Rows of a ``.npy`` file read with ``os.pread`` (the header parsed once; nothing memory-mapped)."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as f:
            version = np.lib.format.read_magic(f)
            shape, fortran, dtype = (
                np.lib.format.read_array_header_1_0(f) if version == (1, 0) else np.lib.format.read_array_header_2_0(f)
            )
            self.offset = f.tell()
        if fortran:
            raise DataError(f"unreadable: {path} is Fortran-ordered; the store writes C order only")
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
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


class FeatureStore:
    """A complete feature store opened for reading: its index as arrays and any rows of any array.

    ``labels``, ``item``, ``segment``, ``crop`` — int64 [R] per row; ``files`` — the file of each item id.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_path = self.path / "store.json"
        if not meta_path.is_file():
            raise DataError(f"missing: {self.path} is not a feature store (no store.json)")
        self.meta = json.loads(meta_path.read_text())
        if not self.meta.get("complete"):
            raise DataError(f"unreadable: feature store {self.path} is incomplete; run the same command again")
        self.config = self.meta["config"]
        counts = self.meta["shard_rows"]
        self.shard_first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        cols: dict[str, list[int]] = {"label": [], "item": [], "segment": [], "crop": []}
        self.files: dict[int, str] = {}
        with (self.path / "index.jsonl").open() as f:
            for line in f:
                r = json.loads(line)
                for c in cols:
                    cols[c].append(-1 if r[c] is None else int(r[c]))
                self.files[int(r["item"])] = r["file"]
        self.labels, self.item, self.segment, self.crop = (np.asarray(cols[c], np.int64) for c in cols)
        self._readers: dict[tuple[str, int], _NpyRows] = {}

    def __len__(self) -> int:
        return len(self.labels)

    def has(self, name: str) -> bool:
        return any((self.path / f"{name}-{k:05d}.npy").is_file() for k, n in enumerate(self.meta["shard_rows"]) if n)

    def _reader(self, name: str, k: int) -> _NpyRows:
        key = (name, k)
        if key not in self._readers:
            path = self.path / f"{name}-{k:05d}.npy"
            if not path.is_file():
                raise DataError(f"missing: {path} (was the store computed without tokens? recompute with them)")
            self._readers[key] = _NpyRows(path)
        return self._readers[key]

    def read(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any order) of array ``name`` (``cls``, ``mean``, ``tokens``) as a new array; a compact
        store's int8 and int4 tokens come back as float16 (scaled by their ``scales``)."""
        if name == "tokens" and TokenCodec.parse(self.config.get("token_codec", "full")).bits < 16:
            q = torch.from_numpy(self._read("tokens", rows))
            return TokenCodec.decode(q, torch.from_numpy(self._read("scales", rows))).numpy()
        return self._read(name, rows)

    def _read(self, name: str, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            raise ValueError(f"FeatureStore.read({name!r}): no rows asked for")
        shard = np.searchsorted(self.shard_first, rows, side="right") - 1
        parts: list[np.ndarray] = []
        where: list[np.ndarray] = []
        for k in np.unique(shard):
            sel = np.nonzero(shard == k)[0]
            parts.append(self._reader(name, int(k)).read(rows[sel] - self.shard_first[k]))
            where.append(sel)
        out = np.empty((len(rows), *parts[0].shape[1:]), parts[0].dtype)
        for sel, part in zip(where, parts, strict=True):
            out[sel] = part
        return out

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()
