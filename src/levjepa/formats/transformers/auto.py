"""transformers' models of ``model_type: levjepa``, without remote code: :func:`register` registers
``LeVJEPATransformersModel`` with ``AutoModel`` and ``LeVJEPATransformersForVideoClassification`` with
``AutoModelForVideoClassification``, and nothing else. The config (``LeVJEPAConfig``, ``AutoConfig``) is
``config.py``'s, registered by its own ``register`` as soon as ``configuration_auto`` is imported;
the video processor (``AutoVideoProcessor``) is ``video_processor.py``'s, registered once
``video_processing_auto`` is imported; no image processor is registered: an export's
``preprocessor_config.json`` names transformers' own ``VideoMAEImageProcessor``, which ``AutoImageProcessor``
finds by that name.

Imported only where transformers is installed (``levjepa.formats.transformers.hub.register_transformers``, which the
post-import hook of ``levjepa/__init__.py`` calls in either import order, once ``modeling_auto`` is imported).

**Two schemas share ``model_type: levjepa``** and ``LeVJEPAConfig`` reads both:

* a levjepa export (``levjepa.formats.writing.export``): an ``encoder`` section with every ``EncoderConfig`` field,
  weights in levjepa's names (no prefix; ``encoder.`` once transformers' ``save_pretrained`` wrote them);
* the released official checkpoint (``galilai-group/LeVJEPA-VideoMix-Large``, whose remote code this
  replaces): the official ``VisionTransformer``'s arguments at the top level (``embed_dim``, ``depth``,
  ``num_heads``, ``attn_mode``, ...: ``levjepa.formats.reading.official.RELEASED_KEYS``), weights under ``encoder.``
  in the official layout (a Conv patch kernel, ``qkv`` rows in the official RoPE channel order).

For the second, the model's ``encoder`` is :class:`OfficialLayout`: it holds its parameters in the official
names and shapes — so transformers loads the released file strictly, with its own loader, and
``save_pretrained`` writes the released layout back — and computes with levjepa's ``VideoEncoder`` in the
``vjepa2`` RoPE layout: each call maps the parameters differentiably (``official.to_levjepa``: a view of the
kernel, a row permutation of ``qkv``) onto a parameter-free template of that encoder
(``torch.func.functional_call``), which computes the official function (``tests/test_hub_auto.py`` against
the official code's outputs). Fine-tuning it trains the official-layout parameters.

Inputs and outputs follow ``levjepa.formats.transformers.outputs``: ``pixel_values`` ``[B, C, T, H, W]`` (or frames
first, as the image processor stacks them, told apart by the channel count) or ``pixel_values_videos``
``[B, T, C, H, W]``; ``get_vision_features`` (V-JEPA 2's name) is ``last_hidden_state``;
``BaseModelOutputWithPooling`` with ``depth + 1`` hidden states; ``output_attentions`` refused in one line; the
classifier's ``ImageClassifierOutput`` with ``id2label`` in its config (a classifier's export: ``head``
section + ``head.*`` weights). Readout layers — an export's ``encoder.readout_layers`` (``levjepa export --layers``)
or ``AutoModel.from_pretrained(DIR, readout_layers=[5, 11, 17, 23])`` on either schema — make
``last_hidden_state`` the readout of those blocks, concatenated on channels (``levjepa.model.readout_layers``).

The image processor is transformers' ``VideoMAEImageProcessor`` (its Pillow backend without torchvision),
which an export's ``preprocessor_config.json`` names: frames resized on the short side, centre-cropped,
``/ 255``, normalised, stacked ``[B, T, C, H, W]`` under the name ``pixel_values``. The video processor
(``video_preprocessor_config.json``, preferred by the video-classification pipeline) also samples a file's
frames as the model was trained.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput
from transformers.modeling_utils import PreTrainedModel
from transformers.models.auto.modeling_auto import AutoModel, AutoModelForVideoClassification

from levjepa.formats.reading.official import ANCHOR, official_state_shapes, released_config, to_levjepa
from levjepa.formats.transformers.config import LeVJEPAConfig
from levjepa.formats.transformers.outputs import LeVJEPAOutput, hub_forward, hub_logits, video_input
from levjepa.model import EncoderConfig, VideoEncoder
from levjepa.model.classifier import build_head
from levjepa.weights import refuse_nonfinite

__all__ = [
    "LeVJEPATransformersForVideoClassification",
    "LeVJEPATransformersModel",
    "OfficialLayout",
    "register",
]


class _Call(nn.Module):
    """The template encoder behind one call: ``functional_call`` gives it the mapped parameters."""

    def __init__(self, encoder: VideoEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, video: Tensor, output_hidden_states: bool) -> LeVJEPAOutput:
        return hub_forward(self.encoder, video, output_hidden_states)


class OfficialLayout(nn.Module):
    """An encoder whose parameters are the official checkpoint's (names and shapes: ``cls_token``,
    ``patch_embed.proj``, ``blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}``, ``norm``), computing
    with levjepa's ``VideoEncoder`` (module doc)."""

    _template: _Call  # set in __dict__: not a submodule, it holds no weights of its own

    def __init__(self, config: dict[str, Any], cfg: EncoderConfig | None = None) -> None:
        """``config``: the released schema; ``cfg``: the ``EncoderConfig`` it computes with, when not the schema's
        own (``LeVJEPAConfig.encoder_config``: read at other blocks)."""
        super().__init__()
        cfg = released_config(config) if cfg is None else cfg
        shapes = official_state_shapes(config)
        d, hidden, eps = cfg.dim, cfg.mlp_hidden, cfg.norm_eps
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        p, t, c = cfg.patch_size, cfg.tubelet, cfg.in_chans
        video = len(shapes[ANCHOR]) == 5  # a Conv3d kernel (τ, p, p); an image model's is a Conv2d (p, p)
        proj = nn.Conv3d(c, d, (t, p, p), (t, p, p)) if video else nn.Conv2d(c, d, p, p)
        self.patch_embed = nn.ModuleDict({"proj": proj})
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm1": nn.LayerNorm(d, eps=eps),
                    "attn": nn.ModuleDict({"qkv": nn.Linear(d, 3 * d, bias=cfg.qkv_bias), "proj": nn.Linear(d, d)}),
                    "norm2": nn.LayerNorm(d, eps=eps),
                    "mlp": nn.ModuleDict({"fc1": nn.Linear(d, hidden), "fc2": nn.Linear(hidden, d)}),
                }
            )
            for _ in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(d, eps=eps)
        self.cfg = cfg
        with torch.device("meta"):
            template = _Call(VideoEncoder(cfg))
        self.__dict__["_template"] = template

    def forward(self, video: Tensor, output_hidden_states: bool = False) -> LeVJEPAOutput:
        # the parameters in levjepa's names and layout, as differentiable functions of the official ones
        state = {f"encoder.{k}": v for k, v in to_levjepa(dict(self.named_parameters()), self.cfg).items()}
        out: LeVJEPAOutput = torch.func.functional_call(self._template, state, (video, output_hidden_states))
        return out


def _encoder(config: LeVJEPAConfig) -> nn.Module:
    if config.layout == "official":
        return OfficialLayout(vars(config), config.encoder_config())
    return VideoEncoder(config.encoder_config())


class _LeVJEPAPreTrained(PreTrainedModel):
    config_class = LeVJEPAConfig
    base_model_prefix = "encoder"
    main_input_name = "pixel_values"

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """transformers' own loader, then what ``levjepa.load`` refuses too: a weight holding a NaN or an
        infinity, named (``levjepa.weights.refuse_nonfinite``) — such a model gives NaN for every input."""
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True: (model, info)
        where = args[0] if args else kwargs.get("pretrained_model_name_or_path", cls.__name__)
        refuse_nonfinite(dict(model.state_dict()), str(where))
        return loaded

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: the encoder and head initialise themselves, and the checkpoint's weights replace them."""

    def _channels(self) -> int:
        """The channels a frame has (what tells ``[B, C, T, H, W]`` from ``[B, T, C, H, W]``)."""
        encoder = self.encoder
        assert isinstance(encoder, (OfficialLayout, VideoEncoder))
        return encoder.cfg.in_chans

    def _features(self, video: Tensor, output_hidden_states: bool) -> LeVJEPAOutput:
        encoder = self.encoder
        if isinstance(encoder, OfficialLayout):
            return encoder(video, output_hidden_states)
        assert isinstance(encoder, VideoEncoder)
        return hub_forward(encoder, video, output_hidden_states)


class LeVJEPATransformersModel(_LeVJEPAPreTrained):
    """``AutoModel.from_pretrained(DIR)``: ``model(pixel_values=video)`` as the official model."""

    def __init__(self, config: LeVJEPAConfig) -> None:
        super().__init__(config)
        self.encoder = _encoder(config)
        self.post_init()

    def forward(
        self,
        pixel_values: Tensor | None = None,
        pixel_values_videos: Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPooling | tuple[Any, ...]:
        video = video_input(pixel_values, pixel_values_videos, output_attentions, self._channels())
        out = self._features(video, bool(output_hidden_states))
        if return_dict is False:
            return out.to_tuple()
        return BaseModelOutputWithPooling(
            last_hidden_state=out.last_hidden_state, pooler_output=out.pooler_output, hidden_states=out.hidden_states
        )

    def get_vision_features(self, pixel_values_videos: Tensor) -> Tensor:
        """transformers' video models' name (V-JEPA 2's): ``last_hidden_state`` of clips ``[B, T, C, H, W]``."""
        out = self(pixel_values_videos=pixel_values_videos)
        assert isinstance(out, BaseModelOutputWithPooling) and out.last_hidden_state is not None
        return out.last_hidden_state


class LeVJEPATransformersForVideoClassification(_LeVJEPAPreTrained):
    """``AutoModelForVideoClassification.from_pretrained(DIR)`` on a fine-tuned classifier's export: the
    encoder and the head (``head.*``), logits over ``config.id2label``."""

    def __init__(self, config: LeVJEPAConfig) -> None:
        super().__init__(config)
        self.head_cfg = config.head_config()
        if self.head_cfg.num_classes != config.num_labels:
            raise ValueError(
                f"config: the head has {self.head_cfg.num_classes} classes, id2label names {config.num_labels}"
            )
        width = config.encoder_config().readout_dim
        if self.head_cfg.dim != width:  # read at other blocks than the head was trained on
            raise ValueError(f"config: the head reads {self.head_cfg.dim} channels, the encoder's readout has {width}")
        self.encoder = _encoder(config)
        self.head = build_head(self.head_cfg)
        self.post_init()

    def forward(
        self,
        pixel_values: Tensor | None = None,
        pixel_values_videos: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> ImageClassifierOutput | tuple[Any, ...]:
        video = video_input(pixel_values, pixel_values_videos, output_attentions, self._channels())
        out = hub_logits(self._features(video, bool(output_hidden_states)), self.head, self.head_cfg, labels)
        if return_dict is False:
            return out.to_tuple()
        return ImageClassifierOutput(loss=out.loss, logits=out.logits, hidden_states=out.hidden_states)


def register() -> None:
    """Register the models of ``model_type: levjepa`` with transformers' auto model classes (idempotent;
    ``config.register`` registers the config)."""
    AutoModel.register(LeVJEPAConfig, LeVJEPATransformersModel, exist_ok=True)
    AutoModelForVideoClassification.register(LeVJEPAConfig, LeVJEPATransformersForVideoClassification, exist_ok=True)
