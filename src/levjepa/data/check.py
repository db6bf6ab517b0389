"""``levjepa data check SOURCE``: what a source holds, and every file in it that cannot be read.

For each item of the source (a folder, an index file, a file, a shard store — every member — or
"synthetic") it reads the container's
metadata (resolution, frame rate, duration, frame count, codec) and decodes the first and the last frame,
which catches files that open but are cut short; ``--deep`` decodes every frame instead and reports the
true frame count. Images are decoded in full. Items are checked in parallel processes (``--workers``).

The report gives counts (videos, images, readable, unreadable), total and per-file durations, the
resolutions and frame rates met (most common first, with min / median / max short side), and every
unreadable file with its reason (the ``DataError`` kinds of ``badfiles.py``). ``--json PATH`` writes it
all, one row per file. The command exits non-zero when nothing in the source is readable.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import av

from levjepa.data.badfiles import DataError, bad_file_reason, bad_file_text, is_bad_file
from levjepa.data.config import DataConfig, SyntheticConfig
from levjepa.data.shards import ShardSource, is_shard_store, read_index
from levjepa.data.sources import SYNTHETIC, MediaItem, list_media, media_kind
from levjepa.data.synthetic import load_split
from levjepa.data.video import MemoryFile, decode_clip, load_image, open_video, probe_video
from levjepa.data.workers import parallel_map

__all__ = ["CheckReport", "check_item", "check_source", "format_report"]


def _count_frames(path: Any) -> int:
    n = 0
    with open_video(path) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_type = "AUTO"
        try:
            for _ in container.decode(stream):
                n += 1
        except av.error.FFmpegError as exc:
            raise DataError(f"truncated: {path}: decoding stopped after {n} frame(s) ({exc})") from None
    if n == 0:
        raise DataError(f"truncated: {path}: no frame could be decoded")
    return n


def check_item(
    item: MediaItem, *, deep: bool = False, min_side: int = 1, max_side: int = 1 << 30, media: Any = None
) -> dict[str, Any]:
    """One report row: ``{"path", "kind", "ok", ...metadata}`` or ``{..., "ok": False, "reason"}``.
    ``media`` (a ``MemoryFile``: a shard member) is read instead of ``item.path`` when given."""
    row: dict[str, Any] = {"path": item.path, "kind": item.kind, "label": item.label}
    target = media if media is not None else item.path
    try:
        if item.kind == "image":
            img = load_image(target, min_side=min_side, max_side=max_side)
            row.update(ok=True, width=int(img.shape[1]), height=int(img.shape[0]))
            return row
        info = probe_video(target, min_side=min_side, max_side=max_side)
        row.update(
            width=info.width,
            height=info.height,
            fps=info.fps,
            duration=info.duration,
            frames=info.num_frames,
            frames_exact=info.frames_exact,
            codec=info.codec,
        )
        if deep:
            row["frames"], row["frames_exact"] = _count_frames(target), True
            row["duration"] = row["frames"] / info.fps
        else:
            last = max(0, info.num_frames - 1)
            for start in sorted({0, last}):
                decode_clip(target, num_frames=1, frame_stride=1, start_frame=start, short_side=64)
        row["ok"] = True
    except Exception as exc:  # the one bad-file rule (badfiles.is_bad_file): list the file; a bug still ends
        if not is_bad_file(exc):
            raise
        row.update(ok=False, reason=bad_file_reason(exc))
    return row


@dataclass
class CheckReport:
    source: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    @property
    def readable(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["ok"]]

    @property
    def unreadable(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r["ok"]]

    def summary(self) -> dict[str, Any]:
        ok = self.readable
        videos = [r for r in ok if r["kind"] == "video"]
        durations = [r["duration"] for r in videos if r.get("duration") == r.get("duration")]  # drop NaN
        short_sides = [min(r["width"], r["height"]) for r in ok]
        return {
            "source": self.source,
            "files": len(self.rows),
            "videos": sum(r["kind"] == "video" for r in self.rows),
            "images": sum(r["kind"] == "image" for r in self.rows),
            "readable": len(ok),
            "unreadable": len(self.rows) - len(ok),
            "total_duration_s": float(sum(durations)),
            "duration_s": _stats(durations),
            "frames_total": int(sum(max(r.get("frames", 0), 0) for r in videos)),
            "short_side": _stats(short_sides),
            "resolutions": Counter(f"{r['width']}x{r['height']}" for r in ok).most_common(),
            "fps": Counter(round(r["fps"], 3) for r in videos).most_common(),
            "codecs": Counter(r["codec"] for r in videos).most_common(),
            "labels": len({r["label"] for r in self.rows if r.get("label") is not None}),
            "bad_files": [{"path": r["path"], "reason": r["reason"]} for r in self.unreadable],
            "note": self.note,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "files": self.rows}


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": float(min(values)), "median": float(statistics.median(values)), "max": float(max(values))}


def _check_one(args: tuple[MediaItem, bool, int, int]) -> dict[str, Any]:
    item, deep, min_side, max_side = args
    return check_item(item, deep=deep, min_side=min_side, max_side=max_side)


def check_source(
    source: str, *, workers: int = 1, deep: bool = False, min_side: int = 1, max_side: int = 1 << 30
) -> CheckReport:
    """Check every item of ``source`` (see the module docstring)."""
    if source == SYNTHETIC:
        cfg = SyntheticConfig()
        report = CheckReport(source)
        for split in ("train", "val", "test"):
            clips = load_split(cfg, split)
            n, _, t, h, w = clips.clips.shape
            report.rows.extend(
                {"path": f"synthetic:{split}/{i}", "kind": "video", "label": None, "ok": True, "width": w,
                 "height": h, "fps": 15.0, "duration": t / 15.0, "frames": t, "codec": "raw"}
                for i in range(n)
            )  # fmt: skip
        report.note = f"built-in benchmark, image source: {clips.image_source} (frame rate nominal)"
        return report
    if is_shard_store(source):
        shards = len(read_index(source).shards)
        per_shard = [(source, i, deep, min_side, max_side) for i in range(shards)]
        parts = parallel_map(_check_shard, per_shard, workers, desc="check", unit="shard")
        rows = [row for part in parts for row in part]
        return CheckReport(source, rows, note=f"shard store: {shards} shard(s)")
    items = list_media(source)
    tasks = [(it, deep, min_side, max_side) for it in items]
    rows = parallel_map(_check_one, tasks, workers, desc="check", failed=lambda row: not row["ok"])
    return CheckReport(source, rows)


def _check_shard(args: tuple[str, int, bool, int, int]) -> list[dict[str, Any]]:
    """The rows of every member of one shard (read once, member by member, in stored order)."""
    spec, shard, deep, min_side, max_side = args
    src = ShardSource(spec, DataConfig())
    members = list(range(src.index.first[shard], src.index.first[shard + 1]))
    src.prefetch(members)
    rows = []
    for j in members:
        item = MediaItem(src.path(j), src.index.labels[j], media_kind(src.index.names[j]) or "video")
        try:
            media = MemoryFile(item.path, src.read(j))
        except DataError as exc:
            rows.append({"path": item.path, "kind": item.kind, "label": item.label, "ok": False, "reason": str(exc)})
            continue
        row = check_item(item, deep=deep, min_side=min_side, max_side=max_side, media=media)
        row["packed_from"] = src.index.paths[j]
        rows.append(row)
    return rows


def format_report(report: CheckReport, *, max_bad: int = 50) -> str:
    """Human-readable summary of a :class:`CheckReport`."""
    s = report.summary()
    lines = [f"source: {s['source']}"]
    if s["note"]:
        lines.append(f"note: {s['note']}")
    lines.append(
        f"files: {s['files']} ({s['videos']} videos, {s['images']} images); readable: {s['readable']}, "
        f"unreadable: {s['unreadable']}"
    )
    if s["labels"]:
        lines.append(f"labels: {s['labels']} distinct")
    if s["duration_s"]:
        d = s["duration_s"]
        lines.append(
            f"duration: {s['total_duration_s'] / 3600:.3f} h total, {s['frames_total']} frames; per video "
            f"min {d['min']:.2f} s, median {d['median']:.2f} s, max {d['max']:.2f} s"
        )
    if s["short_side"]:
        ss = s["short_side"]
        top = ", ".join(f"{res} ({n})" for res, n in s["resolutions"][:8])
        lines.append(
            f"resolution: short side min {ss['min']:.0f}, median {ss['median']:.0f}, max {ss['max']:.0f}; {top}"
        )
    if s["fps"]:
        lines.append("fps: " + ", ".join(f"{fps:g} ({n})" for fps, n in s["fps"][:8]))
        lines.append("codecs: " + ", ".join(f"{c} ({n})" for c, n in s["codecs"][:8]))
    if s["bad_files"]:
        lines.append(f"unreadable files ({len(s['bad_files'])}):")
        lines.extend(f"  {bad_file_text(b['path'], b['reason'])}" for b in s["bad_files"][:max_bad])
        if len(s["bad_files"]) > max_bad:
            lines.append(f"  ... and {len(s['bad_files']) - max_bad} more (see --json)")
    return os.linesep.join(lines)
