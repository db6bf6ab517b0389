"""A video classifier: the encoder plus one probe head, the model that ``probe`` keeps, ``finetune`` trains and
``classify`` runs.

The head is one row (``G = 1``) of the stacked grid of a probe kind (``levjepa.model.probe_kinds``, the one
registry of kinds), e.g. the attentive probe (one learnable query cross-attending every output token,
V-JEPA's protocol) or the linear probe (a linear map of the standardised mean-pooled patch tokens, or of CLS).
A probe kept by ``levjepa probe`` is the row of its grid that validation chose, so the classifier computes
what the probe computed when it was scored.

**Views of a file** (the evaluation protocol, ``levjepa.data.eval_clip.ViewSpec.load``): ``segments`` clips
spread over the video × ``crops`` spatial crops, segment-major. As in the frozen evaluation
(``levjepa.eval.source.StoreSource``), a (file, crop) sample reads its segments together — the attentive head
the concatenation of their tokens ``[segments · (1+L), D]``, the linear head their features averaged — and
the class probabilities of a file's crops are averaged (:meth:`VideoClassifier.probabilities_from`).

``token_dtype``: a frozen probe trained on float16 tokens (the feature stores keep tokens in float16), so
the kept probe reads its tokens rounded to float16 to compute the numbers it was scored with; a fine-tuned
classifier reads them in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from levjepa.config import check
from levjepa.model.probe_kinds import head_kind, kind_names
from levjepa.model.vit import VideoEncoder

__all__ = ["HeadConfig", "VideoClassifier", "build_head", "view_inputs"]

HeadInput = Literal["tokens", "mean", "cls"]


@dataclass(frozen=True)
class HeadConfig:
    """One classification head: its kind, what it reads, its sizes (``levjepa.model.probe_heads``)."""

    kind: str = "attentive"  # a kind of levjepa.model.probe_kinds: attentive, linear, ...
    input: HeadInput = "tokens"  # what the kind reads: attentive tokens; linear mean (pooled patches) or cls
    dim: int = 192
    num_classes: int = 2
    depth: int = 1
    num_heads: int = 0  # 0 = max(1, dim // 64)
    mlp_ratio: float = 4.0
    init_std: float = 0.02
    token_dtype: Literal["float32", "float16"] = "float32"

    def __post_init__(self) -> None:
        kinds = kind_names()
        check(self.kind in kinds, f"head.kind={self.kind!r}: valid choices are {', '.join(kinds)}")
        valid = head_kind(self.kind).inputs
        check(self.input in valid, f"head.input={self.input!r}: a {self.kind} head reads {' or '.join(valid)}")
        check(self.num_classes >= 2, f"head.num_classes={self.num_classes}: a classifier needs >= 2 classes")
        check(self.dim >= 1 and self.depth >= 1, f"head: dim={self.dim}, depth={self.depth} must be >= 1")


def build_head(cfg: HeadConfig, generator: torch.Generator | None = None) -> nn.Module:
    """The head of ``cfg``: a probe grid of one row of its kind (``levjepa.model.probe_kinds``),
    ``[B, ...] -> [1, B, C]``."""
    return head_kind(cfg.kind).build(
        1,
        cfg.dim,
        cfg.num_classes,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        init_std=cfg.init_std,
        generator=generator,
    )


def view_inputs(
    cls: Tensor, mean: Tensor, tokens: Tensor | None, cfg: HeadConfig, segments: int = 1, crops: int = 1
) -> Tensor:
    """What the head reads for each (file, crop), from the features of its views, file-major then
    segment-major: ``cls`` [B·S·C, D], ``mean`` [B·S·C, D] (the patch tokens averaged) and ``tokens``
    [B·S·C, 1+L, D] (CLS first; needed by an attentive head) -> ``[B·C, ...]`` (tokens ``[B·C, S·(1+L), D]``
    in the head's ``token_dtype``, pooled features ``[B·C, D]`` averaged over the segments)."""
    n, d = cls.shape
    s, c = segments, crops
    b = n // (s * c)
    if b * s * c != n:
        raise ValueError(f"view_inputs: {n} views are not files × {s} segments × {c} crops")
    if cfg.input == "tokens":
        if tokens is None:
            raise ValueError("view_inputs: an attentive head reads every token; none were given")
        tokens = tokens.to(torch.float16 if cfg.token_dtype == "float16" else torch.float32)
        tokens = tokens.view(b, s, c, tokens.shape[1], d).transpose(1, 2)  # [B, C, S, 1+L, D]
        return tokens.reshape(b * c, s * tokens.shape[3], d)
    x = cls.float() if cfg.input == "cls" else mean.float()
    return x.view(b, s, c, d).transpose(1, 2).reshape(b * c, s, d).mean(1)


class VideoClassifier(nn.Module):
    """``encoder`` + ``head``: normalised clips ``[N, C, T, H, W]`` -> logits (see the module doc)."""

    def __init__(self, encoder: VideoEncoder, head_cfg: HeadConfig, head: nn.Module | None = None) -> None:
        super().__init__()
        if head_cfg.dim != encoder.num_features:  # dim per readout layer (cfg.readout_layers)
            raise ValueError(
                f"classifier: a head of width {head_cfg.dim} on an encoder of width {encoder.num_features}"
            )
        self.encoder, self.head_cfg = encoder, head_cfg
        self.head = head if head is not None else build_head(head_cfg)

    def forward(
        self,
        video: Tensor,
        *,
        segments: int = 1,
        crops: int = 1,
        drop_ratio: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Logits ``[B·crops, classes]`` of each (file, crop) sample; ``drop_ratio > 0``: the encoder drops that
        fraction of the patch tokens at random as in pretraining, drawn from ``generator`` (fine-tuning on a
        kept fraction)."""
        drop = drop_ratio > 0
        out = self.encoder.forward_features(video, drop=drop, generator=generator, drop_ratio=drop_ratio)
        patches = out.patches.float()
        tokens = torch.cat([out.cls[:, None], out.patches], 1) if self.head_cfg.input == "tokens" else None
        inputs = view_inputs(out.cls, patches.mean(1), tokens, self.head_cfg, segments, crops)
        return self.head(inputs)[0]

    def probabilities_from(
        self, cls: Tensor, mean: Tensor, tokens: Tensor | None, *, segments: int = 1, crops: int = 1
    ) -> Tensor:
        """Class probabilities ``[B, classes]`` of each file from the frozen features of its views (what
        ``levjepa.infer.encode.encode`` computes): the softmax of every crop, averaged."""
        logits = self.head(view_inputs(cls, mean, tokens, self.head_cfg, segments, crops))[0]
        probs = logits.float().softmax(-1)
        return probs.view(-1, crops, probs.shape[-1]).mean(1)
