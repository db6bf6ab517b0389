"""Clips for evaluation: the transform every frozen readout applies (probes, extraction, streaming, maps).

Training cuts random views (``views.py``); evaluation sees one deterministic view of the whole scene, the
usual frozen-evaluation transform (SPEC §5): frames are resized so that their short side is ``size``
(bilinear, antialiased), then the centred square whose side is the largest multiple of the patch size is
kept (:func:`center_square`), so every clip of a run has the same token grid. Nothing is dropped later.
Images are clips too: the frame is repeated along time (the paper repeats ImageNet images 8 or 16 times;
:func:`as_clip` for image batches, :func:`load_eval_clip` for files) — or, with ``ViewSpec.image_frames``, read
as that many frames (the commands' ``--image-frames one``: one temporal slot, i.e. one frame for a tubelet-1
model and the frame twice for a tubelet-2 one, whose patch embedding needs two).

* :func:`load_eval_clip` — one clip of ``num_frames`` frames from a video (every ``frame_stride``-th frame
  from ``start``, by default the centred window) or an image, as uint8 ``[T, S, S, 3]``;
* :meth:`ViewSpec.load` — the test-time views of the standard protocols: ``segments`` clips spread
  evenly over the video times ``crops`` spatial crops (1: centre; 3: both ends and the centre of the long
  side, V-JEPA 2's ``num_views_per_segment = 3``), as uint8 ``[segments · crops, C, T, S, S]``;
* :func:`load_train_views` — the *training* views of frozen evaluation: V-JEPA's frozen-evaluation train
  transform (``levjepa.data.clip_augment``: V-JEPA 2's temporal starts per segment, then RandAugment
  ``rand-m7-n4-mstd0.5-inc1`` on every frame alike, a random resized crop of 8–100 % of the area at aspect
  3/4–4/3 resized to the evaluation square, random erasing of one box through time with p = 0.25; no flip), every
  draw from the generators of one :class:`~levjepa.data.clip_augment.ViewKey` ``(seed, item, view)``, so a view
  never depends on workers, ranks or a restart. The probe stores' K augmented views
  (``levjepa.features.store``) and the online probes (``levjepa.eval.online``) both call it; test views stay
  the centre crops above;
* :func:`load_eval_video` — every kept frame of a whole video (``frame_stride`` or ``target_fps``) with
  their timestamps, for extraction and streaming, which cut their own windows.

:class:`ViewSpec` is the one typed statement of "how a labelled file becomes the views a frozen readout
sees" (frames, stride, size, segments, crops): a benchmark protocol holds one (``levjepa.eval.protocols``),
a feature store is computed with one (``levjepa.features.store``), a classifier records the one its
scores were measured with (``levjepa.formats.reading.classifier``) and fine-tuning evaluates with one.

Videos are scaled down to about ``size`` inside FFmpeg (``short_side``) before the exact resize, so a 4K
file never reaches the crop at full size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from levjepa.config import check
from levjepa.data.clip_augment import ViewKey, train_starts, train_transform
from levjepa.data.sources import media_kind
from levjepa.data.video import VideoFrames, decode_all, decode_clip, frame_step, load_image, probe_video

__all__ = [
    "ViewSpec",
    "as_clip",
    "random_resized_crop",
    "center_square",
    "resize_square",
    "load_eval_clip",
    "load_eval_video",
    "load_train_views",
    "segment_starts",
]


def center_square(frames: Tensor, size: int, patch: int) -> Tensor:
    """uint8 frames [T, H, W, 3] -> short side ``size`` (bilinear, antialiased), then the centred square
    whose side is the largest multiple of ``patch`` (the usual evaluation transform: resize + centre crop)."""
    if frames.dim() != 4 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
        raise ValueError(f"center_square: expected uint8 frames [T, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    x = resize_square(frames.permute(0, 3, 1, 2).float(), size, patch)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def resize_square(x: Tensor, size: int, patch: int) -> Tensor:
    """float frames ``[T, C, H, W]`` -> ``[T, C, S, S]``: :func:`center_square`'s geometry (short side ``size``,
    bilinear, antialiased; the centred square whose side ``S`` is the largest multiple of ``patch``) without its
    rounding to uint8, for frames that are already floats."""
    return _square(_short_side(x, size, patch), patch, 1)


def _short_side(x: Tensor, size: int, patch: int) -> Tensor:
    """float frames ``[..., H, W]`` resized (bilinear, antialiased) to short side ``size`` (at least ``patch``)."""
    h, w = x.shape[-2:]
    scale = size / min(h, w)
    nh, nw = max(patch, round(h * scale)), max(patch, round(w * scale))
    if (nh, nw) != (h, w):
        x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
    return x


def _square(x: Tensor, patch: int, pos: int) -> Tensor:
    """The square of ``x`` ``[..., H, W]`` whose side is the largest multiple of ``patch``: at the start (0), the
    centre (1) or the end (2) of the long side, centred on the short one."""
    nh, nw = x.shape[-2:]
    side = (min(nh, nw) // patch) * patch
    top = (nh - side) * pos // 2 if nh > nw else (nh - side) // 2
    left = (nw - side) * pos // 2 if nw >= nh else (nw - side) // 2
    return x[..., top : top + side, left : left + side]


def as_clip(x: Tensor, num_frames: int) -> Tensor:
    """An image batch [N, C, H, W] as clips [N, C, T, H, W] (the frame repeated T times); clips pass through."""
    if x.dim() == 4:
        return x.unsqueeze(2).expand(-1, -1, num_frames, -1, -1)
    if x.dim() == 5:
        return x
    raise ValueError(f"as_clip: expected images [N, C, H, W] or clips [N, C, T, H, W], got {list(x.shape)}")


def load_eval_clip(
    path: str,
    *,
    num_frames: int,
    size: int,
    patch: int,
    frame_stride: int = 1,
    start: int | None = None,
    kind: Literal["video", "image"] | None = None,
    target_fps: float | None = None,
) -> Tensor:
    """uint8 ``[num_frames, S, S, 3]``: a video's ``num_frames`` frames, every ``frame_stride``-th (or at
    ``target_fps`` frames per second) from source frame ``start`` (``None``: the window centred in the video; a
    short video is padded with its last frame), or an image repeated ``num_frames`` times; through
    :func:`center_square` (``S`` a multiple of ``patch``). ``kind`` defaults to the one the extension says
    (unknown extensions are read as videos)."""
    kind = kind or media_kind(path) or "video"
    if kind == "image":
        image = center_square(load_image(path, short_side=size)[None], size, patch)
        return image.expand(num_frames, -1, -1, -1)
    if start is None:
        info = probe_video(path)
        start = segment_starts(info.num_frames, num_frames, frame_step(info.fps, frame_stride, target_fps), 1)[0]
    return center_square(_decode_at(path, start, num_frames, frame_stride, target_fps, size), size, patch)


def random_resized_crop(clip: Tensor, scale: tuple[float, float], flip_p: float, generator: torch.Generator) -> Tensor:
    """uint8 ``[T, S, S, 3]`` -> a square of ``scale`` (a range) of the area at a random place, resized back to
    ``S`` (the same box for every frame), flipped horizontally with probability ``flip_p``: the train-time
    augmentation of fine-tuning (VideoMAE's; the probes' is ``clip_augment``), every draw from ``generator``."""
    s = clip.shape[1]
    lo, hi = scale
    area = lo + (hi - lo) * float(torch.rand((), generator=generator))
    side = max(1, min(s, round(s * math.sqrt(area))))
    top = int(torch.randint(0, s - side + 1, (), generator=generator))
    left = int(torch.randint(0, s - side + 1, (), generator=generator))
    x = clip[:, top : top + side, left : left + side].permute(0, 3, 1, 2).float()
    if side != s:
        x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
    if float(torch.rand((), generator=generator)) < flip_p:
        x = x.flip(-1)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


def load_train_views(
    path: str, views: ViewSpec, patch: int, key: ViewKey, kind: Literal["video", "image"] | None = None
) -> Tensor:
    """One training view of the file at ``path``: uint8 ``[segments, C, T, S, S]`` (what :meth:`ViewSpec.load`
    gives with one crop). Segment ``k`` starts where V-JEPA 2's rule puts it (``clip_augment.train_starts``), its
    frames are read at the short side ``size`` and through ``clip_augment.train_transform`` (its own draws per
    segment) to the square ``S`` of :func:`center_square`."""
    kind = kind or media_kind(path) or "video"
    side = (views.size // patch) * patch
    if kind == "image":
        frame = load_image(path, short_side=views.size)[None]
        crops = [train_transform(frame, side, key, k) for k in range(views.segments)]
        clips = [c.expand(views.image_length, -1, -1, -1) for c in crops]
        return torch.stack(clips).permute(0, 4, 1, 2, 3).contiguous()
    info = probe_video(path)
    step = frame_step(info.fps, views.frame_stride, views.fps)
    starts = train_starts(info.num_frames, views.frames, step, views.segments, key.generator("starts"))
    out = []
    for k, start in enumerate(starts):
        frames = _decode_at(path, start, views.frames, views.frame_stride, views.fps, views.size)
        out.append(train_transform(frames, side, key, k))
    return torch.stack(out).permute(0, 4, 1, 2, 3).contiguous()


def square_crops(frames: Tensor, size: int, patch: int, crops: int) -> Tensor:
    """uint8 frames [T, H, W, 3] -> ``crops`` squares [crops, T, S, S, 3] after the short-side resize of
    :func:`center_square`: one crop is exactly :func:`center_square`; three are the start, the centre and
    the end of the long side (the usual 3-crop test protocol)."""
    if crops == 1:
        return center_square(frames, size, patch)[None]
    if crops != 3:
        raise ValueError(f"square_crops: crops={crops}: valid choices are 1 (centre) or 3 (start, centre, end)")
    x = _short_side(frames.permute(0, 3, 1, 2).float(), size, patch)
    out = torch.stack([_square(x, patch, pos) for pos in (0, 1, 2)])
    return out.round().clamp(0, 255).to(torch.uint8).permute(0, 1, 3, 4, 2).contiguous()


def _decode_at(
    path: str, start: int, num_frames: int, frame_stride: int, target_fps: float | None, size: int
) -> torch.Tensor:
    """``num_frames`` frames of ``path`` from frame ``start``, at the stride or the rate, short side ``size``."""
    return decode_clip(
        path,
        num_frames=num_frames,
        frame_stride=frame_stride,
        target_fps=target_fps,
        start_frame=start,
        short_side=size,
    )


def segment_starts(num_source_frames: int, num_frames: int, frame_stride: float, segments: int) -> list[int]:
    """First source frame of each of ``segments`` clips of ``num_frames`` frames ``frame_stride`` source frames
    apart (fractional at a target rate), spread evenly over the video: one segment is the centred window,
    several go from the first frame to the last possible start (a video shorter than one clip: every segment
    starts at 0 and is padded)."""
    span = round((num_frames - 1) * frame_stride) + 1
    room = max(0, num_source_frames - span)
    if segments == 1:
        return [room // 2]
    return [round(k * room / (segments - 1)) for k in range(segments)]


def load_eval_video(
    path: str, *, size: int, patch: int, frame_stride: int = 1, target_fps: float | None = None
) -> VideoFrames:
    """Every kept frame of a video (every ``frame_stride``-th, or at ``target_fps``) through
    :func:`center_square`, with their timestamps and the source's frame rate (``decode_all``)."""
    video = decode_all(path, frame_stride=frame_stride, target_fps=target_fps, short_side=size)
    return dataclasses.replace(video, frames=center_square(video.frames, size, patch))


@dataclass(frozen=True)
class ViewSpec:
    """How a file becomes the views a frozen readout reads (:meth:`load`): ``segments`` clips of
    ``frames`` frames, every ``frame_stride``-th source frame — or, with ``fps``, frames ``1 / fps`` seconds
    apart whatever the video's own rate — spread over the video, × ``crops`` square crops (1: centre; 3:
    start, centre, end of the long side) at short side ``size``; an image is its frame repeated ``frames`` times,
    or ``image_frames`` times when set (one slot: the tubelet). Views are segment-major. (The field order is
    the on-disk order of ``classifier.json``'s ``protocol``.)"""

    size: int = 224
    frames: int = 16
    frame_stride: int = 2
    segments: int = 1
    crops: int = 1
    fps: float | None = None  # sample at this rate (frames per second) instead of every frame_stride-th
    image_frames: int | None = None  # frames an image gives (None: repeated to ``frames``, the paper's protocol)

    def __post_init__(self) -> None:
        for name in ("size", "frames", "frame_stride", "segments"):
            check(getattr(self, name) >= 1, f"views: {name}={getattr(self, name)} must be >= 1")
        check(
            self.image_frames is None or self.image_frames >= 1,
            f"views: image_frames={self.image_frames} must be >= 1 (or unset: an image repeated to frames)",
        )
        check(self.crops in (1, 3), f"views: crops={self.crops}: valid choices are 1 (centre), 3 (start, centre, end)")
        check(self.fps is None or self.fps > 0, f"views: fps={self.fps} must be > 0 (or unset: frame_stride)")

    @property
    def views(self) -> int:
        """Views per file: ``segments × crops``."""
        return self.segments * self.crops

    @property
    def text(self) -> str:
        """``frames×segments×crops``, as evaluation tables write a protocol's views (``16×2×3``)."""
        return f"{self.frames}×{self.segments}×{self.crops}"

    @property
    def sampling(self) -> str:
        """How frames are taken, in words: ``at 7.5 fps`` or ``every 2nd frame``."""
        if self.fps is not None:
            return f"at {self.fps:g} fps"
        return "every frame" if self.frame_stride == 1 else f"every {_ordinal(self.frame_stride)} frame"

    def describe(self) -> str:
        """``16 frames at 7.5 fps, 224 px, 2×3 views`` (what a reader says it used)."""
        views = "" if self.views == 1 else f", {self.segments}×{self.crops} views"
        return f"{self.frames} frames {self.sampling}, {self.size} px{views}{self.image_text}"

    @property
    def image_text(self) -> str:
        """``, images as 1 frame`` when images are not repeated to ``frames`` (else empty)."""
        n = self.image_frames
        return "" if n is None else f", images as {n} frame{'s' if n > 1 else ''}"

    @property
    def image_length(self) -> int:
        """Frames of an image's clip: ``image_frames``, or ``frames`` (repeated)."""
        return self.frames if self.image_frames is None else self.image_frames

    def fields(self) -> dict[str, Any]:
        """The fields, ``image_frames`` only when set (so a record written before it still matches)."""
        out = dataclasses.asdict(self)
        if self.image_frames is None:
            del out["image_frames"]
        return out

    def record(self, *, windows: bool = False) -> dict[str, Any]:
        """What a feature set's manifest records of the views (``levjepa.features``): the fields, ``fps`` and
        ``image_frames`` only when set — or, for extraction's windows (one segment, one crop: not recorded),
        ``frames, frame_stride, fps, size`` (and ``image_frames`` when set). Either way every folder written before
        keeps its manifest, so it is reused, and a store its name."""
        out = self.fields()
        if windows:
            return {k: out[k] for k in ("frames", "frame_stride", "fps", "size", "image_frames") if k in out}
        if self.fps is None:
            del out["fps"]
        return out

    def load(self, path: str, patch: int, kind: Literal["video", "image"] | None = None) -> Tensor:
        """The views of the file at ``path``, segment-major (:func:`segment_starts` × :func:`square_crops`): uint8
        ``[segments · crops, C, T, S, S]`` (``S`` a multiple of ``patch``), ready for an encoder. An image gives the
        same frame for every segment, :attr:`image_length` times; one segment and one crop are
        :func:`load_eval_clip`'s clip (the centred window, centre crop). ``kind`` defaults to the extension's.
        Raises what decoding raises (``DataError``, PyAV's errors)."""
        if (kind or media_kind(path) or "video") == "image":
            frame = load_image(path, short_side=self.size)[None]
            crops = square_crops(frame, self.size, patch, self.crops).expand(-1, self.image_length, -1, -1, -1)
            views = crops.repeat(self.segments, 1, 1, 1, 1)
        else:
            info = probe_video(path)
            step = frame_step(info.fps, self.frame_stride, self.fps)
            out = []
            for start in segment_starts(info.num_frames, self.frames, step, self.segments):
                frames = _decode_at(path, start, self.frames, self.frame_stride, self.fps, self.size)
                out.append(square_crops(frames, self.size, patch, self.crops))
            views = torch.cat(out)
        return views.permute(0, 4, 1, 2, 3).contiguous()


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
