"""The training transform of V-JEPA's frozen evaluation, for the probes' augmented views.

V-JEPA's and V-JEPA 2's frozen-evaluation data loaders (``evals/video_classification_frozen/eval.py``,
``make_dataloader``, for SSv2, K400 and the rest alike) build their ``VideoTransform`` with
``random_horizontal_flip=False, random_resize_scale=(0.08, 1.0), random_resize_aspect_ratio=(0.75, 4/3),
auto_augment=True, reprob=0.25, motion_shift=False``, and ``VideoDataset`` cuts the training clips at fixed
starts. This module is that transform, written here on uint8 frames ``[T, H, W, 3]`` (timm and torchvision, which
the reference uses, do not import beside levjepa's torch; kornia's RandAugment has its own op set and magnitude
mapping, none of which can be set to timm's ``inc1`` ops with magnitude noise). Per clip, in the reference's order:

1. **RandAugment** ``rand-m7-n4-mstd0.5-inc1`` (timm's ``rand_augment_transform`` as vjepa vendors it,
   ``src/datasets/utils/video/randaugment.py``), on the decoded frames before the crop: 4 ops drawn uniformly
   *with replacement* from the 15 "increasing" ops :data:`OPS`; each op is applied with probability 0.5; when
   it is, its magnitude is ``m ~ N(7, 0.5)`` clipped to ``[0, 10]``, and a signed op negates its argument with
   probability 0.5. Every frame of the clip gets the same ops with the same arguments (vjepa's video
   ``AugmentOp`` draws once per clip); data-dependent ops (autocontrast, equalize, contrast) read each frame's
   own histogram, as PIL does per image. The arguments (:func:`op_argument`, ``M = m / 10``): Rotate ``±30 M``
   degrees, ShearX/Y ``±0.3 M``, TranslateX/YRel ``±0.45 M`` of the width/height (geometric ops: bicubic, the
   uncovered area grey 128); Posterize keeps ``4 − ⌊4 M⌋`` bits; Solarize inverts pixels ``≥ 256 − ⌊256 M⌋``;
   SolarizeAdd adds ``⌊110 M⌋`` to pixels under 128; Color, Contrast, Brightness, Sharpness blend with their
   degenerate image (grey, mean grey, black, 3×3 smoothed) by the factor ``1 ± 0.9 M``; AutoContrast, Equalize,
   Invert have no argument.
2. **Random resized crop** of ``a ∈ U(0.08, 1)`` of the area at aspect ``r`` with ``log r ∈ U(log 3/4, log 4/3)``
   (10 tries, ``w = round(√(a·A·r))``, ``h = round(√(a·A / r))``, accepted when ``0 < w ≤ W`` and ``0 < h ≤ H``;
   else the whole frame, clamped to the aspect range, centred), the same box on every frame, resized to the
   evaluation square (bilinear). **No horizontal flip.**
3. **Random erasing** with probability 0.25: one box through time (vjepa's ``RandomErasing(cube=True)``) of
   ``U(0.02, 1/3)`` of the area at aspect log-uniform in ``[0.3, 1/0.3]`` (100 tries; ``h = round(√(s·r))``,
   ``w = round(√(s/r))``, accepted when ``h < H`` and ``w < W``), filled per pixel and per frame with a standard
   normal value *in the normalised space* — written here as the uint8 ``(mean + std · z) · 255`` of the
   ImageNet normalisation the encoder applies (rounded; ``|z|`` beyond about 2.1 is clipped to 0 / 255).

**Temporal starts** (:func:`train_starts`, V-JEPA 2's ``VideoDataset.loadvideo_decord`` with
``random_clip_sampling=True, allow_clip_overlap=True``): a clip spans ``L = frames · step`` source frames; the
video's ``N`` frames are cut into ``S`` partitions of ``P = ⌊N / S⌋``. When ``P > L``, segment ``i`` starts at
``i · P + u`` with ``u`` uniform in ``[0, P − L − 1]``; otherwise at the fixed ``i · ⌊(N − L) / (S − 1)⌋`` (0 when
``N ≤ L`` or ``S = 1``). Inside the clip levjepa keeps its exact stride (the reference spreads its frames by a
``linspace`` over the window, 64 / 15 source frames apart for 16 frames at step 4).

**Randomness.** Every piece draws from its own generator, ``make_generator(seed, "train-view", item, view,
piece, segment)`` (:class:`ViewKey`), so a view depends on (seed, item, view) only, never on workers, ranks,
restarts or how many draws another piece made. ``tests/test_clip_augment.py`` compares the draws with the
reference's definition (op frequencies, magnitude histograms, crop areas and aspects, erased areas) and checks
that every frame of a clip gets the same op and that no flip happens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa.data.views import IMAGENET_MEAN, IMAGENET_STD
from levjepa.rng import make_generator

__all__ = [
    "CROP_ASPECT",
    "DESCRIPTION",
    "CROP_SCALE",
    "ERASE_ASPECT",
    "ERASE_P",
    "ERASE_SCALE",
    "NAME",
    "OPS",
    "OpDraw",
    "RandAugment",
    "ViewKey",
    "apply_op",
    "crop_box",
    "draw_ops",
    "erase_box",
    "op_argument",
    "train_starts",
    "train_transform",
]

NAME = "vjepa-frozen-eval"  # the transform's name, in a store's settings and the tables' captions
DESCRIPTION = (  # what the tables' captions say of it
    "V-JEPA's frozen-evaluation training transform: RandAugment rand-m7-n4-mstd0.5-inc1, random resized crop "
    "8-100 % at 3/4-4/3, random erasing p 0.25, no flip, V-JEPA 2's temporal starts"
)
CROP_SCALE = (0.08, 1.0)  # random resized crop: share of the area
CROP_ASPECT = (3 / 4, 4 / 3)  # and its aspect ratio (width / height), log-uniform
ERASE_P = 0.25  # random erasing: probability of one box
ERASE_SCALE = (0.02, 1 / 3)  # its share of the area
ERASE_ASPECT = (0.3, 1 / 0.3)  # its aspect ratio (height / width), log-uniform
FILL = 128  # the grey of the area a geometric op uncovers (timm's _FILL)

# timm's _RAND_INCREASING_TRANSFORMS, in its order (the 'inc1' op set)
OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
SIGNED = {"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"} | {o for o in OPS if "Increasing" in o}
SIGNED -= {"PosterizeIncreasing", "SolarizeIncreasing"}
NO_ARGUMENT = {"AutoContrast", "Equalize", "Invert"}


@dataclass(frozen=True)
class RandAugment:
    """timm's RandAugment settings (``rand-m7-n4-mstd0.5-inc1``: magnitude 7, 4 ops, magnitude noise 0.5, the
    increasing op set); each op applied with probability ``prob``, magnitudes clipped to ``[0, max_level]``."""

    num_ops: int = 4
    magnitude: float = 7.0
    magnitude_std: float = 0.5
    prob: float = 0.5
    max_level: float = 10.0

    @property
    def text(self) -> str:
        return f"rand-m{self.magnitude:g}-n{self.num_ops}-mstd{self.magnitude_std:g}-inc1"


@dataclass(frozen=True)
class OpDraw:
    """One op of a clip's RandAugment: its name, magnitude (clipped) and sign (+1 or −1; 1 for unsigned ops)."""

    name: str
    magnitude: float
    sign: int = 1


@dataclass(frozen=True)
class ViewKey:
    """Training view ``view`` of item ``item`` (its position in the split's list) under ``seed``: the generators
    of its pieces, so every draw of ``eval_clip.load_train_views`` for that view is the same whoever computes it."""

    seed: int
    item: int
    view: int

    def generator(self, piece: str, segment: int = 0) -> torch.Generator:
        return make_generator(self.seed, "train-view", self.item, self.view, piece, segment)


def draw_ops(policy: RandAugment, generator: torch.Generator) -> list[OpDraw]:
    """The ops a clip gets, in the reference's order of draws: ``num_ops`` op indices (uniform, with
    replacement), then per op: applied (probability ``prob``)? then its magnitude ``N(m, std)`` clipped, then its
    sign (signed ops). Ops that are not applied are left out."""
    idx = torch.randint(0, len(OPS), (policy.num_ops,), generator=generator).tolist()
    out = []
    for i in idx:
        if float(torch.rand((), generator=generator)) >= policy.prob:
            continue
        m = policy.magnitude + policy.magnitude_std * float(torch.randn((), generator=generator, dtype=torch.float64))
        m = min(policy.max_level, max(0.0, m))
        sign = 1
        if OPS[i] in SIGNED:
            sign = -1 if float(torch.rand((), generator=generator)) < 0.5 else 1
        out.append(OpDraw(OPS[i], m, sign))
    return out


def op_argument(draw: OpDraw, max_level: float = 10.0) -> float:
    """The argument of op ``draw`` (timm's level-to-argument rules, module doc); 0 for ops without one."""
    m, s = draw.magnitude / max_level, draw.sign
    name = draw.name
    if name in NO_ARGUMENT:
        return 0.0
    if name == "Rotate":
        return s * 30.0 * m
    if name in ("ShearX", "ShearY"):
        return s * 0.3 * m
    if name in ("TranslateXRel", "TranslateYRel"):
        return s * 0.45 * m
    if name == "PosterizeIncreasing":
        return float(4 - int(m * 4))
    if name == "SolarizeIncreasing":
        return float(256 - int(m * 256))
    if name == "SolarizeAdd":
        return float(int(m * 110))
    return 1.0 + s * 0.9 * m  # the four enhancement factors


def _gray(x: Tensor) -> Tensor:
    """PIL's ``convert("L")`` of uint8-valued float frames ``[T, 3, H, W]``: ``[T, 1, H, W]`` (ITU-R 601-2)."""
    r, g, b = x[:, 0:1].long(), x[:, 1:2].long(), x[:, 2:3].long()
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).float()


def _blend(degenerate: Tensor, x: Tensor, factor: float) -> Tensor:
    """PIL's ``Image.blend(degenerate, x, factor)``: ``degenerate + factor · (x − degenerate)``, truncated, 0..255."""
    return (degenerate + factor * (x - degenerate)).clamp(0, 255).floor()


def _affine(x: Tensor, matrix: tuple[float, float, float, float, float, float]) -> Tensor:
    """PIL's ``Image.transform(AFFINE, (a, b, c, d, e, f))`` of float frames ``[T, C, H, W]``: the output pixel at
    ``(x, y)`` (pixel centres ``+ 0.5``) reads the input at ``(a x + b y + c, d x + e y + f)``; bicubic, the area
    outside the frame :data:`FILL`."""
    t, _, h, w = x.shape
    a, b, c, d, e, f = matrix
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64) + 0.5, torch.arange(w, dtype=torch.float64) + 0.5,
                            indexing="ij")  # fmt: skip
    sx, sy = a * xs + b * ys + c, d * xs + e * ys + f
    grid = torch.stack((2 * sx / w - 1, 2 * sy / h - 1), dim=-1).float()[None].expand(t, -1, -1, -1)
    out = F.grid_sample(x - FILL, grid, mode="bicubic", padding_mode="zeros", align_corners=False) + FILL
    return out.clamp(0, 255).round()


def _geometric(x: Tensor, name: str, arg: float) -> Tensor:
    h, w = x.shape[-2:]
    if name == "Rotate":  # PIL's rotate(deg): counter-clockwise about the centre
        th = -math.radians(arg)
        cos, sin = math.cos(th), math.sin(th)
        cx, cy = w / 2.0, h / 2.0
        return _affine(x, (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy))
    if name == "ShearX":
        return _affine(x, (1, arg, 0, 0, 1, 0))
    if name == "ShearY":
        return _affine(x, (1, 0, 0, arg, 1, 0))
    if name == "TranslateXRel":
        return _affine(x, (1, 0, arg * w, 0, 1, 0))
    return _affine(x, (1, 0, 0, 0, 1, arg * h))  # TranslateYRel


def _autocontrast(x: Tensor) -> Tensor:
    """PIL's ``autocontrast`` per frame and channel: ``lo..hi`` stretched to ``0..255`` (truncated)."""
    lo = x.amin(dim=(-2, -1), keepdim=True).double()
    hi = x.amax(dim=(-2, -1), keepdim=True).double()
    scale = 255.0 / (hi - lo).clamp_min(1)
    out = (x.double() * scale - lo * scale).floor().clamp(0, 255)
    return torch.where(hi > lo, out, x.double()).float()


def _equalize(x: Tensor) -> Tensor:
    """PIL's ``equalize`` per frame and channel: the look-up ``(step // 2 + cumulative count) // step`` with
    ``step = (pixels − count of the last used level) // 255`` (identity when a channel has one level or no step)."""
    t, c, h, w = x.shape
    v = x.long().reshape(t * c, h * w)
    hist = torch.zeros(t * c, 256, dtype=torch.long).scatter_add_(1, v, torch.ones_like(v))
    last = torch.where(hist > 0, torch.arange(256), -1).amax(1)  # the highest used level
    step = (h * w - hist.gather(1, last[:, None])[:, 0]) // 255
    before = hist.cumsum(1) - hist  # pixels strictly below each level
    lut = ((step[:, None] // 2 + before) // step.clamp_min(1)[:, None]).clamp(max=255)
    keep = ((hist > 0).sum(1) <= 1) | (step == 0)
    out = torch.where(keep[:, None], v, lut.gather(1, v))
    return out.reshape(t, c, h, w).float()


def _sharpness_degenerate(x: Tensor) -> Tensor:
    """PIL's ``ImageFilter.SMOOTH`` (3×3 kernel, centre 5, the rest 1, over 13), border pixels kept."""
    k = torch.ones(3, 3)
    k[1, 1] = 5
    k = (k / 13).expand(x.shape[1], 1, 3, 3)
    out = x.clone()
    if x.shape[-1] > 2 and x.shape[-2] > 2:
        out[..., 1:-1, 1:-1] = F.conv2d(x, k, groups=x.shape[1]).round().clamp(0, 255)
    return out


def apply_op(frames: Tensor, draw: OpDraw, max_level: float = 10.0) -> Tensor:
    """uint8 frames ``[T, H, W, 3]`` after op ``draw`` — the same op with the same argument on every frame."""
    x = frames.permute(0, 3, 1, 2).float()
    name, arg = draw.name, op_argument(draw, max_level)
    if name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
        x = _geometric(x, name, arg)
    elif name == "AutoContrast":
        x = _autocontrast(x)
    elif name == "Equalize":
        x = _equalize(x)
    elif name == "Invert":
        x = 255 - x
    elif name == "PosterizeIncreasing":
        bits = int(arg)
        if bits < 8:
            x = (x.long() & (~(2 ** (8 - bits) - 1) & 0xFF)).float()
    elif name == "SolarizeIncreasing":
        x = torch.where(x < arg, x, 255 - x)
    elif name == "SolarizeAdd":
        x = torch.where(x < 128, (x + arg).clamp(max=255), x)
    elif name == "ColorIncreasing":
        x = _blend(_gray(x).expand_as(x), x, arg)
    elif name == "ContrastIncreasing":
        mean = (_gray(x).mean(dim=(-3, -2, -1), keepdim=True) + 0.5).floor()
        x = _blend(mean.expand_as(x), x, arg)
    elif name == "BrightnessIncreasing":
        x = _blend(torch.zeros_like(x), x, arg)
    elif name == "SharpnessIncreasing":
        x = _blend(_sharpness_degenerate(x), x, arg)
    else:
        raise ValueError(f"apply_op: unknown op {name!r}; valid ops are {', '.join(OPS)}")
    return x.to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def crop_box(height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of the random resized crop (module doc, step 2)."""
    area = height * width
    lo, hi = math.log(CROP_ASPECT[0]), math.log(CROP_ASPECT[1])
    for _ in range(10):
        u = torch.rand(2, generator=generator, dtype=torch.float64)
        target = area * (CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * float(u[0]))
        ratio = math.exp(lo + (hi - lo) * float(u[1]))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=generator))
            left = int(torch.randint(0, width - w + 1, (), generator=generator))
            return top, left, h, w
    ratio_in = width / height
    h, w = height, width
    if ratio_in < CROP_ASPECT[0]:
        h = round(w / CROP_ASPECT[0])
    elif ratio_in > CROP_ASPECT[1]:
        w = round(h * CROP_ASPECT[1])
    return (height - h) // 2, (width - w) // 2, h, w


def erase_box(height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int] | None:
    """``(top, left, h, w)`` of the erased box, or None (not erased, or no try fitted): module doc, step 3."""
    if float(torch.rand((), generator=generator)) >= ERASE_P:
        return None
    lo, hi = math.log(ERASE_ASPECT[0]), math.log(ERASE_ASPECT[1])
    for _ in range(100):
        u = torch.rand(2, generator=generator, dtype=torch.float64)
        target = height * width * (ERASE_SCALE[0] + (ERASE_SCALE[1] - ERASE_SCALE[0]) * float(u[0]))
        ratio = math.exp(lo + (hi - lo) * float(u[1]))
        h, w = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if w < width and h < height:
            top = int(torch.randint(0, height - h + 1, (), generator=generator))
            left = int(torch.randint(0, width - w + 1, (), generator=generator))
            return top, left, h, w
    return None


def _erase(x: Tensor, box: tuple[int, int, int, int], generator: torch.Generator) -> Tensor:
    """Float frames ``[T, 3, S, S]`` (0..255) with ``box`` filled per pixel and frame by ``N(0, 1)`` in the
    normalised space (module doc)."""
    top, left, h, w = box
    z = torch.randn(x.shape[0], 3, h, w, generator=generator)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    x = x.clone()
    x[:, :, top : top + h, left : left + w] = (mean + std * z) * 255
    return x


def train_transform(frames: Tensor, side: int, key: ViewKey, segment: int = 0) -> Tensor:
    """uint8 frames ``[T, H, W, 3]`` -> one augmented training clip ``[T, side, side, 3]`` (module doc): RandAugment,
    the random resized crop to ``side`` (bilinear), random erasing; no flip. Draws from ``key``'s generators of
    ``segment``."""
    if frames.dim() != 4 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
        raise ValueError(
            f"train_transform: expected uint8 frames [T, H, W, 3], got {frames.dtype} {list(frames.shape)}"
        )
    policy = RandAugment()
    for draw in draw_ops(policy, key.generator("randaugment", segment)):
        frames = apply_op(frames, draw, policy.max_level)
    h, w = frames.shape[1:3]
    top, left, bh, bw = crop_box(h, w, key.generator("crop", segment))
    x = frames[:, top : top + bh, left : left + bw].permute(0, 3, 1, 2).float()
    if (bh, bw) != (side, side):
        x = F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)
    gen = key.generator("erase", segment)
    box = erase_box(side, side, gen)
    if box is not None:
        x = _erase(x, box, gen)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def train_starts(
    num_source_frames: int, frames: int, step: float, segments: int, generator: torch.Generator
) -> list[int]:
    """First source frame of each training segment: V-JEPA 2's rule (module doc, "Temporal starts")."""
    clip = max(1, round(frames * step))
    part = num_source_frames // segments
    if part > clip:
        u = torch.randint(0, part - clip, (segments,), generator=generator).tolist()
        return [i * part + int(u[i]) for i in range(segments)]
    every = (num_source_frames - clip) // (segments - 1) if num_source_frames > clip and segments > 1 else 0
    return [i * every for i in range(segments)]
