"""The frozen forward, written once: what every reader of a frozen encoder computes — probes (in memory and
feature stores), ``extract``, ``classify``, fine-tuning's evaluation and ``visualize``.

:func:`encode` takes views ``[B, C, T, H, W]`` (uint8, normalised here with the ImageNet mean and std on the
device; or float, taken as normalised) and returns :class:`Encoded`:

* ``cls``    [B, D] float32 — the CLS token after the final norm;
* ``mean``   [B, D] float32 — the patch tokens averaged (in float32);
* ``tokens`` [B, 1+L, D] — CLS then every patch token, time-major, in ``token_dtype`` (float16 by default:
  what feature stores keep and kept probes read), when ``tokens=True``;
* ``positions`` [B, L, 3] — each patch token's (t, y, x) on the token grid.

**Frozen**: the encoder runs in ``eval()`` mode under ``torch.inference_mode`` (:func:`frozen`: its previous
mode is restored, its parameters never written), and **nothing is dropped** (SPEC §5).

**The precision rule** (:func:`precision`), the same for every reader so that a probe trained on features in
memory is deployed on the numbers it was trained on: on CUDA the encoder runs under bf16 autocast and its
outputs are cast to float32 before anything else is computed from them; on any other device it runs in
float32. The streaming encoder (``levjepa stream``, ``extract --stream``) runs under the same rule. Tokens
are cast to ``token_dtype`` on the device, before the copy to the host (half the bytes).

"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from levjepa.data import normalize
from levjepa.model.vit import VideoEncoder

__all__ = ["Encoded", "encode", "frozen", "precision"]


@dataclass
class Encoded:
    """What :func:`encode` returns (see the module doc)."""

    cls: Tensor  # [B, D] float32
    mean: Tensor  # [B, D] float32
    tokens: Tensor | None  # [B, 1+L, D] in token_dtype, CLS first; None unless asked for
    positions: Tensor  # [B, L, 3] int64 (t, y, x) of every patch token

    def __len__(self) -> int:
        return len(self.cls)

    @property
    def patches(self) -> Tensor:
        """The patch tokens ``[B, L, D]`` (``tokens`` without CLS)."""
        if self.tokens is None:
            raise ValueError("encode(..., tokens=False) kept no token: ask for tokens=True")
        return self.tokens[:, 1:]


@contextlib.contextmanager
def frozen(encoder: nn.Module) -> Iterator[nn.Module]:
    """``eval()`` + ``inference_mode`` for the duration; the encoder's previous train/eval mode is restored."""
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.inference_mode():
            yield encoder
    finally:
        encoder.train(was_training)


def precision(device: str | torch.device) -> contextlib.AbstractContextManager[object]:
    """The frozen forward's precision on ``device`` (module doc): bf16 autocast on CUDA, float32 elsewhere."""
    cuda = torch.device(device).type == "cuda"
    return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()


def _pixels(views: Tensor, device: str | torch.device) -> Tensor:
    x = views.to(device, non_blocking=True)
    if x.dtype == torch.uint8:
        return normalize(x)
    if not x.is_floating_point():
        raise ValueError(f"encode: views must be uint8 (raw) or float (normalised), got {x.dtype}")
    return x.float()


def encode(
    encoder: VideoEncoder,
    views: Tensor,
    device: str | torch.device,
    *,
    tokens: bool = True,
    token_dtype: torch.dtype = torch.float16,
    host: bool = True,
) -> Encoded:
    """The frozen features of ``views`` ``[B, C, T, H, W]`` (module doc); on the host unless ``host=False``."""
    if views.dim() != 5:
        raise ValueError(f"encode: expected views [B, C, T, H, W], got {list(views.shape)}")
    with frozen(encoder):
        with precision(device):
            out = encoder.forward_features(_pixels(views, device))  # drop=False: every token
        cls, patches = out.cls.float(), out.patches.float()
        kept = torch.cat([cls[:, None], patches], 1).to(token_dtype) if tokens else None
        enc = Encoded(cls, patches.mean(1), kept, out.positions)
        if host:
            enc = Encoded(enc.cls.cpu(), enc.mean.cpu(), None if kept is None else kept.cpu(), enc.positions.cpu())
    return enc
