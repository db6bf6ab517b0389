"""The standard frozen-evaluation protocols as named presets, and readers for their official label files.

A :class:`Protocol` says how a dataset's clips are cut and how many views a test video gets — its
:class:`~levjepa.data.eval_clip.ViewSpec`: frames, frame stride, resolution, ``segments`` temporal clips ×
``crops`` spatial crops (the probe's predictions are averaged over the crops and it reads the tokens of all
segments together) — and whether the data are images repeated along time. ``PROTOCOLS`` holds:

* ``ssv2`` — Something-Something v2: 16 frames, stride 4, 256 px, **16×2×3** at test time (2 segments ×
  3 crops), 174 classes. Source: V-JEPA 2's frozen-evaluation config ``configs/eval/vitl/ssv2.yaml``
  (facebookresearch/vjepa2; ``frames_per_clip: 16, frame_step: 4, num_segments: 2,
  num_views_per_segment: 3, resolution: 256, num_classes: 174`` — read from the ``ssv2-area-attn.yaml``
  variant in the stored snapshot, which says it is based on ``ssv2.yaml`` and differs only in the encoder).
* ``k400`` — Kinetics-400: 16 frames, stride 4, 256 px, **16×8×3** (8 segments × 3 crops), 400 classes.
  Source: V-JEPA 2's ``configs/eval/vitl/k400.yaml`` (``frame_step: 4, num_segments: 8,
  num_views_per_segment: 3``; read from its ``k400-area-attn.yaml`` variant as above).
* ``diving48`` — Diving-48: 16 frames, stride 4, 256 px, 8 segments × 3 crops, 48 classes. V-JEPA 2
  (arXiv:2506.09985, Table 4 and its appendix on the probe protocol) evaluates Diving-48 with the same
  attentive probe as K400 and SSv2; we use K400's clip sampling (whole-video coverage with 8 segments),
  since Diving-48's label depends on the whole dive. Our choice where the paper gives no config file.
* ``in1k`` — ImageNet-1k: images as clips, each image repeated ``frames = 16`` times (the LeJEPA / V-JEPA
  image protocol: "we repeat ImageNet images 16 times"; SPEC §5 and the LeVJEPA paper's appendix C),
  224 px, 1 view (centre crop), 1000 classes.

Every preset reads the usual ``path label`` index files (V-JEPA's CSV: space-separated, no header) and
the official label files (:func:`read_labelled`):

* **Kinetics CSV** (``label,youtube_id,time_start,time_end,split[,is_cc]`` with a header): the video is
  ``<youtube_id>_<time_start:06d>_<time_end:06d>.<ext>`` anywhere under ``video_root`` (the layout of the
  usual downloaders); class indices are the sorted class names of the training file;
* **Something-Something v2 JSON** (``[{"id": "78687", "template": "Holding [something] next to
  [something]", ...}]``) with ``something-something-v2-labels.json`` (``{"Holding something next to
  something": "12", ...}``) beside it or given: the video is ``<id>.webm`` (any extension) under
  ``video_root``; the class is the template without brackets, looked up in the labels file. A test JSON
  without templates has no labels and is refused.

A row whose video is not found is kept with its path as written, so it is reported as a bad file (never
silently dropped).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

from levjepa.data import DataError
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.sources import MediaItem, media_kind, read_index_labels

__all__ = ["PROTOCOLS", "Protocol", "read_labelled"]


@dataclass(frozen=True)
class Protocol:
    """A standard benchmark: how its files are viewed (a :class:`ViewSpec`), its class count, whether its data
    are images repeated along time, and where the settings come from (the module doc, per preset)."""

    name: str
    views: ViewSpec  # frames, frame stride, short side, segments × crops at test time
    num_classes: int
    images: bool  # the dataset is images, evaluated as clips of a repeated frame
    source: str  # where the settings come from

    @property
    def views_text(self) -> str:
        return self.views.text


PROTOCOLS: dict[str, Protocol] = {
    "ssv2": Protocol("ssv2", ViewSpec(256, 16, 4, 2, 3), 174, False, "V-JEPA 2 configs/eval/vitl/ssv2.yaml"),
    "k400": Protocol("k400", ViewSpec(256, 16, 4, 8, 3), 400, False, "V-JEPA 2 configs/eval/vitl/k400.yaml"),
    "diving48": Protocol(
        "diving48", ViewSpec(256, 16, 4, 8, 3), 48, False, "V-JEPA 2 paper; K400's sampling (our choice)"
    ),
    "in1k": Protocol("in1k", ViewSpec(224, 16, 1, 1, 1), 1000, True, "LeJEPA / V-JEPA: images repeated 16 times"),
}


def _find_videos(root: Path) -> dict[str, str]:
    """File stem -> path of every media file under ``root`` (first found in sorted order wins)."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            if media_kind(name) is not None:
                found.setdefault(os.path.splitext(name)[0], os.path.join(dirpath, name))
    return found


def _video_root(path: Path, video_root: str | os.PathLike | None) -> Path:
    root = Path(video_root) if video_root is not None else path.parent
    if not root.is_dir():
        raise DataError(f"missing: video root {root} (for {path}) is not a folder: pass --video-root")
    return root


def _read_kinetics_csv(
    path: Path, video_root: str | os.PathLike | None, classes: dict[str, int] | None
) -> tuple[list[MediaItem], dict[str, int]]:
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    missing = {"label", "youtube_id", "time_start", "time_end"} - set(rows[0] if rows else {})
    if missing:
        raise DataError(f"unreadable: {path}: a Kinetics CSV needs the columns {sorted(missing)}")
    if classes is None:
        classes = {name: i for i, name in enumerate(sorted({r["label"] for r in rows}))}
    root = _video_root(path, video_root)
    videos = _find_videos(root)
    items = []
    for lineno, r in enumerate(rows, start=2):
        if r["label"] not in classes:
            raise DataError(
                f"unreadable: {path} line {lineno}: class {r['label']!r} is not in the training file's classes"
            )
        stem = f"{r['youtube_id']}_{int(float(r['time_start'])):06d}_{int(float(r['time_end'])):06d}"
        file = videos.get(stem, str(root / f"{stem}.mp4"))
        items.append(MediaItem(file, classes[r["label"]], "video"))
    return items, classes


def _read_ssv2_json(
    path: Path, video_root: str | os.PathLike | None, labels_file: str | os.PathLike | None
) -> tuple[list[MediaItem], dict[str, int]]:
    labels_path = Path(labels_file) if labels_file is not None else path.parent / "something-something-v2-labels.json"
    if not labels_path.is_file():
        raise DataError(
            f"missing: {path} is a Something-Something v2 JSON; its labels file {labels_path} was not found "
            "(pass --labels-file)"
        )
    classes = {k: int(v) for k, v in json.loads(labels_path.read_text()).items()}
    rows = json.loads(path.read_text())
    root = _video_root(path, video_root)
    videos = _find_videos(root)
    items = []
    for i, r in enumerate(rows):
        if "template" not in r:
            raise DataError(f"unreadable: {path} entry {i} (id {r.get('id')!r}) has no 'template': no label to probe")
        name = r["template"].replace("[", "").replace("]", "")
        if name not in classes:
            raise DataError(f"unreadable: {path} entry {i}: template {name!r} is not in {labels_path}")
        vid = str(r["id"])
        items.append(MediaItem(videos.get(vid, str(root / f"{vid}.webm")), classes[name], "video"))
    return items, classes


def read_labelled(
    path: str | os.PathLike,
    *,
    video_root: str | os.PathLike | None = None,
    classes: dict[str, int] | None = None,
    labels_file: str | os.PathLike | None = None,
) -> tuple[list[MediaItem], dict[str, int] | None]:
    """Labelled items of one split file, and the class-name map (None for index files with integer labels).
    ``classes`` from the training split keeps validation's indices consistent (Kinetics, and index files
    labelled by class name, ``path left``).
    Format by content: a JSON list (Something-Something v2), a CSV whose header has ``youtube_id``
    (Kinetics), otherwise a ``path label`` index. Every row must carry a label."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"missing: label file {p} does not exist")
    head = p.read_text(encoding="utf-8", errors="replace")[:4096].lstrip()
    names: dict[str, int] | None
    if head.startswith("["):
        items, names = _read_ssv2_json(p, video_root, labels_file)
    elif "youtube_id" in head.splitlines()[0] if head else False:
        items, names = _read_kinetics_csv(p, video_root, classes)
    else:
        items, names = read_index_labels(p, classes)  # integer labels, or class names numbered in sorted order
    unlabeled = [it.path for it in items if it.label is None]
    if unlabeled:
        raise DataError(f"unreadable: {p}: {len(unlabeled)} row(s) have no integer label, e.g. {unlabeled[0]!r}")
    if not items:
        raise DataError(f"unreadable: {p} lists no file")
    return items, names
