"""Predictions of a classifier on files: what ``levjepa classify`` computes.

A classifier (``levjepa.formats.reading.classifier``: a kept probe or a fine-tuned classifier) carries its views
(a ``levjepa.data.eval_clip.ViewSpec``), so every file is cut exactly as its scores were measured:
``segments`` clips of ``frames`` frames at ``frame_stride`` spread over the video × ``crops`` square crops at
short side ``size``; the encoder runs the one frozen forward (``levjepa.infer.encode.encode``, the numbers a
kept probe was trained on) and the class probabilities of the crops are averaged
(``VideoClassifier.probabilities_from``). With ``windows`` a long video gets one prediction per window instead:
consecutive windows of ``frames`` kept frames (the last one padded with its last frame), each one centre
crop, with its time span in seconds.

Decoding runs in ``workers`` worker processes (``levjepa.data.workers.safe_map``); the model runs on
``device`` (the encoder under bf16 autocast on CUDA, float32 on the CPU; the head in float32, reading tokens
in its ``token_dtype``). A file that cannot be read is reported in ``bad`` and skipped, never fatal.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from levjepa.data import BadFileReport, DataError, MediaItem, list_media
from levjepa.data.eval_clip import ViewSpec, load_eval_video
from levjepa.data.sources import media_kind, read_index_labels
from levjepa.data.workers import safe_map
from levjepa.features.compact import FULL, TokenCodec, grid_of
from levjepa.formats.deployment.runner import OnnxClassifier
from levjepa.infer.encode import encode
from levjepa.model.classifier import VideoClassifier

__all__ = ["Prediction", "accuracy", "classifier_items", "predict", "split_accuracy"]


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


def _file_views(
    items: list[MediaItem], views: ViewSpec, patch: int, windows: bool, i: int
) -> tuple[Tensor, Tensor | None]:
    """File ``i``'s uint8 views ``[V, C, T, S, S]`` and, with ``windows`` (a video), each window's (start, end)
    time ``[W, 2]`` (in a decoding worker)."""
    it = items[i]
    if windows and it.kind == "video":
        return _windows(it.path, views, patch)
    return views.load(it.path, patch, it.kind), None


def _windows(path: str, p: ViewSpec, patch: int) -> tuple[Tensor, Tensor]:
    """Consecutive windows of ``p.frames`` kept frames [W, C, T, S, S] and their (start, end) times [W, 2]."""
    video = load_eval_video(path, size=p.size, patch=patch, frame_stride=p.frame_stride, target_fps=p.fps)
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


def _probs(
    model: VideoClassifier | OnnxClassifier,
    views: Tensor,
    device: str,
    segments: int,
    crops: int,
    codec: TokenCodec = FULL,
) -> Tensor:
    """Class probabilities ``[files, classes]`` of ``views`` (the frozen forward, the tokens as ``codec`` keeps
    them, then the head; or the exported graph of both, run by onnxruntime)."""
    if isinstance(model, OnnxClassifier):
        return model.probabilities(views, segments, crops)
    cfg = model.head_cfg
    token_dtype = torch.float16 if cfg.token_dtype == "float16" else torch.float32
    enc = encode(model.encoder, views, device, tokens=cfg.input == "tokens", token_dtype=token_dtype, host=False)
    tokens = enc.tokens
    if tokens is not None and not codec.lossless:  # what the store the head was trained on kept
        tokens = codec.roundtrip(tokens, grid_of(enc.positions)).to(token_dtype)
    with torch.no_grad():  # the head, on the frozen features
        probs = model.probabilities_from(enc.cls, enc.mean, tokens, segments=segments, crops=crops)
    return probs.float().cpu()


def predict(
    model: VideoClassifier | OnnxClassifier,
    names: tuple[str, ...],
    p: ViewSpec,
    items: list[MediaItem],
    *,
    top_k: int = 5,
    workers: int = 2,
    device: str = "cpu",
    windows: bool = False,
    batch_files: int = 8,
    bad: BadFileReport | None = None,
    codec: TokenCodec = FULL,
) -> Iterator[Prediction]:
    """Predictions of ``model`` (in eval mode, or the exported graph of one; class names ``names``, views of
    protocol ``p``) for ``items``, in order (see the module doc)."""
    patch = model.patch_size if isinstance(model, OnnxClassifier) else model.encoder.cfg.patch_size
    load = functools.partial(_file_views, items, p, patch, windows)
    pending: list[tuple[int, Tensor]] = []

    def flush() -> Iterator[Prediction]:
        probs = _probs(model, torch.cat([v for _, v in pending]), device, p.segments, p.crops, codec)
        for (i, _), pr in zip(pending, probs, strict=True):
            yield Prediction(items[i].path, *_top(pr, names, top_k), truth=items[i].label)
        pending.clear()

    for i, loaded, err in safe_map(load, range(len(items)), workers):
        if loaded is None:
            if bad is not None:
                bad.add(items[i].path, err)
            continue
        views, spans = loaded
        if spans is not None:  # one prediction per window, each window one centre view
            probs = torch.cat(
                [
                    _probs(model, views[j : j + batch_files], device, 1, 1, codec)
                    for j in range(0, len(views), batch_files)
                ]
            )
            for w, (pr, (t0, t1)) in enumerate(zip(probs, spans.tolist(), strict=True)):
                yield Prediction(items[i].path, *_top(pr, names, top_k), items[i].label, w, t0, t1)
            continue
        if pending and pending[0][1].shape[1:] != views.shape[1:]:  # a one-frame image beside clips: own batch
            yield from flush()
        pending.append((i, views))
        if len(pending) >= batch_files:
            yield from flush()
    if pending:
        yield from flush()


def classifier_items(sources: list[str], names: tuple[str, ...]) -> tuple[list[MediaItem], dict[str, str]]:
    """The files of ``sources`` (files, folders, index files) for a classifier of class names ``names``, each
    index row's label mapped onto the classifier's classes: a class name through ``names``, an integer as the
    class index it is. A label the classifier does not know is not scored: its item carries no label, and
    ``unknown`` maps its path to the label as the index wrote it."""
    known = {n: i for i, n in enumerate(names)}
    items: list[MediaItem] = []
    unknown: dict[str, str] = {}
    for source in sources:
        path = Path(source).expanduser()
        if not (path.is_file() and media_kind(str(path)) is None):  # a folder or a media file: no labels
            items += [MediaItem(it.path, None, it.kind) for it in list_media(source)]
            continue
        found, by_name = read_index_labels(path, known)  # names numbered by the classifier's own order
        written = {i: n for n, i in (by_name or {}).items()}
        for it in found:
            if it.label is None or (0 <= it.label < len(names) and (by_name is None or it.label in written)):
                items.append(it)
            else:
                unknown[it.path] = written.get(it.label, str(it.label))
                items.append(MediaItem(it.path, None, it.kind))
    return items, unknown


def accuracy(predictions: list[Prediction]) -> float | None:
    """Top-1 accuracy (%) over the predictions that carry a label (None when none does)."""
    scored = [q for q in predictions if q.truth is not None]
    if not scored:
        return None
    return 100.0 * sum(q.index[0] == q.truth for q in scored) / len(scored)


def split_accuracy(
    model: VideoClassifier,
    names: tuple[str, ...],
    p: ViewSpec,
    items: list[MediaItem],
    *,
    split: str,
    workers: int,
    device: str,
) -> float:
    """Top-1 accuracy (%) of a classifier being trained on a labelled split (fine-tuning's validation and test):
    :func:`predict` over ``items`` in eval mode, ``model`` left in training mode; a ``DataError`` when no file
    of the split could be read."""
    model.eval()
    preds = list(predict(model, names, p, items, top_k=1, workers=workers, device=device))
    model.train()
    acc = accuracy(preds)
    if acc is None:
        raise DataError(f"unreadable: no file of the {split} split could be read")
    return acc
