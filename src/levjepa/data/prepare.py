"""``levjepa data prepare SRC DST``: re-encode a folder of videos into a form that is cheap to train on.

Why: a training clip needs 16 frames from a random point of a video. From a 720p file with a key frame
every 250 frames, PyAV decodes on average ~125 large frames to reach the window; from a 256-px file with a
key frame every 16 frames it decodes ~38 small ones. What that costs in time: ``bench/data.md``,
"Numbers the data/ module docs used to carry".

What it writes: for every video under ``SRC`` (recursively, the same files ``list_media`` finds), an
H.264 mp4 at ``DST/<same relative path>.mp4`` (extension replaced; ``name.ext.mp4`` when two sources would
collide) with

* the short side scaled down to ``--short-side`` (default 256; never up; even dimensions, area filter),
* a key frame exactly every ``--keyint`` frames (default 16, even) and a **fixed GOP**: one B-frame between
  reference frames, no adaptive B-frames, no B-pyramid, no scene-cut key frames, closed GOPs
  (``bframes=1:b-adapt=0:b-pyramid=none:scenecut=0:open-gop=0``). Every odd frame but the last of a GOP
  is then a non-reference B-frame, and the file is marked (mp4 comment ``FIXED_GOP_COMMENT``) so that
  training at an even frame stride decodes with ``skip_frame=NONREF`` and never touches those frames
  (``video.py``). On the benchmark clip a 16-frame window at stride 2 then decodes 22 frames instead of
  39, for somewhat more bytes (the CPU and bytes measured: ``bench/data.md``, "Each lever").
  ``--no-fixed-gop`` gives x264's adaptive GOP (a key frame at least every ``--keyint`` frames),
* ``--tune fastdecode`` (no CABAC, no deblocking: faster decoding for more bytes), ``--crf``
  (default 23) and ``--preset`` (default veryfast),
* the source frame rate, or ``--fps`` (frames dropped or repeated by timestamp), and no audio.

Images are copied, scaled down the same way. Resumable: each output is written to a hidden temporary
name in its destination folder and renamed when complete, so an interrupted run leaves no half file
under a final name; a rerun skips every output that exists and opens as a valid video (or image), and
deletes stale temporary files. Files that fail are listed with their reason and do not stop the others;
the command exits non-zero when any failed. Work is spread over ``--workers`` processes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
from PIL import Image

from levjepa.config import ConfigError
from levjepa.data.badfiles import DataError
from levjepa.data.encode import VideoWriter
from levjepa.data.sources import MediaItem, list_media, media_kind
from levjepa.data.video import FIXED_GOP_COMMENT, decode_clip, load_image, open_video, resized_shape, stream_fps
from levjepa.data.workers import parallel_map
from levjepa.weights import atomic_write_text

__all__ = ["PrepareOptions", "PrepareResult", "output_is_valid", "plan_outputs", "prepare_file", "prepare_folder"]

_PARTIAL = ".partial-"
REPORT = "prepare_report.json"  # what a prepared folder is told by


@dataclass(frozen=True)
class PrepareOptions:
    short_side: int = 256
    keyint: int = 16
    fps: float | None = None
    crf: int = 23
    preset: str = "veryfast"
    fastdecode: bool = True
    fixed_gop: bool = True  # odd frames non-reference, marked for skip_frame=NONREF (module docstring)

    def __post_init__(self) -> None:
        if self.short_side < 2:
            raise ConfigError(f"--short-side {self.short_side}: expected >= 2")
        if self.keyint < 1:
            raise ConfigError(f"--keyint {self.keyint}: expected >= 1")
        if self.fixed_gop and self.keyint % 2:
            raise ConfigError(
                f"--keyint {self.keyint}: a fixed GOP needs an even key-frame interval (so that every GOP starts "
                "on an even frame); use an even value or --no-fixed-gop"
            )
        if self.fps is not None and self.fps <= 0:
            raise ConfigError(f"--fps {self.fps}: expected > 0")
        if not 0 <= self.crf <= 51:
            raise ConfigError(f"--crf {self.crf}: expected in [0, 51]")


@dataclass
class PrepareResult:
    done: list[str] = field(default_factory=list)  # outputs written by this run
    skipped: list[str] = field(default_factory=list)  # outputs that already existed and were valid
    failed: list[tuple[str, str]] = field(default_factory=list)  # (source path, reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "done": len(self.done),
            "skipped": len(self.skipped),
            "failed": [{"path": p, "reason": r} for p, r in self.failed],
        }


def _even(x: int) -> int:
    return max(2, x - x % 2)


def output_is_valid(path: str | os.PathLike) -> bool:
    """True when ``path`` exists and opens as a video with at least one decodable frame (or as an image)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    try:
        if media_kind(path) == "image":
            load_image(path)
        else:
            decode_clip(path, num_frames=1, frame_stride=1, start_frame=0, short_side=None)
        return True
    except DataError:
        return False


def _partial_name(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}{_PARTIAL}{os.getpid()}{dst.suffix}")


def _prepare_video(src: str, dst: Path, opts: PrepareOptions) -> None:
    tmp = _partial_name(dst)
    written = 0
    try:
        with open_video(src) as inp:
            if not inp.streams.video:
                raise DataError(f"no-video: {src} has no video stream")
            stream = inp.streams.video[0]
            stream.codec_context.thread_type = "AUTO"
            cc = stream.codec_context
            if cc.width <= 0 or cc.height <= 0:
                raise DataError(f"unreadable: {src} reports a {cc.width}x{cc.height} video stream")
            h, w = resized_shape(cc.height, cc.width, opts.short_side)
            h, w = _even(h), _even(w)
            fps_in = stream_fps(stream)
            fps_out = opts.fps or fps_in
            options = {"crf": str(opts.crf), "preset": opts.preset}
            if opts.fastdecode:
                options["tune"] = "fastdecode"
            metadata = {}
            if opts.fixed_gop:
                k = opts.keyint
                options["x264-params"] = (
                    f"keyint={k}:min-keyint={k}:scenecut=0:bframes=1:b-adapt=0:b-pyramid=none:open-gop=0"
                )
                metadata["comment"] = FIXED_GOP_COMMENT
            tb, start = stream.time_base, stream.start_time or 0
            next_out = 0.0
            with VideoWriter(
                tmp, width=w, height=h, fps=fps_out, options=options, keyint=opts.keyint, metadata=metadata
            ) as writer:
                try:
                    for i, frame in enumerate(inp.decode(stream)):
                        t = float((frame.pts - start) * tb) if frame.pts is not None and tb is not None else i / fps_in
                        out = frame.reformat(width=w, height=h, format="yuv420p", interpolation="AREA")
                        if opts.fps is None:
                            writer.write(out)
                            written += 1
                            continue
                        while next_out < t + 0.5 / fps_in:  # repeat or drop frames to the output rate
                            writer.write(out)
                            written += 1
                            next_out += 1.0 / fps_out
                except av.error.FFmpegError as exc:
                    if written == 0:
                        raise DataError(f"truncated: {src}: no frame could be decoded ({exc})") from None
        if written == 0:
            raise DataError(f"truncated: {src}: the video stream holds no decodable frame")
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _prepare_image(src: str, dst: Path, opts: PrepareOptions) -> None:
    img = load_image(src, short_side=opts.short_side)
    tmp = _partial_name(dst)
    try:
        fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".webp": "WEBP"}[dst.suffix.lower()]
        Image.fromarray(img.numpy()).save(tmp, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def prepare_file(item: MediaItem, dst: str | os.PathLike, opts: PrepareOptions) -> None:
    """Re-encode one video (or rescale one image) to ``dst``, atomically; raises DataError on bad input."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if item.kind == "image":
        _prepare_image(item.path, dst, opts)
    else:
        _prepare_video(item.path, dst, opts)


def plan_outputs(src_dir: str | os.PathLike, dst_dir: str | os.PathLike) -> list[tuple[MediaItem, Path]]:
    """(item, output path) for every media file under ``src_dir`` (see the module docstring)."""
    src_root, dst_root = Path(src_dir), Path(dst_dir)
    if not src_root.is_dir():
        raise DataError(f"missing: prepare SRC {src_dir} is not a folder")
    if dst_root.resolve() == src_root.resolve() or src_root.resolve() in dst_root.resolve().parents:
        raise ConfigError(f"prepare: DST {dst_dir} must not be SRC or lie inside it (its outputs would be re-read)")
    plan: list[tuple[MediaItem, Path]] = []
    taken: set[Path] = set()
    for item in list_media(str(src_root)):
        rel = Path(item.path).relative_to(src_root)
        out = dst_root / rel if item.kind == "image" else (dst_root / rel).with_suffix(".mp4")
        if out in taken:
            out = dst_root / rel.with_name(rel.name + ".mp4")
        taken.add(out)
        plan.append((item, out))
    return plan


def _remove_partials(dst_root: Path) -> int:
    removed = 0
    if dst_root.is_dir():
        for path in dst_root.rglob(f".*{_PARTIAL}*"):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _run_one(task: tuple[MediaItem, Path, PrepareOptions]) -> tuple[str, str, str]:
    item, out, opts = task
    if output_is_valid(out):
        return ("skipped", str(out), "")
    try:
        prepare_file(item, out, opts)
        return ("done", str(out), "")
    except DataError as exc:
        return ("failed", item.path, str(exc))
    except Exception as exc:  # one broken file must not stop the others
        return ("failed", item.path, f"unreadable: {item.path}: {type(exc).__name__}: {exc}")


def _failed(outcome: tuple[str, str, str]) -> bool:
    return outcome[0] == "failed"


def prepare_folder(
    src_dir: str | os.PathLike, dst_dir: str | os.PathLike, opts: PrepareOptions | None = None, *, workers: int = 1
) -> PrepareResult:
    """Prepare every media file under ``src_dir`` into ``dst_dir``; writes ``DST/prepare_report.json``."""
    opts = opts or PrepareOptions()
    plan = plan_outputs(src_dir, dst_dir)
    dst_root = Path(dst_dir)
    dst_root.mkdir(parents=True, exist_ok=True)
    _remove_partials(dst_root)
    result = PrepareResult()
    tasks = [(it, out, opts) for it, out in plan]
    for status, path, reason in parallel_map(_run_one, tasks, workers, desc="prepare", failed=_failed):
        if status == "failed":
            result.failed.append((path, reason))
        else:
            getattr(result, status).append(path)
    report = {**result.to_dict(), "options": vars(opts), "source": str(src_dir)}
    atomic_write_text(dst_root / REPORT, json.dumps(report, indent=2) + "\n")
    return result
