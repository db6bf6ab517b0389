"""The standard frozen-evaluation protocols as named presets, and readers for their official label files.

A :class:`Protocol` says how a benchmark's files are cut — its resolution, how many views a test video gets
(``segments`` temporal clips × ``crops`` spatial crops; the probe's predictions are averaged over the crops and
it reads the tokens of all segments together), whether its data are images repeated along time — and how many
**temporal positions** (``slots``: frames / tubelet) a clip gives the encoder. :meth:`Protocol.views` turns it
into the :class:`~levjepa.data.eval_clip.ViewSpec` for one encoder:

* ``slots=8`` (the default) — **the paper's matched evaluation**: 8 temporal positions whatever the tubelet,
  so a τ = 1 model reads 8 frames and ImageNet images repeated 8 times, a τ = 2 model 16 frames and 16
  repeats (the LeVJEPA paper, its comparison at equal slots); the frames are sampled at the model's own rate
  (its preprocessing: the released weights' 7.5 fps), or as ``--fps`` / ``--frame-stride`` say;
* ``slots=16`` — twice the temporal positions, selectable;
* ``slots="vjepa2"`` — V-JEPA 2's own sampling, for comparison with its tables: 16 frames every 4th source
  frame for videos, images repeated 16 times, whatever the tubelet.

Every evaluation table states the protocol and its slots (:meth:`Protocol.describe`). ``PROTOCOLS`` holds:

* ``ssv2`` — Something-Something v2: 256 px, **2 segments × 3 crops** at test time, 174 classes. Source:
  V-JEPA 2's frozen-evaluation config ``configs/eval/vitl/ssv2.yaml`` (facebookresearch/vjepa2;
  ``frames_per_clip: 16, frame_step: 4, num_segments: 2, num_views_per_segment: 3, resolution: 256,
  num_classes: 174`` — read from the ``ssv2-area-attn.yaml`` variant in the stored snapshot, which says it is
  based on ``ssv2.yaml`` and differs only in the encoder).
* ``k400`` — Kinetics-400: 256 px, **8 segments × 3 crops**, 400 classes. Source: V-JEPA 2's
  ``configs/eval/vitl/k400.yaml`` (``frame_step: 4, num_segments: 8, num_views_per_segment: 3``; read from its
  ``k400-area-attn.yaml`` variant as above).
* ``diving48`` — Diving-48: 256 px, 8 segments × 3 crops, 48 classes. V-JEPA 2 (arXiv:2506.09985, Table 4 and
  its appendix on the probe protocol) evaluates Diving-48 with the same attentive probe as K400 and SSv2; we
  use K400's clip sampling (whole-video coverage with 8 segments), since Diving-48's label depends on the
  whole dive. Our choice where the paper gives no config file.
* ``in1k`` — ImageNet-1k: images as clips of a repeated frame, 224 px, 1 view (centre crop), 1000 classes;
  8 repeats for a τ = 1 model by default (the matched evaluation), 16 with ``slots="vjepa2"`` (the LeJEPA /
  V-JEPA image protocol: "we repeat ImageNet images 16 times").

**Grid and report.** With ``--budget full``, ``ssv2`` and ``k400`` train V-JEPA 2's own grid (``grid="vjepa2"``,
``levjepa.eval.probes.probe_config``: the 20 heads lr 5e-3 … 1e-4 × wd 0.01 … 0.8 of their configs'
``multihead_kwargs``, each its own AdamW, V-JEPA 2's schedules) and their tables print two numbers per probe, each
labelled: levjepa's (the head chosen on val, read on test) and V-JEPA 2's report (the best head on the evaluation
split itself). ``diving48`` and ``in1k`` keep the budget's grid (V-JEPA 2's Diving-48 config trains 3 heads for 100
epochs, its IN1K config another 20-head grid, lr 5e-4 … 2e-3 × wd 5e-4 … 8e-3 with 5 warm-up epochs: not
reproduced); ``probe --grid vjepa2`` asks for it anywhere.

**Training views** (``train_views``, ``probe --train-views online|fixed|K``). ``ssv2``, ``k400`` and ``diving48``
train by default as V-JEPA's and V-JEPA 2's frozen evaluation does, the **reference protocol**: ``online``, the
frozen encoder re-run every epoch on a new view drawn by their training transform (``levjepa.data.clip_augment``),
the attentive probe's tokens never stored — so a number under their name is the number their code makes, at its
cost (``probe --plan`` counts it; ``--train-views K`` keeps K such views in a store, ``fixed`` one centre crop, each
a cheaper protocol the table's caption names). ``in1k`` keeps the fixed centre crop: V-JEPA 2's image evaluation
trains with another transform (timm's AutoAugment ``original`` policy, a flip, random erasing per pixel), not
implemented here, so no default of ours would be its protocol. Without a protocol the default is ``fixed``. The
measurement behind these defaults — fixed views, K-view stores and online on four kinds of task, paired seeds —
and why it does not carry over to 256-px video: ``bench/eval.md``, "The reference training transform (issue 65)",
and docs/evaluation.md.

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
from typing import Literal

from levjepa.config import ConfigError
from levjepa.data import DataError
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.sources import MediaItem, media_kind, read_index_labels

__all__ = [
    "PROTOCOLS",
    "SLOTS_DEFAULT",
    "Protocol",
    "Slots",
    "TrainViews",
    "parse_slots",
    "parse_train_views",
    "read_labelled",
]


Slots = int | Literal["vjepa2"]
SLOTS_DEFAULT = 8  # the paper's matched evaluation: 8 temporal positions
TrainViews = int | Literal["online"]  # K augmented views per file in a store (0: fixed centre crops), or online


@dataclass(frozen=True)
class Protocol:
    """A standard benchmark: resolution, test views, class count, images or videos, where the settings come
    from, and V-JEPA 2's own temporal sampling (module doc)."""

    name: str
    size: int  # short side, then square crop(s)
    segments: int  # temporal clips per video at test time
    crops: int  # spatial crops per clip at test time (1 centre, 3 start/centre/end)
    num_classes: int
    images: bool  # the dataset is images, evaluated as clips of a repeated frame
    source: str  # where the settings come from
    vjepa2_stride: int = 4  # V-JEPA 2's frame_step, with its 16 frames per clip
    train_views: TrainViews = 0  # the probes' training views by default (module doc; bench/eval.md)
    grid: str = "budget"  # the attentive grid with --budget full: vjepa2 (its config's 20 heads) or the budget's

    def views(self, tubelet: int, sampling: ViewSpec, slots: Slots = SLOTS_DEFAULT) -> ViewSpec:
        """The views for an encoder of ``tubelet`` frames per token: ``slots`` temporal positions sampled as
        ``sampling`` says (the model's rate or stride, or the user's), or V-JEPA 2's sampling (module doc)."""
        images = sampling.image_frames  # an image as one slot (--image-frames one), or repeated (None)
        if slots == "vjepa2":
            return ViewSpec(self.size, 16, self.vjepa2_stride, self.segments, self.crops, image_frames=images)
        if not isinstance(slots, int) or slots < 1:
            raise ConfigError(f"--slots {slots!r}: a number of temporal positions (8, the paper's; 16) or vjepa2")
        frames = slots * tubelet
        return ViewSpec(self.size, frames, sampling.frame_stride, self.segments, self.crops, sampling.fps, images)

    def describe(self, views: ViewSpec, slots: Slots, tubelet: int) -> str:
        """What an evaluation table says of its protocol: ``ssv2, 8 slots (8 frames at 7.5 fps, 256 px, 2×3
        views; the paper's matched evaluation)``."""
        what = {SLOTS_DEFAULT: "the paper's matched evaluation", "vjepa2": "V-JEPA 2's sampling"}.get(slots, "")
        n = views.frames // tubelet
        repeats = f"images repeated {views.frames} times" if self.images else views.describe()
        if self.images and views.image_frames is not None:
            repeats = f"images as {views.image_frames // tubelet} slot ({views.image_frames} frame(s))"
        return f"{self.name}, {n} slots ({repeats}{', ' + what if what else ''})"


PROTOCOLS: dict[str, Protocol] = {
    "ssv2": Protocol(
        "ssv2", 256, 2, 3, 174, False, "V-JEPA 2 configs/eval/vitl/ssv2.yaml", train_views="online", grid="vjepa2"
    ),
    "k400": Protocol(
        "k400", 256, 8, 3, 400, False, "V-JEPA 2 configs/eval/vitl/k400.yaml", train_views="online", grid="vjepa2"
    ),
    "diving48": Protocol(
        "diving48", 256, 8, 3, 48, False, "V-JEPA 2 paper; K400's sampling (our choice)", train_views="online"
    ),
    "in1k": Protocol("in1k", 224, 1, 1, 1000, True, "LeVJEPA paper's matched evaluation; V-JEPA: 16 repeats", 1),
}


def parse_slots(text: str | int | None) -> Slots:
    """``--slots``: a number of temporal positions, or ``vjepa2``; None: the paper's 8."""
    if text is None:
        return SLOTS_DEFAULT
    if isinstance(text, int) or str(text).isdigit():
        return int(text)
    if text == "vjepa2":
        return "vjepa2"
    raise ConfigError(f"--slots {text!r}: a number of temporal positions (8, the paper's; 16) or vjepa2")


def parse_train_views(text: str | int) -> TrainViews:
    """``--train-views``: ``online`` (the reference protocol: a new augmented view every epoch), ``fixed`` or 0
    (one centre crop per segment), or ``K`` augmented views per file kept in the store."""
    if isinstance(text, int) or str(text).isdigit():
        return int(text)
    if text == "fixed":
        return 0
    if text == "online":
        return "online"
    raise ConfigError(
        f"--train-views {text!r}: online (the reference protocol), fixed (centre crops), or a number K of "
        "augmented views per video kept in the store"
    )


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
