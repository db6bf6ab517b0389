"""How a reader reads a model: the clips the model was trained on, unless told otherwise — and said.

Every reader of an encoder (``probe``, ``extract``, ``classify``, ``finetune``, ``visualize``, ``stream`` and the
Python API) cuts its clips the way the model records (timm's ``resolve_data_config(model=m)``, STYLE 21): the
size, the number of frames and the sampling — a frame stride, or a rate in frames per second when the model
records one (the released LeVJEPA weights: 7.5 fps) — of its preprocessing (``LoadedEncoder.preprocessing``:
an export's ``config.json``, the geometry a run trained on, the official weights' own). A value the user gives
overrides the model's, a rate overriding a stride and the reverse, and :func:`model_views` returns one line
that says what was used and where each value came from, which every command prints. A 32-px demo encoder is
read at 32 px: at 224 px it would be read off the distribution it saw, and seven times more slowly.

The number of frames must be a whole number of the encoder's tubelets (refused in one line otherwise).
"""

from __future__ import annotations

from levjepa.config import ConfigError
from levjepa.data.eval_clip import ViewSpec
from levjepa.formats.reading.load import LoadedEncoder, Preprocessing, preprocessing_of
from levjepa.model.vit import VideoEncoder

__all__ = ["model_preprocessing", "model_views"]


def model_preprocessing(model: LoadedEncoder | VideoEncoder) -> Preprocessing:
    """What ``model`` records of the clips it expects: a ``LoadedEncoder``'s preprocessing (its export's, its
    run's, or the official weights'), or the ``pretrained_cfg`` that ``levjepa.load`` puts on the encoder."""
    if isinstance(model, LoadedEncoder):
        return model.preprocessing or preprocessing_of(model.run_config)
    cfg = getattr(model, "pretrained_cfg", None)
    if not cfg:
        return Preprocessing()
    return Preprocessing(
        size=int(cfg["input_size"][-1]),
        frames=int(cfg["num_frames"]),
        frame_stride=int(cfg["frame_stride"]),
        mean=tuple(cfg["mean"]),
        std=tuple(cfg["std"]),
        fps=cfg.get("fps"),
    )


def model_views(
    loaded: LoadedEncoder | VideoEncoder,
    *,
    size: int | None = None,
    frames: int | None = None,
    frame_stride: int | None = None,
    fps: float | None = None,
    segments: int = 1,
    crops: int = 1,
    frames_option: str = "--frames",
) -> tuple[ViewSpec, str]:
    """The views to cut for ``loaded`` (what ``levjepa.formats.reading.load.load_encoder`` or ``levjepa.load`` returns):
    its preprocessing, each value given overriding it (module doc), and the line that says so, e.g.
    ``views: 16 frames at 7.5 fps, 224 px (the model's preprocessing)``. ``frames_option``: the option that sets
    the frames in the command calling (``extract``'s ``--window``), named when they are refused; ``--fps`` and
    ``--frame-stride`` together are refused, and a size that is no whole number of patches is said as adjusted."""
    pre = model_preprocessing(loaded)
    if fps is not None and frame_stride is not None:
        raise ConfigError(
            f"--fps {fps:g} and --frame-stride {frame_stride} both set the sampling (a rate, or every n-th frame): "
            "give one of the two"
        )
    given = [name for name, v in (("size", size), ("frames", frames), ("frame stride", frame_stride),
                                  ("fps", fps)) if v is not None]  # fmt: skip
    if fps is None and frame_stride is None:  # the model's sampling: its rate when it records one
        fps, frame_stride = pre.fps, pre.frame_stride
    elif fps is not None:
        frame_stride = pre.frame_stride  # unused: the rate decides
    views = ViewSpec(
        size=size if size is not None else pre.size,
        frames=frames if frames is not None else pre.frames,
        frame_stride=frame_stride if frame_stride is not None else pre.frame_stride,
        segments=segments,
        crops=crops,
        fps=fps,
    )
    cfg = loaded.config if isinstance(loaded, LoadedEncoder) else loaded.cfg
    tau, patch = cfg.tubelet, cfg.patch_size
    if views.frames % tau:
        raise ConfigError(
            f"{views.frames} frames: the encoder's tubelet is {tau} frames, so a clip holds a multiple of {tau} "
            f"({frames_option} {max(tau, views.frames // tau * tau)})"
        )
    origin = "the model's preprocessing" if not given else f"{', '.join(given)} as given, the rest the model's"
    adjusted = ""
    if views.size % patch:  # the centred square is cut to whole patches (levjepa.data.eval_clip.resize_square)
        side = max(patch, views.size // patch * patch)
        adjusted = f"; frames cut to {side} px, {views.size} adjusted to a whole number of {patch}-px patches"
    return views, f"views: {views.describe()} ({origin}){adjusted}"
