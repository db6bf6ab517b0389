"""Predictions of a classifier on files: what ``levjepa classify`` computes.

A classifier (``levjepa.formats.classifier``: a kept probe or a fine-tuned classifier) carries its
protocol, so every file is cut exactly as its scores were measured: ``segments`` clips of ``frames``
frames at ``frame_stride`` spread over the video × ``crops`` square crops at short side ``size``
(``levjepa.data.eval_clip.load_eval_views``), the class probabilities of the crops averaged
(``VideoClassifier.probabilities``). With ``windows`` a long video gets one prediction per window instead:
consecutive windows of ``frames`` kept frames (the last one padded with its last frame), each one centre
crop, with its time span in seconds.

Decoding runs in ``workers`` worker processes (``levjepa.data.workers``); the model runs on ``device``
under bf16 autocast on CUDA, fp32 on the CPU. A file that cannot be read is reported in ``bad`` and
skipped, never fatal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from levjepa.data import BadFileReport, DataError, MediaItem, normalize
from levjepa.data.eval_clip import load_eval_video
from levjepa.data.workers import decode_in_workers
from levjepa.eval.feature_store import protocol_views
from levjepa.formats.classifier import Protocol
from levjepa.model.classifier import VideoClassifier

__all__ = ["Prediction", "accuracy", "predict"]


@dataclass
class Prediction:
    """One file (or one window of it): the top-k labels with their probabilities."""

    path: str
    labels: list[str]  # top-k, most probable first
    probs: list[float]
    index: list[int]  # their class indices
    truth: int | None = None  # the label an index file gives
    window: int | None = None
    start_time: float | None = None
    end_time: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.window is not None:
            out.update(window=self.window, start_time=self.start_time, end_time=self.end_time)
        out.update(labels=self.labels, probs=self.probs, classes=self.index)
        if self.truth is not None:
            out["truth"] = self.truth
        return out


class _Views(Dataset[tuple[int, Tensor | None, Tensor | None, str]]):
    """Item ``i`` -> (i, uint8 views [V, C, T, S, S] or None, window start times or None, the error)."""

    def __init__(self, items: list[MediaItem], protocol: Protocol, patch: int, windows: bool) -> None:
        self.items, self.p, self.patch, self.windows = items, protocol, patch, windows

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[int, Tensor | None, Tensor | None, str]:
        it, p = self.items[i], self.p
        if self.windows and it.kind == "video":
            try:
                return (i, *_windows(it.path, p, self.patch), "")
            except (DataError, OSError, RuntimeError, ValueError) as err:
                return i, None, None, str(err) or type(err).__name__
        views, reason = protocol_views(it, self.patch, p.frames, p.size, p.frame_stride, p.segments, p.crops)
        return i, views, None, reason


def _windows(path: str, p: Protocol, patch: int) -> tuple[Tensor, Tensor]:
    """Consecutive windows of ``p.frames`` kept frames [W, C, T, S, S] and their (start, end) times [W, 2]."""
    video = load_eval_video(path, size=p.size, patch=patch, frame_stride=p.frame_stride)
    frames, ts = video.frames, video.timestamps
    n = len(frames)
    if n == 0:
        raise DataError(f"unreadable: {path}: no frame")
    clips, spans = [], []
    for start in range(0, n, p.frames):
        idx = torch.arange(start, start + p.frames).clamp_max(n - 1)
        clips.append(frames[idx])
        end = float(ts[min(n - 1, start + p.frames - 1)]) + 1.0 / max(video.fps, 1e-6)
        spans.append((float(ts[start]), end))
    return torch.stack(clips).permute(0, 4, 1, 2, 3).contiguous(), torch.tensor(spans, dtype=torch.float64)


def _top(probs: Tensor, names: tuple[str, ...], k: int) -> tuple[list[str], list[float], list[int]]:
    first = int(probs.argmax())  # the class the probe's accuracy counted (argmax's tie-break)
    order = [first] + [j for j in probs.topk(min(k, len(probs))).indices.tolist() if j != first]
    order = order[: min(k, len(probs))]
    return [names[j] for j in order], [float(probs[j]) for j in order], order


@torch.no_grad()
def _probs(model: VideoClassifier, views: Tensor, device: str, segments: int, crops: int) -> Tensor:
    x = normalize(views.to(device, non_blocking=True))
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.device(device).type == "cuda"):
        return model.probabilities(x, segments=segments, crops=crops).float().cpu()


def predict(
    model: VideoClassifier,
    names: tuple[str, ...],
    p: Protocol,
    items: list[MediaItem],
    *,
    top_k: int = 5,
    workers: int = 2,
    device: str = "cpu",
    windows: bool = False,
    batch_files: int = 8,
    bad: BadFileReport | None = None,
) -> Iterator[Prediction]:
    """Predictions of ``model`` (in eval mode; class names ``names``, views of protocol ``p``) for ``items``,
    in order (see the module doc)."""
    data = _Views(items, p, model.encoder.cfg.patch_size, windows)
    pending: list[tuple[int, Tensor]] = []

    def flush() -> Iterator[Prediction]:
        probs = _probs(model, torch.cat([v for _, v in pending]), device, p.segments, p.crops)
        for (i, _), pr in zip(pending, probs, strict=True):
            yield Prediction(items[i].path, *_top(pr, names, top_k), truth=items[i].label)
        pending.clear()

    for i, views, spans, err in decode_in_workers(data, workers):
        if views is None:
            if bad is not None:
                bad.add(items[i].path, err)
            continue
        if spans is not None:  # one prediction per window, each window one centre view
            probs = torch.cat(
                [_probs(model, views[j : j + batch_files], device, 1, 1) for j in range(0, len(views), batch_files)]
            )
            for w, (pr, (t0, t1)) in enumerate(zip(probs, spans.tolist(), strict=True)):
                yield Prediction(items[i].path, *_top(pr, names, top_k), items[i].label, w, t0, t1)
            continue
        pending.append((i, views))
        if len(pending) >= batch_files:
            yield from flush()
    if pending:
        yield from flush()


def accuracy(predictions: list[Prediction]) -> float | None:
    """Top-1 accuracy (%) over the predictions that carry a label (None when none does)."""
    scored = [q for q in predictions if q.truth is not None]
    if not scored:
        return None
    return 100.0 * sum(q.index[0] == q.truth for q in scored) / len(scored)
