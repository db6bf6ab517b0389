"""Where clips come from: folders, V-JEPA index files, images, the built-in benchmark, and their mixture.

A *source* is a string in ``DataConfig.sources``:

* ``"synthetic"`` — the built-in benchmark's train split (``synthetic.py``), unlabeled for pretraining.
* a **folder** — searched recursively for videos (mp4, m4v, mov, mkv, webm, avi, mpg, mpeg, wmv, flv, ts,
  3gp, ogv, gif) and images (jpg, jpeg, png, bmp, webp), in sorted path order; hidden files and folders
  (leading ``.``, e.g. ``prepare``'s partial outputs) are skipped. When every file lies in a first-level
  sub-folder, the sub-folder (in sorted order) is the label, ImageFolder-style; otherwise labels are None.
* a **V-JEPA index file** — one ``path label`` row per clip, separated by whitespace, no header (V-JEPA's
  CSV format). The label is the last field when it is an integer (it may be absent); a relative path is
  relative to the index file's folder; blank lines and ``#`` comments are skipped. Rows whose extension is
  an image extension are images; every other row is a video. Rows are *not* checked for existence here:
  a missing file is reported as a bad file when it is read, like every other bad file. A file with no row, or
  none of whose rows names a media file (by extension, or by existing), is refused: it is not an index (a
  plain text file given by mistake would otherwise become a list of missing videos).
* a single **video or image file**.

``list_media`` returns :class:`MediaItem` rows; the loader mixes several sources with ``DataConfig.weights``
(see ``loader.py``: each epoch holds a fixed quota of positions per source, proportional to its weight).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from levjepa.data.badfiles import DataError
from levjepa.data.video import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS

__all__ = ["SYNTHETIC", "MediaItem", "list_media", "media_kind", "parse_index"]

SYNTHETIC = "synthetic"


@dataclass(frozen=True)
class MediaItem:
    path: str
    label: int | None
    kind: Literal["video", "image"]


def media_kind(path: str) -> Literal["video", "image"] | None:
    """ "video", "image" or None (not a media extension) from a path's extension."""
    ext = os.path.splitext(path)[1].lower()
    if ext in VIDEO_EXTENSIONS:
        return "video"
    if ext in IMAGE_EXTENSIONS:
        return "image"
    return None


def _list_folder(root: Path) -> list[MediaItem]:
    found: list[tuple[str, Literal["video", "image"]]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            kind = media_kind(name)
            if kind is not None:
                found.append((os.path.join(dirpath, name), kind))
    found.sort()
    rel_parts = [Path(p).relative_to(root).parts for p, _ in found]
    if found and all(len(parts) >= 2 for parts in rel_parts):
        classes = sorted({parts[0] for parts in rel_parts})
        label_of = {c: i for i, c in enumerate(classes)}
        return [MediaItem(p, label_of[parts[0]], k) for (p, k), parts in zip(found, rel_parts, strict=True)]
    return [MediaItem(p, None, k) for p, k in found]


def parse_index(path: str | os.PathLike) -> list[MediaItem]:
    """Parse a V-JEPA index file (``path label`` rows, no header; see the module docstring)."""
    path = Path(path)
    base = path.parent
    items: list[MediaItem] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"unreadable: index file {path} is not UTF-8 text (is it a video?)") from None
    except PermissionError as exc:
        raise DataError(f"permission: index file {path} cannot be read ({exc.strerror})") from None
    except FileNotFoundError:
        raise DataError(f"missing: index file {path} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"unreadable: index file {path} is a folder (give the folder as a source instead)") from None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        label: int | None = None
        file = line
        if len(parts) == 2:
            try:
                label = int(parts[1])
                file = parts[0].strip()
            except ValueError:
                label, file = None, line
        if not file:
            raise DataError(f"unreadable: index file {path} line {lineno}: {raw!r} has no path")
        full = file if os.path.isabs(file) else os.path.normpath(base / file)
        items.append(MediaItem(str(full), label, media_kind(full) or "video"))
    _check_looks_like_index(path, items)
    return items


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
