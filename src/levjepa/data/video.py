"""Decoding videos and images into uint8 frames with PyAV (FFmpeg), reading only what a clip needs.

Design:

* **Which frames.** A clip is ``T`` frames at a fixed step in source frames: ``frame_stride`` (default 2,
  the official LeVJEPA code's every 2nd frame of 15 fps video), or ``source_fps / target_fps`` when a
  target rate is given (possibly fractional; indices are rounded). The window start is uniform over all
  starts that keep the window inside the video, drawn from the caller's ``torch.Generator``
  (:func:`clip_indices`). A video shorter than the window is padded by repeating its last frame (indices
  clipped to the last frame) or rejected, per ``short_videos``.
* **Seek, then decode only the window.** The container is seeked to the key frame at or before the first
  wanted frame; frames are decoded until the last wanted one, and only wanted frames are converted to
  RGB. A frame's index is read from its timestamp, ``round((pts - start_time) · time_base · fps)``, which
  is exact for constant-frame-rate files; with variable frame rate a wanted index that does not occur
  takes the nearest earlier frame. Re-encoding with frequent key frames (``levjepa data prepare``,
  ``--keyint 16``) bounds the frames decoded before the window.
* **Fixed-GOP files skip what no clip uses.** ``levjepa data prepare`` writes H.264 with a key frame
  every ``keyint`` (even) frames and one non-reference B-frame between reference frames, so that every
  odd frame except the last of each GOP is a non-reference frame, and marks the file (mp4 comment
  ``FIXED_GOP_COMMENT``). On such a file, when every wanted frame is even (stride 2 from an even start;
  windows are then drawn on even starts only), the decoder runs with ``skip_frame="NONREF"``: it never
  decodes the odd frames, and the frames it does decode are bit-identical (a reference frame never
  depends on a non-reference one). Should a wanted frame be missing anyway (a file whose marker lies),
  the window is decoded again without skipping.
* **Several windows per decode** (:func:`decode_windows`): ``count`` windows whose starts lie within
  ``shift`` frames of each other are read in one pass over their union of frames (repeated sampling,
  ``data.repeats``).
* **Resize early.** Frames whose short side exceeds ``short_side`` are scaled down inside FFmpeg's
  converter (area filter) as they are converted to RGB, so later crops never work on 720p frames.
* **Errors are data, not crashes.** Every way a file can be unusable raises :class:`DataError` with a
  kind prefix (``missing``, ``empty``, ``permission``, ``unreadable``, ``no-video``, ``resolution``,
  ``truncated``, ``short``); see ``badfiles.py``.

Checked on mp4, mov, mkv, webm (VP9), avi (H.264 timestamps offset by one: calibrated on the first frame)
and MPEG-TS (seeks that land late: retried further back). Known limits: MPEG-PS (.mpg) files may be off
by one frame after a seek and report a wrong duration; rotation metadata (phone videos) and non-square
pixels are ignored (by ``prepare`` too). ``levjepa data prepare`` turns .mpg files into clean mp4s.

A source is a path or a :class:`MemoryFile` (bytes, e.g. a shard member, with a name for messages).
``hwaccel="cuda"`` decodes on NVDEC through FFmpeg when the machine has one (frames are downloaded, then
converted on the CPU); :func:`hwaccel_status` says whether it works here.

``decode_clip`` returns ``uint8 [T, H, W, 3]``; ``decode_all`` returns every (strided) frame with its
timestamp; ``load_image`` reads a jpg/png as ``uint8 [H, W, 3]``. Pixels are read at their true range, whatever
the format stores: 8 or 16 bits, grayscale, palette, limited or full range; transparent pixels show white
(``_Converter``, ``pil_to_rgb8``). Writing videos lives in ``encode.py``.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import av
import numpy as np
import torch

from levjepa.data.badfiles import DataError

__all__ = [
    "FIXED_GOP_COMMENT",
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "DecodeOptions",
    "DecodedWindows",
    "MemoryFile",
    "VideoFrames",
    "VideoInfo",
    "clip_indices",
    "decode_all",
    "decode_clip",
    "decode_windows",
    "frame_step",
    "hwaccel_status",
    "load_image",
    "open_video",
    "over_white",
    "pil_to_rgb8",
    "probe_video",
    "resized_shape",
    "stream_fps",
]

VIDEO_EXTENSIONS = frozenset(
    {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".wmv", ".flv", ".ts", ".3gp", ".ogv", ".gif"}
)
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})
# the mp4 comment of prepare's fixed-GOP files: odd frames (but each GOP's last) are non-reference B-frames
FIXED_GOP_COMMENT = "levjepa fixed-gop nonref-odd"


@dataclass(frozen=True)
class MemoryFile:
    """A media file held in memory (a shard member): ``name`` is what messages and reports show."""

    name: str
    data: bytes

    def __str__(self) -> str:
        return self.name


Source = str | os.PathLike | MemoryFile


@dataclass(frozen=True)
class DecodeOptions:
    """How clips are cut from a video and decoded (see the module doc): one object from the loader down to
    :func:`decode_windows`. What differs per call (the window's start or its generator, how many windows)
    is an argument of the decode functions instead."""

    num_frames: int = 16  # frames per clip
    frame_stride: int = 2  # step in source frames, unless target_fps is given
    target_fps: float | None = None  # step = source fps / target_fps (possibly fractional)
    shift: int = 0  # several windows of one decode start within this many source frames of each other
    short_side: int | None = 256  # frames whose short side is larger are scaled down inside FFmpeg
    short_videos: Literal["pad", "skip"] = "pad"  # a video shorter than the window: pad with its last frame
    min_side: int = 1  # refuse (DataError "resolution") smaller or larger videos
    max_side: int = 1 << 30
    threads: int = 1  # FFmpeg's decoding threads per file
    skip_nonref: bool = True  # the fixed-GOP fast path (never skips anything on other files)
    hwaccel: str | None = None  # "cuda": decode on NVDEC

    def __post_init__(self) -> None:
        if self.num_frames < 1 or self.frame_stride < 1:
            raise ValueError(f"num_frames={self.num_frames}, frame_stride={self.frame_stride}: expected both >= 1")
        if self.target_fps is not None and self.target_fps <= 0:
            raise ValueError(f"target_fps={self.target_fps}: expected None or > 0")


def _name(source: Source) -> str:
    return source.name if isinstance(source, MemoryFile) else os.fspath(source)


@dataclass(frozen=True)
class VideoInfo:
    """What the container says about its first video stream (``num_frames`` may be an estimate)."""

    path: str
    width: int
    height: int
    fps: float
    num_frames: int  # -1 when neither a frame count nor a duration is stored
    duration: float  # seconds; NaN when unknown
    codec: str
    frames_exact: bool  # True when the container stores the frame count (mp4, mov), False when estimated


@dataclass
class VideoFrames:
    """Every kept frame of a video: ``frames`` uint8 [N, H, W, 3], ``timestamps`` seconds [N] (float64)."""

    frames: torch.Tensor
    fps: float  # the rate of the kept frames (source fps / stride, or the target fps)
    timestamps: torch.Tensor
    source_fps: float


# ----------------------------------------------------------------------------------------------- errors


def _check_file(path: str) -> None:
    """Raise the DataError of a path that cannot be a readable file, before FFmpeg sees it."""
    if not os.path.exists(path):
        raise DataError(f"missing: {path} does not exist")
    if os.path.isdir(path):
        raise DataError(f"unreadable: {path} is a directory, expected a video or image file")
    if os.path.getsize(path) == 0:
        raise DataError(f"empty: {path} has 0 bytes")


def open_video(source: Source, hwaccel: str | None = None) -> Any:
    """Open a path or a MemoryFile with FFmpeg (a PyAV container, a context manager; raises DataError with the
    reason); ``hwaccel`` names a decoding device."""
    target: io.BytesIO | str
    if isinstance(source, MemoryFile):
        path, target = source.name, io.BytesIO(source.data)
        if not source.data:
            raise DataError(f"empty: {path} has 0 bytes")
    else:
        path = target = os.fspath(source)
        _check_file(path)
    kwargs: dict[str, Any] = {}
    if hwaccel:
        from av.codec.hwaccel import HWAccel

        # primary_ctx: share the device's primary CUDA context (the one torch uses) instead of creating a
        # context for every opened file (a CUDA context costs far more than decoding a clip)
        options: dict[str, object] | None = {"primary_ctx": "1"} if hwaccel == "cuda" else None
        kwargs["hwaccel"] = HWAccel(device_type=hwaccel, allow_software_fallback=True, options=options)
    try:
        try:
            return av.open(target, metadata_errors="ignore", **kwargs)
        except TypeError:  # PyAV 19 dropped the keyword (and no longer fails on bad metadata)
            return av.open(target, **kwargs)
    except PermissionError as exc:  # av.error.PermissionError subclasses it
        if hwaccel:  # FFmpeg reports a missing device (no driver) as EPERM
            raise
        raise DataError(f"permission: {path} cannot be read ({exc.strerror or exc})") from None
    except (av.error.FFmpegError, OSError, UnicodeDecodeError, ValueError) as exc:
        if _looks_like_cut_mp4(source):
            raise DataError(
                f"truncated: {path} starts like an MP4/MOV file but FFmpeg cannot open it (its index, the moov "
                f"atom, is missing: cut short while downloading or writing?) ({exc})"
            ) from None
        raise DataError(f"unreadable: {path} is not a readable video ({type(exc).__name__}: {exc})") from None


def _looks_like_cut_mp4(source: Source) -> bool:
    """An ISO-BMFF file ("ftyp" box first) without a "moov" box: an MP4 whose writing or download stopped
    before the index that mp4 writers put at the end."""
    try:
        if isinstance(source, MemoryFile):
            opened: Any = io.BytesIO(source.data)
            size = len(source.data)
        else:
            opened, size = open(source, "rb"), os.path.getsize(source)  # noqa: SIM115 (closed by the with)
        with opened as f:
            head = f.read(12)
            if len(head) < 12 or head[4:8] != b"ftyp":
                return False
            f.seek(0)
            offset = 0
            while offset + 8 <= size:  # walk the top-level boxes
                f.seek(offset)
                box = f.read(16)
                length, kind = int.from_bytes(box[:4], "big"), box[4:8]
                if kind == b"moov":
                    return False
                if length == 1 and len(box) == 16:
                    length = int.from_bytes(box[8:16], "big")
                if length < 8:
                    break
                offset += length
            return True
    except OSError:
        return False


def _check_resolution(path: str, width: int, height: int, min_side: int, max_side: int) -> None:
    if width <= 0 or height <= 0:
        raise DataError(f"unreadable: {path} reports a {width}x{height} video stream")
    if min(width, height) < min_side or max(width, height) > max_side:
        raise DataError(
            f"resolution: {path} is {width}x{height}; expected a short side >= {min_side} and a long side "
            f"<= {max_side} (data.min_side / data.max_side)"
        )


# --------------------------------------------------------------------------------------------- metadata


def stream_fps(stream: Any) -> float:
    for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        if rate is not None and float(rate) > 0:
            return float(rate)
    return 30.0  # nothing stored at all: assume a common rate [choice]


def _info(path: str, container: Any, min_side: int, max_side: int) -> VideoInfo:
    if not container.streams.video:
        kinds = ", ".join(sorted({s.type for s in container.streams})) or "no streams"
        raise DataError(f"no-video: {path} has no video stream ({kinds})")
    stream = container.streams.video[0]
    cc = stream.codec_context
    _check_resolution(path, cc.width, cc.height, min_side, max_side)
    fps = stream_fps(stream)
    duration = math.nan
    if stream.duration is not None and stream.time_base is not None:
        duration = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        duration = container.duration / av.time_base
    if stream.frames and stream.frames > 0:
        num_frames, exact = int(stream.frames), True
    elif not math.isnan(duration):
        num_frames, exact = max(1, round(duration * fps)), False
    else:
        num_frames, exact = -1, False
    if math.isnan(duration) and num_frames > 0:
        duration = num_frames / fps
    return VideoInfo(path, cc.width, cc.height, fps, num_frames, duration, cc.name, exact)


def probe_video(path: Source, *, min_side: int = 1, max_side: int = 1 << 30) -> VideoInfo:
    """Read a video's metadata without decoding (raises :class:`DataError`)."""
    with open_video(path) as container:
        return _info(_name(path), container, min_side, max_side)


def _fixed_gop(container: Any) -> bool:
    """True for prepare's fixed-GOP files (odd frames non-reference, see the module docstring)."""
    return container.metadata.get("comment", "") == FIXED_GOP_COMMENT


_HWACCEL_STATUS: dict[str, str | None] = {}


def hwaccel_status(device_type: str = "cuda") -> str | None:
    """None when FFmpeg can decode H.264 on ``device_type`` here, else the reason (checked once per process
    by decoding a tiny in-memory clip)."""
    if device_type not in _HWACCEL_STATUS:
        from av.codec.hwaccel import hwdevices_available

        if device_type not in hwdevices_available():
            _HWACCEL_STATUS[device_type] = f"this FFmpeg build has no {device_type!r} device"
        else:
            from levjepa.data.encode import write_video

            buf = io.BytesIO()
            write_video(buf, np.zeros((2, 64, 64, 3), np.uint8), container_format="mp4")
            try:
                with open_video(MemoryFile("probe.mp4", buf.getvalue()), hwaccel=device_type) as container:
                    next(container.decode(container.streams.video[0]))
                _HWACCEL_STATUS[device_type] = None
            except Exception as exc:
                _HWACCEL_STATUS[device_type] = (
                    f"FFmpeg could not start a {device_type} decoder ({type(exc).__name__}: {exc}): no GPU, no "
                    "driver, or no driver video library (libnvcuvid) in this machine or container"
                )
    return _HWACCEL_STATUS[device_type]


def resized_shape(height: int, width: int, short_side: int | None) -> tuple[int, int]:
    """(H, W) after scaling down so that ``min(H, W) <= short_side`` (never up; None/0 = unchanged)."""
    if not short_side or min(height, width) <= short_side:
        return height, width
    scale = short_side / min(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


# ------------------------------------------------------------------------------------ temporal sampling


def clip_indices(
    num_source_frames: int,
    *,
    num_frames: int,
    step: float,
    start: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[list[int], bool]:
    """Source frame indices of a clip, and whether it had to be padded.

    ``indices[k] = round(start + k * step)`` for ``k < num_frames``. With ``start=None`` the start is uniform
    over ``0 .. N - 1 - (num_frames - 1) * step`` (drawn from ``generator``); when the window does not fit,
    the start is 0 and indices past the last frame repeat the last frame (``padded=True``).
    """
    windows, padded = window_indices(
        num_source_frames, num_frames=num_frames, step=step, start=start, generator=generator
    )
    return windows[0], padded


def window_indices(
    num_source_frames: int,
    *,
    num_frames: int,
    step: float,
    count: int = 1,
    shift: int = 0,
    even: bool = False,
    start: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[list[list[int]], bool]:
    """Source frame indices of ``count`` windows, and whether any had to be padded.

    A base start ``s`` is uniform over ``0 .. max_start - shift`` (``max_start = N - 1 - (num_frames - 1) ·
    step``), or ``start`` when given; each window starts at ``s + o`` with ``o`` uniform over
    ``0 .. min(shift, max_start - s)``, drawn in window order (``shift = 0``: every window is the same).
    ``even`` draws even starts only (fixed-GOP files). With ``count = 1, shift = 0, even = False`` this is
    exactly :func:`clip_indices`'s draw. A window that does not fit starts at 0 and repeats the last frame.
    """
    if num_source_frames < 1:
        raise ValueError(f"num_source_frames={num_source_frames}: expected >= 1")
    if step <= 0:
        raise ValueError(f"step={step}: expected > 0")
    if count < 1 or shift < 0:
        raise ValueError(f"count={count}, shift={shift}: expected count >= 1 and shift >= 0")
    last = num_source_frames - 1
    max_start = max(0, math.floor(last - (num_frames - 1) * step + 1e-9))
    unit = 2 if even else 1
    if start is None:
        top = max(0, max_start - shift) // unit
        start = unit * int(torch.randint(0, top + 1, (1,), generator=generator).item()) if top >= 1 else 0
    elif not 0 <= start <= last:
        raise ValueError(f"start_frame={start}: expected in [0, {last}] for a video of {num_source_frames} frames")
    windows, padded = [], False
    for _ in range(count):
        room = min(shift, max_start - start) // unit if shift else 0
        offset = unit * int(torch.randint(0, room + 1, (1,), generator=generator).item()) if room >= 1 else 0
        raw = [round(start + offset + k * step) for k in range(num_frames)]
        padded = padded or raw[-1] > last
        windows.append([min(i, last) for i in raw])
    return windows, padded


# ------------------------------------------------------------------------------------------- decoding


def _setup_stream(stream: Any, threads: int) -> None:
    cc = stream.codec_context
    if threads == 1:
        cc.thread_type = "NONE"
        cc.thread_count = 1
    else:
        cc.thread_type = "AUTO"
        cc.thread_count = threads  # 0: FFmpeg picks


_local = threading.local()


def _reformatter() -> Any:
    """One FFmpeg converter per thread: it caches its scaling context, which costs more to build than
    converting a 256-px frame (``bench/data.md``, "Numbers the data/ module docs used to carry") and would
    otherwise be rebuilt for every frame."""
    if not hasattr(_local, "reformatter"):
        from av.video.reformatter import VideoReformatter

        _local.reformatter = VideoReformatter()
    return _local.reformatter


def over_white(rgba: np.ndarray) -> np.ndarray:
    """uint8 RGBA ``[..., 4]`` composited over white, as uint8 RGB ``[..., 3]``: what a transparent pixel shows
    is the background, never the colour its bytes happen to hold (transformers' ``convert_to_rgb`` does the
    same for images) [choice: white]."""
    rgb, alpha = rgba[..., :3].astype(np.uint16), rgba[..., 3:].astype(np.uint16)
    return ((rgb * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)


def _has_alpha(fmt: Any) -> bool:
    """Whether frames of PyAV pixel format ``fmt`` may be transparent (an alpha plane, or a palette's alpha)."""
    return bool(fmt.has_palette) or any(c.is_alpha for c in fmt.components)


class _Converter:
    """Frame → uint8 RGB ndarray at the early-resized size (area filter when scaling down). Every pixel format
    FFmpeg decodes is converted at its true range by FFmpeg's converter (8 to 16 bits, grayscale, limited or
    full range as the frame says); a format with alpha (``rgba``, ``yuva420p``, a palette) is composited over
    white (:func:`over_white`)."""

    def __init__(self, height: int, width: int, short_side: int | None) -> None:
        self.out_h, self.out_w = resized_shape(height, width, short_side)
        self.resize = (self.out_h, self.out_w) != (height, width)

    def __call__(self, frame: Any) -> np.ndarray:
        alpha = _has_alpha(frame.format)
        target = "rgba" if alpha else "rgb24"
        if self.resize:
            out = _reformatter().reformat(
                frame, width=self.out_w, height=self.out_h, format=target, interpolation="AREA"
            )
        else:
            out = _reformatter().reformat(frame, format=target)
        return over_white(out.to_ndarray()) if alpha else out.to_ndarray()


# Containers whose stored start time is the first frame's timestamp. Others (AVI above all, where H.264
# frames come out with pts = dts + 1) are calibrated by decoding their first frame once.
_TRUSTED_TIMESTAMPS = ("mov", "matroska", "mpegts", "mpeg", "flv", "ogg")


def _first_pts(container: Any, stream: Any) -> int:
    """The timestamp of the stream's first frame (frame index 0)."""
    if container.format.name.startswith(_TRUSTED_TIMESTAMPS) or stream.start_time not in (None, 0):
        return stream.start_time or 0
    first = 0
    try:
        for frame in container.decode(stream):
            first = frame.pts if frame.pts is not None else 0
            break
    except av.error.FFmpegError:
        pass
    container.seek(0)
    return first


def _frame_index(frame: Any, start_time: int, time_base: Fraction | None, fps: float, fallback: int) -> int:
    if frame.pts is None or time_base is None:
        return fallback
    return round(float((frame.pts - start_time) * time_base) * fps)


def _frames_from(container: Any, stream: Any, first: int, start_time: int, fps: float) -> Iterator[Any]:
    """Decoded frames starting at or before source frame ``first``: seek to the key frame before it; when a
    demuxer's seek lands after the target (MPEG-TS does), seek again further back (1 s, 2 s, 4 s, then 0)."""
    tb = stream.time_base
    if first <= 0 or tb is None:
        return container.decode(stream)
    backoff = 0.0
    for _ in range(5):
        target = start_time + int(((first - 0.5) / fps - backoff) / tb)  # half a frame early: rounding-safe
        try:
            container.seek(max(target, start_time), stream=stream, backward=True, any_frame=False)
        except av.error.FFmpegError:
            container.seek(0)
            return container.decode(stream)
        it = container.decode(stream)
        head = next(it, None)
        if head is None:
            return iter(())
        if target <= start_time or _frame_index(head, start_time, tb, fps, first) <= first:
            return itertools.chain((head,), it)
        backoff = max(1.0, 2.0 * backoff)
    container.seek(0)
    return container.decode(stream)


class _NonrefMiss(Exception):
    """A wanted frame did not come out while non-reference frames were skipped."""


def _decode_indices(
    path: str, container: Any, info: VideoInfo, indices: list[int], convert: _Converter, skip_nonref: bool = False
) -> np.ndarray:
    """Decode the frames at sorted source ``indices`` (repeats allowed) → uint8 [len(indices), H, W, 3].

    ``skip_nonref`` decodes with ``skip_frame="NONREF"`` and falls back to a plain decode when a wanted
    frame does not come out (the module docstring's fixed-GOP files never need that)."""
    if skip_nonref:
        container.streams.video[0].codec_context.skip_frame = "NONREF"
        try:
            return _decode_indices_once(path, container, info, indices, convert, strict=True)
        except _NonrefMiss:
            container.seek(0)  # rewind and flush the decoder: the plain pass must not continue this one
        finally:
            container.streams.video[0].codec_context.skip_frame = "DEFAULT"
    return _decode_indices_once(path, container, info, indices, convert, strict=False)


def _decode_indices_once(
    path: str, container: Any, info: VideoInfo, indices: list[int], convert: _Converter, strict: bool
) -> np.ndarray:
    stream = container.streams.video[0]
    tb = stream.time_base
    start_time = _first_pts(container, stream)
    first = indices[0]
    out: list[np.ndarray | None] = [None] * len(indices)
    k, prev, prev_idx = 0, None, -1
    cache: dict[int, np.ndarray] = {}  # frame index -> RGB, so a frame used twice is converted once

    def rgb(frame: Any, idx: int) -> np.ndarray:
        if idx not in cache:
            cache.clear()
            cache[idx] = convert(frame)
        return cache[idx]

    try:
        for frame in _frames_from(container, stream, first, start_time, info.fps):
            idx = _frame_index(frame, start_time, tb, info.fps, prev_idx + 1)
            if idx < indices[k]:
                prev, prev_idx = frame, idx
                continue
            while k < len(indices) and indices[k] <= idx:
                if indices[k] < idx and strict:
                    raise _NonrefMiss
                if indices[k] < idx and prev is not None:  # the wanted index never occurred: nearest earlier
                    out[k] = rgb(prev, prev_idx)
                else:
                    out[k] = rgb(frame, idx)
                k += 1
            prev, prev_idx = frame, idx
            if k == len(indices):
                break
    except av.error.FFmpegError as exc:
        if k == 0:
            raise DataError(f"truncated: {path}: decoding failed near frame {first} ({exc})") from None
    if k < len(indices) and strict:
        raise _NonrefMiss
    if k < len(indices):
        # The stream ended before the window did. A frame count that was estimated from the duration, or
        # that is off by a few frames, is tolerated (the clip is padded with its last frame); a stream
        # that ends well before its stated length is a truncated or corrupt file.
        slack = max(3, 0.05 * info.num_frames)
        if prev is None or prev_idx < info.num_frames - 1 - slack:
            got = "no frame at all" if prev is None else f"frames end at {prev_idx}"
            raise DataError(
                f"truncated: {path}: the container claims {info.num_frames} frames but {got}; "
                "the file is cut short or corrupt"
            )
        if k == 0:
            out[0] = rgb(prev, prev_idx)
            k = 1
        for j in range(k, len(indices)):
            out[j] = out[k - 1]
    return np.stack(out)  # type: ignore[arg-type]


def frame_step(source_fps: float, frame_stride: int, target_fps: float | None) -> float:
    """Source frames between two kept frames: ``frame_stride``, or ``source fps / target_fps`` (time in seconds)."""
    return source_fps / target_fps if target_fps else float(frame_stride)


def decode_clip(
    path: Source, *, start_frame: int | None = None, generator: torch.Generator | None = None, **options: Any
) -> torch.Tensor:
    """Decode one clip: ``num_frames`` frames → uint8 ``[T, H, W, 3]`` (see the module docstring); ``options``
    are the fields of :class:`DecodeOptions` (``num_frames=8, short_side=None``, ...).

    ``start_frame`` fixes the first source frame; otherwise the window is drawn from ``generator``.
    A video shorter than the window is padded with its last frame, or raises ``DataError("short: ...")``
    when ``short_videos="skip"``. ``skip_nonref=False`` never skips frames, even on fixed-GOP files.
    """
    out = decode_windows(path, DecodeOptions(**options), start_frame=start_frame, generator=generator)
    return out.frames if out.sequential else out.frames[out.index[0]]


@dataclass
class DecodedWindows:
    """The union of the frames of several windows of one video: ``frames`` uint8 [U, H, W, 3] (sorted source
    indices ``source_index`` [U]); window ``w`` is ``frames[index[w]]`` (``index`` int64 [count, T])."""

    frames: torch.Tensor
    index: torch.Tensor
    source_index: list[int]
    note: str | None  # "short: ..." when a window was padded
    skipped_nonref: bool  # whether the fixed-GOP fast path decoded it

    @property
    def sequential(self) -> bool:
        """True when there is one window and it is ``frames`` itself (no repeated frame)."""
        return self.index.shape[0] == 1 and bool(torch.equal(self.index[0], torch.arange(self.frames.shape[0])))


def decode_windows(
    path: Source,
    options: DecodeOptions = DecodeOptions(),
    *,
    count: int = 1,
    start_frame: int | None = None,
    generator: torch.Generator | None = None,
) -> DecodedWindows:
    """Decode ``count`` windows of ``options.num_frames`` frames (starts within ``options.shift`` source frames
    of each other, see :func:`window_indices`) in one pass over their union of frames (module docstring)."""
    o = options
    name = _name(path)
    with open_video(path, o.hwaccel) as container:
        info = _info(name, container, o.min_side, o.max_side)
        _setup_stream(container.streams.video[0], o.threads)
        convert = _Converter(info.height, info.width, o.short_side)
        step = frame_step(info.fps, o.frame_stride, o.target_fps)
        everything = None
        if info.num_frames < 0:  # neither a frame count nor a duration is stored: decode everything once
            everything = _decode_everything(name, container, convert)
        n = len(everything) if everything is not None else info.num_frames
        even_step = abs(step - round(step)) < 1e-9 and round(step) % 2 == 0
        fast = o.skip_nonref and everything is None and even_step and _fixed_gop(container)
        windows, padded = window_indices(
            n, num_frames=o.num_frames, step=step, count=count, shift=o.shift, even=fast, start=start_frame,
            generator=generator,
        )  # fmt: skip
        if padded and o.short_videos == "skip":
            raise DataError(_short_message(name, n, o.num_frames, step, "skipped"))
        union = sorted({i for w in windows for i in w})
        fast = fast and all(i % 2 == 0 for i in union)
        if everything is not None:
            frames = np.stack([everything[i] for i in union])
        else:
            frames = _decode_indices(name, container, info, union, convert, skip_nonref=fast)
    position = {src: k for k, src in enumerate(union)}
    index = torch.tensor([[position[i] for i in w] for w in windows], dtype=torch.int64)
    note = _short_message(name, n, o.num_frames, step, "padded with its last frame") if padded else None
    return DecodedWindows(torch.from_numpy(frames), index, union, note, fast)


def _short_message(path: str, n: int, num_frames: int, step: float, action: str) -> str:
    need = math.floor((num_frames - 1) * step) + 1
    return f"short: {path} has {n} frame(s), a clip needs {need} ({num_frames} at step {step:g}); {action}"


def _decode_everything(path: str, container: Any, convert: _Converter) -> list[np.ndarray]:
    frames: list[np.ndarray] = []
    try:
        for frame in container.decode(container.streams.video[0]):
            frames.append(convert(frame))
    except av.error.FFmpegError as exc:
        if not frames:
            raise DataError(f"truncated: {path}: no frame could be decoded ({exc})") from None
    if not frames:
        raise DataError(f"truncated: {path}: the video stream holds no decodable frame")
    return frames


def decode_all(
    path: str | os.PathLike,
    *,
    frame_stride: int = 1,
    target_fps: float | None = None,
    short_side: int | None = None,
    threads: int = 0,
) -> VideoFrames:
    """Decode a whole video, keeping every ``frame_stride``-th frame (or frames at ``target_fps``).

    With ``target_fps`` the kept frames are those nearest to ``k / target_fps`` seconds; a target above the
    source rate keeps every frame once (no duplicates). Returns frames, their timestamps and the rate.
    """
    if frame_stride < 1:
        raise ValueError(f"frame_stride={frame_stride}: expected >= 1")
    if target_fps is not None and target_fps <= 0:
        raise ValueError(f"target_fps={target_fps}: expected None or > 0")
    frames: list[np.ndarray] = []
    times: list[float] = []
    with open_video(path) as container:
        path = _name(path)
        info = _info(path, container, 1, 1 << 30)
        stream = container.streams.video[0]
        _setup_stream(stream, threads)
        convert = _Converter(info.height, info.width, short_side)
        tb, start_time = stream.time_base, _first_pts(container, stream)
        step = frame_step(info.fps, frame_stride, target_fps)
        next_k, counter = 0, -1
        try:
            for frame in container.decode(stream):
                counter += 1
                idx = _frame_index(frame, start_time, tb, info.fps, counter)
                counter = idx
                if idx + 1e-9 < round(next_k * step):
                    continue
                frames.append(convert(frame))
                times.append(
                    idx / info.fps if frame.pts is None or tb is None else float((frame.pts - start_time) * tb)
                )
                while round(next_k * step) <= idx:
                    next_k += 1
        except av.error.FFmpegError as exc:
            if not frames:
                raise DataError(f"truncated: {path}: no frame could be decoded ({exc})") from None
    if not frames:
        raise DataError(f"truncated: {path}: the video stream holds no decodable frame")
    out_fps = target_fps if target_fps else info.fps / frame_stride
    return VideoFrames(
        frames=torch.from_numpy(np.stack(frames)),
        fps=float(min(out_fps, info.fps)),
        timestamps=torch.tensor(times, dtype=torch.float64),
        source_fps=info.fps,
    )


# ---------------------------------------------------------------------------------------------- images


_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # Pillow's modes of 16-bit grayscale PNGs
_TRANSPARENT = ("RGBA", "LA", "PA", "RGBa", "La")


def pil_to_rgb8(img: Any) -> Any:
    """A Pillow image of any mode as 8-bit RGB at its true range: 16-bit grayscale scaled by 255 / 65535 (Pillow's
    own ``convert`` clips it to 255, a 16-bit PNG turning white), transparency composited over white
    (:func:`over_white`; a palette's or a single colour's too), every other mode (1, L, P, CMYK, YCbCr, 16-bit
    RGB, which Pillow reads as 8 bits) by Pillow's conversion."""
    from PIL import Image

    if img.mode in _SIXTEEN_BIT:
        gray = np.clip((np.asarray(img).astype(np.int64) + 128) // 257, 0, 255).astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")
    if img.mode in _TRANSPARENT or "transparency" in img.info:
        return Image.fromarray(over_white(np.asarray(img.convert("RGBA"))))
    return img.convert("RGB")


def load_image(
    path: Source, *, short_side: int | None = None, min_side: int = 1, max_side: int = 1 << 30
) -> torch.Tensor:
    """Read a jpg/png/... (a path or a :class:`MemoryFile`) as uint8 ``[H, W, 3]`` (RGB) at its true range
    (:func:`pil_to_rgb8`: 16-bit, grayscale, palette, transparency), scaled down to ``short_side`` if larger."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(path, MemoryFile):
        target: Any = io.BytesIO(path.data)
        path = path.name
        if not target.getbuffer().nbytes:
            raise DataError(f"empty: {path} has 0 bytes")
    else:
        path = target = os.fspath(path)
        _check_file(path)
    try:
        with Image.open(target) as img:
            _check_resolution(path, img.width, img.height, min_side, max_side)
            img.draft("RGB", (img.width, img.height))
            rgb = pil_to_rgb8(img)
            h, w = resized_shape(rgb.height, rgb.width, short_side)
            if (h, w) != (rgb.height, rgb.width):
                rgb = rgb.resize((w, h), Image.Resampling.BILINEAR, reducing_gap=2.0)
            return torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy())
    except PermissionError as exc:
        raise DataError(f"permission: {path} cannot be read ({exc.strerror or exc})") from None
    except DataError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DataError(f"unreadable: {path} is not a readable image ({type(exc).__name__}: {exc})") from None
