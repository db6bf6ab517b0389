"""Configs of the data pipeline: where clips come from, how they are decoded, how views are cut.

``DataConfig`` is the ``data`` section of a run config; ``SyntheticConfig`` (its ``synthetic`` sub-section)
describes the built-in appearance/motion benchmark (:mod:`levjepa.data.synthetic`).

Defaults and where they come from:

* 16 frames at frame stride 2 (the official LeVJEPA code takes every 2nd frame of 15 fps video, ≈ 2.1 s);
  ``target_fps`` overrides the stride with a rate in frames per second (V-JEPA 2 pretrains at 4 fps).
* Videos are resized at decode time so that their short side is at most ``short_side`` = 256 px: cropping
  and resizing then never touch 720p frames.
* One global view of 224 px, crop scale 0.8–1.0, crop only (no flip, no photometric change); ``num_local``
  = 4 local views of 96 px, crop scale 0.02–0.4, horizontal flip p = 0.5, colour jitter p = 0.8
  (brightness 0.4, contrast 0.4, saturation 0.2, hue 0.1), grayscale p = 0.2, no blur: the official code's
  augmentation. ``num_global`` = 2 with 6–8 local views is the LeJEPA image recipe.
* Crop aspect ratios 3/4–4/3 (the usual RandomResizedCrop range; the papers do not state one) [choice].
* Short videos are padded by repeating their last frame (``short_videos="pad"``) or skipped ("skip").
* Files whose short side is under ``min_side`` px or whose long side is over ``max_side`` px are
  rejected as absurd before any frame is decoded [choice: 16 and 8192].

Throughput knobs (measured in ``bench/data.md``; none changes what one sample is, only how it is made):

* ``repeats`` = k clips per decode ("repeated sampling", default 1): the k consecutive positions of a
  group read the same video and share one decode; each gets its own crops, flips and colours, and its own
  window when ``repeat_shift`` > 0 (starts within ``repeat_shift`` source frames of the group's; 0 = the
  same 16 frames). Effect on diversity: a batch of B holds B/k videos instead of B (SIGReg's batch
  statistics see k near-duplicate global views per video when ``repeat_shift`` = 0), while an epoch still
  visits every video once (``samples_per_epoch`` defaults to k × items). ``batch_size`` must be a
  multiple of k so that a group never straddles two batches (or two ranks).
* ``resize_on``: where views are cut — "worker" (CPU, uint8, the loader worker), "device" (the worker
  ships decoded frames and crop boxes; the training device resizes, ``resize.py``), "auto" (default:
  "device" when CUDA is available). The two agree within one uint8 level.
* ``skip_nonref`` (default on): decode prepare's fixed-GOP files with ``skip_frame=NONREF`` when every
  wanted frame is even (``video.py``); bit-identical frames.
* ``decode_device``: "cpu" (default) or "cuda" (NVDEC through FFmpeg; falls back to the CPU with a
  warning where it is not available).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from levjepa.config import MAX_SEED, check, check_range

__all__ = ["DataConfig", "SyntheticConfig"]


def _check_unit_range(name: str, value: tuple[float, float]) -> None:
    check(
        len(value) == 2 and 0.0 < value[0] <= value[1] <= 1.0,
        f"{name}={value}: expected (low, high) with 0 < low <= high <= 1",
    )


def _check_colour_range(name: str, value: tuple[float, float]) -> None:
    check(
        len(value) == 2 and 0.0 <= value[0] <= value[1] <= 1.0,
        f"{name}={value}: expected (low, high) with 0 <= low <= high <= 1",
    )


def _check_prob(name: str, value: float) -> None:
    check(0.0 <= value <= 1.0, f"{name}={value}: expected a probability in [0, 1]")


@dataclass(frozen=True)
class SyntheticConfig:
    """The built-in benchmark: a real image moving over a textured background (see ``synthetic.py``).

    The defaults make 1600 / 400 / 400 clips of 16 × 64 × 64 (about 470 MB of uint8 for the three splits,
    generated in a few seconds on 2 cores), enough for linear/attentive probes of 10 appearance classes,
    8 directions and 2 arrows of time while the CPU demo stays within minutes.
    """

    image_source: Literal["auto", "fashion-mnist", "digits"] = "auto"
    size: int = 64  # clip height = width in pixels
    num_frames: int = 16
    num_train: int = 1600
    num_val: int = 400
    num_test: int = 400
    seed: int = 0
    object_scale: float = 0.45  # object side as a fraction of the clip side
    speed: float = 0.045  # initial object speed in forward time, fraction of the clip side per frame
    speed_jitter: float = 0.2  # initial speed drawn uniformly in speed * [1 - j, 1 + j]
    friction: float = 0.9  # forward-time speed multiplier per frame (< 1: decelerates; the arrow-of-time cue)
    background_motion_p: float = 0.5  # probability that the background texture drifts (own random direction)
    background_speed: float = 0.03  # drift speed, fraction of the clip side per frame
    texture_cutoff: float = 0.06  # low-pass cutoff of the background noise, cycles per pixel
    texture_contrast: float = 0.5  # relative std of the background brightness texture
    background_value: tuple[float, float] = (0.25, 0.6)  # HSV value range of the background colour
    background_saturation: tuple[float, float] = (0.15, 0.5)  # HSV saturation range of the background colour
    object_saturation: tuple[float, float] = (0.6, 1.0)  # HSV saturation range of the object colour (hue: uniform)
    object_value: tuple[float, float] = (0.75, 1.0)  # HSV value range of the object colour
    boundary: Literal["wrap", "inside"] = "wrap"  # object wraps around the edges, or stays wholly inside
    # what pretraining reads from the benchmark: "split" = the train split's num_train fixed clips; "fresh" =
    # the same train images (the same sequence per epoch), each draw rendered with new random labels, motion,
    # position and colours (an unlimited stream, as a video corpus is; the probes' splits do not change)
    pretrain_clips: Literal["split", "fresh"] = "split"
    fashion_mnist_dir: str | None = None  # where to look for Fashion-MNIST's idx files; None: Debian's path

    def __post_init__(self) -> None:
        check(16 <= self.size <= 1024, f"synthetic.size={self.size}: expected 16..1024 pixels")
        check(
            2 <= self.num_frames <= 1024,
            f"synthetic.num_frames={self.num_frames}: expected 2..1024 (motion needs 2 frames)",
        )
        for name in ("num_train", "num_val", "num_test"):  # every clip is rendered in memory: 1e6 is ~200 GB
            value = getattr(self, name)
            check(1 <= value <= 1_000_000, f"synthetic.{name}={value}: expected 1..1000000 clips")
        check_range("synthetic.seed", self.seed, 0, MAX_SEED)
        check(0.1 <= self.object_scale <= 0.8, f"synthetic.object_scale={self.object_scale}: expected in [0.1, 0.8]")
        check(0.0 < self.speed <= 0.25, f"synthetic.speed={self.speed}: expected in (0, 0.25]")
        check(0.0 <= self.speed_jitter < 1.0, f"synthetic.speed_jitter={self.speed_jitter}: expected in [0, 1)")
        check(0.0 < self.friction <= 1.0, f"synthetic.friction={self.friction}: expected in (0, 1]")
        _check_prob("synthetic.background_motion_p", self.background_motion_p)
        check(
            0.0 <= self.background_speed <= 0.25,
            f"synthetic.background_speed={self.background_speed}: expected in [0, 0.25]",
        )
        check(0.0 < self.texture_cutoff <= 0.5, f"synthetic.texture_cutoff={self.texture_cutoff}: expected in (0, 0.5]")
        check(
            0.0 <= self.texture_contrast <= 2.0,
            f"synthetic.texture_contrast={self.texture_contrast}: expected in [0, 2]",
        )
        _check_unit_range("synthetic.background_value", self.background_value)
        for name in ("background_saturation", "object_saturation", "object_value"):
            _check_colour_range(f"synthetic.{name}", getattr(self, name))
        check(
            self.boundary in ("wrap", "inside"),
            f"synthetic.boundary={self.boundary!r}: valid choices are wrap, inside",
        )
        check(
            self.pretrain_clips in ("split", "fresh"),
            f"synthetic.pretrain_clips={self.pretrain_clips!r}: valid choices are split, fresh",
        )


@dataclass(frozen=True)
class DataConfig:
    """Sources, decoding, views and loading of pretraining clips (per-rank batch size)."""

    # "synthetic", a folder (recursive), a V-JEPA index file (`path label` rows), an image folder, or a file
    sources: tuple[str, ...] = ("synthetic",)
    weights: tuple[float, ...] = ()  # mixture weights, one per source; empty = equal
    samples_per_epoch: int | None = None  # None: the total number of items over all sources
    num_frames: int = 16
    frame_stride: int = 2
    target_fps: float | None = None  # when set, frames are taken at this rate instead of every frame_stride-th
    short_side: int = 256  # resize videos/images down at decode time so min(H, W) <= short_side; 0 = never
    short_videos: Literal["pad", "skip"] = "pad"
    min_side: int = 16  # a file whose short side is smaller is rejected (absurd resolution)
    max_side: int = 8192  # a file whose long side is larger is rejected (absurd resolution)
    num_global: int = 1
    num_local: int = 4
    global_size: int = 224
    local_size: int = 96
    global_scale: tuple[float, float] = (0.8, 1.0)
    local_scale: tuple[float, float] = (0.02, 0.4)
    crop_ratio: tuple[float, float] = (0.75, 4.0 / 3.0)  # aspect-ratio range (w/h) of every crop
    flip_p: float = 0.5  # horizontal flip, local views only
    reverse_p: float = 0.0  # play a training clip backwards (all its views), e.g. to pretrain on both arrows of time
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    grayscale_p: float = 0.2
    batch_size: int = 64  # per rank
    num_workers: int = 8
    pin_memory: bool = True  # only takes effect when CUDA is available
    persistent_workers: bool = True
    prefetch_factor: int = 2  # batches prepared ahead per worker
    decode_threads: int = 1  # FFmpeg threads per decode (workers already run in parallel)
    repeats: int = 1  # k clips per decode (repeated sampling, see the module docstring); batch_size % k == 0
    repeat_shift: int = 0  # the k windows of a decode start within this many source frames (0: one window)
    resize_on: Literal["auto", "worker", "device"] = "auto"  # where views are cut (auto: device on CUDA)
    skip_nonref: bool = True  # fixed-GOP files: skip the non-reference odd frames when no clip uses them
    decode_device: Literal["cpu", "cuda"] = "cpu"  # "cuda": NVDEC via FFmpeg, CPU fallback with a warning
    # how worker processes start: "forkserver" (default) forks them from a clean single-threaded server, so a
    # lock held by one of the trainer's threads at fork time cannot deadlock a worker; "fork" starts faster
    worker_start: Literal["forkserver", "fork", "spawn"] = "forkserver"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def __post_init__(self) -> None:
        check(len(self.sources) >= 1, "data.sources=(): expected at least one source")
        check(
            len(self.weights) in (0, len(self.sources)),
            f"data.weights={self.weights}: expected none or one per source ({len(self.sources)} sources)",
        )
        check(all(w > 0 for w in self.weights), f"data.weights={self.weights}: every weight must be > 0")
        check(
            self.samples_per_epoch is None or self.samples_per_epoch >= 1,
            f"data.samples_per_epoch={self.samples_per_epoch}: expected None or >= 1",
        )
        check(1 <= self.num_frames <= 1024, f"data.num_frames={self.num_frames}: expected 1..1024")
        check(1 <= self.frame_stride <= 10_000, f"data.frame_stride={self.frame_stride}: expected 1..10000")
        check(
            self.target_fps is None or self.target_fps > 0,
            f"data.target_fps={self.target_fps}: expected None or > 0",
        )
        check(self.short_side >= 0, f"data.short_side={self.short_side}: expected >= 0 (0 = never resize)")
        check(self.short_side <= 16384, f"data.short_side={self.short_side}: expected 0..16384 (0 = never resize)")
        check(self.min_side >= 1, f"data.min_side={self.min_side}: expected >= 1")
        check(self.max_side >= self.min_side, f"data.max_side={self.max_side}: expected >= min_side={self.min_side}")
        check(self.num_global >= 1, f"data.num_global={self.num_global}: expected >= 1")
        # upper bounds: a typo (an extra zero or three) fails here, not as an out-of-memory error minutes later
        check(0 <= self.num_local <= 64, f"data.num_local={self.num_local}: expected 0..64")
        check(8 <= self.global_size <= 4096, f"data.global_size={self.global_size}: expected 8..4096 pixels")
        check(8 <= self.local_size <= 4096, f"data.local_size={self.local_size}: expected 8..4096 pixels")
        _check_unit_range("data.global_scale", self.global_scale)
        _check_unit_range("data.local_scale", self.local_scale)
        check(
            len(self.crop_ratio) == 2 and 0 < self.crop_ratio[0] <= self.crop_ratio[1],
            f"data.crop_ratio={self.crop_ratio}: expected (low, high) with 0 < low <= high",
        )
        for name in ("flip_p", "reverse_p", "jitter_p", "grayscale_p"):
            _check_prob(f"data.{name}", getattr(self, name))
        for name in ("brightness", "contrast", "saturation"):
            value = getattr(self, name)
            check(0.0 <= value < 1.0, f"data.{name}={value}: expected in [0, 1) (factor drawn in [1-x, 1+x])")
        check(0.0 <= self.hue <= 0.5, f"data.hue={self.hue}: expected in [0, 0.5] (fraction of the hue circle)")
        check(1 <= self.batch_size <= 65536, f"data.batch_size={self.batch_size}: expected 1..65536 clips per rank")
        check(0 <= self.num_workers <= 1024, f"data.num_workers={self.num_workers}: expected 0..1024")
        check(1 <= self.prefetch_factor <= 1024, f"data.prefetch_factor={self.prefetch_factor}: expected 1..1024")
        check(
            0 <= self.decode_threads <= 1024,
            f"data.decode_threads={self.decode_threads}: expected 0..1024 (0 = FFmpeg's choice)",
        )
        check(1 <= self.repeats <= 65536, f"data.repeats={self.repeats}: expected 1..65536 (clips per decode)")
        check(
            self.batch_size % self.repeats == 0,
            f"data.repeats={self.repeats} does not divide data.batch_size={self.batch_size}: the clips of one "
            "decode must fall in one batch; pick a divisor of the batch size",
        )
        check(self.repeat_shift >= 0, f"data.repeat_shift={self.repeat_shift}: expected >= 0 (source frames)")
        check(
            self.resize_on in ("auto", "worker", "device"),
            f"data.resize_on={self.resize_on!r}: expected 'auto', 'worker' or 'device'",
        )
        check(self.decode_device in ("cpu", "cuda"), f"data.decode_device={self.decode_device!r}: expected cpu/cuda")
