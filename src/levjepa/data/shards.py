"""A shard store: a corpus of prepared videos packed into a few large tar files, read rank-sharded.

Why: a real corpus (K710: 650k videos) usually sits on network storage, where opening 650k small files
at random is slow; a few hundred large files read in long sequential runs are not.

**Format: WebDataset-style tar, written and read with Python's ``tarfile`` and plain byte ranges.**
Each shard ``shard-000000.tar`` (POSIX ustar) holds, per sample, ``KEY.mp4`` (or ``.jpg``, ...: the file
itself, bytes unchanged) and ``KEY.json`` (``{"path": original path, "label": int | null}``), with ``KEY``
a 9-digit sample number; any WebDataset reader reads these shards as they are. Beside them,
``shards.json`` indexes every media member: shard, byte offset and size of its data, original path,
label. The choice, against MosaicML streaming's MDS and Lance: zero new dependencies (``tarfile`` is in
the standard library; MDS pulls in a cloud-storage stack and Lance a ~40 MB Arrow binary), nothing that
depends on a torch version (both alternatives ship their own dataset/loader classes, which would have to
fit torch 2.13's DataLoader and our step-keyed resume; here a member is just bytes at an offset), and
shards that standard tools (``tar tf``, webdataset, wids) can list and read. The index makes any member
one range read, so the loader keeps its deterministic, step-keyed plan (``loader.py``) instead of a
stream position, and resumes exactly from a step number.

**Reading.** ``data.sources=DIR`` (a folder with ``shards.json``) or any fsspec URL of one
(``s3://bucket/k710``, ``gs://...``, ``file:///...``; needs the optional ``fsspec`` package and its
backend, ``pip install 'levjepa[remote]' s3fs``). Per epoch the shards are permuted (seeded by the epoch)
and dealt to ranks, ``perm[r::world_size]`` to rank ``r``, so **ranks read disjoint shards**; rank ``r``'s
stream is its shards' members in stored order, each shard's members rotated by a per-epoch offset, and the
groups the plan gives rank ``r`` take that stream in order (a rank with fewer members wraps around).
A batch therefore reads one contiguous run of members of one or two shards; the loader fetches each run
with a single read (:meth:`ShardSource.prefetch`), and DataLoader workers, which build whole batches,
read disjoint runs. Everything is a function of ``(seed, epoch, rank, world_size)``, so a run resumes
exactly at a step; changing the world size changes which rank reads what. ``pack`` shuffles the samples
(seeded) before dealing them to shards, so a run of consecutive members is a random draw of the corpus;
runs that share a batch recur from epoch to epoch, shifted by the rotation (the price of sequential
reads, as with WebDataset's shuffle buffer).

**Bad members** fail like bad files: a member that cannot be read or decoded raises ``DataError`` naming
``SHARD:MEMBER`` and the path it was packed from, and goes to ``bad_files.json``; the loader replaces it
with the next member of the same shard.

**Writing** (``levjepa data pack SRC DST --shards N``, or ``levjepa data prepare SRC DST --shards N``):
:func:`pack` writes each shard under a temporary name and renames it when complete, then writes
``shards.json`` last (atomically); a rerun keeps every shard whose members already match the plan.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from levjepa.config import ConfigError
from levjepa.data.badfiles import DataError
from levjepa.data.config import DataConfig
from levjepa.data.sources import Decoded, MediaItem, decode_media, decode_options, image_clip, media_kind
from levjepa.data.video import MemoryFile, load_image
from levjepa.data.workers import parallel_map
from levjepa.rng import make_generator
from levjepa.weights import atomic_write_text

__all__ = ["INDEX_NAME", "PackResult", "ShardIndex", "ShardSource", "is_shard_store", "pack", "read_index"]

INDEX_NAME = "shards.json"
FORMAT = "levjepa-shards"
_PARTIAL = ".partial-"
_MERGE_GAP = 1 << 20  # members closer than this are fetched in one read (tar headers and .json members between)


def _is_url(spec: str) -> bool:
    return "://" in spec


def _filesystem(url: str) -> tuple[Any, str]:
    """``(fsspec filesystem, path)`` of a URL; a clear error when fsspec is not installed."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise DataError(
            f"missing: {url}: reading shards from a URL needs the optional fsspec package and its backend "
            "(pip install 'levjepa[remote]' s3fs, or gcsfs, adlfs, ...); local folders need nothing"
        ) from None
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise DataError(f"missing: {url}: fsspec cannot open this URL ({type(exc).__name__}: {exc})") from None


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


def is_shard_store(spec: str) -> bool:
    """True for a URL, a folder holding ``shards.json``, or the path of a ``shards.json``."""
    if _is_url(spec):
        return True
    path = Path(spec).expanduser()
    return (path.is_dir() and (path / INDEX_NAME).is_file()) or (path.name == INDEX_NAME and path.is_file())


# ------------------------------------------------------------------------------------------------ index


@dataclass
class ShardIndex:
    """Every media member of a store, in stored order (member ``j`` of the store is row ``j``)."""

    root: str  # the folder or URL holding the shards
    shards: list[str]  # shard file names
    first: list[int]  # member ids of shard i: first[i] .. first[i + 1] - 1 (first has len(shards) + 1 entries)
    offset: torch.Tensor  # int64 [N]: byte offset of the member's data in its shard
    size: torch.Tensor  # int64 [N]
    names: list[str]  # member names, KEY.ext
    paths: list[str]  # the paths the members were packed from
    labels: list[int | None]

    def __len__(self) -> int:
        return len(self.names)

    def shard_of(self, j: int) -> int:
        return bisect.bisect_right(self.first, j) - 1


def read_index(spec: str) -> ShardIndex:
    """Read ``shards.json`` of a folder or URL (or the path of the file itself)."""
    root = spec[: -len(INDEX_NAME)].rstrip("/") if spec.endswith(INDEX_NAME) else spec
    location = _join(root, INDEX_NAME)
    try:
        if _is_url(root):
            fs, path = _filesystem(location)
            text = fs.cat_file(path).decode("utf-8")
        else:
            root = str(Path(root).expanduser())
            text = Path(root, INDEX_NAME).read_text(encoding="utf-8")
        doc = json.loads(text)
    except DataError:
        raise
    except (OSError, ValueError) as exc:
        raise DataError(f"unreadable: shard index {location}: {type(exc).__name__}: {exc}") from None
    if doc.get("format") != FORMAT:
        raise DataError(f"unreadable: {location} is not a levjepa shard index (format {doc.get('format')!r})")
    shards, first, offset, size, names, paths, labels = [], [0], [], [], [], [], []
    for shard in doc["shards"]:
        m = shard["members"]
        shards.append(shard["name"])
        offset += m["offset"]
        size += m["size"]
        names += m["name"]
        paths += m["path"]
        labels += m["label"]
        first.append(len(names))
    return ShardIndex(
        root, shards, first, torch.tensor(offset, dtype=torch.int64), torch.tensor(size, dtype=torch.int64),
        names, paths, labels,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- reading


class ShardSource:
    """A loader source over a shard store (see the module docstring); ``cfg`` is the ``DataConfig``."""

    def __init__(self, spec: str, cfg: DataConfig) -> None:
        self.name, self.cfg = spec, cfg
        self.options = decode_options(cfg)
        self.index = read_index(spec)
        self._fs: Any = None
        self._files: dict[int, Any] = {}
        self._cache: dict[int, bytes] = {}

    def __getstate__(self) -> dict[str, Any]:  # open files and filesystems stay in their process
        return {**self.__dict__, "_fs": None, "_files": {}, "_cache": {}}

    def __len__(self) -> int:
        return len(self.index)

    def path(self, j: int) -> str:
        return f"{_join(self.index.root, self.index.shards[self.index.shard_of(j)])}:{self.index.names[j]}"

    # -- which members a rank reads
    def rank_stream(self, seed: int, epoch: int, rank: int, world_size: int) -> torch.Tensor:
        """Member ids in the order rank ``rank`` reads them in ``epoch`` (module docstring)."""
        n_shards = len(self.index.shards)
        if n_shards < world_size:
            raise DataError(
                f"missing: shard store {self.name} has {n_shards} shard(s) for {world_size} ranks; every rank "
                f"reads its own shards: repack with --shards >= {world_size} (a multiple of it balances them)"
            )
        g = make_generator(seed, "shards", epoch)
        order = torch.randperm(n_shards, generator=g)[rank::world_size].tolist()
        runs = []
        for i in order:
            members = torch.arange(self.index.first[i], self.index.first[i + 1])
            if len(members):
                shift = int(torch.randint(0, len(members), (1,), generator=g).item())
                runs.append(torch.roll(members, -shift))
        if not runs:
            raise DataError(f"missing: shard store {self.name}: the shards of rank {rank} hold no members")
        return torch.cat(runs)

    # -- bytes
    def _read_range(self, shard: int, start: int, length: int) -> bytes:
        if _is_url(self.index.root):
            if self._fs is None:
                self._fs = _filesystem(self.index.root)
            fs, root = self._fs
            return fs.cat_file(_join(root, self.index.shards[shard]), start=start, end=start + length)
        f = self._files.get(shard)
        if f is None:
            location = _join(self.index.root, self.index.shards[shard])
            f = self._files[shard] = open(location, "rb")  # noqa: SIM115 (kept open for the worker's life)
        f.seek(start)
        return f.read(length)

    def prefetch(self, members: list[int]) -> None:
        """Read these members (a batch's) in as few reads as possible: one per run of nearby members."""
        self._cache = {}
        by_shard: dict[int, list[int]] = {}
        for j in sorted(set(members)):
            by_shard.setdefault(self.index.shard_of(j), []).append(j)
        for shard, ids in by_shard.items():
            ids.sort(key=lambda j: int(self.index.offset[j]))
            run = [ids[0]]
            following: list[int | None] = [*ids[1:], None]  # None closes the last run
            for nxt in following:
                if nxt is not None:
                    end = int(self.index.offset[run[-1]] + self.index.size[run[-1]])
                    if int(self.index.offset[nxt]) - end <= _MERGE_GAP:
                        run.append(nxt)
                        continue
                start = int(self.index.offset[run[0]])
                stop = int(self.index.offset[run[-1]] + self.index.size[run[-1]])
                try:
                    data = self._read_range(shard, start, stop - start)
                except OSError:
                    data = b""  # each member is then read (and reported) on its own
                for m in run:
                    lo = int(self.index.offset[m]) - start
                    chunk = data[lo : lo + int(self.index.size[m])]
                    if len(chunk) == int(self.index.size[m]):
                        self._cache[m] = chunk
                run = [nxt] if nxt is not None else []

    def read(self, j: int) -> bytes:
        """The bytes of member ``j`` (from the last prefetch when there); raises DataError."""
        if j in self._cache:
            return self._cache[j]
        size = int(self.index.size[j])
        try:
            data = self._read_range(self.index.shard_of(j), int(self.index.offset[j]), size)
        except OSError as exc:
            raise DataError(f"unreadable: {self.path(j)}: the shard cannot be read ({exc})") from None
        if len(data) != size:
            raise DataError(f"truncated: {self.path(j)}: the shard ends {size - len(data)} bytes early")
        return data

    def load(self, j: int, generator: torch.Generator, count: int = 1) -> Decoded:
        """Like a file source's ``load``, for member ``j``; a DataError names the member and its origin."""
        cfg = self.cfg
        try:
            member = MemoryFile(self.path(j), self.read(j))
            if media_kind(self.index.names[j]) == "image":
                img = load_image(member, short_side=cfg.short_side, min_side=cfg.min_side, max_side=cfg.max_side)
                return image_clip(img, cfg.num_frames, count)
            return decode_media(member, self.options, generator, count)
        except DataError as exc:
            raise DataError(f"{exc} (packed from {self.index.paths[j]})") from None


# ---------------------------------------------------------------------------------------------- writing


@dataclass
class PackResult:
    index: Path
    shards: int = 0
    members: int = 0
    reused: int = 0  # shards kept from an earlier run
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, reason): files that could not be packed


def _member_names(path: Path) -> list[str]:
    try:
        with tarfile.open(path, "r:") as tar:
            return [m.name for m in tar.getmembers()]
    except (OSError, tarfile.TarError):
        return []


def _plan_names(chunk: list[tuple[int, MediaItem]]) -> list[str]:
    names = []
    for key, item in chunk:
        names += [f"{key:09d}{Path(item.path).suffix.lower()}", f"{key:09d}.json"]
    return names


def _write_shard(task: tuple[Path, list[tuple[int, MediaItem]], str]) -> tuple[int, list[tuple[str, str]]]:
    """Write one shard (atomically); returns (1 if it was kept from an earlier run else 0, failures)."""
    dst, chunk, source_root = task
    if dst.is_file() and _member_names(dst) == _plan_names(chunk):
        return 1, []
    tmp = dst.with_name(f".{dst.name}{_PARTIAL}{os.getpid()}")
    failed: list[tuple[str, str]] = []
    try:
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, item in chunk:
                try:
                    with open(item.path, "rb") as f:
                        data = f.read()
                except OSError as exc:
                    failed.append((item.path, f"unreadable: {item.path}: {exc.strerror or exc}"))
                    continue
                rel = os.path.relpath(item.path, source_root) if source_root else item.path
                meta = json.dumps({"path": rel, "label": item.label}).encode()
                for name, payload in ((f"{key:09d}{Path(item.path).suffix.lower()}", data), (f"{key:09d}.json", meta)):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(payload), 0, 0o644
                    tar.addfile(info, io.BytesIO(payload))
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return 0, failed


def _scan(path: Path) -> dict[str, list[Any]]:
    """The index entry of one written shard: data offset and size of each media member, and its .json."""
    cols: dict[str, list[Any]] = {"name": [], "offset": [], "size": [], "path": [], "label": []}
    with tarfile.open(path, "r:") as tar:
        members = tar.getmembers()
        meta = {m.name[: -len(".json")]: m for m in members if m.name.endswith(".json")}
        for m in members:
            if m.name.endswith(".json"):
                continue
            key = m.name.split(".", 1)[0]
            info = json.loads(tar.extractfile(meta[key]).read()) if key in meta else {}  # type: ignore[union-attr]
            cols["name"].append(m.name)
            cols["offset"].append(m.offset_data)
            cols["size"].append(m.size)
            cols["path"].append(info.get("path", m.name))
            cols["label"].append(info.get("label"))
    return cols


def _any_failed(outcome: tuple[int, list[tuple[str, str]]]) -> bool:
    return bool(outcome[1])


def pack(
    items: list[MediaItem],
    dst: str | os.PathLike,
    *,
    shards: int,
    seed: int = 0,
    shuffle: bool = True,
    workers: int = 1,
    source_root: str | None = None,
) -> PackResult:
    """Pack media files into ``shards`` tar shards under ``dst`` plus ``shards.json`` (module docstring).

    Samples are shuffled with ``seed`` (unless ``shuffle=False``) and dealt to shards in contiguous,
    nearly equal runs; bytes are copied unchanged (prepare the videos first). Paths in the members'
    ``.json`` are relative to ``source_root`` when given.
    """
    if shards < 1:
        raise ConfigError(f"--shards {shards}: expected >= 1")
    if not items:
        raise DataError(f"missing: nothing to pack into {dst}: the source holds no video or image files")
    shards = min(shards, len(items))
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for stale in dst.glob(f".shard-*{_PARTIAL}*"):
        stale.unlink(missing_ok=True)
    order = list(range(len(items)))
    if shuffle:
        order = torch.randperm(len(items), generator=make_generator("pack", seed)).tolist()
    bounds = [round(i * len(items) / shards) for i in range(shards + 1)]
    names = [f"shard-{i:06d}.tar" for i in range(shards)]
    tasks = [
        (dst / names[i], [(k, items[order[k]]) for k in range(bounds[i], bounds[i + 1])], source_root or "")
        for i in range(shards)
    ]
    result = PackResult(dst / INDEX_NAME, shards=shards)
    for reused, failed in parallel_map(_write_shard, tasks, workers, desc="pack", unit="shard", failed=_any_failed):
        result.reused += reused
        result.failed += failed
    doc: dict[str, Any] = {"format": FORMAT, "version": 1, "shards": []}
    for name in names:
        cols = _scan(dst / name)
        result.members += len(cols["name"])
        doc["shards"].append({"name": name, "bytes": (dst / name).stat().st_size, "members": cols})
    atomic_write_text(dst / INDEX_NAME, json.dumps(doc, separators=(",", ":")) + "\n")
    return result
