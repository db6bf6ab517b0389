"""The public real-video kNN protocol: frozen clip features, a gallery and queries, nothing trained.

The one cheap public real-video number of the released LeVJEPA ViT-L (jepa.cpp ``docs/accuracy.md``,
"UCF-101 k-NN"; ``docs/accuracy-video.md`` states the protocol): a 10-class UCF-101 subset, gallery = its 300
training clips, queries = its 105 val + test clips; per video **16 frames at** ``round(linspace(0, T − 1, 16))``
**over the whole video** (T = every decoded frame), through the model's own preprocessing (here
:func:`levjepa.data.eval_clip.center_square` at the model's size); the feature is the **CLS** token (LeVJEPA) or the
**mean of the tokens** (V-JEPA 2, which has no CLS), L2-normalised. Two parameter-free read-outs:

* **k-NN**: the ``k = 20`` most cosine-similar gallery clips vote with weights ``exp(sim / 0.07)`` (DINO's vote,
  ``levjepa.eval.knn.knn_predict``); the class with the largest total wins;
* **nearest centroid**: each class's centroid is the mean of its L2-normalised gallery features, normalised;
  a query takes the class of the most cosine-similar centroid.

Both accuracies are on the queries (%); there is no validation split and no choice. Public numbers a user with
the data and ``levjepa import`` should reproduce: ``docs/evaluation.md``. ``levjepa probe --protocol video-knn
--task index:GALLERY,QUERY`` runs it (:func:`video_knn`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa.data import DataError, MediaItem
from levjepa.data.eval_clip import center_square
from levjepa.data.video import decode_all
from levjepa.eval.knn import knn_predict
from levjepa.infer.encode import encode
from levjepa.model.vit import VideoEncoder

__all__ = ["VideoKnnResult", "centroid_predict", "linspace_indices", "load_linspace_clip", "video_knn"]

FRAMES, K, TEMPERATURE = 16, 20, 0.07
Feature = Literal["cls", "mean"]


def linspace_indices(total: int, frames: int = FRAMES) -> list[int]:
    """``round(linspace(0, total − 1, frames))``: the frames the protocol reads of a ``total``-frame video (numpy's
    round: halves to even)."""
    if total < 1:
        raise ValueError("linspace_indices: a video with no frame")
    if frames == 1:
        return [0]
    return torch.linspace(0, total - 1, frames, dtype=torch.float64).round().long().tolist()


def load_linspace_clip(path: str, size: int, patch: int, frames: int = FRAMES) -> Tensor:
    """uint8 ``[frames, S, S, 3]``: the protocol's frames of the video at ``path`` (every decoded frame indexed by
    :func:`linspace_indices`), through :func:`center_square`."""
    video = decode_all(path, short_side=size)
    if len(video.frames) == 0:
        raise DataError(f"unreadable: {path}: no frame decoded")
    return center_square(video.frames[linspace_indices(len(video.frames), frames)], size, patch)


@torch.no_grad()
def centroid_predict(gallery: Tensor, labels: Tensor, queries: Tensor, num_classes: int | None = None) -> Tensor:
    """Nearest-centroid labels [Q] of ``queries`` [Q, D]: centroids are the class means of the L2-normalised
    ``gallery`` [N, D], normalised; the most cosine-similar wins (a class absent from the gallery never does)."""
    c = int(num_classes if num_classes is not None else int(labels.max()) + 1)
    g = F.normalize(gallery.float(), dim=1)
    sums = torch.zeros(c, g.shape[1]).index_add_(0, labels.long(), g)
    present = torch.bincount(labels.long(), minlength=c) > 0
    sim = F.normalize(queries.float(), dim=1) @ F.normalize(sums, dim=1).T
    return sim.masked_fill(~present[None], float("-inf")).argmax(1)


@dataclass
class VideoKnnResult:
    """Accuracy (%) of k-NN and of the nearest centroid on the queries, and what they read."""

    knn: float
    centroid: float
    feature: str
    gallery: int
    queries: int
    k: int = K
    temperature: float = TEMPERATURE

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def table(self, name: str) -> str:
        return (
            f"Video kNN protocol (16 frames at round(linspace(0, T−1, 16)) over the whole video, {self.feature}, "
            f"L2-normalised; k-NN k = {self.k}, weights exp(sim / {self.temperature:g}); nearest centroid), "
            f"gallery {self.gallery} clips, {self.queries} queries, accuracy (%) on the queries\n\n"
            f"| encoder | k-NN | nearest centroid |\n| --- | ---: | ---: |\n"
            f"| {name} | {self.knn:.1f} | {self.centroid:.1f} |"
        )


def _features(encoder: VideoEncoder, items: Sequence[MediaItem], size: int, feature: Feature, device: str) -> Tensor:
    patch = encoder.cfg.patch_size
    out = []
    for it in items:
        clip = load_linspace_clip(it.path, size, patch).permute(3, 0, 1, 2)[None]  # [1, C, T, S, S]
        enc = encode(encoder, clip, device)
        out.append(enc.cls if feature == "cls" else enc.mean)
    return torch.cat(out)


def video_knn(
    encoder: VideoEncoder,
    gallery: Sequence[MediaItem],
    queries: Sequence[MediaItem],
    *,
    size: int,
    feature: Feature = "cls",
    device: str = "cpu",
) -> VideoKnnResult:
    """The protocol (module doc) of ``encoder`` at short side ``size``: k-NN and centroid accuracy on ``queries``."""
    if feature not in ("cls", "mean"):
        raise ValueError(f"video_knn: feature={feature!r}: valid choices are cls, mean")
    g = _features(encoder, gallery, size, feature, device)
    q = _features(encoder, queries, size, feature, device)
    gy = torch.tensor([int(it.label) for it in gallery if it.label is not None])
    qy = torch.tensor([int(it.label) for it in queries if it.label is not None])
    if len(gy) != len(gallery) or len(qy) != len(queries):
        raise DataError("unreadable: the video kNN protocol needs a label on every gallery and query clip")
    c = int(max(gy.max(), qy.max())) + 1
    knn = knn_predict(g, gy, q, k=K, temperature=TEMPERATURE, num_classes=c)
    cen = centroid_predict(g, gy, q, c)
    acc = [100.0 * float((p == qy).float().mean()) for p in (knn, cen)]
    return VideoKnnResult(acc[0], acc[1], feature, len(gallery), len(queries))
