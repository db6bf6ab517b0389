"""k-nearest-neighbour classification with cosine similarity on frozen CLS features (DINO's kNN protocol).

For a query ``q`` and training features ``f_i`` (both L2-normalised), the ``k`` most similar training
points vote for their labels with weights ``exp(cos(q, f_i) / T)``; the class with the largest total
weight wins (ties: the smaller class index). Defaults: ``T = 0.07`` (DINO). ``k`` is chosen on the
validation split from ``ks = (1, 5, 10, 20, 50)`` (capped at the training-set size) and the test accuracy
of that ``k`` reported, like every probe here. No training, no randomness. :func:`knn_from_sources` reads
each file's CLS (averaged over its views) from feature sources (``levjepa.eval.source``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa.eval.source import FeatureSource

__all__ = ["KnnResult", "knn_evaluate", "knn_from_sources", "knn_predict"]


@torch.no_grad()
def knn_predict(
    train_feats: Tensor,
    train_labels: Tensor,
    queries: Tensor,
    *,
    k: int | Sequence[int] = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
    batch_size: int = 1024,
) -> Tensor:
    """Predicted labels of ``queries`` [Q, D] by weighted cosine kNN over ``train_feats`` [N, D].

    With a sequence of ``k`` returns [len(ks), Q] (one neighbour search serves every ``k``); else [Q].
    """
    if train_feats.dim() != 2 or queries.dim() != 2 or train_feats.shape[1] != queries.shape[1]:
        raise ValueError(
            f"knn: features must be [N, D] and [Q, D] with the same D, got {list(train_feats.shape)} and "
            f"{list(queries.shape)}"
        )
    if len(train_feats) != len(train_labels) or len(train_feats) == 0:
        raise ValueError(f"knn: {len(train_feats)} training features for {len(train_labels)} labels")
    ks = [k] if isinstance(k, int) else list(k)
    if any(kk < 1 for kk in ks) or temperature <= 0:
        raise ValueError(f"knn: k={ks} must be >= 1 and temperature={temperature} > 0")
    ks = [min(kk, len(train_feats)) for kk in ks]
    c = int(num_classes if num_classes is not None else int(train_labels.max()) + 1)
    train = F.normalize(train_feats.float(), dim=1)
    labels = train_labels.long().to(train.device)
    out = torch.empty(len(ks), len(queries), dtype=torch.long)
    kmax = max(ks)
    for i in range(0, len(queries), batch_size):
        q = F.normalize(queries[i : i + batch_size].float().to(train.device), dim=1)
        sim, idx = (q @ train.T).topk(kmax, dim=1)  # [b, kmax], sorted descending
        weights = ((sim - sim[:, :1]) / temperature).exp()  # a common factor exp(-max/T): no overflow
        onehot = F.one_hot(labels[idx], c).float()  # [b, kmax, C]
        for j, kk in enumerate(ks):
            votes = (weights[:, :kk, None] * onehot[:, :kk]).sum(1)  # [b, C]
            out[j, i : i + len(q)] = votes.argmax(1).cpu()
    return out[0] if isinstance(k, int) else out


@dataclass
class KnnResult:
    ks: list[int]
    val_acc: list[float]
    test_acc: list[float] | None
    best: int
    temperature: float
    seconds: float

    @property
    def reported(self) -> float:
        return self.val_acc[self.best] if self.test_acc is None else self.test_acc[self.best]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "knn",
            "best": {
                "k": self.ks[self.best],
                "val_acc": self.val_acc[self.best],
                "test_acc": None if self.test_acc is None else self.test_acc[self.best],
            },
            "reported_acc": self.reported,
            "temperature": self.temperature,
            "seconds": self.seconds,
            "grid": [
                {"k": k, "val_acc": v, **({"test_acc": self.test_acc[i]} if self.test_acc is not None else {})}
                for i, (k, v) in enumerate(zip(self.ks, self.val_acc, strict=True))
            ],
        }


def knn_evaluate(
    train: tuple[Tensor, Tensor],
    val: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor] | None = None,
    *,
    ks: Sequence[int] = (1, 5, 10, 20, 50),
    temperature: float = 0.07,
    num_classes: int | None = None,
) -> KnnResult:
    """Accuracy (%) for each ``k`` on val (and test); the reported ``k`` is the best on val (ties: smaller k)."""
    start = time.perf_counter()
    ks = sorted({min(k, len(train[0])) for k in ks})
    c = num_classes if num_classes is not None else int(max(train[1].max(), val[1].max())) + 1

    def acc(split: tuple[Tensor, Tensor]) -> list[float]:
        pred = knn_predict(train[0], train[1], split[0], k=ks, temperature=temperature, num_classes=c)
        return [100.0 * float((p == split[1].long().cpu()).float().mean()) for p in pred]

    val_acc = acc(val)
    test_acc = None if test is None else acc(test)
    best = max(range(len(ks)), key=lambda i: (val_acc[i], -ks[i]))
    return KnnResult(ks, val_acc, test_acc, best, temperature, time.perf_counter() - start)


def knn_from_sources(
    train: FeatureSource, val: FeatureSource, test: FeatureSource | None = None, *, task: str, num_classes: int
) -> KnnResult:
    """:func:`knn_evaluate` on each file's CLS (averaged over its views) and its label for ``task``."""

    def split(s: FeatureSource) -> tuple[Tensor, Tensor]:
        return s.file_cls(), s.file_labels(task)

    return knn_evaluate(split(train), split(val), None if test is None else split(test), num_classes=num_classes)
