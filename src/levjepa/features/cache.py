"""Frozen features, computed once: CLS, mean-pooled patches and (for the attentive probe) every token.

Evaluation protocol (SPEC §5): every batch goes through the one frozen forward,
``levjepa.infer.encode.encode`` (``eval()`` under ``torch.inference_mode``, **no token dropped**, uint8 clips
normalised with the ImageNet mean/std on the device, bf16 autocast on CUDA and float32 elsewhere: the
numbers feature stores hold), and an image is a clip whose frame is repeated along time
(``levjepa.data.eval_clip.as_clip``; the paper repeats ImageNet images 8 or 16 times).

Stored per clip (:class:`Features`):

* ``cls``    [N, D] float32 — the kNN input;
* ``mean``   [N, D] float32 — mean of the patch tokens (the linear probe's input, appendix C.2);
* ``tokens`` [N, 1+L, D] float16 — CLS then every patch token: "all output tokens" that the attentive
  probe's query reads (fp16 halves the cache; the probe computes in fp32).

The encoder's mode is restored afterwards (a training loop may pass its live encoder), and its
parameters are never written: ``tests/test_benchmark_eval.py`` checks they are bit-identical after
feature computation and probing. The encoder's function fingerprint (``levjepa.model.fingerprint``: its
weights and the config that says what they compute) keys the on-disk cache (:func:`cached_features`), so
features are recomputed when the weights, the attention or RoPE layout, or the data change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from levjepa.data.eval_clip import as_clip
from levjepa.data.progress import Progress
from levjepa.infer.encode import encode
from levjepa.model.fingerprint import function_fingerprint
from levjepa.model.vit import VideoEncoder
from levjepa.weights import WeightsError, load_tensors, save_tensors

__all__ = ["Features", "cached_features", "compute_features"]


@dataclass
class Features:
    cls: Tensor  # [N, D] float32
    mean: Tensor  # [N, D] float32
    tokens: Tensor | None  # [N, 1+L, D] float16 (CLS first), or None when not kept

    def __len__(self) -> int:
        return len(self.cls)

    def to_tensors(self) -> dict[str, Tensor]:
        out = {"cls": self.cls, "mean": self.mean}
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out


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
    bar = Progress(len(clips), desc, "clip", show=progress)
    for i in range(0, len(clips), batch_size):
        enc = encode(encoder, clips[i : i + batch_size], device, tokens=keep_tokens)
        cls.append(enc.cls)
        mean.append(enc.mean)
        if enc.tokens is not None:
            tokens.append(enc.tokens)
        bar.update(len(enc))
    bar.close()
    return Features(torch.cat(cls), torch.cat(mean), torch.cat(tokens) if keep_tokens else None)


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
    its function fingerprint (``levjepa.model.fingerprint``). ``cache_dir=None`` disables the cache.
    """
    if cache_dir is None:
        return compute_features(encoder, clips, keep_tokens=keep_tokens, **kwargs)
    path = Path(cache_dir) / f"{function_fingerprint(encoder)}-{key}.safetensors"
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
