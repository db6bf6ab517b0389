"""transformers' view of a levjepa export: ``AutoConfig`` / ``AutoModel`` for ``model_type: levjepa``.

Imported only where transformers is installed (``levjepa.formats.hub.register_transformers``). The model
holds a levjepa ``VideoEncoder`` as ``encoder`` (``base_model_prefix``) and returns transformers'
``BaseModelOutputWithPooling`` with the same tensors as ``levjepa.LeVJEPAModel``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling

from levjepa.config import from_dict
from levjepa.formats.outputs import hub_forward
from levjepa.model import EncoderConfig, VideoEncoder

__all__ = ["LeVJEPAConfig", "LeVJEPATransformersModel", "register"]


class LeVJEPAConfig(PretrainedConfig):
    """A levjepa export's ``config.json``; ``encoder`` holds every ``EncoderConfig`` field."""

    model_type = "levjepa"

    def __init__(self, encoder: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.encoder = dict(encoder or {})
        super().__init__(**kwargs)

    def encoder_config(self) -> EncoderConfig:
        return from_dict(EncoderConfig, self.encoder)


class LeVJEPATransformersModel(PreTrainedModel):
    """``AutoModel.from_pretrained(EXPORT_DIR)``: ``model(pixel_values=video)`` as the official model."""

    config_class = LeVJEPAConfig
    base_model_prefix = "encoder"
    main_input_name = "pixel_values"

    def __init__(self, config: LeVJEPAConfig) -> None:
        super().__init__(config)
        self.encoder = VideoEncoder(config.encoder_config())
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: ``VideoEncoder`` initialises itself, and the export's weights replace it."""

    def forward(
        self, pixel_values: torch.Tensor, output_hidden_states: bool | None = None, return_dict: bool | None = None
    ) -> BaseModelOutputWithPooling | tuple[Any, ...]:
        out = hub_forward(self.encoder, pixel_values, bool(output_hidden_states))
        if return_dict is False:
            return out.to_tuple()
        return BaseModelOutputWithPooling(
            last_hidden_state=out.last_hidden_state, pooler_output=out.pooler_output, hidden_states=out.hidden_states
        )


def register() -> None:
    AutoConfig.register("levjepa", LeVJEPAConfig, exist_ok=True)
    AutoModel.register(LeVJEPAConfig, LeVJEPATransformersModel, exist_ok=True)
