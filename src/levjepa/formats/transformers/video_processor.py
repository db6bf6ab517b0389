"""levjepa's video processor for transformers: ``AutoVideoProcessor.from_pretrained(DIR)`` and
``pipeline("video-classification", model=DIR)`` cut a video as levjepa's own readers do.

An export writes ``video_preprocessor_config.json`` (``levjepa.formats.writing.export.video_processor_config``) naming
:class:`LeVJEPAVideoProcessor`, registered with ``AutoVideoProcessor`` for ``model_type: levjepa`` by
:func:`register` (the post-import hook of ``levjepa/__init__.py`` calls it once
``transformers.models.auto.video_processing_auto`` is imported, in either import order). Its output is the
model's main input, ``pixel_values_videos`` ``[B, T, C, S, S]``, ImageNet-normalised as the model records.

**Without torchvision.** transformers' ``BaseVideoProcessor`` is its torchvision backend (decoding through
torchcodec or torchvision, resizing with ``torchvision.transforms.v2``), and torchvision does not import beside
a CPU torch of another build. This class derives from its backend-free half, ``VideoProcessorMixin`` (the
save / load / ``to_dict`` / ``push_to_hub`` machinery, ``model_input_names``), and does every step with
levjepa's own torch code: PyAV decoding and the evaluation transform of ``levjepa.data.eval_clip``.

**What it does** (the same as ``levjepa classify`` on one segment and one crop; the clip is the centred window,
while ``levjepa extract``'s windows start at frame 0, so extract has this clip's row only when one of its windows
is the centred one, e.g. with ``--stride 1``):

* a **path** (a video or an image file, or a list of them) is cut as ``ViewSpec.load`` cuts it: ``num_frames``
  frames ``1 / fps`` seconds apart when the model records its training rate (``fps``), else every
  ``frame_stride``-th source frame, the window centred in the video (a short video padded with its last
  frame); an image is its frame repeated ``num_frames`` times;
* **frames** — one video as a list of frames (PIL images, ``[H, W, C]`` / ``[C, H, W]`` arrays or tensors), a
  ``[T, H, W, C]`` / ``[T, C, H, W]`` array or tensor, a list of such videos or a batched 5-D
  ``[B, T, C, H, W]`` / ``[B, T, H, W, C]`` — are taken as given (the caller chose them), or with
  ``do_sample_frames=True`` sampled as a path is (the source rate from ``video_metadata``'s ``fps`` when the
  model records a rate); a single frame (``[H, W, C]``, a PIL image) is an image, repeated ``num_frames`` times;
* then every frame is resized on its short side to ``size["shortest_edge"]`` (bilinear, antialiased), the
  centred square whose side is the largest multiple of the patch size kept (``crop_size``), times
  ``rescale_factor`` (``1 / 255``), minus ``image_mean``, over ``image_std``. uint8 frames are rounded back to
  uint8 after the resize, as levjepa's readers do (``eval_clip.center_square``); float frames (values in
  ``[0, 255]``, as transformers' ``do_rescale`` expects) are not.

A channel axis that could be either end of a frame (a ``3 × W × 3`` frame) is refused in one line, never
guessed; so are keyword arguments this processor does not read, and settings it cannot honour (no resize or no
crop: levjepa's transform does both at once).

transformers' default video processors sample ``num_frames`` frames spread over the whole video; this one
takes the model's frames — the pipeline's ``num_frames`` (the model's ``config.num_frames`` by default) is the
clip length, spaced at the model's rate or stride, never stretched over the video.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers.image_processing_utils import BatchFeature
from transformers.models.auto.video_processing_auto import AutoVideoProcessor
from transformers.video_processing_utils import VideoProcessorMixin

from levjepa.config import check
from levjepa.data.eval_clip import ViewSpec, center_square, resize_square, segment_starts
from levjepa.data.video import clip_indices, frame_step, pil_to_rgb8
from levjepa.formats.reading.load import OFFICIAL_PREPROCESSING, Preprocessing
from levjepa.formats.transformers.config import LeVJEPAConfig

__all__ = ["CALL_KEYS", "LeVJEPAVideoProcessor", "register", "settings_of"]

# what a call may change; anything else is refused in one line (transformers' own processors only warn)
CALL_KEYS = ("num_frames", "fps", "frame_stride", "do_sample_frames", "video_metadata", "return_tensors", "device")
RELEASED_PATCH = 16  # the released checkpoint's patch size (its config's patch_size)


def settings_of(data: Mapping[str, Any]) -> tuple[Preprocessing, int]:
    """The preprocessing and patch size a video processor's settings (``video_preprocessor_config.json``'s
    keys, transformers' names) describe, checked: a ``ConfigError`` in one line naming the key."""
    base = Preprocessing()
    size = data.get("size", {"shortest_edge": base.size})
    check(isinstance(size, Mapping) and "shortest_edge" in size, f"size={size!r}: expected {{'shortest_edge': S}}")
    for key in ("do_resize", "do_center_crop"):
        check(
            data.get(key, True) is True,
            f"{key}={data.get(key)!r}: levjepa's transform resizes the short side and crops the centred square "
            "together (levjepa.data.eval_clip.center_square); set both or give frames already at the model's size",
        )
    pre = Preprocessing(
        size=int(size["shortest_edge"]),
        frames=int(data.get("num_frames", base.frames)),
        frame_stride=int(data.get("frame_stride", base.frame_stride)),
        mean=tuple(float(v) for v in data.get("image_mean", base.mean)),  # type: ignore[arg-type]
        std=tuple(float(v) for v in data.get("image_std", base.std)),  # type: ignore[arg-type]
        fps=None if data.get("fps") is None else float(data["fps"]),
    )
    patch = int(data.get("patch_size", RELEASED_PATCH))
    ViewSpec(size=pre.size, frames=pre.frames, frame_stride=pre.frame_stride, fps=pre.fps)  # checks them
    check(patch >= 1 and pre.size >= patch, f"patch_size={patch}: must be >= 1 and <= size {pre.size}")
    check(len(pre.mean) == len(pre.std), f"image_mean {pre.mean} and image_std {pre.std}: one value per channel")
    return pre, patch


def _settings(pre: Preprocessing, patch: int) -> dict[str, Any]:
    """A processor's settings for ``pre`` and ``patch``: an export's ``video_preprocessor_config.json`` but its
    type. Given none, ``Preprocessing()``'s and patch 16: no rate (``fps``), so that a saved processor whose
    ``fps`` is ``null`` (transformers drops it on save) reads back without one."""
    from levjepa.formats.writing.export import video_processor_config

    return {k: v for k, v in video_processor_config(pre, patch).items() if k != "video_processor_type"}


class LeVJEPAVideoProcessor(VideoProcessorMixin):
    """Frames or files -> ``pixel_values_videos`` ``[B, T, C, S, S]`` as the model was trained (module doc).
    Settings it is not given are ``Preprocessing()``'s (16 frames, every 2nd, 224 px) and patch 16; the
    released checkpoint's come from its config (:meth:`from_model_config`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**_settings(Preprocessing(), RELEASED_PATCH), **kwargs})
        settings_of(vars(self))  # bad settings fail here, in one line

    @property
    def preprocessing(self) -> Preprocessing:
        return settings_of(vars(self))[0]

    @property
    def patch(self) -> int:
        return settings_of(vars(self))[1]

    @classmethod
    def from_model_config(cls, config: LeVJEPAConfig) -> LeVJEPAVideoProcessor:
        """The processor of a model that ships none: a levjepa export's recorded preprocessing, the released
        checkpoint's (``OFFICIAL_PREPROCESSING``) for the released schema."""
        record = getattr(config, "preprocessing", None)
        pre = Preprocessing.from_record(record) if isinstance(record, dict) else OFFICIAL_PREPROCESSING
        return cls(**_settings(pre, config.encoder_config().patch_size))

    @classmethod
    def from_pretrained(  # type: ignore[override, unused-ignore]  # transformers' own signature varies by version
        cls, pretrained_model_name_or_path: str | os.PathLike[str], **kwargs: Any
    ) -> Any:
        """``video_preprocessor_config.json`` when the folder or repo has one, else the model's own config
        (:meth:`from_model_config`: the released checkpoint ships no processor file)."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except OSError:
            from transformers.models.auto.configuration_auto import AutoConfig

            config = AutoConfig.from_pretrained(pretrained_model_name_or_path, **kwargs)
            if not isinstance(config, LeVJEPAConfig):
                raise
            return cls.from_model_config(config)

    def __call__(self, videos: Any, **kwargs: Any) -> BatchFeature:  # type: ignore[override, unused-ignore]
        return self.preprocess(videos, **kwargs)

    def preprocess(self, videos: Any, **kwargs: Any) -> BatchFeature:
        """``pixel_values_videos`` ``[B, T, C, S, S]`` of ``videos`` (module doc); ``kwargs``: :data:`CALL_KEYS`."""
        unknown = sorted(set(kwargs) - set(CALL_KEYS))
        if unknown:
            raise ValueError(
                f"LeVJEPAVideoProcessor: {', '.join(unknown)} not read here (a call may set {', '.join(CALL_KEYS)}; "
                "the transform is the model's, in video_preprocessor_config.json)"
            )
        pre, patch = settings_of({**vars(self), **{k: v for k, v in kwargs.items() if k in ("num_frames",)}})
        fps = kwargs.get("fps", pre.fps)
        stride = int(kwargs.get("frame_stride", pre.frame_stride))
        views = ViewSpec(size=pre.size, frames=pre.frames, frame_stride=stride, fps=fps)
        sample = bool(kwargs.get("do_sample_frames") or False)
        metadata = kwargs.get("video_metadata")
        clips = []
        for i, item in enumerate(_items(videos)):
            if isinstance(item, str):
                clip = views.load(item, patch)[0].transpose(0, 1)  # [T, C, S, S] uint8, classify's one view
            else:
                clip = _frames_clip(item, views, patch, sample, _source_fps(metadata, i))
            clips.append(_normalise(clip, vars(self), pre))
        shapes = {tuple(c.shape) for c in clips}
        if len(shapes) > 1:
            raise ValueError(f"videos of different shapes {sorted(shapes)} do not batch: give them one at a time")
        pixels = torch.stack(clips)
        if kwargs.get("device") is not None:
            pixels = pixels.to(kwargs["device"])
        return BatchFeature(data={"pixel_values_videos": pixels}, tensor_type=kwargs.get("return_tensors"))


def _source_fps(metadata: Any, i: int) -> float | None:
    """The frame rate ``video_metadata`` gives video ``i`` (a dict or transformers' ``VideoMetadata``, or a list
    of them), or ``None``."""
    if metadata is None:
        return None
    one = metadata[i] if isinstance(metadata, (list, tuple)) else metadata
    fps = one.get("fps") if isinstance(one, Mapping) else getattr(one, "fps", None)
    return None if fps is None else float(fps)


def _is_frame_like(x: Any) -> bool:
    return _is_pil(x) or (isinstance(x, (np.ndarray, Tensor)) and x.ndim == 3)


def _is_pil(x: Any) -> bool:
    return type(x).__module__.startswith("PIL.")


def _items(videos: Any) -> list[str | tuple[Tensor, bool]]:
    """Each video of ``videos`` as a path or as (frames ``[T, C, H, W]``, is-an-image)."""
    if isinstance(videos, (str, os.PathLike)):
        return [os.fspath(videos)]
    if _is_frame_like(videos):
        return [(_frame(videos)[None], True)]
    if isinstance(videos, (np.ndarray, Tensor)):
        x = torch.as_tensor(videos)
        if x.dim() == 4:
            return [(_channels_first(x), False)]
        if x.dim() == 5:
            return [(_channels_first(v), False) for v in x]
        raise ValueError(f"videos: a {x.dim()}-D array; expected a frame (3-D), a video (4-D) or a batch (5-D)")
    if isinstance(videos, Sequence) and len(videos) > 0:
        if all(_is_frame_like(f) for f in videos):  # one video, as a list of frames
            return [(torch.stack([_frame(f) for f in videos]), False)]
        out: list[str | tuple[Tensor, bool]] = []
        for v in videos:
            out += _items(v)
        return out
    raise ValueError(
        f"videos: expected a path, frames (PIL images, arrays or tensors) or a batch of videos, not "
        f"{type(videos).__name__}"
    )


def _frame(x: Any) -> Tensor:
    """One frame ``[C, H, W]`` (uint8 or float) of a PIL image or a ``[H, W, C]`` / ``[C, H, W]`` array."""
    if _is_pil(x):
        x = np.array(pil_to_rgb8(x))  # 16-bit, palette, transparency at their true range
    return _channels_first(x if isinstance(x, Tensor) else torch.from_numpy(np.array(x)))


def _channels_first(x: Tensor) -> Tensor:
    """Frames ``[..., H, W, C]`` or ``[..., C, H, W]`` (``C`` in 1, 3, 4) as ``[..., C, H, W]``; a frame whose both
    ends could be its channels is refused in one line."""
    last, first = x.shape[-1], x.shape[-3]
    if last in (1, 3, 4) and first in (1, 3, 4):
        raise ValueError(
            f"frames of shape {tuple(x.shape)}: channels could be first or last; give frames [.., H, W, C] whose "
            "height and width are not 1, 3 or 4"
        )
    if last in (1, 3, 4):
        return x.movedim(-1, -3)
    if first in (1, 3, 4):
        return x
    raise ValueError(f"frames of shape {tuple(x.shape)}: no channel axis of 1, 3 or 4 at either end")


def _frames_clip(item: tuple[Tensor, bool], views: ViewSpec, patch: int, sample: bool, fps: float | None) -> Tensor:
    """Given frames ``[T, C, H, W]`` as the model's clip ``[T', C, S, S]`` (module doc)."""
    frames, image = item
    if frames.shape[1] == 4:  # RGBA: the colour channels
        frames = frames[:, :3]
    if frames.shape[1] == 1:
        frames = frames.expand(-1, 3, -1, -1)
    if image:
        frames = frames.expand(views.frames, -1, -1, -1)
    elif sample:
        n = len(frames)
        if views.fps is not None and fps is None:
            raise ValueError(
                f"do_sample_frames: this model samples at {views.fps:g} fps; give video_metadata={{'fps': ...}} "
                "for the frames' own rate, or pass a path"
            )
        step = frame_step(fps or 1.0, views.frame_stride, views.fps)
        start = segment_starts(n, views.frames, step, 1)[0]
        frames = frames[clip_indices(n, num_frames=views.frames, step=step, start=start)[0]]
    if frames.dtype == torch.uint8:
        return center_square(frames.permute(0, 2, 3, 1), views.size, patch).permute(0, 3, 1, 2)
    return resize_square(frames.float(), views.size, patch)


def _normalise(clip: Tensor, settings: Mapping[str, Any], pre: Preprocessing) -> Tensor:
    """``[T, C, S, S]`` -> float32, times ``rescale_factor`` and normalised when the settings say so."""
    x = clip.to(torch.float32)
    if settings.get("do_rescale", True):
        x = x / (1 / float(settings.get("rescale_factor", 1 / 255)))  # / 255.0, as levjepa's readers divide
    if settings.get("do_normalize", True):
        mean = torch.tensor(pre.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(pre.std, dtype=torch.float32).view(-1, 1, 1)
        x = (x - mean) / std
    return x


def register() -> None:
    """Register :class:`LeVJEPAVideoProcessor` for ``model_type: levjepa`` with ``AutoVideoProcessor``
    (idempotent), under transformers' backend names: it needs neither."""
    classes: dict[str, type] = {"torchvision": LeVJEPAVideoProcessor, "pil": LeVJEPAVideoProcessor}
    AutoVideoProcessor.register(LeVJEPAConfig, video_processor_classes=classes, exist_ok=True)
