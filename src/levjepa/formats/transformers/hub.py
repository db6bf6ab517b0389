"""The official calling convention, ``from_pretrained`` and ``push_to_hub``: code written against the official
LeVJEPA model runs unchanged on a levjepa export, on the released checkpoint and on imported official weights.

``LeVJEPAModel(pixel_values=video)`` takes ``[B, C, T, H, W]`` ImageNet-normalised clips (``[B, C, H, W]`` is
one frame per clip; ``pixel_values_videos`` ``[B, T, C, H, W]`` is transformers' video layout) and returns
:class:`LeVJEPAOutput` (``levjepa.formats.transformers.outputs``: ``last_hidden_state``, ``pooler_output``, and the
``depth + 1`` ``hidden_states`` when asked; with readout layers — ``from_pretrained(..., layers=[5, 11, 17, 23])``
or an export made with ``--layers`` — ``last_hidden_state`` is their readout, concatenated on channels). A
fine-tuned classifier's export gives a
:class:`LeVJEPAForVideoClassification` instead: ``logits`` over ``model.config.id2label``. Nothing is dropped;
the model is frozen (``eval()``, no gradients) as ``levjepa.load`` returns it.

:func:`from_pretrained` takes a local directory (a levjepa export, a run, a checkpoint; offline) or a hub repo
id (``ORG/NAME`` with ``revision``), resolved with ``huggingface_hub`` (the ``hub`` extra; the hub cache
offline with ``HF_HUB_OFFLINE=1``, ``levjepa.formats.reading.origin``). Official LeVJEPA weights — the released
checkpoint ``galilai-group/LeVJEPA-VideoMix-Large`` included — are imported on the fly
(``levjepa.formats.reading.official``; ``heads``, ``attention`` give what a source does not state), and the model's
``weights_info`` names the source, the revision and the weights file's SHA-256 (checked against ``sha256=``
and the pinned releases).

:func:`push_to_hub` publishes an export folder with ``huggingface_hub``'s ``create_repo`` + ``upload_folder``
(``levjepa export ... --push-to-hub ORG/NAME``). :func:`register_transformers` registers ``model_type:
levjepa`` with transformers' auto classes (``auto.py``, ``video_processor.py``); ``import levjepa``
arranges for it to run when transformers' auto classes are imported, in either order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from levjepa.config import from_dict
from levjepa.formats.reading.classifier import export_head_state, head_module
from levjepa.formats.reading.load import (
    LoadedEncoder,
    Preprocessing,
    freeze,
    is_official_folder,
    load_encoder,
    load_official,
    read_hub_config,
)
from levjepa.formats.reading.official import Overrides
from levjepa.formats.reading.origin import Origin, first_line, hub_errors, hub_offline, resolve
from levjepa.formats.transformers.outputs import (
    LeVJEPAClassifierOutput,
    LeVJEPAOutput,
    hub_forward,
    hub_logits,
    video_input,
)
from levjepa.model import EncoderConfig, VideoEncoder
from levjepa.model.classifier import HeadConfig
from levjepa.model.readout_layers import layers_text
from levjepa.weights import CONFIG, HUB_WEIGHTS, WeightsError

__all__ = [
    "ClassifierConfig",
    "LeVJEPAForVideoClassification",
    "LeVJEPAModel",
    "LeVJEPAOutput",
    "from_pretrained",
    "push_to_hub",
    "register_transformers",
]


class LeVJEPAModel(nn.Module):
    """A frozen levjepa encoder behind the official model's interface (``model(pixel_values=video)``)."""

    def __init__(self, encoder: VideoEncoder, preprocessing: Preprocessing | None = None, info: str = "") -> None:
        super().__init__()
        self.encoder = encoder
        self.preprocessing = preprocessing or Preprocessing()
        self.weights_info = info or encoder.weights_info

    @property
    def config(self) -> EncoderConfig:
        return self.encoder.cfg

    def forward(
        self,
        pixel_values: Tensor | None = None,
        output_hidden_states: bool = False,
        *,
        pixel_values_videos: Tensor | None = None,
        output_attentions: bool | None = None,
    ) -> LeVJEPAOutput:
        video = video_input(pixel_values, pixel_values_videos, output_attentions, self.encoder.cfg.in_chans)
        return hub_forward(self.encoder, video, output_hidden_states)

    def get_vision_features(self, pixel_values_videos: Tensor) -> Tensor:
        """transformers' video models' name (V-JEPA 2's): ``last_hidden_state`` of clips ``[B, T, C, H, W]``."""
        return self(pixel_values_videos=pixel_values_videos).last_hidden_state

    @classmethod
    def from_pretrained(
        cls, path_or_repo_id: str | Path, **kwargs: Any
    ) -> LeVJEPAModel | LeVJEPAForVideoClassification:
        return from_pretrained(path_or_repo_id, **kwargs)


@dataclass(frozen=True)
class ClassifierConfig:
    """A classifier's configuration as transformers' configs name it: the encoder, the head, the labels."""

    encoder: EncoderConfig
    head: HeadConfig
    id2label: dict[int, str] = field(default_factory=dict)

    @property
    def label2id(self) -> dict[str, int]:
        return {n: i for i, n in self.id2label.items()}

    @property
    def num_labels(self) -> int:
        return len(self.id2label)


class LeVJEPAForVideoClassification(nn.Module):
    """A fine-tuned classifier's export: the encoder and its head, frozen; ``logits`` over ``config.id2label``
    (one view per clip, as transformers' video classifiers; ``levjepa classify`` adds segments and crops)."""

    def __init__(
        self,
        encoder: VideoEncoder,
        head_cfg: HeadConfig,
        head: nn.Module,
        labels: dict[int, str],
        preprocessing: Preprocessing | None = None,
        info: str = "",
    ) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head
        self._config = ClassifierConfig(encoder.cfg, head_cfg, dict(labels))
        self.preprocessing = preprocessing or Preprocessing()
        self.weights_info = info or encoder.weights_info

    @property
    def config(self) -> ClassifierConfig:
        return self._config

    def forward(
        self,
        pixel_values: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        *,
        pixel_values_videos: Tensor | None = None,
        output_attentions: bool | None = None,
    ) -> LeVJEPAClassifierOutput:
        video = video_input(pixel_values, pixel_values_videos, output_attentions, self.encoder.cfg.in_chans)
        features = hub_forward(self.encoder, video, output_hidden_states)
        return hub_logits(features, self.head, self._config.head, labels)


HubModel = LeVJEPAModel | LeVJEPAForVideoClassification


def _classifier_head(folder: Path, data: dict[str, Any]) -> tuple[HeadConfig, nn.Module, dict[int, str]] | None:
    """A classifier export's head (``config.json``'s ``head`` + ``id2label``, weights ``head.*`` of
    ``model.safetensors``), or ``None`` for an encoder."""
    if not isinstance(data.get("head"), dict):
        return None
    where = folder / CONFIG
    head_cfg = from_dict(HeadConfig, data["head"])
    labels = {int(i): str(n) for i, n in (data.get("id2label") or {}).items()}
    if sorted(labels) != list(range(head_cfg.num_classes)):
        raise WeightsError(f"{where}: id2label names {len(labels)} classes, the head has {head_cfg.num_classes}")
    head = head_module(head_cfg, export_head_state(folder), folder / HUB_WEIGHTS)
    return head_cfg, freeze(head), labels


def _is_official(origin: Origin) -> bool:
    p = origin.path
    return is_official_folder(p) or (p.is_file() and p.suffix == ".ckpt")


def from_pretrained(
    path_or_repo_id: str | Path,
    *,
    weights: str = "ema",
    device: str | torch.device = "cpu",
    revision: str | None = None,
    sha256: str | None = None,
    heads: int | None = None,
    attention: str | None = None,
    layers: Sequence[int] | None = None,
) -> HubModel:
    """A :class:`LeVJEPAModel` (or :class:`LeVJEPAForVideoClassification`) from a local export / run /
    checkpoint, official weights or a hub repo id (see the module doc). ``layers``: read these blocks instead
    (negative from the end; several concatenated on channels, ``levjepa.model.readout_layers``, e.g. V-JEPA
    2.1's ``[5, 11, 17, 23]`` of a ViT-L); left out, the source's own readout (its last block, or the blocks an
    export records). A classifier reads the blocks its head was trained on: others are refused."""
    origin = resolve(path_or_repo_id, revision)
    if _is_official(origin):
        loaded = load_official(
            origin, weights=weights, device=device, overrides=Overrides(heads=heads, attention=attention), sha256=sha256
        )
    else:
        loaded = load_encoder(origin.path, weights=weights, device=device)  # type: ignore[arg-type]
        if origin.repo_id is not None or sha256 is not None:
            record = origin.record(sha256)
            loaded.source = f"{record['source']}" + (f"@{record['revision']}" if record["revision"] else "")
    return _model(loaded, origin, device, layers)


def _model(
    loaded: LoadedEncoder, origin: Origin, device: str | torch.device, layers: Sequence[int] | None = None
) -> LeVJEPAModel | LeVJEPAForVideoClassification:
    data = read_hub_config(origin.path) if origin.path.is_dir() and loaded.kind == "export" else None
    head = _classifier_head(origin.path, data) if data is not None else None
    if layers is not None:
        before = loaded.config.readout_layers
        loaded = loaded.with_readout(layers)
        if head is not None and loaded.config.readout_layers != before:
            raise WeightsError(
                f"layers={list(layers)}: {origin.path} is a classifier whose head reads "
                f"{layers_text(before, loaded.config.depth)}; leave layers out"
            )
    info = loaded.describe()
    loaded.encoder.weights_info = info
    if head is None:
        return LeVJEPAModel(loaded.encoder, loaded.preprocessing, info)
    head_cfg, module, labels = head
    return LeVJEPAForVideoClassification(
        loaded.encoder, head_cfg, module.to(device), labels, loaded.preprocessing, info
    )


def push_to_hub(folder: str | Path, repo_id: str, *, private: bool = False, message: str | None = None) -> str:
    """Publish an export folder as the model repo ``repo_id`` (created when missing) with huggingface_hub;
    returns the commit's URL. The token is huggingface_hub's (``hf auth login`` or ``HF_TOKEN``).

    With ``HF_HUB_OFFLINE`` set the network is not tried; offline, or when the hub cannot be reached or
    refuses, one :class:`WeightsError` line says the folder is written, the push not done and why, and gives
    huggingface_hub's own command that pushes the same folder later (``hf upload``)."""
    try:
        from huggingface_hub import create_repo, upload_folder
    except ImportError as err:
        raise WeightsError(f"--push-to-hub {repo_id}: needs huggingface_hub (pip install 'levjepa[hub]')") from err
    folder = Path(folder)
    if not (folder / CONFIG).is_file():
        raise WeightsError(f"{folder}: not an export folder (no {CONFIG}); write one with levjepa export first")
    retry = f"`hf upload {repo_id} {folder} .{' --private' if private else ''}`"
    if hub_offline():
        raise WeightsError(f"{folder} is written; not pushed to {repo_id}: HF_HUB_OFFLINE is set; push it with {retry}")
    try:
        create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type="model",
            commit_message=message or f"levjepa export ({folder.name})",
        )
    except hub_errors() as err:
        raise WeightsError(
            f"{folder} is written; not pushed to {repo_id}: the hub cannot be reached or refused it "
            f"({first_line(err)}); push it with {retry}"
        ) from err
    return str(getattr(commit, "commit_url", commit))


_REGISTERED: set[str] = set()
CONFIG_HOOK = "configuration_auto"  # the tails of the transformers modules the post-import hook watches
MODELS_HOOK = "modeling_auto"
VIDEO_HOOK = "video_processing_auto"


def register_transformers(trigger: str | None = None) -> bool:
    """Register ``model_type: levjepa`` with transformers' ``AutoConfig``, its ``AutoModel`` /
    ``AutoModelForVideoClassification`` and ``AutoVideoProcessor`` (``levjepa.formats.transformers.video_processor``);
    ``False`` when transformers cannot be imported. Idempotent.

    ``trigger``: the transformers module whose import called this (``levjepa/__init__.py``'s post-import
    hook): after ``...configuration_auto`` only the config is registered (transformers' model classes may not
    exist yet), after ``...modeling_auto`` the models, after ``...video_processing_auto`` the video processor;
    ``None`` (a call by hand) registers all three."""
    parts = [p for p in (CONFIG_HOOK, MODELS_HOOK, VIDEO_HOOK) if trigger is None or trigger.endswith(p)]
    try:
        for part in parts:
            if part in _REGISTERED:
                continue
            if part == CONFIG_HOOK:
                from levjepa.formats.transformers.config import register
            elif part == MODELS_HOOK:
                from levjepa.formats.transformers.auto import register
            else:
                from levjepa.formats.transformers.video_processor import register
            register()
            _REGISTERED.add(part)
    except ImportError:
        return False
    return True
