"""transformers' config of ``model_type: levjepa`` (``AutoConfig``): a levjepa export's schema or the released
official checkpoint's (``auto.py`` says what each holds).

Its own module, importing only transformers' configuration classes: the post-import hook of
``levjepa/__init__.py`` registers it the moment ``transformers.models.auto.configuration_auto`` is imported,
before transformers' model classes exist (``AutoConfig.from_pretrained`` alone must know ``levjepa``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers.configuration_utils import PretrainedConfig
from transformers.models.auto.configuration_auto import AutoConfig

from levjepa.config import from_dict
from levjepa.formats.reading.official import is_released_schema, released_config
from levjepa.model import EncoderConfig
from levjepa.model.classifier import HeadConfig

__all__ = ["LeVJEPAConfig", "register"]


class LeVJEPAConfig(PretrainedConfig):
    """``config.json`` of ``model_type: levjepa`` in either schema (module doc); ``head``: a classifier's
    ``HeadConfig`` fields (with ``id2label``); ``readout_layers``: the blocks the model reads instead of the
    encoder section's (``AutoModel.from_pretrained(DIR, readout_layers=[5, 11, 17, 23])``: several concatenated
    on channels, negative from the end; ``levjepa.model.readout_layers``), for either schema."""

    model_type = "levjepa"
    encoder: dict[str, Any] | None = None  # class defaults: an absent section is not written back as null
    head: dict[str, Any] | None = None
    readout_layers: list[int] | None = None

    def __init__(
        self,
        encoder: dict[str, Any] | None = None,
        head: dict[str, Any] | None = None,
        readout_layers: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if encoder:
            self.encoder = dict(encoder)
        if head:
            self.head = dict(head)
        if readout_layers is not None:
            self.readout_layers = [int(i) for i in readout_layers]
        super().__init__(**kwargs)

    @property
    def layout(self) -> str:
        """``"official"`` for the released schema, ``"levjepa"`` for a levjepa export."""
        return "official" if self.encoder is None and is_released_schema(vars(self)) else "levjepa"

    def encoder_config(self) -> EncoderConfig:
        """The ``EncoderConfig`` the model computes with: the schema's, read at ``readout_layers`` when given."""
        cfg = released_config(vars(self)) if self.layout == "official" else from_dict(EncoderConfig, self.encoder or {})
        if self.readout_layers is None:
            return cfg
        return dataclasses.replace(cfg, readout_layers=tuple(self.readout_layers))

    def head_config(self) -> HeadConfig:
        if not self.head:
            raise ValueError(
                "this config has no classification head ('head' section): load it with AutoModel, or export a "
                "fine-tuned classifier (levjepa export FT_DIR) for AutoModelForVideoClassification"
            )
        return from_dict(HeadConfig, self.head)


def register() -> None:
    """Register ``model_type: levjepa`` with ``AutoConfig`` (idempotent)."""
    AutoConfig.register("levjepa", LeVJEPAConfig, exist_ok=True)
