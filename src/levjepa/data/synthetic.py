"""The built-in benchmark: appearance and motion, measured separately, with no download, on a laptop CPU.

Each clip shows one real image — an 8×8 handwritten digit (the UCI/scikit-learn digits, shipped with the
package: ``levjepa.data.digits``), or a Fashion-MNIST garment when asked for (``image_source``: ``digits``,
``fashion-mnist``, or ``auto`` = Fashion-MNIST when installed) — moving over a textured background. Three
labels per clip, drawn independently:

* ``appearance`` — the image's class (10 classes for both image sources); the IN1K-like readout.
* ``motion`` — the direction of the object's motion *as seen on screen*, one of 8 compass directions:
  ``k`` ↦ angle ``45°·k`` counter-clockwise from east (0 E, 1 NE, 2 N, 3 NW, 4 W, 5 SW, 6 S, 7 SE; screen
  "north" is up). The SSv2-like readout.
* ``arrow`` — 0 when the clip plays forward, 1 when its frames are in reverse order. Forward motion
  decelerates (speed ×``friction`` per frame: something slowing down by friction), so a reversed clip
  *accelerates*; reversal also turns the visible direction around. ``motion`` is the visible direction
  after reversal: a clip with ``arrow = 1`` was rendered moving the opposite way and then reversed.

Nothing but motion reveals motion or arrow. With ``boundary="wrap"`` the object wraps around the frame
edges (toroidal) and its start position is uniform, so its position in any single frame is uniform
whatever the labels; with ``boundary="inside"`` (the CPU demos) the whole trajectory stays inside the
frame, the start drawn uniformly among the positions that allow it — the object is never cut in two, at
the price of a weak position cue (a clip moving east tends to sit further west at its first frame); the
background is a random smooth colour texture (periodic, so it wraps too) that drifts, with probability
``background_motion_p``, at constant speed in its own uniformly random direction — a camera-motion
distractor that a motion probe must see past, and that is time-symmetric, so it carries no arrow cue.
Object colour, background colour, texture, initial speed (±``speed_jitter``) and positions are random
nuisances independent of the labels. Positions are rounded to whole pixels.

Splits are **by source image**: the image pool (Fashion-MNIST's 70 000 train+test images, or the 1797
digits) is shuffled with ``seed`` and cut 70 % / 15 % / 15 % into train / val / test images, so no image
appears in two splits (digits are reused within a split, with fresh motion and background). Everything
is a function of ``(seed, split)``; a clip's texture comes from its own seed, so rendering does not depend
on the chunking. ``load_split`` is vectorised (gathers of toroidally shifted maps) and cached per process.
Every result computed on this benchmark must state ``LabelledClips.image_source``.

Fashion-MNIST is read from Debian's ``dataset-fashion-mnist`` package (``apt-get install
dataset-fashion-mnist``; its files are ``/usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz``), or from
``SyntheticConfig.fashion_mnist_dir`` holding the same idx files.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from levjepa.config import ConfigError
from levjepa.data.badfiles import DataError
from levjepa.data.config import SyntheticConfig
from levjepa.rng import make_generator
from levjepa.threads import torch_threads

__all__ = [
    "DIRECTION_NAMES",
    "FASHION_MNIST_DIRS",
    "ClipParams",
    "draw_params",
    "ImagePool",
    "LabelledClips",
    "find_fashion_mnist",
    "load_image_pool",
    "load_split",
    "read_idx",
    "render",
    "sample_params",
    "split_images",
]

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
_FASHION_FILES = (
    ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
)
DIRECTION_NAMES = ("E", "NE", "N", "NW", "W", "SW", "S", "SE")
SPLITS = ("train", "val", "test")
_SPLIT_FRACTIONS = (0.70, 0.15)  # train, val; test takes the rest


@dataclass
class LabelledClips:
    clips: torch.Tensor  # uint8 [N, C, T, H, W]
    labels: dict[str, torch.Tensor]  # "appearance", "motion", "arrow": int64 [N]
    num_classes: dict[str, int]
    image_source: str  # "fashion-mnist" or "digits"
    source_image: torch.Tensor  # int64 [N], index of the clip's image in the image pool (splits are disjoint)

    def __len__(self) -> int:
        return self.clips.shape[0]


@dataclass
class ImagePool:
    images: torch.Tensor  # uint8 [M, h, w], bright object on a dark (0) background
    labels: torch.Tensor  # int64 [M]
    num_classes: int
    name: str  # "fashion-mnist" or "digits"


@dataclass
class ClipParams:
    """Everything that decides a clip (one row per clip); :func:`render` turns it into pixels."""

    image: torch.Tensor  # int64 [N] pool index
    motion: torch.Tensor  # int64 [N] visible direction 0..7
    arrow: torch.Tensor  # int64 [N] 1 = frames reversed
    speed: torch.Tensor  # float [N] initial forward speed, px/frame
    obj_start: torch.Tensor  # float [N, 2] (y, x) top-left of the object in forward frame 0
    obj_colour: torch.Tensor  # float [N, 3] in [0, 1]
    bg_colour: torch.Tensor  # float [N, 3]
    bg_velocity: torch.Tensor  # float [N, 2] (dy, dx) px/frame in forward time (zero when static)
    bg_start: torch.Tensor  # float [N, 2]
    texture_seed: torch.Tensor  # int64 [N]

    def __len__(self) -> int:
        return self.image.shape[0]

    def select(self, index: torch.Tensor | slice) -> ClipParams:
        return ClipParams(**{k: v[index] for k, v in vars(self).items()})


# ------------------------------------------------------------------------------------------ image pool


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST format; gzip or raw): uint8 data with its stored shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"unreadable: {path} is not an unsigned-byte IDX file (magic {data[:4]!r})")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    count = math.prod(dims)
    if len(data) - offset != count:
        raise DataError(f"truncated: {path} holds {len(data) - offset} bytes of data, its header says {count}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def _idx_file(directory: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        if (directory / name).is_file():
            return directory / name
    return None


def find_fashion_mnist(directory: str | None = None) -> Path | None:
    """The folder holding Fashion-MNIST's training idx files, or None. ``directory`` replaces the default
    search path (Debian's ``/usr/share/datasets/fashion-mnist``)."""
    for candidate in (directory,) if directory is not None else FASHION_MNIST_DIRS:
        folder = Path(candidate)
        if _idx_file(folder, _FASHION_FILES[0][0]) and _idx_file(folder, _FASHION_FILES[0][1]):
            return folder
    return None


def _load_fashion(folder: Path) -> ImagePool:
    images, labels = [], []
    for img_stem, lab_stem in _FASHION_FILES:
        img_path, lab_path = _idx_file(folder, img_stem), _idx_file(folder, lab_stem)
        if img_path is None or lab_path is None:
            continue
        x, y = read_idx(img_path), read_idx(lab_path)
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise DataError(f"unreadable: {img_path} / {lab_path}: shapes {x.shape} and {y.shape} do not match")
        images.append(torch.from_numpy(x.copy()))
        labels.append(torch.from_numpy(y.astype(np.int64)))
    return ImagePool(torch.cat(images), torch.cat(labels), 10, "fashion-mnist")


def _load_digits() -> ImagePool:
    from levjepa.data.digits import load_digits

    digits = load_digits()
    images = torch.from_numpy(np.round(digits.images * (255.0 / 16.0)).astype(np.uint8))
    return ImagePool(images, torch.from_numpy(digits.target.astype(np.int64)), 10, "digits")


@functools.lru_cache(maxsize=4)
def _pool_cached(source: str, directory: str | None) -> ImagePool:
    folder = find_fashion_mnist(directory) if source in ("auto", "fashion-mnist") else None
    if folder is not None:
        return _load_fashion(folder)
    if source == "fashion-mnist":
        where = directory if directory is not None else ", ".join(FASHION_MNIST_DIRS)
        raise DataError(
            f"missing: synthetic.image_source=fashion-mnist but no Fashion-MNIST idx files were found in {where}; "
            "install Debian's package (apt-get install dataset-fashion-mnist), point synthetic.fashion_mnist_dir "
            "at the files, or set synthetic.image_source=digits (or auto)"
        )
    return _load_digits()


def load_image_pool(cfg: SyntheticConfig) -> ImagePool:
    """The images the benchmark draws from: the shipped digits, or Fashion-MNIST (forced, or found by ``auto``)."""
    return _pool_cached(cfg.image_source, cfg.fashion_mnist_dir)


# --------------------------------------------------------------------------------------------- sampling


def _split_images(num_images: int, seed: int, split: str) -> torch.Tensor:
    if num_images < 3:
        raise DataError(f"unreadable: the image pool has {num_images} image(s); the benchmark needs >= 3")
    perm = torch.randperm(num_images, generator=make_generator("synthetic-images", seed))
    n_train = max(1, int(_SPLIT_FRACTIONS[0] * num_images))
    n_val = max(1, int(_SPLIT_FRACTIONS[1] * num_images))
    bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, num_images)}
    lo, hi = bounds[split]
    return perm[lo:hi]


def _unit(direction: torch.Tensor) -> torch.Tensor:
    """(dy, dx) screen unit vector of compass direction k (45°·k counter-clockwise from east, y down)."""
    angle = direction.to(torch.float64) * (math.pi / 4)
    return torch.stack((-torch.sin(angle), torch.cos(angle)), dim=-1)


def _within(bounds: tuple[float, float], u: torch.Tensor) -> torch.Tensor:
    """``u`` in [0, 1) mapped onto ``[low, high)``."""
    lo, hi = bounds
    return lo + (hi - lo) * u


def _hsv(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from levjepa.data.views import hsv_to_rgb

    return hsv_to_rgb(torch.stack((h, s, v), dim=1)).to(torch.float32)


def _split_order(
    cfg: SyntheticConfig, split: Literal["train", "val", "test"], pool: ImagePool
) -> tuple[torch.Tensor, torch.Generator]:
    """Pool indices of the ``num_{split}`` clips of ``split`` (int64 [n]: the split's images in shuffled rounds,
    each image once per round) and the split's generator, which then draws the clips' parameters."""
    n = {"train": cfg.num_train, "val": cfg.num_val, "test": cfg.num_test}[split]
    g = make_generator("synthetic-split", cfg.seed, split)
    images = _split_images(pool.images.shape[0], cfg.seed, split)
    reps = -(-n // images.numel())
    order = torch.cat([torch.randperm(images.numel(), generator=g) for _ in range(reps)])[:n]
    return images[order], g


def split_images(cfg: SyntheticConfig, split: Literal["train", "val", "test"], pool: ImagePool) -> torch.Tensor:
    """Pool indices of the clips of ``split``, int64 [num_{split}] (a function of ``cfg.seed`` and ``split``)."""
    return _split_order(cfg, split, pool)[0]


def _raw_draws(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The random numbers behind ``n`` clips, drawn from ``g`` in a fixed order (one row per clip)."""
    return {
        "motion": torch.randint(0, 8, (n,), generator=g),
        "arrow": torch.randint(0, 2, (n,), generator=g),
        "speed": torch.rand(n, generator=g, dtype=torch.float64),
        "start": torch.rand(n, 2, generator=g, dtype=torch.float64),
        "colour": torch.rand(n, 6, generator=g),
        "moves": torch.rand(n, generator=g),
        "theta": torch.rand(n, generator=g, dtype=torch.float64),
        "bg_start": torch.rand(n, 2, generator=g, dtype=torch.float64),
        "texture": torch.randint(0, 2**62, (n,), generator=g),
    }


def _params(cfg: SyntheticConfig, images: torch.Tensor, r: dict[str, torch.Tensor]) -> ClipParams:
    """Raw draws (:func:`_raw_draws`) -> the clips' parameters; row ``i`` depends on row ``i`` only."""
    size = float(cfg.size)
    motion, arrow = r["motion"], r["arrow"]
    speed = cfg.speed * size * (1.0 + cfg.speed_jitter * (2.0 * r["speed"] - 1))
    obj_start = r["start"] * size
    if cfg.boundary == "inside":
        obj_start = _inside_start(cfg, obj_start / size, motion, arrow, speed)
    u = r["colour"]
    obj_colour = _hsv(u[:, 0], _within(cfg.object_saturation, u[:, 1]), _within(cfg.object_value, u[:, 2]))
    bg_colour = _hsv(u[:, 3], _within(cfg.background_saturation, u[:, 4]), _within(cfg.background_value, u[:, 5]))
    bg_speed = cfg.background_speed * size * (r["moves"] < cfg.background_motion_p).to(torch.float64)
    theta = r["theta"] * (2 * math.pi)
    bg_velocity = torch.stack((torch.sin(theta), torch.cos(theta)), dim=-1) * bg_speed[:, None]
    return ClipParams(
        image=images,
        motion=motion,
        arrow=arrow,
        speed=speed,
        obj_start=obj_start,
        obj_colour=obj_colour,
        bg_colour=bg_colour,
        bg_velocity=bg_velocity,
        bg_start=r["bg_start"] * size,
        texture_seed=r["texture"],
    )


def draw_params(
    cfg: SyntheticConfig, images: torch.Tensor, generator: torch.Generator | list[torch.Generator]
) -> ClipParams:
    """Fresh random choices — labels, speed, start, colours, background — for clips of the pool images
    ``images`` (int64 [n]): all drawn from one ``generator`` in a fixed order, or clip ``i`` from
    ``generator[i]`` (then each clip is what ``draw_params`` gives for it alone with its generator)."""
    if isinstance(generator, torch.Generator):
        return _params(cfg, images, _raw_draws(images.numel(), generator))
    if len(generator) != images.numel():
        raise ValueError(f"draw_params: {len(generator)} generators for {images.numel()} images")
    rows = [_raw_draws(1, g) for g in generator]
    return _params(cfg, images, {k: torch.cat([r[k] for r in rows]) for k in rows[0]})


def sample_params(cfg: SyntheticConfig, split: Literal["train", "val", "test"], pool: ImagePool) -> ClipParams:
    """The random choices of every clip of ``split`` (a function of ``cfg`` and ``split`` only)."""
    images, g = _split_order(cfg, split, pool)
    return draw_params(cfg, images, g)


# -------------------------------------------------------------------------------------------- rendering


def _textures(cfg: SyntheticConfig, seeds: torch.Tensor) -> torch.Tensor:
    """Periodic smooth noise, zero mean and unit std per clip: float [n, 1, S, S] (one clip seed each)."""
    s = cfg.size
    noise = torch.stack([torch.randn(1, s, s, generator=make_generator("synthetic-texture", int(x))) for x in seeds])
    freq = torch.fft.fftfreq(s)
    radius2 = freq[:, None] ** 2 + freq[None, :] ** 2
    spectrum = torch.fft.fft2(noise) * torch.exp(-radius2 / (2 * cfg.texture_cutoff**2))
    tex = torch.fft.ifft2(spectrum).real
    tex = tex - tex.mean(dim=(-2, -1), keepdim=True)
    return tex / tex.std(dim=(-2, -1), keepdim=True).clamp_min(1e-6)


def _shifted(maps: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Toroidal shifts: ``out[i, t, c, y, x] = maps[i, c, (y - p) mod S, (x - q) mod S]`` with ``(p, q)`` the
    rounded ``pos[i, t]``; ``maps`` [n, C, S, S] → [n, T, C, S, S]. One copy: the windows of the 2×2-tiled
    map are strided views, and advanced indexing gathers the ones wanted."""
    n, _, s, _ = maps.shape
    tiled = maps.repeat(1, 1, 2, 2)
    windows = tiled.unfold(2, s, 1).unfold(3, s, 1)  # [n, C, S+1, S+1, S, S], a view
    start = (-torch.round(pos).to(torch.int64)) % s  # [n, T, 2]
    rows = torch.arange(n)[:, None]
    return windows[rows, :, start[..., 0], start[..., 1]]


def _travelled(cfg: SyntheticConfig) -> torch.Tensor:
    """Distance covered after each forward frame at unit initial speed: ``Σ_{i<t} friction^i``, [T]."""
    t = torch.arange(cfg.num_frames, dtype=torch.float64)
    f = cfg.friction
    return t if f == 1.0 else (1.0 - f**t) / (1.0 - f)


def _displacement(cfg: SyntheticConfig, motion: torch.Tensor, arrow: torch.Tensor, speed: torch.Tensor) -> torch.Tensor:
    """The object's forward-time displacement from its start, [n, T, 2] (a reversed clip was rendered moving
    the opposite way)."""
    direction = torch.where(arrow.bool(), (motion + 4) % 8, motion)  # forward direction
    return _unit(direction)[:, None, :] * (speed[:, None] * _travelled(cfg)[None, :])[..., None]


def _inside_start(
    cfg: SyntheticConfig, u: torch.Tensor, motion: torch.Tensor, arrow: torch.Tensor, speed: torch.Tensor
) -> torch.Tensor:
    """Start positions [n, 2] uniform among those whose whole trajectory keeps the object inside the frame."""
    side = max(2, round(cfg.object_scale * cfg.size))
    disp = _displacement(cfg, motion, arrow, speed)
    lo = -disp.min(dim=1).values
    hi = (cfg.size - side) - disp.max(dim=1).values
    if bool((hi < lo).any()):
        raise ConfigError(
            f"synthetic.boundary=inside: a {side}-px object moving up to {float((hi - lo).neg().max()):.1f} px too "
            "far does not fit the frame; lower synthetic.object_scale or synthetic.speed, or set "
            "synthetic.boundary=wrap"
        )
    return lo + u * (hi - lo)


def _trajectory(cfg: SyntheticConfig, params: ClipParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward-time object and background positions [n, T, 2] (float64, before wrapping)."""
    t = torch.arange(cfg.num_frames, dtype=torch.float64)
    obj = params.obj_start[:, None, :] + _displacement(cfg, params.motion, params.arrow, params.speed)
    bg = params.bg_start[:, None, :] + t[None, :, None] * params.bg_velocity[:, None, :]
    return obj, bg


def render(cfg: SyntheticConfig, params: ClipParams, pool: ImagePool) -> torch.Tensor:
    """Pixels of the clips described by ``params``: uint8 [N, 3, T, S, S] (see the module docstring).

    ``frame = background + (colour - background) · alpha`` where alpha is the (resized) image intensity; the
    background is ``bg_colour · (1 + contrast · texture)``; maps are shifted as uint8, blended in float.
    """
    s, t_len = cfg.size, cfg.num_frames
    side = max(2, round(cfg.object_scale * s))
    n_all = len(params)
    out = torch.empty(n_all, 3, t_len, s, s, dtype=torch.uint8)
    chunk = max(1, (1 << 20) // (t_len * s * s))
    for lo in range(0, n_all, chunk):
        p = params.select(slice(lo, lo + chunk))
        n = len(p)
        glyphs = pool.images[p.image].to(torch.float32)[:, None]  # [n, 1, h, w] in 0..255
        alpha = F.interpolate(glyphs, size=(side, side), mode="bilinear", align_corners=False, antialias=True)
        canvas = torch.zeros(n, 1, s, s, dtype=torch.uint8)
        canvas[:, :, :side, :side] = alpha.round().clamp(0, 255).to(torch.uint8)
        tex = 1.0 + cfg.texture_contrast * _textures(cfg, p.texture_seed)
        bg = (p.bg_colour[:, :, None, None] * tex * 255.0).round().clamp(0, 255).to(torch.uint8)
        obj_pos, bg_pos = _trajectory(cfg, p)
        a = _shifted(canvas, obj_pos).to(torch.float32).mul_(1.0 / 255.0)  # [n, T, 1, S, S]
        b = _shifted(bg, bg_pos).to(torch.float32)  # [n, T, 3, S, S]
        colour = (p.obj_colour * 255.0)[:, None, :, None, None]
        frames = torch.addcmul(b, colour - b, a).add_(0.5).to(torch.uint8)  # convex: stays in [0, 255]
        reverse = p.arrow.bool()
        frames[reverse] = frames[reverse].flip(1)
        out[lo : lo + n] = frames.permute(0, 2, 1, 3, 4)
    return out


def _one_thread() -> contextlib.AbstractContextManager[None]:
    """Rendering is memory-bound: two intra-op threads on a busy 2-core machine spin on each other and are
    much slower than one (measured: ``bench/data.md``, "Numbers the data/ module docs used to carry")."""
    return torch_threads(1)


@functools.lru_cache(maxsize=6)
def _load_split_cached(cfg: SyntheticConfig, split: str) -> LabelledClips:
    pool = load_image_pool(cfg)
    params = sample_params(cfg, split, pool)  # type: ignore[arg-type]
    with _one_thread():
        clips = render(cfg, params, pool)
    return LabelledClips(
        clips=clips,
        labels={"appearance": pool.labels[params.image], "motion": params.motion, "arrow": params.arrow},
        num_classes={"appearance": pool.num_classes, "motion": 8, "arrow": 2},
        image_source=pool.name,
        source_image=params.image,
    )


def load_split(cfg: SyntheticConfig, split: Literal["train", "val", "test"]) -> LabelledClips:
    """The clips and labels of one split (cached per process: treat the tensors as read-only)."""
    if split not in SPLITS:
        raise ValueError(f"load_split: split={split!r}, expected one of {', '.join(SPLITS)}")
    return _load_split_cached(cfg, split)
