"""Where clips come from: folders, V-JEPA index files, images, the built-in benchmark, and their mixture.

A *source* is a string in ``DataConfig.sources``:

* ``"synthetic"`` — the built-in benchmark's train split (``synthetic.py``), unlabeled for pretraining.
* a **folder** — searched recursively for videos (mp4, m4v, mov, mkv, webm, avi, mpg, mpeg, wmv, flv, ts,
  3gp, ogv, gif) and images (jpg, jpeg, png, bmp, webp), in sorted path order; hidden files and folders
  (leading ``.``, e.g. ``prepare``'s partial outputs) are skipped. Each real file is listed once: symbolic
  links are followed, but a link loop, a second way into the same folder and a second path to the same file
  (a symbolic or hard link) are skipped, with one line on stderr saying how many (a loop would otherwise list
  one file forty times). When every file lies in a first-level sub-folder, the sub-folder (in sorted order)
  is the label, ImageFolder-style; otherwise labels are None.
* a **V-JEPA index file** — one ``path label`` row per clip, separated by whitespace, no header (V-JEPA's
  CSV format). The label is the last field when it is an integer (it may be absent), or a class name
  (``videos/a.mp4 left``, Kinetics-style lists) when the path before it names a media file and the whole row
  does not; class names are numbered in sorted order (:func:`read_index_labels` returns that map, and takes
  a training split's map to keep a validation split's numbers), and one file uses one kind; a relative path is
  relative to the index file's folder; blank lines and ``#`` comments are skipped. Rows whose extension is
  an image extension are images; every other row is a video. Rows are *not* checked for existence here:
  a missing file is reported as a bad file when it is read, like every other bad file. A file with no row, or
  none of whose rows names a media file (by extension, or by existing), is refused: it is not an index (a
  plain text file given by mistake would otherwise become a list of missing videos).
* a single **video or image file**.

``list_media`` returns :class:`MediaItem` rows. Pretraining reads a source through an object with ``len``,
``path(j)`` and ``load(j, generator, count) -> Decoded`` (``count`` clips of item ``j`` from one decode):
:class:`FileSource` (folders, indexes, files), :class:`SyntheticSource` (the built-in benchmark) and
``shards.ShardSource`` (a packed shard store); the decode options come from the data config in one
:class:`~levjepa.data.video.DecodeOptions` (:func:`decode_options`). The loader mixes several sources with
``DataConfig.weights`` (see ``loader.py``: each epoch holds a fixed quota of positions per source,
proportional to its weight).
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from levjepa.data.badfiles import DataError
from levjepa.data.config import DataConfig
from levjepa.data.video import (
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    DecodeOptions,
    MemoryFile,
    decode_windows,
    load_image,
    window_indices,
)

__all__ = [
    "SYNTHETIC",
    "Decoded",
    "FileSource",
    "MediaItem",
    "SyntheticSource",
    "decode_media",
    "decode_options",
    "image_clip",
    "items_hash",
    "list_media",
    "media_kind",
    "parse_index",
    "read_index_labels",
]

SYNTHETIC = "synthetic"


@dataclass(frozen=True)
class MediaItem:
    path: str
    label: int | None
    kind: Literal["video", "image"]


def items_hash(items: list[MediaItem]) -> str:
    """A hash of a list of items, in order (path, label, kind): what a feature store or an extraction records
    so that a job into the same folder continues only over the same files."""
    h = hashlib.sha1()
    for it in items:
        h.update(f"{it.path}\t{it.label}\t{it.kind}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def media_kind(path: str) -> Literal["video", "image"] | None:
    """ "video", "image" or None (not a media extension) from a path's extension."""
    ext = os.path.splitext(path)[1].lower()
    if ext in VIDEO_EXTENSIONS:
        return "video"
    if ext in IMAGE_EXTENSIONS:
        return "image"
    return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _hidden(path: str, root: str) -> bool:
    """Whether ``path`` (inside ``root``) lies in a hidden folder, which the walk does not enter by its own name."""
    return any(part.startswith(".") for part in Path(os.path.relpath(path, root)).parts)


def _through_link(path: str, root: Path) -> bool:
    """Whether ``path`` (found under ``root``) is reached through a symbolic link, of a file or of a folder."""
    return os.path.realpath(path) != os.path.join(os.path.realpath(root), os.path.relpath(path, root))


def _walk_folder(root: Path) -> tuple[list[tuple[str, Literal["video", "image"]]], list[str]]:
    """Every media file below ``root`` once per real file, sorted by path, and the paths left out.

    Folders are followed through symbolic links, but a link to a folder inside the source is not entered (its
    files are listed under their own path; unless that folder is hidden, then the link is the way in) and no
    folder is entered twice (a link back up, a loop); a file reached by several paths (a symbolic or hard
    link, a link to the same folder outside the source) is listed once, under its path that goes through no
    link, else the first in sorted order."""
    real_root = os.path.realpath(root)
    found: list[tuple[str, Literal["video", "image"]]] = []
    skipped: list[str] = []
    entered: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        entered.add(os.path.realpath(dirpath))
        keep = []
        for d in sorted(d for d in dirnames if not d.startswith(".")):
            full = os.path.join(dirpath, d)
            real = os.path.realpath(full)
            inside_link = os.path.islink(full) and _within(real, real_root) and not _hidden(real, real_root)
            if inside_link or real in entered or _within(os.path.realpath(dirpath), real):  # a copy or a loop
                skipped.append(full)
            else:
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            kind = media_kind(name)
            if kind is not None:
                found.append((os.path.join(dirpath, name), kind))
    found.sort()
    by_file: dict[tuple[int, int] | str, int] = {}
    unique: list[tuple[str, Literal["video", "image"]]] = []
    for path, kind in found:
        try:
            st = os.stat(path)
            key: tuple[int, int] | str = (st.st_dev, st.st_ino)
        except OSError:  # a broken link: listed, and reported when it is read
            key = path
        if key not in by_file:
            by_file[key] = len(unique)
            unique.append((path, kind))
            continue
        first = by_file[key]
        if _through_link(unique[first][0], root) and not _through_link(path, root):  # keep the real path
            skipped.append(unique[first][0])
            unique[first] = (path, kind)
        else:
            skipped.append(path)
    unique.sort()
    return unique, skipped


def _list_folder(root: Path) -> list[MediaItem]:
    found, skipped = _walk_folder(root)
    if skipped:
        print(
            f"{root}: {len(skipped)} path(s) skipped that reach a file or folder listed already (symbolic links, "
            f"a link loop or hard links; e.g. {skipped[0]}): each real file is read once",
            file=sys.stderr,
            flush=True,
        )
    rel_parts = [Path(p).relative_to(root).parts for p, _ in found]
    if found and all(len(parts) >= 2 for parts in rel_parts):
        classes = sorted({parts[0] for parts in rel_parts})
        label_of = {c: i for i, c in enumerate(classes)}
        return [MediaItem(p, label_of[parts[0]], k) for (p, k), parts in zip(found, rel_parts, strict=True)]
    return [MediaItem(p, None, k) for p, k in found]


def parse_index(path: str | os.PathLike) -> list[MediaItem]:
    """Parse a V-JEPA index file (``path label`` rows, no header; see the module docstring). Rows labelled by
    class name come back unlabelled (``None``): their numbers depend on the map a caller shares across splits,
    which :func:`read_index_labels` takes and returns."""
    return _read_index(Path(path))[0]


def read_index_labels(
    path: str | os.PathLike, classes: dict[str, int] | None = None
) -> tuple[list[MediaItem], dict[str, int] | None]:
    """The rows of an index file and, when its labels are class names, the map name -> label (``None`` for
    integer labels). ``classes`` (a training split's map) numbers the names it knows as it says; a name it
    does not know gets the next free number, in sorted order."""
    items, names = _read_index(Path(path))
    if not any(names):
        return items, None
    known = dict(classes or {})
    for name in sorted({n for n in names if n} - known.keys()):
        known[name] = max(known.values(), default=-1) + 1
    labelled = [MediaItem(it.path, known[n] if n else it.label, it.kind) for it, n in zip(items, names, strict=True)]
    return labelled, known


def _class_name(line: str, parts: list[str]) -> str | None:
    """The class name ending a row (``videos/a.mp4 left``): the path before it names a media file by its
    extension and the whole row does not (a path with a space stays a path)."""
    if len(parts) == 2 and media_kind(parts[0].strip()) is not None and media_kind(line) is None:
        return parts[1]
    return None


def _read_index(path: Path) -> tuple[list[MediaItem], list[str | None]]:
    """The rows of an index file and the class name of each (``None``: an integer label or none)."""
    base = path.parent
    items: list[MediaItem] = []
    try:
        data = path.read_bytes()
        if b"\0" in data[:4096]:
            raise DataError(f"unreadable: index file {path} is not text (is it a video?)")
        text = data.decode("utf-8", "surrogateescape")  # a path in any bytes the file system allows (os.fsdecode's)
    except PermissionError as exc:
        raise DataError(f"permission: index file {path} cannot be read ({exc.strerror})") from None
    except FileNotFoundError:
        raise DataError(f"missing: index file {path} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"unreadable: index file {path} is a folder (give the folder as a source instead)") from None
    names: list[str | None] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        label: int | None = None
        file, name = line, None
        if len(parts) == 2:
            try:
                label = int(parts[1])
                file = parts[0].strip()
            except ValueError:
                name = _class_name(line, parts)
                file = parts[0].strip() if name else line
        if not file:
            raise DataError(f"unreadable: index file {path} line {lineno}: {raw!r} has no path")
        if (name is not None and label is None and any(n is None for n in names) and items) or (
            name is None and label is not None and any(names)
        ):
            raise DataError(
                f"unreadable: index file {path} line {lineno}: {raw!r} mixes integer labels and class names; "
                "use one kind in a file"
            )
        full = file if os.path.isabs(file) else os.path.normpath(base / file)
        items.append(MediaItem(str(full), label, media_kind(full) or "video"))
        names.append(name)
    _check_looks_like_index(path, items)
    return items, names


def _check_looks_like_index(path: Path, items: list[MediaItem]) -> None:
    """Refuse a file that is not an index: no rows, or no row naming a media file (by extension or on disk;
    the first 100 rows are looked at)."""
    if not items:
        raise DataError(f"unreadable: index file {path} has no rows (expected `path label` lines)")
    head = items[:100]
    if not any(media_kind(it.path) is not None or os.path.isfile(it.path) for it in head):
        raise DataError(
            f"unreadable: {path} does not look like a V-JEPA index file: none of its first {len(head)} row(s) "
            f"names a video or image file (first row: {head[0].path!r}). An index holds `path label` rows such "
            "as `videos/a.mp4 3`; a folder of videos can be given as a source directly."
        )


def list_media(source: str) -> list[MediaItem]:
    """Every media item of a folder, an index file or a single file (see the module docstring).

    ``"synthetic"`` is not a file source (the loader reads the benchmark's clips from memory); asking
    for its files raises ``ValueError``. A source that does not exist raises :class:`DataError`.
    """
    if source == SYNTHETIC:
        raise ValueError("list_media('synthetic'): the built-in benchmark has no files; use synthetic.load_split")
    path = Path(source).expanduser()
    if path.is_dir():
        return _list_folder(path)
    if not path.exists():
        raise DataError(f"missing: source {source!r} is neither 'synthetic', a folder, an index file nor a file")
    kind = media_kind(str(path))
    if kind is not None:
        return [MediaItem(str(path), None, kind)]
    return parse_index(path)


# ---------------------------------------------------------------------------------------------- reading clips


@dataclass
class Decoded:
    """What a source yields for one group of ``k`` clips: ``frames`` uint8 ``[U, H, W, C]`` (a span of
    decoded frames, channels last), clip ``m`` being ``frames[index[m]]`` (``index`` int64 ``[k, T]``), and a
    note when the video was padded."""

    frames: torch.Tensor
    index: torch.Tensor
    note: str | None = None


def decode_options(cfg: DataConfig) -> DecodeOptions:
    """How ``cfg`` cuts clips from a video (its decode fields, in one object)."""
    return DecodeOptions(
        num_frames=cfg.num_frames,
        frame_stride=cfg.frame_stride,
        target_fps=cfg.target_fps,
        shift=cfg.repeat_shift,
        short_side=cfg.short_side,
        short_videos=cfg.short_videos,
        min_side=cfg.min_side,
        max_side=cfg.max_side,
        threads=cfg.decode_threads,
        skip_nonref=cfg.skip_nonref,
        hwaccel="cuda" if cfg.decode_device == "cuda" else None,
    )


def decode_media(source: str | MemoryFile, options: DecodeOptions, generator: torch.Generator, count: int) -> Decoded:
    """``count`` windows of a video (a path or the bytes of a shard member) from one decode; raises DataError."""
    out = decode_windows(source, options, count=count, generator=generator)
    return Decoded(out.frames, out.index, out.note)


def image_clip(img: torch.Tensor, num_frames: int, count: int) -> Decoded:
    """An image is a clip of ``num_frames`` copies of itself: one frame, indexed ``T`` times."""
    return Decoded(img.unsqueeze(0), torch.zeros(count, num_frames, dtype=torch.int64))


class FileSource:
    """The files of a folder, an index or a single file, read as pretraining clips."""

    def __init__(self, name: str, items: list[MediaItem], cfg: DataConfig) -> None:
        self.name, self.items, self.cfg = name, items, cfg
        self.options = decode_options(cfg)

    def __len__(self) -> int:
        return len(self.items)

    def path(self, j: int) -> str:
        return self.items[j].path

    def load(self, j: int, generator: torch.Generator, count: int = 1) -> Decoded:
        """``count`` clips of item ``j`` from one decode; raises DataError."""
        cfg, item = self.cfg, self.items[j]
        if item.kind == "image":
            img = load_image(item.path, short_side=cfg.short_side, min_side=cfg.min_side, max_side=cfg.max_side)
            return image_clip(img, cfg.num_frames, count)
        return decode_media(item.path, self.options, generator, count)


class SyntheticSource:
    """The benchmark's train clips (labels unused). Its clips are already at the benchmark's frame rate, so
    ``frame_stride`` / ``target_fps`` do not apply: a clip longer than ``num_frames`` gives a random window of
    consecutive frames, a shorter one is padded with its last frame.

    ``synthetic.pretrain_clips="fresh"``: item ``j`` is the train split's ``j``-th image, rendered on every
    draw with new random choices (labels, motion, position, colours) from the draw's own generator, so a
    position of an epoch gives the same clip on any worker or rank, and a new one in the next epoch."""

    def __init__(self, cfg: DataConfig) -> None:
        from levjepa.data import synthetic

        self.name, self.cfg = SYNTHETIC, cfg
        self.fresh = cfg.synthetic.pretrain_clips == "fresh"
        if self.fresh:
            self.pool = synthetic.load_image_pool(cfg.synthetic)
            self.images = synthetic.split_images(cfg.synthetic, "train", self.pool)
        else:
            self.clips = synthetic.load_split(cfg.synthetic, "train").clips

    def __len__(self) -> int:
        return self.images.numel() if self.fresh else self.clips.shape[0]

    def path(self, j: int) -> str:
        return f"synthetic:train/{j}"

    def load_many(self, items: list[int], generators: list[torch.Generator], count: int = 1) -> list[Decoded]:
        """``load`` for several items at once (the batch's fresh clips rendered in one call, cheaper than one
        by one: ``bench/data.md``, "Numbers the data/ module docs used to carry"); item ``i`` reads
        ``generators[i]`` exactly as ``load`` would."""
        if self.fresh:
            from levjepa.data import synthetic

            params = synthetic.draw_params(self.cfg.synthetic, self.images[items], generators)
            clips = list(synthetic.render(self.cfg.synthetic, params, self.pool))
        else:
            clips = [self.clips[j] for j in items]
        return [self._windows(clip, g, count) for clip, g in zip(clips, generators, strict=True)]

    def load(self, j: int, generator: torch.Generator, count: int = 1) -> Decoded:
        return self.load_many([j], [generator], count)[0]

    def _windows(self, clip: torch.Tensor, generator: torch.Generator, count: int) -> Decoded:
        """``count`` windows of ``clip`` [C, T, H, W], drawn from ``generator`` after the clip's own draws."""
        windows, _ = window_indices(
            clip.shape[1], num_frames=self.cfg.num_frames, step=1, count=count, shift=self.cfg.repeat_shift,
            generator=generator,
        )  # fmt: skip
        return Decoded(clip.permute(1, 2, 3, 0), torch.tensor(windows, dtype=torch.int64))
