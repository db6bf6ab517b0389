"""Frozen features, computed once: CLS, mean-pooled patches and (for the attentive probe) every token.

Evaluation protocol (SPEC §5): the encoder runs in ``eval()`` mode under ``torch.inference_mode`` (no
gradient, no autograd graph), **no token is dropped** (``forward_features(drop=False)``), and an image is
a clip whose frame is repeated along time (``levjepa.data.eval_clip.as_clip``; the paper repeats ImageNet
images 8 or 16 times). uint8 clips are normalised with the ImageNet mean/std on the device, batch by batch.

Stored per clip (:class:`Features`):

* ``cls``    [N, D] float32 — the kNN input;
* ``mean``   [N, D] float32 — mean of the patch tokens (the linear probe's input, appendix C.2);
* ``tokens`` [N, 1+L, D] float16 — CLS then every patch token: "all output tokens" that the attentive
  probe's query reads (fp16 halves the cache; the probe computes in fp32).

The encoder's mode is restored afterwards (a training loop may pass its live encoder), and its
parameters are never written: ``tests/test_benchmark_eval.py`` checks they are bit-identical after
feature computation and probing. :func:`encoder_fingerprint` (SHA-1 of the state dict) keys the on-disk
cache (:func:`cached_features`), so features are recomputed only when the weights or the data change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from levjepa.data.eval_clip import as_clip
from levjepa.data.views import normalize
from levjepa.eval.progress import Progress
from levjepa.formats.classifier import weights_fingerprint
from levjepa.model.vit import VideoEncoder
from levjepa.weights import WeightsError, load_tensors, save_tensors

__all__ = [
    "Features",
    "cached_features",
    "compute_features",
    "encoder_fingerprint",
    "frozen_eval",
]


@dataclass
class Features:
    cls: Tensor  # [N, D] float32
    mean: Tensor  # [N, D] float32
    tokens: Tensor | None  # [N, 1+L, D] float16 (CLS first), or None when not kept

    def __len__(self) -> int:
        return len(self.cls)

    def subset(self, idx: Tensor | slice) -> Features:
        return Features(self.cls[idx], self.mean[idx], None if self.tokens is None else self.tokens[idx])

    def to_tensors(self) -> dict[str, Tensor]:
        out = {"cls": self.cls, "mean": self.mean}
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out


@contextlib.contextmanager
def frozen_eval(encoder: nn.Module) -> Iterator[nn.Module]:
    """``eval()`` + ``inference_mode`` for the duration; the encoder's previous train/eval mode is restored."""
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.inference_mode():
            yield encoder
    finally:
        encoder.train(was_training)


def _normalize(x: Tensor) -> Tensor:
    if x.dtype == torch.uint8:
        return normalize(x)
    if not x.is_floating_point():
        raise ValueError(f"clips must be uint8 (raw) or float (normalised), got {x.dtype}")
    return x.float()


def compute_features(
    encoder: VideoEncoder,
    clips: Tensor,
    *,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    keep_tokens: bool = True,
    num_frames: int = 16,
    progress: bool = False,
    desc: str = "features",
) -> Features:
    """Features of ``clips`` (uint8 [N, C, T, H, W] raw, or float already normalised; images [N, C, H, W]
    are repeated ``num_frames`` times) through the frozen ``encoder``, in batches, nothing dropped."""
    clips = as_clip(clips, num_frames)
    if len(clips) == 0:
        raise ValueError("compute_features: no clips (got an empty batch)")
    cls, mean, tokens = [], [], []
    starts = range(0, len(clips), batch_size)
    bar = Progress(len(clips), desc, "clip", show=progress)
    with frozen_eval(encoder):
        for i in starts:
            x = _normalize(clips[i : i + batch_size].to(device, non_blocking=True))
            out = encoder.forward_features(x)  # drop=False: every token
            cls.append(out.cls.float().cpu())
            mean.append(out.patches.float().mean(1).cpu())
            if keep_tokens:
                tokens.append(torch.cat([out.cls[:, None], out.patches], 1).to(torch.float16).cpu())
            bar.update(len(x))
    bar.close()
    return Features(torch.cat(cls), torch.cat(mean), torch.cat(tokens) if keep_tokens else None)


def encoder_fingerprint(encoder: nn.Module) -> str:
    """SHA-1 over the state dict (names, shapes, dtypes and bytes): equal weights <=> equal fingerprint
    (``levjepa.formats.classifier.weights_fingerprint``, which a kept probe records)."""
    return weights_fingerprint(encoder)


def cached_features(
    encoder: VideoEncoder,
    clips: Tensor,
    *,
    key: str,
    cache_dir: str | Path | None,
    keep_tokens: bool = True,
    **kwargs: Any,
) -> Features:
    """:func:`compute_features`, stored under ``cache_dir/<fingerprint>-<key>.safetensors`` and reused.

    ``key`` must name the data (e.g. ``"synthetic-<config hash>-train"``); the encoder part of the name is
    its weights fingerprint. ``cache_dir=None`` disables the cache.
    """
    if cache_dir is None:
        return compute_features(encoder, clips, keep_tokens=keep_tokens, **kwargs)
    path = Path(cache_dir) / f"{encoder_fingerprint(encoder)[:16]}-{key}.safetensors"
    if path.is_file():
        try:
            t, _ = load_tensors(path)
            if "cls" in t and "mean" in t and (not keep_tokens or "tokens" in t) and len(t["cls"]) == len(clips):
                return Features(t["cls"], t["mean"], t.get("tokens") if keep_tokens else None)
        except WeightsError:
            pass  # unreadable cache entry: recompute and overwrite
    feats = compute_features(encoder, clips, keep_tokens=keep_tokens, **kwargs)
    save_tensors(path, feats.to_tensors(), {"key": key})
    return feats
