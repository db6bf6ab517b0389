"""The official calling convention and ``from_pretrained``: code written against the official LeVJEPA model
runs unchanged on a levjepa export and on imported official weights.

``LeVJEPAModel(pixel_values)`` takes ``[B, C, T, H, W]`` ImageNet-normalised clips (a ``[B, C, H, W]`` image
batch is one frame per clip) and returns :class:`LeVJEPAOutput`: ``last_hidden_state`` ``[B, 1 + N, D]``
(CLS first, then every patch token in ``(t, y, x)`` order, after the final norm) and ``pooler_output``
``[B, D]`` (the CLS), plus ``hidden_states`` (the embedding and every block's output, before the final norm)
when asked — the fields of transformers' ``BaseModelOutputWithPooling``, readable by name, by key and by
index. Nothing is dropped; the model is frozen (``eval()``, no gradients) as ``levjepa.load`` returns it.

:func:`from_pretrained` takes a local directory (a levjepa export, a run, a checkpoint; offline) or a hub repo
id, downloaded with ``huggingface_hub`` (the ``hub`` extra). A directory that holds official LeVJEPA weights
instead of a levjepa export is imported on the fly (``levjepa.formats.official``; the keyword arguments
``heads``, ``attention`` give what it does not state).

With ``transformers`` importable, :func:`register_transformers` registers the ``levjepa`` model type with
``AutoConfig`` / ``AutoModel`` (no ``trust_remote_code``); ``import levjepa`` calls it when transformers is
already imported, ``import levjepa.formats.hub`` always tries.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from levjepa.formats.load import Preprocessing, freeze, load_encoder
from levjepa.formats.official import Overrides, read_official
from levjepa.formats.outputs import LeVJEPAOutput, hub_forward
from levjepa.model import VideoEncoder
from levjepa.weights import WeightsError

__all__ = ["LeVJEPAModel", "LeVJEPAOutput", "from_pretrained", "register_transformers"]


class LeVJEPAModel(nn.Module):
    """A frozen levjepa encoder behind the official model's interface (``model(pixel_values=video)``)."""

    def __init__(self, encoder: VideoEncoder, preprocessing: Preprocessing | None = None, info: str = "") -> None:
        super().__init__()
        self.encoder = encoder
        self.preprocessing = preprocessing or Preprocessing()
        self.weights_info = info or encoder.weights_info

    @property
    def config(self) -> Any:
        return self.encoder.cfg

    def forward(self, pixel_values: Tensor, output_hidden_states: bool = False) -> LeVJEPAOutput:
        return hub_forward(self.encoder, pixel_values, output_hidden_states)

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | Path, **kwargs: Any) -> LeVJEPAModel:
        return from_pretrained(path_or_repo_id, **kwargs)


def _download(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        raise WeightsError(
            f"{repo_id}: not a local directory; a hub repo id needs huggingface_hub "
            "(pip install 'levjepa[hub]'), or download it and pass the folder"
        ) from err
    return Path(snapshot_download(repo_id, revision=revision))


def from_pretrained(
    path_or_repo_id: str | Path,
    *,
    weights: str = "ema",
    device: str | torch.device = "cpu",
    revision: str | None = None,
    heads: int | None = None,
    attention: str | None = None,
) -> LeVJEPAModel:
    """A :class:`LeVJEPAModel` from a local export / run / checkpoint or a hub repo id (see the module doc)."""
    path = Path(path_or_repo_id)
    if not path.exists():
        text = str(path_or_repo_id)
        if text.count("/") != 1 or text.startswith((".", "/")):
            raise WeightsError(f"{text}: no such directory, and not a hub repo id (ORG/NAME)")
        path = _download(text, revision)
    try:
        loaded = load_encoder(path, weights=weights, device=device)  # type: ignore[arg-type]
    except WeightsError:
        if not (path.is_dir() and (path / "config.json").is_file()) and path.suffix != ".ckpt":
            raise
        official = read_official(path, Overrides(heads=heads, attention=attention), weights=weights)
        encoder = VideoEncoder(official.config)
        encoder.load_state_dict(official.encoder, strict=True)
        freeze(encoder.to(device))
        return LeVJEPAModel(encoder, Preprocessing(), f"{official.note} from {official.source} (imported)")
    loaded.encoder.weights_info = loaded.describe()
    return LeVJEPAModel(loaded.encoder, loaded.preprocessing, loaded.describe())


_REGISTERED = False


def register_transformers() -> bool:
    """Register ``model_type: levjepa`` with transformers' ``AutoConfig`` / ``AutoModel``; ``False`` when
    transformers cannot be imported. Idempotent."""
    global _REGISTERED
    if _REGISTERED:
        return True
    try:
        from levjepa.formats.transformers_auto import register
    except ImportError:
        return False
    register()
    _REGISTERED = True
    return True


if "transformers" in sys.modules:  # imported by the user already: registering costs nothing more
    register_transformers()
