"""Feature extraction for a folder or index of videos and images: CLS, mean-pooled and optionally patch
features per time window — the *extract* row cutter of the one feature-set format
(``levjepa.features.feature_set``: the manifest ``store.json``, the index, the layouts, the done rule and the
reader are described there, and shared with the probes' feature stores).

**Rows.** How frames are taken is a ``levjepa.data.eval_clip.ViewSpec`` (``ExtractConfig.views``: ``frames``
per window, every ``frame_stride``-th source frame or ``fps`` frames a second, short side ``size``; one
segment, one crop), the same statement a feature store and a protocol use. A video's kept frames are cut
into windows of ``frames`` frames whose starts step by ``stride`` (``1 ≤ stride ≤ frames``): starts
``0, s, 2s, …`` plus, when the last regular window stops short of the end, one final window ending on the
last frame — so every frame of the video lies in at least one window (:func:`window_starts`). A video
with fewer kept frames than a window gives one window padded by repeating its last frame (``padded: true``).
An image is one row, its frame repeated ``frames`` times — or, with ``views.image_frames`` (``--image-frames
one``: one temporal slot), that many times; such a row is encoded in a batch of its own length, and beside
videos whose windows have more slots it is refused when a stored array's length would differ (``patches``,
``frames``, a codec keeping every slot). Each row's index fields: the core ``file, label,
item``, then ``kind, window, start_frame, end_frame`` (source frame indices, inclusive) ``, start_time,
end_time`` (seconds, of those frames) ``, num_frames, padded``.

**Frames.** Decoded with ``levjepa.data.eval_clip.load_eval_video`` (scaled down to a short side of
``size`` inside FFmpeg), then resized to short side ``size`` and centre-cropped to a square multiple of the
patch size (the evaluation transform; every row then has the same token count). Note: a whole video is decoded into
memory at that size (about 10 minutes of 15 fps video at stride 2 and 224 px ≈ 1.2 GB).

**Features.** ``cls`` [R, D] and ``mean`` (patch tokens averaged) [R, D] in float32 (``D``: the encoder's
readout width, ``len(layers) · dim`` with readout layers, ``EncoderConfig.readout_layers``, which the manifest
then records as ``readout_layers``); with ``patches``,
every patch token [R, T'·h·w, D] in float16, in time-major (t, y, x) order. With ``readout``
(``levjepa.features.readout``: their definitions), ``frames`` [R, T', D] (each slot's patch tokens averaged),
``last_mean`` [R, D] (the last slot's) and a token codec's ``tokens`` (+ ``scales``): CLS and the patch tokens
as a compact store of that codec keeps them (``last``, ``pool2``, ``int8``, ...); the default extraction
computes exactly what it always did. Windows are batched across
files (``batch_size`` windows per forward), the encoder frozen, nothing dropped. With ``stream`` the
video is pushed through ``levjepa.infer.StreamingEncoder(window=frames)`` ``stride`` frames at a time and a
row is read after the first window and after every push: CLS over the last window's frames and the patch
features of those frames — computed with the banded (sliding-window) causal attention over the whole
history, never recomputing the past. The first row of a video equals the windowed mode's; later rows differ
because their tokens also saw (through earlier layers) frames before the window. Both modes' rows go through
the same writer.

**The job** is the one fill job (``levjepa.features.fill``): decoding in ``workers`` processes, the encoder on
``device`` (``auto``: the GPU when there is one) through the one frozen forward, ``levjepa.infer.encode.encode``
(the streaming rows under the same precision rule).

**Output** (``out/``, layout ``format``): ``safetensors`` — ``features-KKKKK.safetensors`` (tensors ``cls``,
``mean``, ``patches``), shards of ``shard_rows`` rows; ``npy`` — ``cls-KKKKK.npy`` / ``mean-…`` /
``patches-…`` (and a readout's ``frames-…``, ...); ``per_video`` — one ``<name>.npy`` [windows, D] per file
(``per_video_feature``: mean or cls), ``<name>.patches.npy`` and ``<name>.<readout array>.npy``
(the temporal-action-detection layout; names from :func:`video_names`).
Then the feature set's ``index-KKKKK.jsonl`` / ``<name>.jsonl`` per unit, ``index.jsonl`` (every row, with
``row, shard, offset``), ``bad_files.json`` (a bad file is reported and skipped, never fatal — but a source
of which no file could be read is an error), ``store.json``, and ``labels.json`` (the class name -> label
map when an index file labels its rows by name). Read them back with ``levjepa.features.feature_set``: ``read_rows``
(the rows) and ``FeatureSet`` (any rows of any array).

**Run again into the same output.** ``store.json`` records the encoder's function fingerprint, the layout, every
setting that changes a feature (all of :class:`ExtractConfig` but ``workers`` and ``batch_size``) and the list of
files (its hash). A job into a folder continues only the same job (the fill job's resume rules: done units kept,
a killed job ends with the files of an uninterrupted run); anything else — another encoder, setting or list of
files, or features of an older levjepa (``extract.json``) — is refused in one line naming what differs, unless
``overwrite=True`` deletes the old features first. **Stopping**: a SIGTERM or SIGUSR1 stops the job at once with
one line, and ``levjepa extract`` exits with status 75 (requeue); a run again continues.

**Progress.** A bar on a terminal; otherwise (a SLURM ``.out`` file) one line every 30 s and at the end:
``extract: 120/1000 files  3400 rows  4.1 files/s  eta 3m34s``.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from levjepa import distributed
from levjepa.config import check, to_dict
from levjepa.data import DataError, list_media, normalize
from levjepa.data.eval_clip import ViewSpec, load_eval_clip, load_eval_video
from levjepa.data.sources import MediaItem, media_kind, read_index_labels
from levjepa.features.compact import grid_of
from levjepa.features.feature_set import Layout
from levjepa.features.fill import FileUnits, Row, RowUnits, fill, manifest
from levjepa.features.readout import Readout
from levjepa.infer.encode import encode, frozen, precision
from levjepa.infer.stream import StreamingEncoder
from levjepa.model.vit import VideoEncoder
from levjepa.weights import atomic_write_text

__all__ = [
    "ExtractConfig",
    "ExtractResult",
    "extract",
    "video_names",
    "window_starts",
]


@dataclass(frozen=True)
class ExtractConfig:
    """How files become rows (``views``: how frames are taken; ``stride``: frames between window starts),
    what is stored, and how the work is cut (module doc)."""

    views: ViewSpec = field(default_factory=ViewSpec)  # frames per window, frame_stride or fps, size, image_frames
    stride: int = 8  # frames between window starts
    patches: bool = False  # also store every patch token (float16)
    readout: Readout = field(default_factory=Readout)  # per-slot, last-slot and codec readouts (features/readout.py)
    batch_size: int = 8  # windows per forward pass
    stream: bool = False  # use the KV-cache StreamingEncoder instead of independent windows
    format: Layout = "safetensors"  # the feature set's layout: shards of rows, or one file per video
    shard_rows: int = 4096  # rows per output file
    per_video_feature: Literal["mean", "cls"] = "mean"  # what <name>.npy holds with format="per_video"
    workers: int = 2  # decoding processes (0: decode in this process)

    def __post_init__(self) -> None:
        v = self.views
        check(v.segments == 1 and v.crops == 1, f"extract.views: {v.segments}×{v.crops} views: windows are one crop")
        check(
            1 <= self.stride <= v.frames,
            f"extract.stride={self.stride}: must be in 1..frames={v.frames} (a larger stride leaves frames in no "
            "window)",
        )
        check(self.batch_size >= 1, f"extract.batch_size={self.batch_size}: must be >= 1")
        check(self.shard_rows >= 1, f"extract.shard_rows={self.shard_rows}: must be >= 1")
        check(
            self.format in ("safetensors", "npy", "per_video"),
            f"extract.format={self.format!r}: valid choices are safetensors, npy, per_video",
        )
        check(
            self.per_video_feature in ("mean", "cls"),
            f"extract.per_video_feature={self.per_video_feature!r}: valid choices are mean, cls",
        )
        check(self.workers >= 0, f"extract.workers={self.workers}: must be >= 0")

    @property
    def window(self) -> int:
        """Frames per row."""
        return self.views.frames

    def storage(self) -> dict[str, Any]:
        """The settings that change a stored byte (the manifest's ``config``): the views (``ViewSpec.record``) and
        all the rest but ``workers`` and ``batch_size`` (per-row results do not depend on the batch on the CPU)."""
        out = self.views.record(windows=True)
        out.update(stride=self.stride, patches=self.patches, stream=self.stream)
        if self.format == "per_video":
            out["per_video_array"] = self.per_video_feature
        else:
            out["shard_rows"] = self.shard_rows
        out.update(self.readout.storage())  # only when asked for: a default job's manifest is unchanged
        return out

    def arrays(self) -> list[str]:
        """The arrays each row has, in write order (``per_video``: ``<name>.npy`` is ``per_video_feature``)."""
        return ["cls", "mean", *(["patches"] if self.patches else []), *self.readout.arrays()]


def window_starts(num_frames: int, window: int, stride: int) -> list[int]:
    """Start frames of the windows covering ``num_frames`` frames (see the module doc)."""
    if num_frames < 1:
        raise ValueError(f"window_starts: num_frames={num_frames}, need at least one frame")
    if not 1 <= stride <= window:
        raise ValueError(f"window_starts: stride={stride} must be in 1..window={window}")
    if num_frames <= window:
        return [0]
    starts = list(range(0, num_frames - window + 1, stride))
    if starts[-1] + window < num_frames:
        starts.append(num_frames - window)
    return starts


@dataclass
class ExtractResult:
    rows: int
    files: int
    bad_files: int
    shards: list[str]
    seconds: float
    out_dir: str
    info: dict[str, Any] = field(default_factory=dict)


def video_names(items: list[MediaItem]) -> list[str]:
    """The output name of each file with ``format="per_video"`` (see the module doc)."""
    stems = [Path(it.path).stem for it in items]
    dup = {s for s in stems if stems.count(s) > 1}
    if not dup:
        return stems
    root = os.path.commonpath([os.path.dirname(os.path.abspath(it.path)) for it in items])
    return [
        os.path.splitext(os.path.relpath(os.path.abspath(it.path), root))[0].replace(os.sep, "__") if s in dup else s
        for it, s in zip(items, stems, strict=True)
    ]


def _video_windows(
    frames: Tensor, timestamps: Tensor, source_fps: float, cfg: ExtractConfig
) -> Iterator[tuple[dict[str, Any], Tensor]]:
    """(index fields, clip uint8 [T, S, S, 3]) per window of one decoded, cropped video."""
    n = len(frames)
    frame_idx = [round(float(t) * source_fps) for t in timestamps]
    for w, s in enumerate(window_starts(n, cfg.window, cfg.stride)):
        idx = [min(i, n - 1) for i in range(s, s + cfg.window)]
        last = min(s + cfg.window, n) - 1
        yield _window_meta(w, s, last, frame_idx, timestamps, cfg.window, n < cfg.window), frames[idx]


def _window_meta(
    window: int, first: int, last: int, frame_idx: list[int], timestamps: Tensor, num_frames: int, padded: bool
) -> dict[str, Any]:
    """The index fields of one window covering decoded frames ``first .. last`` (both paths write these)."""
    return {
        "window": window,
        "start_frame": frame_idx[first],
        "end_frame": frame_idx[last],
        "start_time": float(timestamps[first]),
        "end_time": float(timestamps[last]),
        "num_frames": num_frames,
        "padded": padded,
    }


def _pad_time(clip: Tensor, multiple: int) -> Tensor:
    """Repeat the last frame of ``clip`` [T, ...] until T is a multiple of ``multiple``."""
    extra = (-len(clip)) % multiple
    return clip if extra == 0 else torch.cat([clip, clip[-1:].expand(extra, *clip.shape[1:])])


def _stream_rows(
    encoder: VideoEncoder, frames: Tensor, timestamps: Tensor, source_fps: float, cfg: ExtractConfig, device: str
) -> Iterator[tuple[dict[str, Any], Tensor, Tensor, Tensor]]:
    """Rows of one video through the KV-cache streaming encoder (see the module doc): index fields, CLS [D],
    mean [D] and the patch tokens of the last window's frames [T'·h·w, D], float32."""
    tau = encoder.cfg.tubelet
    n = len(frames)
    padded = n < cfg.window
    if padded:
        frames = torch.cat([frames, frames[-1:].expand(cfg.window - n, *frames.shape[1:])])
        timestamps = torch.cat([timestamps, timestamps[-1:].expand(cfg.window - n)])
    total = len(frames)
    stream = StreamingEncoder(encoder, window=cfg.window)
    ends = [e + cfg.window for e in window_starts(total, cfg.window, cfg.stride)]
    recent: list[Tensor] = []  # patch features of the pushed frames, one [h·w, D] per temporal slot
    pushed = 0
    frame_idx = [round(float(t) * source_fps) for t in timestamps]
    for w, end in enumerate(ends):
        new = _pad_time(frames[pushed:end], tau)  # only the last push can need padding (stride % τ == 0)
        x = normalize(new.permute(3, 0, 1, 2)[None].to(device))  # [1, C, t, H, W]
        with precision(device):
            feats = stream.push(x)[0].float()  # [t/τ·h·w, D], time-major
        recent.extend(feats.split(feats.shape[0] // (len(new) // tau)))
        recent = recent[-(cfg.window // tau) :]
        pushed = end
        patches = torch.cat(recent)  # tokens of the last `window` frames
        first = end - cfg.window
        last = min(end, n) - 1 if not padded else n - 1
        meta = _window_meta(w, first, last, frame_idx, timestamps, cfg.window, padded)
        yield meta, stream.cls()[0].float().cpu(), patches.float().mean(0).cpu(), patches.float().cpu()


def _load(items: list[MediaItem], cfg: ExtractConfig, patch: int, i: int) -> tuple[Tensor, Tensor, float]:
    """``(frames uint8 [N, S, S, 3], timestamps [N], source fps)`` of file ``i``, through the evaluation
    transform (in a decoding worker); an image is ``window`` copies of itself (``views.image_frames``: that
    many). Raises ``DataError`` (and what decoders raise)."""
    item, v = items[i], cfg.views  # the one place the views become decoder arguments
    if item.kind == "image":
        image = load_eval_clip(item.path, num_frames=v.image_length, size=v.size, patch=patch, kind="image")
        return image, torch.zeros(v.image_length), 1.0
    video = load_eval_video(item.path, size=v.size, patch=patch, frame_stride=v.frame_stride, target_fps=v.fps)
    if len(video.frames) == 0:
        raise DataError(f"truncated: {item.path} decoded to no frame")
    return video.frames, video.timestamps, video.source_fps


class _WindowRows:
    """Extraction's row cutter (``levjepa.features.fill.Cutter``): file × window, or the streaming encoder's rows
    (computed here, straight to the units); the frozen forward, then the readouts."""

    def __init__(self, encoder: VideoEncoder, cfg: ExtractConfig, items: list[MediaItem], device: str) -> None:
        self.encoder, self.cfg, self.items, self.device = encoder, cfg, items, device

    def rows(self, i: int, loaded: tuple[Tensor, Tensor, float]) -> Iterator[Row]:
        """Every row of loaded file ``i``: a window (uint8 ``[T, S, S, 3]``; a one-frame image is encoded in a
        batch of its own length) or, with ``stream``, a row's arrays."""
        frames, timestamps, fps = loaded
        item, cfg, tau = self.items[i], self.cfg, self.encoder.cfg.tubelet
        base = {"file": item.path, "label": item.label, "item": i, "kind": item.kind}
        if item.kind == "image":
            meta = _window_meta(0, 0, 0, [0], torch.zeros(1), cfg.views.image_length, False)
            yield {**base, **meta}, _pad_time(frames, tau)
        elif cfg.stream:
            with frozen(self.encoder):  # the streaming rows run the encoder outside encode()
                for meta, cls, mean, patches in _stream_rows(self.encoder, frames, timestamps, fps, cfg, self.device):
                    yield {**base, **meta}, self._stream_arrays(cls, mean, patches)
        else:
            for meta, clip in _video_windows(frames, timestamps, fps, cfg):
                yield {**base, **meta}, _pad_time(clip, tau)

    def _stream_arrays(self, cls: Tensor, mean: Tensor, patches: Tensor) -> dict[str, Tensor]:
        cfg = self.cfg
        arrays = {"cls": cls[None], "mean": mean[None]}
        if cfg.patches:
            arrays["patches"] = patches[None].half()
        if not cfg.readout.default:
            t = cfg.window // self.encoder.cfg.tubelet
            side = round((len(patches) // t) ** 0.5)  # square frames (the evaluation transform)
            arrays.update(cfg.readout.compute(torch.cat([cls[None], patches])[None], (t, side, side)))
        return arrays

    def forward(self, clips: Tensor) -> dict[str, Tensor]:
        """Windows ``[B, T, S, S, 3]`` through the frozen forward (nothing dropped) into the rows' arrays."""
        x, cfg = clips.permute(0, 4, 1, 2, 3), self.cfg  # [B, C, T, S, S]
        if cfg.readout.default:  # the default extraction, byte for byte as it always was
            enc = encode(self.encoder, x, self.device, tokens=cfg.patches)
            return {"cls": enc.cls, "mean": enc.mean, **({"patches": enc.patches} if cfg.patches else {})}
        enc = encode(self.encoder, x, self.device, token_dtype=torch.float32)  # float32 tokens for the readouts
        assert enc.tokens is not None
        arrays = {"cls": enc.cls, "mean": enc.mean, **({"patches": enc.patches.half()} if cfg.patches else {})}
        return arrays | cfg.readout.compute(enc.tokens, grid_of(enc.positions))


def _check_encoder(encoder: VideoEncoder, cfg: ExtractConfig) -> None:
    if cfg.stream and encoder.cfg.attention != "block_causal":
        raise ValueError("extract: --stream needs a block-causal encoder (its past features must not see the future)")
    tau = encoder.cfg.tubelet
    if cfg.window % tau or (cfg.stream and cfg.stride % tau):
        raise ValueError(
            f"extract: window={cfg.window} (and stride={cfg.stride} with stream) must be multiples of the encoder's "
            f"tubelet={tau}"
        )
    n = cfg.views.image_frames
    if n is not None and n % tau:
        raise ValueError(f"extract: images as {n} frame(s): the encoder's tubelet is {tau} frames (--image-frames one)")


def _check_lengths(items: list[MediaItem], cfg: ExtractConfig, tubelet: int) -> None:
    """Images of another slot count than the videos' windows give token arrays of another length: refused
    when a stored array depends on it (one folder holds one shape per array)."""
    image_slots = -(-cfg.views.image_length // tubelet)
    kinds = {it.kind for it in items}
    if image_slots == cfg.window // tubelet or kinds != {"image", "video"}:
        return
    if cfg.patches or cfg.readout.slot_dependent():
        raise ValueError(
            f"extract: images as {cfg.views.image_length} frame(s) and videos in windows of {cfg.window} give "
            "patches / frames / tokens of two lengths: extract the images and the videos into two folders (or "
            "keep only readouts of one length: cls, mean, last, --tokens ...-last)"
        )


def _list_items(sources: list[str]) -> tuple[list[MediaItem], dict[str, int] | None]:
    """Every item of ``sources`` and, when index files label rows by class name, one name -> label map over
    all of them (``labels.json``; the index's ``label`` field holds the numbers)."""
    items: list[MediaItem] = []
    classes: dict[str, int] | None = None
    for source in sources:
        path = Path(source).expanduser()
        if path.is_file() and media_kind(str(path)) is None:  # an index file
            found, names = read_index_labels(path, classes)
            classes = names or classes
            items += found
        else:
            items += list_media(source)
    return items, classes


def _shard_names(cfg: ExtractConfig, counts: list[int]) -> list[str]:
    """What the result says was written: the shard files, or the per-video names' pattern."""
    if cfg.format == "per_video":
        return ["<name>.npy per video"]
    if cfg.format == "safetensors":
        return [f"features-{k:05d}.safetensors" for k, n in enumerate(counts) if n]
    arrays = ",".join(cfg.arrays())
    return [f"{{{arrays}}}-{k:05d}.npy" for k, n in enumerate(counts) if n]


def extract(
    encoder: VideoEncoder,
    source: str | list[str],
    out_dir: str | Path,
    cfg: ExtractConfig = ExtractConfig(),
    *,
    device: str = "cpu",
    progress: bool = True,
    overwrite: bool = False,
) -> ExtractResult:
    """Extract features of every video/image of ``source`` (a folder, an index file, a file, or a list of
    paths) into ``out_dir`` (see the module doc). Bad files are reported in ``bad_files.json``; a source of
    which no file can be read raises ``DataError``. ``out_dir`` holding features of another encoder, settings
    or list of files, or of an older format, is refused (``DataError``) unless ``overwrite`` deletes them
    first."""
    start = time.perf_counter()
    device = distributed.resolve_device(device)
    out = Path(out_dir)
    items, classes = _list_items(source if isinstance(source, list) else [str(source)])
    if not items:
        raise DataError(f"missing: extract found no video or image in {source!r}")
    _check_encoder(encoder, cfg)
    _check_lengths(items, cfg, encoder.cfg.tubelet)
    units: FileUnits | RowUnits
    if cfg.format == "per_video":  # one unit per file, split over ranks
        units = FileUnits(out, "per_video", len(items), 1, video_names(items), cfg.per_video_feature)
    elif distributed.world_size() > 1:
        raise ValueError("extract under torchrun: use --format per_video (one file per video, split over ranks)")
    else:
        units = RowUnits(out, cfg.format, items, cfg.shard_rows)
    record = fill(
        out,
        manifest("extract", cfg.format, cfg.storage(), encoder, items),
        items,
        functools.partial(_load, items, cfg, encoder.cfg.patch_size),
        _WindowRows(encoder, cfg, items, device),
        units,
        batch_size=cfg.batch_size,
        workers=cfg.workers,
        overwrite=overwrite,
        hint="choose another --out, or pass --overwrite to delete them and extract again",
        progress=progress,
        desc="extract",
        stoppable=True,
    )
    if distributed.rank() == 0 and classes:
        atomic_write_text(out / "labels.json", json.dumps(classes, indent=2) + "\n")
    if distributed.rank() == 0 and record["bad_files"] == len(items):
        raise DataError(
            f"unreadable: none of the {len(items)} file(s) of {source!r} could be read (reasons in "
            f"{out / 'bad_files.json'}); check the paths and `levjepa data check SOURCE`"
        )
    return ExtractResult(
        rows=record["rows"],
        files=len(items) - record["bad_files"],
        bad_files=record["bad_files"],
        shards=_shard_names(cfg, record["shard_rows"]),
        seconds=time.perf_counter() - start,
        out_dir=str(out),
        info={"config": to_dict(cfg), "device": device},
    )
