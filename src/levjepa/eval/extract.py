"""Feature extraction for a folder or index of videos and images: CLS, mean-pooled and optionally patch
features per time window, with an index mapping every row back to its file and time span.

**Rows.** A video's kept frames (every ``frame_stride``-th source frame, or ``target_fps``) are cut into
windows of ``window`` frames whose starts step by ``stride`` (``1 ≤ stride ≤ window``): starts
``0, s, 2s, …`` plus, when the last regular window stops short of the end, one final window ending on the
last frame — so every frame of the video lies in at least one window (:func:`window_starts`). A video
with fewer than ``window`` kept frames gives one window padded by repeating its last frame
(``padded: true`` in the index). An image is one row, its frame repeated ``window`` times.

**Frames.** Decoded with ``levjepa.data.eval_clip.load_eval_video`` (scaled down to a short side of
``size`` inside FFmpeg), then resized to short side ``size`` and centre-cropped to a square multiple of the
patch size (the evaluation transform; every row then has the same token count). Note: a whole video is decoded into
memory at that size (about 10 minutes of 15 fps video at stride 2 and 224 px ≈ 1.2 GB).

**Features.** ``cls`` [R, D] and ``mean`` (patch tokens averaged) [R, D] in float32; with ``patches``,
every patch token [R, T'·h·w, D] in float16, in time-major (t, y, x) order. Windows are batched across
files (``batch_size`` windows per forward), the encoder frozen, nothing dropped. With ``stream`` the
video is pushed through ``levjepa.infer.StreamingEncoder(window=window)`` ``stride`` frames at a time and a
row is read after the first ``window`` frames and after every push: CLS over the last ``window`` frames and
the patch features of those frames — computed with the banded (sliding-window) causal attention over the
whole history, never recomputing the past. The first row of a video equals the windowed mode's; later
rows differ because their tokens also saw (through earlier layers) frames before the window.

**Decoding** runs in ``workers`` worker processes (``levjepa.data.workers.safe_map``), two files ahead per
worker; the encoder runs on ``device`` (``auto``: the GPU when there is one) through the one frozen forward,
``levjepa.infer.encode.encode`` (bf16 autocast on CUDA, float32 on the CPU; the streaming rows under the same
precision rule).

**Output** (``out/``): ``features-00000.safetensors`` … (tensors ``cls``, ``mean``, ``patches``; shards of
``shard_rows`` rows) or ``cls-00000.npy`` / ``mean-…`` / ``patches-…`` with ``format="npy"``;
``index.jsonl``: one JSON object per row — ``row, shard, offset, path, kind, label, window, start_frame,
end_frame`` (source frame indices, inclusive) ``, start_time, end_time`` (seconds, of those frames)
``, num_frames, padded``; ``bad_files.json``: every file that could not be read, with the reason (a bad
file is reported and skipped, never fatal — but a source of which no file could be read is an error);
``extract.json``: the settings and counts; ``labels.json``: the class name -> label map when an index
file labels its rows by name. Every feature file is written atomically
(``levjepa.eval.feature_writer``).

**Run again into the same output.** ``extract.json`` records, from the start of a job, its *signature*: the
encoder's fingerprint (``levjepa.model.fingerprint.function_fingerprint``: a hash of its config and weights) and
every setting that changes a feature (all of :class:`ExtractConfig` but ``workers`` and ``batch_size``). A job
into a folder that holds features continues only under the same signature: ``per_video`` keeps the videos
already written and computes the others; the shard formats keep every complete shard (its files written and
all its rows in ``index.jsonl``), drop the rest, and go on from the file the last kept row came from (its rows
already kept are computed again and not written twice), so the shards end as an uninterrupted job's would;
their signature also holds a hash of the list of files (``levjepa.data.sources.items_hash``), since the
position they continue from is one in that list.
Under another signature — or features without one — a folder is refused with one line naming what differs,
unless ``overwrite=True`` deletes the old features first. A folder never mixes two encoders or two settings.
Unreadable files are written to the report as they are met.

**Stopping.** A SIGTERM or SIGUSR1 (a scheduler's pre-emption) stops the job at once with one line (what was
written, and that the same command continues it) and ``levjepa extract`` exits with status 75 (requeue); every
file written is complete (atomic writes), and a run again continues as above.

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
from levjepa.data import BadFileReport, DataError, list_media, normalize
from levjepa.data.eval_clip import load_eval_clip, load_eval_video
from levjepa.data.progress import Progress
from levjepa.data.sources import MediaItem, items_hash, media_kind, read_index_labels
from levjepa.data.workers import safe_map
from levjepa.eval.feature_writer import save_npy, write_shard
from levjepa.infer.encode import encode, frozen, precision
from levjepa.infer.stream import StreamingEncoder
from levjepa.model.fingerprint import function_fingerprint
from levjepa.model.vit import VideoEncoder
from levjepa.train.preemption import stop_now_on_signals
from levjepa.weights import atomic_write_text

__all__ = [
    "ExtractConfig",
    "ExtractResult",
    "extract",
    "read_index",
    "signature",
    "video_names",
    "window_starts",
]

# settings that do not change a feature (everything else of ExtractConfig is part of the signature)
_NOT_IN_SIGNATURE = ("workers", "batch_size")


@dataclass(frozen=True)
class ExtractConfig:
    window: int = 16  # frames per row (kept frames, after frame_stride)
    stride: int = 8  # frames between window starts
    frame_stride: int = 2  # keep every n-th source frame (ignored when target_fps is set)
    target_fps: float | None = None
    size: int = 224  # short side, then centre square crop (multiple of the patch size)
    patches: bool = False  # also store every patch token (float16)
    batch_size: int = 8  # windows per forward pass
    stream: bool = False  # use the KV-cache StreamingEncoder instead of independent windows
    format: Literal["safetensors", "npy", "per_video"] = "safetensors"
    shard_rows: int = 4096  # rows per output file
    per_video_feature: Literal["mean", "cls"] = "mean"  # what <name>.npy holds with format="per_video"
    workers: int = 2  # decoding processes (0: decode in this process)

    def __post_init__(self) -> None:
        check(self.window >= 1, f"extract.window={self.window}: must be >= 1 frame")
        check(
            1 <= self.stride <= self.window,
            f"extract.stride={self.stride}: must be in 1..window={self.window} (a larger stride leaves frames "
            "in no window)",
        )
        check(self.frame_stride >= 1, f"extract.frame_stride={self.frame_stride}: must be >= 1")
        check(self.target_fps is None or self.target_fps > 0, f"extract.target_fps={self.target_fps}: must be > 0")
        check(self.size >= 1, f"extract.size={self.size}: must be >= 1 pixel")
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


@dataclass
class _ShardsDone:
    """What an earlier job of the same signature left of the shard formats: its complete shards (files written
    and every row in ``index.jsonl``), their rows, and the rows of each file they hold."""

    shards: list[str] = field(default_factory=list)
    rows: int = 0
    per_file: dict[str, int] = field(default_factory=dict)
    last: str | None = None  # the last file with rows in them (possibly only some of its rows)


def _shards_done(out: Path, cfg: ExtractConfig) -> _ShardsDone:
    """Read an earlier job's ``index.jsonl`` (module doc): keep its complete shards, rewrite the index to them
    and delete any later shard's files, so the job continues at a shard boundary and ends with the files of an
    uninterrupted run."""
    index = out / "index.jsonl"
    rows: list[dict[str, Any]] = []
    if index.is_file():
        for line in index.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by the stop
    fmt = "safetensors" if cfg.format == "safetensors" else "npy"
    done, k = _ShardsDone(), 0
    while True:
        shard = [r for r in rows[k * cfg.shard_rows : (k + 1) * cfg.shard_rows] if r.get("shard") == k]
        first = out / (f"features-{k:05d}.safetensors" if fmt == "safetensors" else f"cls-{k:05d}.npy")
        if len(shard) < cfg.shard_rows or not first.is_file():
            break
        done.shards.append(first.name if fmt == "safetensors" else f"{{cls,mean,...}}-{k:05d}.npy")
        k += 1
    kept = rows[: k * cfg.shard_rows]
    done.rows = len(kept)
    for r in kept:
        done.per_file[r["path"]] = done.per_file.get(r["path"], 0) + 1
    done.last = kept[-1]["path"] if kept else None
    atomic_write_text(index, "".join(json.dumps(r) + "\n" for r in kept))
    for stale in out.glob("*-*.npy") if fmt == "npy" else out.glob("features-*.safetensors"):
        number = stale.stem.rsplit("-", 1)[-1]
        if number.isdigit() and int(number) >= k:
            stale.unlink()
    return done


class _Writer:
    """Accumulates rows and writes a shard every ``shard_rows`` rows."""

    def __init__(self, out: Path, cfg: ExtractConfig, done: _ShardsDone | None = None) -> None:
        self.out, self.cfg = out, cfg
        self.buf: dict[str, list[Tensor]] = {"cls": [], "mean": [], "patches": []}
        self.meta: list[dict[str, Any]] = []
        done = done or _ShardsDone()
        self.rows, self.shards = done.rows, list(done.shards)
        self.skip = dict(done.per_file)  # rows of a file an earlier job wrote: computed again, not written twice
        self.index = (out / "index.jsonl").open("a" if done.rows else "w")

    def add(self, metas: list[dict[str, Any]], cls: Tensor, mean: Tensor, patches: Tensor | None) -> None:
        for i, m in enumerate(metas):
            if self.skip.get(m["path"], 0) > 0:
                self.skip[m["path"]] -= 1
                continue
            self.meta.append(m)
            self.buf["cls"].append(cls[i])
            self.buf["mean"].append(mean[i])
            if patches is not None:
                self.buf["patches"].append(patches[i])
            if len(self.meta) == self.cfg.shard_rows:
                self.flush()

    def flush(self) -> None:
        if not self.meta:
            return
        k = self.rows // self.cfg.shard_rows
        tensors = {name: torch.stack(v) for name, v in self.buf.items() if v}
        fmt: Literal["npy", "safetensors"] = "safetensors" if self.cfg.format == "safetensors" else "npy"
        names = write_shard(self.out, k, tensors, fmt, {"rows": len(self.meta), "first_row": self.rows})
        if fmt == "safetensors":
            self.shards += names
        else:
            self.shards.append(f"{{cls,mean{',patches' if 'patches' in tensors else ''}}}-{k:05d}.npy")
        for offset, m in enumerate(self.meta):
            self.index.write(json.dumps({"row": self.rows + offset, "shard": k, "offset": offset, **m}) + "\n")
        self.index.flush()
        self.rows += len(self.meta)
        self.buf = {"cls": [], "mean": [], "patches": []}
        self.meta = []

    def close(self) -> None:
        self.flush()
        self.index.close()


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


class _PerVideoWriter:
    """Rows of the current file, written as ``<name>.npy`` (+ ``.patches.npy``) and ``<name>.json`` when it ends."""

    def __init__(self, out: Path, cfg: ExtractConfig) -> None:
        self.out, self.cfg = out, cfg
        self.meta: list[dict[str, Any]] = []
        self.feats: list[Tensor] = []
        self.patches: list[Tensor] = []
        self.rows = 0
        self.shards: list[str] = []

    def add(self, metas: list[dict[str, Any]], cls: Tensor, mean: Tensor, patches: Tensor | None) -> None:
        self.meta.extend(metas)
        self.feats.append(mean if self.cfg.per_video_feature == "mean" else cls)
        if patches is not None:
            self.patches.append(patches)

    def finish(self, name: str) -> None:
        if not self.meta:
            return
        save_npy(self.out / f"{name}.npy", torch.cat(self.feats).float().numpy())
        if self.patches:
            save_npy(self.out / f"{name}.patches.npy", torch.cat(self.patches).half().numpy())
        rows = [{"file": f"{name}.npy", "offset": i, **m} for i, m in enumerate(self.meta)]
        atomic_write_text(self.out / f"{name}.json", json.dumps(rows) + "\n")
        self.rows += len(rows)
        self.meta, self.feats, self.patches = [], [], []

    def close(self) -> None:
        pass


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
) -> Iterator[tuple[dict[str, Any], Tensor, Tensor, Tensor | None]]:
    """Rows of one video through the KV-cache streaming encoder (see the module doc)."""
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
        yield meta, stream.cls()[0].float().cpu(), patches.float().mean(0).cpu(), patches if cfg.patches else None


class _Batcher:
    """Windows of any number of files, encoded ``batch_size`` at a time by the frozen encoder (nothing dropped)
    and handed to the writer in the order they came."""

    def __init__(
        self, encoder: VideoEncoder, writer: _Writer | _PerVideoWriter, cfg: ExtractConfig, device: str
    ) -> None:
        self.encoder, self.writer, self.cfg, self.device = encoder, writer, cfg, device
        self.pending: list[tuple[dict[str, Any], Tensor]] = []

    def add(self, meta: dict[str, Any], clip: Tensor) -> None:
        """One window: its index fields and uint8 frames ``[T, S, S, 3]``."""
        self.pending.append((meta, _pad_time(clip, self.encoder.cfg.tubelet)))
        if len(self.pending) == self.cfg.batch_size:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        metas = [m for m, _ in self.pending]
        clips = torch.stack([c for _, c in self.pending]).permute(0, 4, 1, 2, 3)  # [B, C, T, S, S]
        enc = encode(self.encoder, clips, self.device, tokens=self.cfg.patches)
        self.writer.add(metas, enc.cls, enc.mean, enc.patches if self.cfg.patches else None)
        self.pending.clear()


def _load(items: list[MediaItem], cfg: ExtractConfig, patch: int, i: int) -> tuple[Tensor, Tensor, float]:
    """``(frames uint8 [N, S, S, 3], timestamps [N], source fps)`` of file ``i``, through the evaluation
    transform (in a decoding worker); an image is ``window`` copies of itself. Raises ``DataError`` (and what
    decoders raise)."""
    item = items[i]
    if item.kind == "image":
        image = load_eval_clip(item.path, num_frames=cfg.window, size=cfg.size, patch=patch, kind="image")
        return image, torch.zeros(cfg.window), 1.0
    video = load_eval_video(
        item.path, size=cfg.size, patch=patch, frame_stride=cfg.frame_stride, target_fps=cfg.target_fps
    )
    if len(video.frames) == 0:
        raise DataError(f"truncated: {item.path} decoded to no frame")
    return video.frames, video.timestamps, video.source_fps


def _add_rows(
    item: MediaItem, frames: Tensor, timestamps: Tensor, fps: float, cfg: ExtractConfig, batcher: _Batcher
) -> None:
    """Every row of one loaded file: its windows to the batcher, or (``stream``) the streaming encoder's rows
    straight to the writer."""
    base = {"path": item.path, "kind": item.kind, "label": item.label}
    if item.kind == "image":
        batcher.add({**base, **_window_meta(0, 0, 0, [0], torch.zeros(1), cfg.window, False)}, frames)
    elif cfg.stream:
        for meta, cls, mean, patches in _stream_rows(batcher.encoder, frames, timestamps, fps, cfg, batcher.device):
            half = None if patches is None else patches[None].half()
            batcher.writer.add([{**base, **meta}], cls[None], mean[None], half)
    else:
        for meta, clip in _video_windows(frames, timestamps, fps, cfg):
            batcher.add({**base, **meta}, clip)


def _check_encoder(encoder: VideoEncoder, cfg: ExtractConfig) -> None:
    if cfg.stream and encoder.cfg.attention != "block_causal":
        raise ValueError("extract: --stream needs a block-causal encoder (its past features must not see the future)")
    tau = encoder.cfg.tubelet
    if cfg.window % tau or (cfg.stream and cfg.stride % tau):
        raise ValueError(
            f"extract: window={cfg.window} (and stride={cfg.stride} with stream) must be multiples of the encoder's "
            f"tubelet={tau}"
        )


def signature(encoder: VideoEncoder, cfg: ExtractConfig) -> dict[str, Any]:
    """What the features of a job depend on (module doc): the encoder's fingerprint and the settings."""
    settings = {k: v for k, v in to_dict(cfg).items() if k not in _NOT_IN_SIGNATURE}
    return {"encoder": function_fingerprint(encoder), **settings}


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


def _outputs(out: Path) -> list[Path]:
    """The files of an extraction in ``out`` (what ``overwrite`` deletes; nothing else of the folder)."""
    names = ("index.jsonl", "extract.json", "bad_files.json", "labels.json")
    found = [out / n for n in names if (out / n).is_file()]
    found += sorted(out.glob("features-*.safetensors")) + sorted(out.glob("bad_files-*.json"))
    found += sorted(p for p in out.glob("*.npy"))
    found += sorted(p for p in out.glob("*.json") if p.with_suffix(".npy").is_file())  # per-video rows
    return found


def _open_output(out: Path, sig: dict[str, Any], *, overwrite: bool, is_main: bool) -> None:
    """Make ``out`` ready for a job of signature ``sig`` (module doc): continue, refuse, or delete what an
    earlier job of another signature left. Records ``sig`` in ``extract.json`` before any feature is written."""
    previous = _outputs(out)
    if previous and is_main:
        record = out / "extract.json"
        saved = json.loads(record.read_text()).get("signature") if record.is_file() else None
        if saved != sig:
            if not overwrite:
                if saved is None:
                    what = "features without a recorded encoder and settings (an older levjepa, or an unfinished job)"
                else:
                    keys = [k for k in sig if saved.get(k) != sig.get(k)]
                    changed = [f"{k} {saved.get(k)!r} -> {sig.get(k)!r}" for k in keys]
                    if keys == ["files"]:  # the shard formats continue over the same list of files only
                        what = "features of another list of files (the source's files or their order changed)"
                    else:
                        what = "features of another " + ("encoder" if "encoder" in keys else "setting")
                        what += f" ({', '.join(changed)})"
                raise DataError(
                    f"{out} holds {what}: choose another --out, or pass --overwrite to delete them and extract again"
                )
            previous_files = previous
        else:
            previous_files = []  # the same job: kept, and continued (per-video files, complete shards)
        for path in previous_files:
            path.unlink()
    distributed.barrier()
    if is_main:
        atomic_write_text(out / "extract.json", json.dumps({"signature": sig, "status": "running"}, indent=2) + "\n")
    distributed.barrier()


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
    which no file can be read raises ``DataError``. ``out_dir`` holding features of another encoder or
    settings is refused (``DataError``) unless ``overwrite`` deletes them first."""
    start = time.perf_counter()
    device = distributed.resolve_device(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items, classes = _list_items(source if isinstance(source, list) else [str(source)])
    if not items:
        raise DataError(f"missing: extract found no video or image in {source!r}")
    _check_encoder(encoder, cfg)
    per_video = cfg.format == "per_video"
    rank, world = distributed.rank(), distributed.world_size()
    if world > 1 and not per_video:
        raise ValueError("extract under torchrun: use --format per_video (one file per video, split over ranks)")
    sig = signature(encoder, cfg)
    if not per_video:  # the shards continue at a position in the list of files: the list must be the same
        sig["files"] = items_hash(items)
    _open_output(out, sig, overwrite=overwrite, is_main=rank == 0)
    if classes and rank == 0:
        atomic_write_text(out / "labels.json", json.dumps(classes, indent=2) + "\n")
    names = video_names(items) if per_video else []
    order = [i for i in range(rank, len(items), world) if not (per_video and (out / f"{names[i]}.json").is_file())]
    bad_path = out / (f"bad_files-{rank}.json" if per_video else "bad_files.json")
    report = BadFileReport(warn=False)
    writer: _Writer | _PerVideoWriter
    if per_video:
        writer = _PerVideoWriter(out, cfg)
    else:
        done = _shards_done(out, cfg)
        if done.last is not None:  # continue at the last file an earlier job wrote rows of
            order = order[[items[i].path for i in order].index(done.last) :]
        writer = _Writer(out, cfg, done)
    if bad_path.is_file():  # an earlier job's unreadable files stay reported
        report.merge(BadFileReport.read(bad_path))
    batcher = _Batcher(encoder, writer, cfg, device)
    report_progress = Progress(len(order), "extract", "file", show=progress and rank == 0)
    load = functools.partial(_load, items, cfg, encoder.cfg.patch_size)
    stopped = functools.partial(_stopped_line, out, writer)
    with stop_now_on_signals(stopped):
        for i, loaded, reason in safe_map(load, order, cfg.workers):
            item = items[i]
            if loaded is None:
                report.add(item.path, reason)
                report.write(bad_path)  # as it goes: a stopped job loses no report
            else:
                frames, timestamps, fps = loaded
                with frozen(encoder):  # the streaming rows run the encoder outside encode()
                    _add_rows(item, frames, timestamps, fps, cfg, batcher)
                if isinstance(writer, _PerVideoWriter):
                    batcher.flush()
                    writer.finish(names[i])
            report_progress.update(1, f"{writer.rows} rows")
        batcher.flush()
        writer.close()
    report_progress.close(f"{writer.rows} rows")
    rows = -1  # known on rank 0 only
    if per_video:
        distributed.barrier()
        if rank == 0:
            rows, report = _merge_per_video(out, names, world)
        distributed.barrier()
        shards = ["<name>.npy per video"]
        total_rows = rows
    else:
        report.write(out / "bad_files.json")
        shards, total_rows = writer.shards, writer.rows
    if rank == 0 and report.total == len(items):
        raise DataError(
            f"unreadable: none of the {len(items)} file(s) of {source!r} could be read (reasons in "
            f"{out / 'bad_files.json'}); check the paths and `levjepa data check SOURCE`"
        )
    result = ExtractResult(
        rows=total_rows,
        files=len(items) - report.total,
        bad_files=report.total,
        shards=shards,
        seconds=time.perf_counter() - start,
        out_dir=str(out),
        info={"config": to_dict(cfg), "bad_file_counts": report.counts, "device": device},
    )
    if rank == 0:
        record = {"signature": sig, "status": "complete", **vars(result)}
        atomic_write_text(out / "extract.json", json.dumps(record, indent=2) + "\n")
    return result


def _stopped_line(out: Path, writer: _Writer | _PerVideoWriter, signal_name: str) -> str:
    """What ``extract`` says when a signal stops it (``levjepa.train.preemption.stop_now_on_signals``)."""
    return (
        f"{signal_name} received: stopped with {writer.rows} row(s) written to {out}; every file written is "
        "complete, and the same command continues where this one stopped"
    )


def _merge_per_video(out: Path, names: list[str], world: int) -> tuple[int, BadFileReport]:
    """``index.jsonl`` from every video's ``<name>.json`` in source order, and the ranks' bad files merged."""
    report = BadFileReport(warn=False)
    for r in range(world):
        if (out / f"bad_files-{r}.json").is_file():
            report.merge(BadFileReport.read(out / f"bad_files-{r}.json"))
    rows = 0
    lines = []
    for name in names:
        path = out / f"{name}.json"
        if path.is_file():
            for row in json.loads(path.read_text()):
                lines.append(json.dumps({"row": rows, **row}) + "\n")
                rows += 1
    atomic_write_text(out / "index.jsonl", "".join(lines))
    report.write(out / "bad_files.json")
    return rows, report


def read_index(out_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``index.jsonl`` (one dict per feature row, in row order)."""
    return [json.loads(line) for line in (Path(out_dir) / "index.jsonl").read_text().splitlines() if line.strip()]
