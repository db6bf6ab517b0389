"""Probes trained from feature stores on disk, in bounded memory (the dataset-scale ``levjepa probe``).

**Choice: float16 tokens stored once and streamed**, not the frozen encoder re-run every epoch. Costs at
ViT-B (D = 768), 16×224² clips (1 + 1568 tokens), one view, per 10k clips: **disk 24 GB** of float16
tokens (+ 61 MB of CLS / mean); **memory** one batch (64 × 1569 × 768 × 4 B = 0.31 GB in fp32) plus the
grid. Re-running the encoder instead costs, per 10k clips and 20 epochs, 200k decodes and ≈ 7×10^16 FLOPs
(≈ 360 GFLOPs a forward) — minutes of encoder time on an H100 but hours of CPU decoding, every time a grid
is trained. Stored tokens are computed once and shared by every probe, grid and seed; the cost is disk
(SSv2's 169k training videos × 2 segments ≈ 0.8 TB). The (lr × wd) grid is still trained stacked on each
batch read (``levjepa.eval.probes``). The deviation from V-JEPA 2's protocol this implies: its training
clips are random-resized-crop augmented each epoch; ours are the fixed views of the store.

**Samples.** A sample is one (file, crop) of a store: the rows of its ``segments`` clips for that crop. The
attentive probe reads the tokens of all its segments concatenated ``[segments · (1+L), D]`` (V-JEPA 2's
multi-clip evaluation concatenates the clips' tokens); the linear probe the mean of the segments' mean
tokens; kNN the CLS averaged over every view of a file. At test time the class probabilities of a file's
crops are averaged (V-JEPA 2 averages its views' softmax outputs) and the accuracy is per file; the
validation loss is the cross-entropy of those averaged probabilities.

**Memory** is one batch of samples read with ``pread`` (``FeatureStore.read``), the probe grid and its
optimizer state, plus the stores' index (a few int64 per row): independent of the number of clips
(``tests/test_disk_probe.py`` checks peak RSS at 2k and 8k clips). kNN keeps every file's CLS vector in
memory (N × D float32: 31 MB per 10k files at D = 768), which is what kNN is.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from levjepa.eval.feature_store import FeatureStore
from levjepa.eval.knn import KnnResult, knn_evaluate
from levjepa.eval.probes import (
    GridAdamW,
    GridResult,
    LinearProbeGrid,
    ProbeConfig,
    build_probe_grid,
    choose_probes,
    lr_factor,
)

__all__ = ["Samples", "knn_from_stores", "probe_from_stores", "samples"]


@dataclass(frozen=True)
class Samples:
    """The samples of a store: ``rows[i]`` = the store rows of sample i (its segments, in order)."""

    rows: np.ndarray  # int64 [N, segments]
    labels: np.ndarray  # int64 [N]
    file: np.ndarray  # int64 [N]: the item id, shared by the crops of one file

    def __len__(self) -> int:
        return len(self.labels)


def samples(store: FeatureStore) -> Samples:
    """One sample per (file, crop) of ``store`` (see the module doc)."""
    segments, crops = int(store.config["segments"]), int(store.config["crops"])
    first = np.nonzero((store.segment == 0) & (store.crop == 0))[0]  # first row of each file
    if len(first) * segments * crops != len(store):
        raise ValueError(f"{store.path}: {len(store)} rows are not {segments} segments × {crops} crops per file")
    base = np.repeat(first, crops) + np.tile(np.arange(crops), len(first))  # [files · crops]
    rows = base[:, None] + crops * np.arange(segments)[None, :]
    if (store.labels[first] < 0).any():
        raise ValueError(f"{store.path}: some rows have no label; a probe needs a labelled store")
    return Samples(rows.astype(np.int64), np.repeat(store.labels[first], crops), np.repeat(store.item[first], crops))


def _inputs(store: FeatureStore, rows: np.ndarray, kind: str) -> Tensor:
    """Probe inputs of samples ``rows`` [B, S]: tokens [B, S·(1+L), D] or mean features [B, D]."""
    b, s = rows.shape
    if kind == "attentive":
        t = torch.from_numpy(store.read("tokens", rows.reshape(-1)))  # [B·S, 1+L, D] float16
        return t.reshape(b, s * t.shape[1], t.shape[2])
    m = torch.from_numpy(store.read("mean", rows.reshape(-1)))
    return m.reshape(b, s, -1).mean(1)


def _batches(n: int, bs: int, order: np.ndarray | None = None) -> Iterator[np.ndarray]:
    idx = np.arange(n) if order is None else order
    for i in range(0, n, bs):
        yield idx[i : i + bs]


@torch.no_grad()
def _standardizer(store: FeatureStore, smp: Samples, bs: int) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation of the training samples' mean features, in one streamed pass (float64)."""
    total, sq, n = None, None, 0
    for b in _batches(len(smp), bs):
        x = _inputs(store, smp.rows[b], "linear").double()
        total = x.sum(0) if total is None else total + x.sum(0)
        sq = (x * x).sum(0) if sq is None else sq + (x * x).sum(0)
        n += len(x)
    assert total is not None and sq is not None
    mean = total / n
    std = (sq / n - mean * mean).clamp_min(0).sqrt()
    return mean.float(), std.float().clamp_min(1e-6)


@torch.no_grad()
def _evaluate(
    model: nn.Module,
    store: FeatureStore,
    kind: str,
    num_classes: int,
    *,
    batch_size: int,
    device: str,
) -> tuple[Tensor, Tensor]:
    """Accuracy (%) and loss of every probe [G], per file: class probabilities averaged over its crops."""
    model.eval()
    smp = samples(store)
    crops = int(store.config["crops"])  # a file's crops are consecutive samples
    files = len(smp) // crops
    per = max(1, batch_size // crops)
    correct: Tensor | None = None
    loss: Tensor | None = None
    for fb in _batches(files, per):
        sb = (fb[:, None] * crops + np.arange(crops)[None, :]).reshape(-1)
        logits = model(_inputs(store, smp.rows[sb], kind).to(device))[:, :, :num_classes]  # [G, B·crops, C]
        probs = logits.float().softmax(-1).reshape(logits.shape[0], len(fb), crops, -1).mean(2)  # [G, B, C]
        y = torch.from_numpy(smp.labels[sb[::crops]]).to(device)
        c = (probs.argmax(-1) == y).sum(1).double()
        lo = F.nll_loss(probs.clamp_min(1e-12).log().transpose(1, 2), y.expand(len(probs), -1), reduction="none")
        lo = lo.sum(1).double()
        correct = c if correct is None else correct + c
        loss = lo if loss is None else loss + lo
    assert correct is not None and loss is not None
    return (100.0 * correct / files).cpu(), (loss / files).cpu()


def probe_from_stores(
    kind: Literal["attentive", "linear"],
    cfg: ProbeConfig,
    train: FeatureStore,
    val: FeatureStore,
    test: FeatureStore | None = None,
    *,
    num_classes: int,
    generator: torch.Generator,
    device: str = "cpu",
) -> GridResult:
    """Train the (lr × wd) grid of ``kind`` probes on ``train``'s samples read from disk batch by batch,
    choose on ``val``, report on ``test`` (``levjepa.eval.probes.choose_probes``)."""
    start = time.perf_counter()
    smp = samples(train)
    if len(smp) == 0:
        raise ValueError(f"{train.path}: no training sample")
    grid = cfg.grid(kind)
    dim = int(train.read("cls", np.array([0])).shape[-1])
    model = build_probe_grid(kind, cfg, dim, num_classes, generator=generator).to(device)
    bs = min(cfg.batch_size, len(smp))
    if isinstance(model, LinearProbeGrid):
        mean, std = _standardizer(train, smp, bs)
        with torch.no_grad():  # the standardiser of LinearProbeGrid.fit_standardizer, computed streamed
            model.get_buffer("feat_mean").copy_(mean.to(device))
            model.get_buffer("feat_std").copy_(std.to(device))
    params, decay = [], []
    for name, p in model.named_parameters():  # decay matrices and the query (as levjepa.eval.probes does)
        params.append(p)
        decay.append(p.dim() >= 3 or name.endswith("query"))
    opt = GridAdamW(params, [lr for lr, _ in grid], [wd for _, wd in grid], decay=decay, betas=(cfg.beta1, cfg.beta2))
    epochs = cfg.epochs if kind == "attentive" else cfg.linear_epochs
    steps_per_epoch = math.ceil(len(smp) / bs)
    total, warmup = epochs * steps_per_epoch, int(cfg.warmup_epochs * steps_per_epoch)
    step = 0
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(smp), generator=generator).numpy()
        for b in _batches(len(smp), bs, order):
            x = _inputs(train, smp.rows[b], kind).to(device, non_blocking=True)
            y = torch.from_numpy(smp.labels[b]).to(device)
            logits = model(x)[:, :, :num_classes]  # [G, B, C]
            loss = F.cross_entropy(logits.reshape(-1, num_classes), y.repeat(len(grid))) * len(grid)
            opt.zero_grad()
            loss.backward()
            opt.step(lr_factor(step, total, warmup))
            step += 1
    ev = {"batch_size": 2 * cfg.batch_size, "device": device}
    val_res = {None: _evaluate(model, val, kind, num_classes, **ev)}  # type: ignore[arg-type]
    test_res = None if test is None else {None: _evaluate(model, test, kind, num_classes, **ev)}  # type: ignore[arg-type]
    extra: dict[str, Any] = {"from_disk": True, "train_samples": len(smp)}
    return choose_probes(kind, cfg, val_res, test_res, seconds=time.perf_counter() - start, extra=extra)[None]


def _file_cls(store: FeatureStore, batch_rows: int = 4096) -> tuple[Tensor, Tensor]:
    """CLS averaged over every view of each file, and the file's label."""
    views = int(store.config["segments"]) * int(store.config["crops"])
    first = np.nonzero((store.segment == 0) & (store.crop == 0))[0]
    out = []
    for b in _batches(len(first), max(1, batch_rows // views)):
        rows = (first[b][:, None] + np.arange(views)[None, :]).reshape(-1)
        out.append(torch.from_numpy(store.read("cls", rows)).reshape(len(b), views, -1).mean(1))
    return torch.cat(out), torch.from_numpy(store.labels[first])


def knn_from_stores(
    train: FeatureStore, val: FeatureStore, test: FeatureStore | None = None, *, num_classes: int
) -> KnnResult:
    """DINO's kNN on each file's CLS (averaged over its views); see ``levjepa.eval.knn``."""
    return knn_evaluate(
        _file_cls(train), _file_cls(val), None if test is None else _file_cls(test), num_classes=num_classes
    )
