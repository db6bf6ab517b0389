"""Views of one clip: spatial crops in the worker (uint8), photometric change and normalisation on device.

Per clip, from the *same* decoded frames (so every view shares the time window):

* ``num_global`` global views: a random-resized crop of area scale ``global_scale`` (0.8–1.0) and aspect
  ratio ``crop_ratio`` (3/4–4/3), resized to ``global_size`` (224). Crop only: no flip, no photometric
  change, as in the official LeVJEPA code.
* ``num_local`` local views: a random-resized crop of scale ``local_scale`` (0.02–0.4) resized to
  ``local_size`` (96), a horizontal flip with probability ``flip_p`` (0.5), then — on the training device,
  in batch — colour jitter with probability ``jitter_p`` (0.8) and grayscale with probability
  ``grayscale_p`` (0.2).

One crop (and one flip) per view is applied identically to all of its frames. The random choices of a
clip (:func:`sample_view_params`) are drawn in the worker either way; the cut happens in the worker
(:func:`make_views`, ``data.resize_on="worker"``) or on the device from the shipped frames (``resize.py``,
``"device"``), equal within one uint8 level. The crop box follows
torchvision's RandomResizedCrop: up to 10 draws of (area, log-aspect) until the box fits, else the
largest centred box with a clamped aspect ratio. Resizing is bilinear with antialiasing on uint8
channels-last frames (fast in PyTorch's CPU kernel).

Photometric parameters are drawn in the worker from the clip's generator — ``PHOTOMETRIC_FIELDS`` =
``(jitter, brightness, contrast, saturation, hue, grayscale)`` per local view, float32 — and applied by
:func:`apply_photometric` on float ``[N, C, T, H, W]`` in ``[0, 1]``, batched:

* brightness ``b ~ U[1-β, 1+β]``: ``x ← clamp(b·x)``
* contrast ``c ~ U[1-γ, 1+γ]``: ``x ← clamp(c·x + (1-c)·mean(gray(x)))``, the mean over the whole view
  (all T frames), so the change is the same on every frame [choice; torchvision takes a per-frame mean]
* saturation ``s ~ U[1-σ, 1+σ]``: ``x ← clamp(s·x + (1-s)·gray(x))``
* hue ``h ~ U[-η, η]``: rotate the HSV hue by ``h`` (fraction of the circle)
* grayscale: ``x ← gray(x)`` on all three channels, ``gray = 0.299 R + 0.587 G + 0.114 B``

in this fixed order [choice: torchvision draws a random order; a fixed one keeps the parameters one
vector per view]. Jitter applies only where its flag is 1, so a view without it is left bit-exact.
Defaults (β, γ, σ, η) = (0.4, 0.4, 0.2, 0.1) as in the official code.

:func:`normalize` maps uint8 (or float in [0, 1]) to ImageNet-normalised float, channel dim ``-4``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from levjepa.data.config import DataConfig

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PHOTOMETRIC_FIELDS",
    "apply_photometric",
    "crop_box",
    "cut_view",
    "grayscale",
    "hsv_to_rgb",
    "make_views",
    "normalize",
    "rgb_to_hsv",
    "sample_photometric",
    "sample_view_params",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PHOTOMETRIC_FIELDS = ("jitter", "brightness", "contrast", "saturation", "hue", "grayscale")
_LUMA = (0.299, 0.587, 0.114)


def normalize(x: torch.Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ImageNet normalisation of ``[..., C=3, T, H, W]``: uint8 is divided by 255 first, float is taken as
    already in [0, 1]. Returns ``(x - mean) / std`` in ``dtype``."""
    if x.dim() < 4 or x.shape[-4] != 3:
        raise ValueError(f"normalize: expected [..., 3, T, H, W] (channel dim -4), got shape {tuple(x.shape)}")
    y = x.to(dtype) / 255.0 if x.dtype == torch.uint8 else x.to(dtype)
    mean = torch.tensor(IMAGENET_MEAN, dtype=dtype, device=x.device).view(3, 1, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=dtype, device=x.device).view(3, 1, 1, 1)
    return (y - mean) / std


# ------------------------------------------------------------------------------------ crops (worker side)


def crop_box(
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator | None,
) -> tuple[int, int, int, int]:
    """A RandomResizedCrop box ``(top, left, h, w)``; always draws the same amount of randomness."""
    u = torch.rand(10, 4, generator=generator, dtype=torch.float64).tolist()
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for a, r, y, x in u:
        target = area * (scale[0] + a * (scale[1] - scale[0]))
        aspect = math.exp(log_lo + r * (log_hi - log_lo))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(y * (height - h + 1)), height - h)
            left = min(int(x * (width - w + 1)), width - w)
            return top, left, h, w
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    h, w = max(1, min(h, height)), max(1, min(w, width))
    return (height - h) // 2, (width - w) // 2, h, w


def cut_view(frames: torch.Tensor, box: tuple[int, int, int, int], size: int, flip: bool = False) -> torch.Tensor:
    """Crop ``frames`` uint8 ``[T, C, H, W]`` to ``box``, resize to ``size``², optionally flip → ``[C, T, s, s]``
    (a permuted view, not contiguous: stacking views into a batch is then the only copy)."""
    top, left, h, w = box
    patch = frames[:, :, top : top + h, left : left + w]
    if (h, w) != (size, size):
        patch = F.interpolate(
            patch.contiguous(memory_format=torch.channels_last),
            size=(size, size),
            mode="bilinear",
            antialias=True,
            align_corners=False,
        )
    if flip:
        patch = patch.flip(-1)
    return patch.permute(1, 0, 2, 3)  # a view: the caller's stack makes the one copy


def sample_photometric(
    generator: torch.Generator | None,
    *,
    jitter_p: float,
    brightness: float,
    contrast: float,
    saturation: float,
    hue: float,
    grayscale_p: float,
) -> torch.Tensor:
    """One local view's photometric parameters (``PHOTOMETRIC_FIELDS``), float32 [6]."""
    u = torch.rand(6, generator=generator, dtype=torch.float64).tolist()
    jitter = 1.0 if u[0] < jitter_p else 0.0
    return torch.tensor(
        [
            jitter,
            max(0.0, 1.0 - brightness) + u[1] * (1.0 + brightness - max(0.0, 1.0 - brightness)),
            max(0.0, 1.0 - contrast) + u[2] * (1.0 + contrast - max(0.0, 1.0 - contrast)),
            max(0.0, 1.0 - saturation) + u[3] * (1.0 + saturation - max(0.0, 1.0 - saturation)),
            -hue + u[4] * 2.0 * hue,
            1.0 if u[5] < grayscale_p else 0.0,
        ],
        dtype=torch.float32,
    )


def sample_view_params(
    height: int, width: int, cfg: DataConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every random choice of one clip's views, for frames of ``height × width``.

    Returns ``(boxes int64 [G + V, 4] (top, left, h, w), flips bool [V], photometric float32 [V, 6])``.
    Draw order (fixed, so a sample is reproducible from its generator): every global crop, then per local
    view its crop, its flip, its photometric parameters. The worker path (:func:`make_views`) and the
    device path (``resize.py``) cut views from these same draws.
    """
    ratio = cfg.crop_ratio
    boxes = [crop_box(height, width, cfg.global_scale, ratio, generator) for _ in range(cfg.num_global)]
    flips, photo = [], []
    for _ in range(cfg.num_local):
        boxes.append(crop_box(height, width, cfg.local_scale, ratio, generator))
        flips.append(bool(torch.rand(1, generator=generator, dtype=torch.float64).item() < cfg.flip_p))
        photo.append(
            sample_photometric(
                generator,
                jitter_p=cfg.jitter_p,
                brightness=cfg.brightness,
                contrast=cfg.contrast,
                saturation=cfg.saturation,
                hue=cfg.hue,
                grayscale_p=cfg.grayscale_p,
            )
        )
    photo_t = torch.stack(photo) if photo else torch.empty(0, len(PHOTOMETRIC_FIELDS))
    return torch.tensor(boxes, dtype=torch.int64), torch.tensor(flips, dtype=torch.bool), photo_t


def make_views(
    frames: torch.Tensor, cfg: DataConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All views of one clip from uint8 ``[T, C, H, W]`` frames, cut in the worker.

    Returns ``(global [G, C, T, Sg, Sg] uint8, local [V, C, T, Sl, Sl] uint8, photometric [V, 6] float32)``,
    from the draws of :func:`sample_view_params`.
    """
    t, c, height, width = frames.shape
    boxes, flips, photo = sample_view_params(height, width, cfg, generator)
    g = cfg.num_global
    glob = [cut_view(frames, tuple(box), cfg.global_size) for box in boxes[:g].tolist()]
    local = [
        cut_view(frames, tuple(box), cfg.local_size, bool(flip))
        for box, flip in zip(boxes[g:].tolist(), flips.tolist(), strict=True)
    ]
    s = cfg.local_size
    local_t = torch.stack(local) if local else torch.empty(0, c, t, s, s, dtype=torch.uint8)
    return torch.stack(glob), local_t, photo


# ------------------------------------------------------------------------------ photometric (device side)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """Luma of ``[N, 3, ...]`` as ``[N, 1, ...]`` (ITU-R 601 weights, as torchvision)."""
    return _LUMA[0] * x[:, 0:1] + _LUMA[1] * x[:, 1:2] + _LUMA[2] * x[:, 2:3]


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """``[N, 3, ...]`` RGB in [0, 1] → HSV with every component in [0, 1] (hue as a fraction of the circle)."""
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    maxc, _ = x.max(dim=1)
    minc, _ = x.min(dim=1)
    delta = maxc - minc
    eq = delta == 0
    safe_delta = torch.where(eq, torch.ones_like(delta), delta)
    s = delta / torch.where(maxc == 0, torch.ones_like(maxc), maxc)
    rc, gc, bc = (maxc - r) / safe_delta, (maxc - g) / safe_delta, (maxc - b) / safe_delta
    h = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.where(eq, torch.zeros_like(h), (h / 6.0) % 1.0)
    return torch.stack((h, s, maxc), dim=1)


def hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv`, element-wise (no per-sector table, so memory stays ~3x the input):
    channel ``n`` in (5, 3, 1) for (R, G, B) is ``v - v·s·clamp(min(k, 4 - k), 0, 1)``, ``k = (n + 6h) mod 6``."""
    h, s, v = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    out = []
    for n in (5.0, 3.0, 1.0):
        k = (n + 6.0 * h) % 6.0
        out.append(v - v * s * torch.minimum(k, 4.0 - k).clamp(0.0, 1.0))
    return torch.cat(out, dim=1)


def _hue_shift(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the HSV hue of ``[N, 3, ...]`` by ``shift`` (fraction of the circle, broadcastable ``[N, 1, ...]``).

    Same result as ``hsv_to_rgb(rgb_to_hsv(x) + shift)``, in fewer passes: with ``M = max``, ``Δ = max - min``
    and ``h6 = 6·hue``, channel ``n`` in (5, 3, 1) is ``M - Δ·clamp(min(k, 4 - k), 0, 1)``, ``k = (n + h6) mod 6``.
    """
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    maxc = torch.maximum(torch.maximum(r, g), b)
    delta = maxc - torch.minimum(torch.minimum(r, g), b)
    inv = 1.0 / torch.where(delta > 0, delta, torch.ones_like(delta))
    h6 = torch.where(maxc == r, (g - b) * inv, torch.where(maxc == g, (b - r) * inv + 2.0, (r - g) * inv + 4.0))
    h6 = h6 + 6.0 * shift
    out = torch.empty_like(x)
    for c, n in enumerate((5.0, 3.0, 1.0)):
        k = torch.remainder(h6 + n, 6.0)
        out[:, c : c + 1] = maxc - delta * torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    return out


def apply_photometric(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Colour jitter and grayscale of float ``[N, 3, T, H, W]`` in [0, 1] by ``params`` ``[N, 6]``.

    See the module docstring for the equations and their order. Returns a new tensor in [0, 1].
    """
    if x.dim() != 5 or x.shape[1] != 3:
        raise ValueError(f"apply_photometric: expected [N, 3, T, H, W], got {tuple(x.shape)}")
    if params.shape != (x.shape[0], len(PHOTOMETRIC_FIELDS)):
        raise ValueError(f"apply_photometric: params of shape {tuple(params.shape)}, expected [{x.shape[0]}, 6]")
    p = params.to(device=x.device, dtype=x.dtype).view(x.shape[0], 6, 1, 1, 1, 1)
    jitter, bright, contr, sat, hue, gray = (p[:, i] for i in range(6))  # each [N, 1, 1, 1, 1]
    y = (x * bright).clamp_(0.0, 1.0)
    mean = grayscale(y).mean(dim=(1, 2, 3, 4), keepdim=True)
    y = y.mul_(contr).add_((1.0 - contr) * mean).clamp_(0.0, 1.0)
    y = y.mul_(sat).add_((1.0 - sat) * grayscale(y)).clamp_(0.0, 1.0)
    y = _hue_shift(y, hue).clamp_(0.0, 1.0)
    y = torch.where(jitter > 0.5, y, x)
    return torch.where(gray > 0.5, grayscale(y).expand_as(y), y)
