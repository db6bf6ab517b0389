"""The LeVJEPA video encoder (ViT with per-frame patches, token dropping, 3D RoPE, block-causal
attention) and its training-only projector. Read ``vit.py`` first; ``tokens.py``, ``rope.py`` and
``attention.py`` hold one concept each."""

from __future__ import annotations

from levjepa.model.config import ENCODER_PRESETS, EncoderConfig, encoder_config
from levjepa.model.heads import Projector
from levjepa.model.vit import EncoderOutput, VideoEncoder

__all__ = ["ENCODER_PRESETS", "EncoderConfig", "EncoderOutput", "Projector", "VideoEncoder", "encoder_config"]
