"""The official model's outputs and the Hugging Face conventions around them, computed once for
``levjepa.LeVJEPAModel`` / ``LeVJEPAForVideoClassification`` and for transformers' ``AutoModel`` /
``AutoModelForVideoClassification`` alike.

Inputs (:func:`video_input`): ``pixel_values`` ``[B, C, T, H, W]`` (the official convention; ``[B, C, H, W]``
is one frame per clip) or ``pixel_values_videos`` ``[B, T, C, H, W]`` (transformers' video models, V-JEPA 2's
name; what a video processor gives), never both. A frames-first ``pixel_values`` ``[B, T, C, H, W]`` — what
transformers' ``VideoMAEImageProcessor`` returns under that name, and so what ``model(**processor(frames))``
and the video-classification pipeline hand the model — is read as frames first when the shape says so: the
model's ``C`` channels at dim 2 and not at dim 1. The one shape both readings fit, ``C`` frames of ``C``
channels (``[B, 3, 3, H, W]``), is refused in one line (:data:`AMBIGUOUS`), never guessed.

Outputs (:func:`hub_forward`): ``last_hidden_state`` ``[B, 1+N, D]`` (CLS first, then every patch token in
``(t, y, x)`` order, after the final norm), ``pooler_output`` ``[B, D]`` (the CLS) and, when asked, ``hidden_states``:
``depth + 1`` tensors as transformers' ViTs give them — the embeddings (CLS and the patch tokens before the first
block), then every block's output before the final norm — so ``hidden_states[-1]`` normed is ``last_hidden_state``.
An encoder with readout layers (``EncoderConfig.readout_layers``, ``levjepa export --layers``) gives its readout
instead: ``last_hidden_state`` ``[B, 1+N, n·D]`` and ``pooler_output`` ``[B, n·D]``, each named block's output
through the final norm, concatenated on channels (``levjepa.model.readout_layers``); ``hidden_states`` stay the
blocks' own. ``output_attentions`` is refused in one line: the attention runs as one fused
``scaled_dot_product_attention`` call and never forms the weights. A classifier adds ``logits`` ``[B, classes]``
(:func:`hub_logits`: the head of ``levjepa.model.classifier`` on one view per clip) and, with ``labels``, the
cross-entropy ``loss``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from levjepa.model import VideoEncoder
from levjepa.model.classifier import HeadConfig, view_inputs

__all__ = [
    "AMBIGUOUS",
    "ATTENTIONS_REFUSED",
    "LeVJEPAClassifierOutput",
    "LeVJEPAOutput",
    "as_clips",
    "hub_forward",
    "hub_logits",
    "video_input",
]

ATTENTIONS_REFUSED = (
    "output_attentions=True: levjepa's attention is one fused scaled_dot_product_attention call that never forms "
    "the attention weights; read hidden_states (output_hidden_states=True) or levjepa visualize's maps instead"
)

AMBIGUOUS = (
    "pixel_values {shape}: {c} frames of {c} channels reads as [B, C, T, H, W] and as [B, T, C, H, W]; pass "
    "pixel_values_videos=[B, T, C, H, W] instead (x.transpose(1, 2) of a channels-first clip)"
)


class _Fields:
    """Readable by name, by key and by index, as transformers' ``ModelOutput`` (``None`` fields skipped)."""

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(v for f in fields(self) if (v := getattr(self, f.name)) is not None)  # type: ignore[arg-type]

    def __getitem__(self, key: int | str) -> Any:
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]

    def keys(self) -> Iterator[str]:
        return iter(f.name for f in fields(self) if getattr(self, f.name) is not None)  # type: ignore[arg-type]


@dataclass
class LeVJEPAOutput(_Fields):
    """``last_hidden_state`` ``[B, 1+N, D]``, ``pooler_output`` ``[B, D]``, ``hidden_states`` (or ``None``)."""

    last_hidden_state: Tensor
    pooler_output: Tensor
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class LeVJEPAClassifierOutput(_Fields):
    """``loss`` (with labels), ``logits`` ``[B, classes]``, ``hidden_states`` (or ``None``)."""

    loss: Tensor | None
    logits: Tensor
    hidden_states: tuple[Tensor, ...] | None = None


def as_clips(pixel_values: Tensor, channels: int = 3) -> Tensor:
    """``pixel_values`` as clips ``[B, C, T, H, W]``: channels first as it is, frames first ``[B, T, C, H, W]``
    transposed (``C``, ``channels``, at dim 2 and not at dim 1), ``[B, C, H, W]`` as one-frame clips; the
    ambiguous ``[B, C, C, H, W]`` and anything else a ``ValueError`` in one line."""
    if not isinstance(pixel_values, Tensor):
        raise ValueError(f"pixel_values: expected a float tensor [B, C, T, H, W], got {type(pixel_values).__name__}")
    if pixel_values.dim() == 4:
        return pixel_values[:, :, None]
    if pixel_values.dim() != 5:
        raise ValueError(f"pixel_values: expected [B, C, T, H, W] or [B, T, C, H, W], got {tuple(pixel_values.shape)}")
    first, second = pixel_values.shape[1:3]
    if first == channels and second == channels:
        raise ValueError(AMBIGUOUS.format(shape=tuple(pixel_values.shape), c=channels))
    if second == channels:
        return pixel_values.transpose(1, 2)  # frames first (an image processor's stack)
    if first != channels:
        raise ValueError(
            f"pixel_values {tuple(pixel_values.shape)}: this model reads {channels} channels, at dim 1 "
            "([B, C, T, H, W]) or dim 2 ([B, T, C, H, W])"
        )
    return pixel_values


def video_input(
    pixel_values: Tensor | None,
    pixel_values_videos: Tensor | None,
    output_attentions: bool | None = None,
    channels: int = 3,
) -> Tensor:
    """The clips ``[B, C, T, H, W]`` of either input convention (module doc; ``channels``: the model's ``C``); a
    ``ValueError`` in one line for none, both, a ``pixel_values_videos`` that is not 5-D, an ambiguous
    ``pixel_values`` or ``output_attentions``."""
    if output_attentions:
        raise ValueError(ATTENTIONS_REFUSED)
    if (pixel_values is None) == (pixel_values_videos is None):
        raise ValueError(
            "give one of pixel_values [B, C, T, H, W] (the official layout) or pixel_values_videos [B, T, C, H, W] "
            f"(transformers' video layout), not {'both' if pixel_values is not None else 'neither'}"
        )
    if pixel_values_videos is not None:
        if not isinstance(pixel_values_videos, Tensor) or pixel_values_videos.dim() != 5:
            shape = tuple(pixel_values_videos.shape) if isinstance(pixel_values_videos, Tensor) else "not a tensor"
            raise ValueError(f"pixel_values_videos: expected a float tensor [B, T, C, H, W], got {shape}")
        return pixel_values_videos.transpose(1, 2)  # [B, C, T, H, W]
    assert pixel_values is not None
    return as_clips(pixel_values, channels)


def hub_forward(encoder: VideoEncoder, video: Tensor, output_hidden_states: bool = False) -> LeVJEPAOutput:
    """The official outputs of ``encoder`` on clips ``[B, C, T, H, W]`` (see the module docstring)."""
    if not output_hidden_states:
        tokens = encoder.forward_features(video).tokens
        return LeVJEPAOutput(tokens, tokens[:, 0])
    depth = encoder.cfg.depth
    blocks = encoder.get_intermediate_layers(video, list(range(depth)), norm=False)
    patches, _ = encoder.patch_embed(video, None)  # the embeddings: what the first block reads
    cls = encoder.cls_token.expand(patches.shape[0], -1, -1).to(patches.dtype)
    hidden = (torch.cat([cls, patches], dim=1), *(o.tokens for o in blocks))
    last = encoder.readout(dict(enumerate(hidden[1:])))  # the final norm of the last block, or the readout layers
    return LeVJEPAOutput(last, last[:, 0], hidden)


def hub_logits(
    features: LeVJEPAOutput, head: nn.Module, head_cfg: HeadConfig, labels: Tensor | None = None
) -> LeVJEPAClassifierOutput:
    """A classifier's logits from the encoder's outputs on one view per clip (``levjepa.model.classifier``:
    what ``classify`` computes for one segment and one crop) and, with ``labels`` ``[B]``, their mean
    cross-entropy."""
    tokens = features.last_hidden_state
    mean = tokens[:, 1:].float().mean(1)
    logits = head(view_inputs(tokens[:, 0], mean, tokens if head_cfg.input == "tokens" else None, head_cfg))[0]
    loss = None if labels is None else nn.functional.cross_entropy(logits.float(), labels.to(logits.device))
    return LeVJEPAClassifierOutput(loss, logits, features.hidden_states)
