"""Read the official LeVJEPA checkpoints (``MLO-lab/LeVJEPA``) into levjepa's encoder and projector, exactly.

Sources (:func:`read_official`):

* a **Hugging Face repo directory** (``config.json`` + ``model.safetensors``, or sharded with
  ``model.safetensors.index.json``), e.g. a download of ``galilai-group/LeVJEPA-VideoMix-Large``;
* an official **training checkpoint** (``.ckpt``, Lightning): ``state_dict`` holds ``encoder.*`` and
  ``projector.net.*`` (and SIGReg's buffers), ``state_dict_ema`` the EMA copy of the encoder (the
  official config's ``ema.save_key``), ``hyper_parameters`` the run's config;
* a bare **safetensors file** of official tensors.

What the official encoder computes, and how levjepa computes the same function (each difference is an
``EncoderConfig`` option, recorded in the export; the defaults of a levjepa encoder are not touched):

* 3D RoPE in V-JEPA 2's "pretrained-compatible" layout, CLS unrotated -> ``rope_layout="vjepa2"``
  (``levjepa.model.rope``); the query and key rows of each head's ``qkv`` weight are permuted into levjepa's
  pair order (:func:`levjepa.model.rope.vjepa2_channel_order`), which leaves every attention score as it was;
* a Conv3d patch embedding with kernel = stride ``(τ, p, p)`` (Conv2d for an image model) -> the same weights
  flattened into levjepa's per-patch Linear (pixels in ``(C, τ, p, p)`` order); τ and p come from its shape;
* the final LayerNorm has a bias -> ``final_norm_bias=True``; every LayerNorm's ``eps`` is 1e-6 in the official
  factories (``vit_tiny`` … ``vit_huge``), or what the config states;
* ``qkv`` bias, MLP ratio, width, depth: from the tensors;
* block-causal attention (``attn_mode="block_causal"``: patches read their own and earlier slots, never CLS;
  CLS reads everything) or full attention (``"full"`` -> ``bidirectional``): the same masks as levjepa's;
* the projector's first Linear has a bias, which levjepa's lacks: a bias right before a BatchNorm only moves
  the batch mean, so it is folded into the running mean (``running_mean − bias``), the same function in
  training and in evaluation mode.

What neither the tensors nor a config can tell — the number of heads, the attention mode — comes from the
caller (``levjepa import --heads N --attention block_causal``), and the error lists exactly what is missing.
Keys are matched by name below any prefix (``encoder.``, ``backbone.``, ``model.``, …).

Verified against the reference code (``tests/fixtures/official``: outputs of the official ``module.py`` on
random weights, every token within 1e-5): the encoder at τ = 1 and 2, block-causal and full attention, an
image model, and the projector in both BatchNorm modes; the ``.ckpt`` layout follows the official ``main.py``
and config. The released checkpoint ``galilai-group/LeVJEPA-VideoMix-Large`` (revision ``e831a03…``, pinned
with its SHA-256 in ``levjepa.formats.reading.origin``) states its encoder at the top level of its ``config.json`` in
the official ``VisionTransformer``'s argument names (:data:`RELEASED_KEYS`, ``model_type: levjepa``) and holds
293 tensors under ``encoder.``: :func:`released_config` builds its encoder from the config alone,
:func:`official_state_shapes` names its tensors (the contract ``tests/test_official.py`` pins at ViT-L on the
meta device, 303,099,904 parameters), and the fixture in that layout goes through ``AutoModel`` and the
importer alike.

Settings are read from the **encoder's own section** of a source's config only (:func:`encoder_section`: the
top level of a hub ``config.json``, a training config's ``model``): an optimizer's ``eps`` or a probe's
``num_heads`` elsewhere in the file is never taken for the encoder's. A config that contradicts the tensors
(width, depth, patch, channels, tubelet) is refused in one line.

A ``.ckpt`` is a pickle: it is read with ``torch.load(weights_only=True)`` (plain containers, tensors and
a short allow-list), never unpickled freely unless the caller opts in (``trust_pickle=True``,
``--trust-pickle``), which runs code from the file.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from levjepa.model import EncoderConfig
from levjepa.model.rope import vjepa2_channel_order
from levjepa.weights import WeightsError, is_pickle, load_tensors, read_json, refuse_nonfinite

__all__ = [
    "OFFICIAL_SIZES",
    "RELEASED_KEYS",
    "OfficialModel",
    "Overrides",
    "convert_encoder",
    "convert_projector",
    "encoder_section",
    "is_released_schema",
    "official_model",
    "official_state_shapes",
    "read_official",
    "released_config",
    "to_levjepa",
]

# the official factories (module.py vit_tiny ... vit_gigantic) by name: (width, depth, heads)
OFFICIAL_SIZES = {
    "vit_tiny": (192, 12, 3),
    "vit_small": (384, 12, 6),
    "vit_base": (768, 12, 12),
    "vit_large": (1024, 24, 16),
    "vit_huge": (1280, 32, 16),
    "vit_giant": (1408, 40, 16),
    "vit_gigantic": (1664, 48, 16),
}
ATTENTION_NAMES = {"block_causal": "block_causal", "full": "bidirectional", "bidirectional": "bidirectional"}
ANCHOR = "patch_embed.proj.weight"  # the one key every official encoder has
PROJECTOR_ANCHOR = "projector.net.0.weight"


@dataclass(frozen=True)
class Overrides:
    """What the caller states (``levjepa import`` options); ``None`` = take it from the source."""

    heads: int | None = None
    attention: str | None = None  # block_causal | bidirectional | full
    norm_eps: float | None = None
    prefix: str | None = None  # the key prefix of the encoder, when a file holds several


@dataclass
class OfficialModel:
    """An official model in levjepa's terms: the encoder config and state dict, the projector's when present."""

    config: EncoderConfig
    encoder: dict[str, torch.Tensor]
    projector: dict[str, torch.Tensor] | None
    source: str  # the file read
    copy: str  # which weights: "ema", "online" or "published"
    note: str  # said to the user: what was read, from where
    stated: dict[str, Any]  # what the source's config stated (recorded with the import)


# ------------------------------------------------------------------------------------------------ reading


def _trusted_load(path: Path, trust_pickle: bool) -> Any:
    if not is_pickle(path):
        raise WeightsError(f"{path}: not a training checkpoint (neither a torch.save archive nor a pickle)")
    if trust_pickle:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        with torch.serialization.safe_globals([pathlib.PosixPath, pathlib.PurePosixPath]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError, or a global outside the allow-list
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WeightsError(
            f"{path}: torch.load(weights_only=True) cannot read this checkpoint safely ({first}); if you trust "
            "its author, rerun with --trust-pickle (it unpickles the file, which can run code from it)"
        ) from err


def _read_source(src: Path, trust_pickle: bool) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any], Path]:
    """``({copy: tensors}, stated config, weights file)`` of a repo directory, a checkpoint or a tensors file."""
    if not src.exists():
        raise WeightsError(f"{src}: no such file or directory (expected an official LeVJEPA checkpoint)")
    if src.is_dir():
        cfg_file = src / "config.json"
        index = src / "model.safetensors.index.json"
        stated = read_json(cfg_file) if cfg_file.is_file() else {}
        if (src / "model.safetensors").is_file():
            tensors, meta = load_tensors(src / "model.safetensors")
            return {"published": tensors}, {**_meta_config(meta), **stated}, src / "model.safetensors"
        if index.is_file():
            shards = sorted(set(read_json(index).get("weight_map", {}).values()))
            if not shards:
                raise WeightsError(f"{index}: no 'weight_map' naming the weight shards")
            tensors = {}
            for shard in shards:
                tensors.update(load_tensors(src / shard)[0])
            return {"published": tensors}, stated, index
        raise WeightsError(f"{src}: no model.safetensors (or model.safetensors.index.json): not a model directory")
    if src.suffix == ".safetensors":
        tensors, meta = load_tensors(src)
        return {"published": tensors}, _meta_config(meta), src
    obj = _trusted_load(src, trust_pickle)
    if not isinstance(obj, Mapping):
        raise WeightsError(f"{src}: not a training checkpoint (a {type(obj).__name__}, expected a dict)")
    copies: dict[str, dict[str, torch.Tensor]] = {}
    for key, copy in (("state_dict_ema", "ema"), ("ema_state_dict", "ema"), ("state_dict", "online")):
        value = obj.get(key)
        if isinstance(value, Mapping):
            copies.setdefault(copy, {k: v for k, v in value.items() if isinstance(v, torch.Tensor)})
    if not copies and all(isinstance(v, torch.Tensor) for v in obj.values()):
        copies["published"] = dict(obj)  # a plain state dict saved with torch.save
    if not copies:
        raise WeightsError(f"{src}: no 'state_dict' in this checkpoint (keys: {', '.join(map(str, list(obj)[:8]))})")
    hparams = obj.get("hyper_parameters") or obj.get("hparams") or {}
    return copies, dict(hparams) if isinstance(hparams, Mapping) else {}, src


def _meta_config(meta: Mapping[str, str]) -> dict[str, Any]:
    text = meta.get("config")
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


# the keyword arguments of the official VisionTransformer that the released checkpoint's config.json states
# (galilai-group/LeVJEPA-VideoMix-Large, model_type "levjepa"): the released schema
RELEASED_KEYS = (
    "img_size",
    "patch_size",
    "num_frames",
    "tubelet_size",
    "in_chans",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "qkv_bias",
    "attn_mode",
    "token_drop_rate",
)
# what else an encoder's own section may state (the official config.yaml's `model`, HF aliases)
ENCODER_KEYS = (*RELEASED_KEYS, "name", "use_rope", "num_attention_heads", "layer_norm_eps", "norm_eps")
SECTIONS = ("model", "encoder", "backbone")  # where a training config keeps the encoder's settings


# keys only an encoder's own settings state: the top level is the encoder's section when it states one of them
STRUCTURAL_KEYS = ("embed_dim", "depth", "num_heads", "num_attention_heads", "attn_mode", "patch_size")


def encoder_section(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The part of a source's config that describes the encoder, and only that part: the top level when it
    states a structural key (:data:`STRUCTURAL_KEYS`: a hub ``config.json``), else the first of ``model`` /
    ``encoder`` / ``backbone`` that states any encoder key (a training config), looked for also under one
    ``cfg`` / ``config`` / ``hparams`` wrapper, else the top level when it states a generic one (``name``).
    A generic key at the top level (a run's ``name``, the data's ``num_frames``) never hides a ``model``
    section; keys of other sections (an optimizer's ``eps``, a probe's ``num_heads``) are never read."""
    if any(k in config for k in STRUCTURAL_KEYS):
        return config
    for wrapper in (config, *(config[w] for w in ("cfg", "config", "hparams") if isinstance(config.get(w), Mapping))):
        for name in SECTIONS:
            section = wrapper.get(name)
            if isinstance(section, Mapping) and any(k in section for k in ENCODER_KEYS):
                return section
    return config if any(k in config for k in ENCODER_KEYS) else {}


def _stated(section: Mapping[str, Any], *names: str) -> Any:
    """The first of ``names`` that the encoder's section states (``None`` when none is)."""
    for name in names:
        if section.get(name) is not None:
            return section[name]
    return None


def is_released_schema(config: Mapping[str, Any]) -> bool:
    """Whether a ``config.json`` is in the released checkpoint's schema (the official VisionTransformer's
    arguments at the top level) rather than a levjepa export's (an ``encoder`` section)."""
    return not isinstance(config.get("encoder"), Mapping) and "embed_dim" in config and "depth" in config


# an unstated attn_mode in the released schema: the official training recipe's (conf/config.yaml), which the released
# models were trained with; the official VisionTransformer class alone defaults to "full"
OFFICIAL_ATTENTION = "block_causal"
OFFICIAL_DROP, OFFICIAL_EPS = 0.95, 1e-6  # its token_drop_rate and LayerNorm eps when they are not stated


@dataclass(frozen=True)
class Stated:
    """What an encoder's own config section states beyond its tensors' shapes, read one way by the importer
    (:func:`read_official`) and by ``AutoModel`` (:func:`released_config`); ``None`` = not stated."""

    heads: Any
    attention: Any
    norm_eps: float
    drop_ratio: float
    name: str | None = None  # an official factory's name (:data:`OFFICIAL_SIZES`) the section states
    heads_from_name: bool = False  # the heads are the named factory's, not stated as a number

    def check_size(self, dim: int, depth: int, where: str) -> None:
        """A stated official model name whose width or depth is not the weights' is refused in one line naming
        both: its heads would split the weights' width into heads of another width, another function."""
        if self.name is None:
            return
        width, layers, heads = OFFICIAL_SIZES[self.name]
        if (width, layers) != (int(dim), int(depth)):
            fix = (
                "correct the name, or state the heads (levjepa import --heads N)"
                if self.heads_from_name
                else ("correct the name or leave it out")
            )
            raise WeightsError(
                f"{where}: the config names {self.name} (width {width}, depth {layers}, {heads} heads), the weights "
                f"are {dim} wide and {depth} deep: {fix}"
            )


def stated_settings(section: Mapping[str, Any]) -> Stated:
    """:class:`Stated` of an encoder's section (:func:`encoder_section`): a value stated as ``0`` or ``false``
    is that value; an unstated eps or token drop rate is the official default; unstated heads are those of a
    stated official model name (checked against the weights: :meth:`Stated.check_size`); an unstated attention
    mode is the official recipe's only in the released schema (:data:`OFFICIAL_ATTENTION`), else unknown (the
    importer asks for it)."""
    stated_name = _stated(section, "name", "model_name", "arch", "architecture")
    name = stated_name.replace("-", "_").lower() if isinstance(stated_name, str) else None
    name = name if name in OFFICIAL_SIZES else None
    heads = _stated(section, "num_heads", "num_attention_heads", "heads", "n_heads")
    heads_from_name = heads is None and name is not None
    if heads_from_name:
        heads = OFFICIAL_SIZES[str(name)][2]
    attention = _stated(section, "attn_mode", "attention", "attention_mode")
    if attention is None and is_released_schema(section):
        attention = OFFICIAL_ATTENTION
    eps, drop = _stated(section, "norm_eps", "layer_norm_eps"), _stated(section, "token_drop_rate")
    return Stated(
        heads=heads,
        attention=attention,
        norm_eps=OFFICIAL_EPS if eps is None else float(eps),
        drop_ratio=OFFICIAL_DROP if drop is None else float(drop),
        name=name,
        heads_from_name=heads_from_name,
    )


def released_config(config: Mapping[str, Any], where: str = "config.json") -> EncoderConfig:
    """The levjepa ``EncoderConfig`` that computes the official function of a config in the released schema
    (:data:`RELEASED_KEYS`), from the config alone — what ``AutoModel`` builds before any weight is read."""
    missing = [k for k in ("embed_dim", "depth", "num_heads", "patch_size") if config.get(k) is None]
    said = stated_settings(config)
    if said.heads is not None and "num_heads" in missing:  # stated under another name (num_attention_heads)
        missing.remove("num_heads")
    if missing:
        raise WeightsError(f"{where}: the released schema needs {', '.join(missing)}; this config does not state it")
    said.check_size(int(config["embed_dim"]), int(config["depth"]), where)
    attention = str(said.attention)
    if attention not in ATTENTION_NAMES:
        raise WeightsError(f"{where}: attn_mode {attention!r}: valid choices are {', '.join(sorted(ATTENTION_NAMES))}")
    if config.get("use_rope") is False:
        raise WeightsError(f"{where}: the config says use_rope=false: levjepa encoders use 3D RoPE only")
    try:
        return EncoderConfig(
            dim=int(config["embed_dim"]),
            depth=int(config["depth"]),
            heads=int(said.heads),
            mlp_ratio=float(config.get("mlp_ratio", 4.0)),
            patch_size=int(config["patch_size"]),
            tubelet=int(config.get("tubelet_size", 2)) if int(config.get("num_frames", 16)) > 1 else 1,
            in_chans=int(config.get("in_chans", 3)),
            attention=ATTENTION_NAMES[attention],  # type: ignore[arg-type]
            final_norm=True,
            final_norm_bias=True,
            qkv_bias=bool(config.get("qkv_bias", True)),
            norm_eps=said.norm_eps,
            rope_layout="vjepa2",
            tubelet_init="random",
            drop_ratio=said.drop_ratio,
        )
    except ValueError as err:
        raise WeightsError(f"{where}: {err}") from err


def official_state_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of an official encoder of a released-schema config (names below ``encoder.``, shapes):
    what a checkpoint in that layout holds, without a single weight (the contract ``AutoModel`` loads)."""
    cfg = released_config(config)
    d, hidden, p, c = cfg.dim, cfg.mlp_hidden, cfg.patch_size, cfg.in_chans
    video = int(config.get("num_frames", 16)) > 1
    shapes: dict[str, tuple[int, ...]] = {
        "cls_token": (1, 1, d),
        ANCHOR: (d, c, cfg.tubelet, p, p) if video else (d, c, p, p),
        "patch_embed.proj.bias": (d,),
    }
    for i in range(cfg.depth):
        block = {
            "norm1.weight": (d,),
            "norm1.bias": (d,),
            "attn.qkv.weight": (3 * d, d),
            "attn.proj.weight": (d, d),
            "attn.proj.bias": (d,),
            "norm2.weight": (d,),
            "norm2.bias": (d,),
            "mlp.fc1.weight": (hidden, d),
            "mlp.fc1.bias": (hidden,),
            "mlp.fc2.weight": (d, hidden),
            "mlp.fc2.bias": (d,),
        }
        if cfg.qkv_bias:
            block["attn.qkv.bias"] = (3 * d,)
        shapes.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    shapes.update({"norm.weight": (d,), "norm.bias": (d,)})
    return shapes


def _prefixes(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    return sorted({k[: -len(ANCHOR)] for k in tensors if k.endswith(ANCHOR)})


def _encoder_tensors(tensors: Mapping[str, torch.Tensor], where: str, prefix: str | None) -> dict[str, torch.Tensor]:
    found = _prefixes(tensors)
    if prefix is not None:
        if prefix not in found:
            raise WeightsError(f"{where}: no encoder under prefix {prefix!r} (encoders found under {found})")
        found = [prefix]
    if not found:
        sample = ", ".join(sorted(tensors)[:4])
        raise WeightsError(
            f"{where}: no official LeVJEPA encoder in this file (no '*{ANCHOR}' key; keys start with {sample})"
        )
    if len(found) > 1:
        raise WeightsError(
            f"{where}: encoders under several prefixes {found}: choose one with --prefix (e.g. --prefix {found[0]!r})"
        )
    p = found[0]
    return {k[len(p) :]: v for k, v in tensors.items() if k.startswith(p) and not k[len(p) :].startswith("projector.")}


# ------------------------------------------------------------------------------------------- conversion


def _config(enc: Mapping[str, torch.Tensor], stated: Mapping[str, Any], over: Overrides, where: str) -> EncoderConfig:
    """The ``EncoderConfig`` of official tensors: sizes from the tensors, what they cannot tell from the encoder's
    own section of the source's config (:func:`encoder_section`) or the caller's overrides."""
    stated = encoder_section(stated)
    if "pos_embed" in enc and _stated(stated, "use_rope") is not True:
        raise WeightsError(
            f"{where}: this encoder has an absolute position embedding (pos_embed) and no RoPE: levjepa encoders "
            "use 3D RoPE only, so it cannot compute this model"
        )
    if _stated(stated, "use_rope") is False:
        raise WeightsError(f"{where}: the config says use_rope=false: levjepa encoders use 3D RoPE only")
    patch = enc[ANCHOR]
    if patch.dim() == 5:
        dim, chans, tubelet, p, p2 = patch.shape
    elif patch.dim() == 4:
        (dim, chans, p, p2), tubelet = patch.shape, 1
    else:
        raise WeightsError(f"{where}: {ANCHOR} has shape {tuple(patch.shape)}: expected a Conv3d or Conv2d kernel")
    if p != p2:
        raise WeightsError(f"{where}: non-square patches {p}x{p2} are not supported")
    depth = len({int(m.group(1)) for k in enc if (m := re.match(r"blocks\.(\d+)\.", k))})
    if depth == 0:
        raise WeightsError(f"{where}: no transformer blocks (blocks.N.*) under the encoder")
    hidden = enc["blocks.0.mlp.fc1.weight"].shape[0]
    said = stated_settings(stated)
    if over.heads is None:  # heads the caller states make the name a label only
        said.check_size(dim, depth, where)
    heads = over.heads if over.heads is not None else said.heads
    attention = over.attention if over.attention is not None else said.attention
    missing = []
    if heads is None:
        missing.append("the number of attention heads (--heads N; the official vit_large has 16)")
    if attention is None:
        missing.append("the attention mode (--attention block_causal|full; the official recipe trains block_causal)")
    if missing:
        raise WeightsError(f"{where}: neither the weights nor a config state {' or '.join(missing)}")
    if str(attention) not in ATTENTION_NAMES:
        raise WeightsError(
            f"{where}: attention mode {attention!r}: valid choices are {', '.join(sorted(ATTENTION_NAMES))}"
        )
    eps = over.norm_eps if over.norm_eps is not None else said.norm_eps
    tube_stated = _stated(stated, "tubelet_size", "tubelet")
    if tube_stated is not None and int(tube_stated) != tubelet and patch.dim() == 5:
        raise WeightsError(f"{where}: the config says tubelet_size={tube_stated}, the patch kernel has {tubelet}")
    for key, found in (("embed_dim", dim), ("depth", depth), ("patch_size", p), ("in_chans", chans)):
        if _stated(stated, key) is not None and int(_stated(stated, key)) != int(found):
            raise WeightsError(f"{where}: the config says {key}={_stated(stated, key)}, the weights have {found}")
    kw = dict(
        dim=int(dim),
        depth=depth,
        heads=int(heads),
        mlp_ratio=hidden / dim,
        patch_size=int(p),
        tubelet=int(tubelet),
        in_chans=int(chans),
        attention=ATTENTION_NAMES[str(attention)],
        final_norm="norm.weight" in enc,
        final_norm_bias="norm.bias" in enc,
        qkv_bias="blocks.0.attn.qkv.bias" in enc,
        norm_eps=float(eps),
        rope_layout="vjepa2",
        tubelet_init="random",
        drop_ratio=said.drop_ratio,
    )
    try:
        return EncoderConfig(**kw)  # type: ignore[arg-type]
    except ValueError as err:
        raise WeightsError(f"{where}: {err}") from err


def to_levjepa(enc: Mapping[str, torch.Tensor], cfg: EncoderConfig) -> dict[str, torch.Tensor]:
    """Official encoder tensors -> levjepa ``VideoEncoder`` tensors (``cfg.rope_layout == "vjepa2"``), as a
    differentiable function of its inputs: the Conv kernel viewed as one Linear, the query and key rows of each
    ``qkv`` permuted into levjepa's RoPE pair order (values as they are)."""
    out = {}
    hd, order = cfg.head_dim, vjepa2_channel_order(cfg.head_dim)
    for key, value in enc.items():
        if key == "pos_embed":
            continue  # an unused leftover of a RoPE model (the official main.py drops it too)
        if key == ANCHOR:
            value = value.reshape(value.shape[0], -1)  # [D, C·τ·p·p]: the Conv kernel as one Linear
        elif re.fullmatch(r"blocks\.\d+\.attn\.qkv\.(weight|bias)", key):
            parts = value.reshape(3, cfg.heads, hd, *value.shape[1:])  # (q | k | v, head, channel, ...)
            idx = order.to(value.device)
            parts = torch.stack([parts[0][:, idx], parts[1][:, idx], parts[2]])  # q, k permuted; v as it is
            value = parts.reshape(value.shape)
        out[key] = value
    return out


def convert_encoder(enc: Mapping[str, torch.Tensor], cfg: EncoderConfig) -> dict[str, torch.Tensor]:
    """Official encoder tensors -> a levjepa ``VideoEncoder`` state dict of its own (float32, contiguous)."""
    return {k: v.detach().clone().to(torch.float32).contiguous() for k, v in to_levjepa(enc, cfg).items()}


def convert_projector(proj: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Official ``projector.net.*`` -> levjepa ``Projector`` state dict: the first Linear's bias folded into the
    BatchNorm's running mean (the batch mean absorbs it in training, the running mean in evaluation)."""
    out = {k: v.detach().clone().contiguous() for k, v in proj.items() if k != "net.0.bias"}
    if "net.0.bias" in proj:
        out["net.1.running_mean"] = out["net.1.running_mean"] - proj["net.0.bias"].to(out["net.1.running_mean"])
    return out


def read_official(
    src: str | Path, overrides: Overrides | None = None, *, weights: str = "ema", trust_pickle: bool = False
) -> OfficialModel:
    """An official checkpoint converted to levjepa's encoder (and projector when present). ``weights``:
    ``"ema"`` (the default: the EMA copy when the checkpoint has one, else its only copy, said so) or
    ``"online"``. Every failure is a :class:`WeightsError` naming the file."""
    if weights not in ("ema", "online"):
        raise ValueError(f"weights={weights!r}: valid choices are ema, online")
    copies, stated, file = _read_source(Path(src), trust_pickle)
    return official_model(copies, stated, file, overrides, weights=weights)


def official_model(
    copies: Mapping[str, Mapping[str, torch.Tensor]],
    stated: Mapping[str, Any],
    file: Path,
    overrides: Overrides | None = None,
    *,
    weights: str = "ema",
) -> OfficialModel:
    """:func:`read_official` on tensors already in memory (``copies``: ``{"ema" | "online" | "published":
    tensors}``; meta tensors too, for a contract checked without weights), ``stated`` the source's config."""
    over = overrides or Overrides()
    where = str(file)
    if weights in copies:
        copy = weights
    elif weights == "online" and "ema" in copies and "online" not in copies:
        raise WeightsError(f"{where}: holds only an EMA copy of the encoder; use --weights ema")
    else:
        copy = next(iter(copies))
    tensors = copies[copy]
    enc = _encoder_tensors(tensors, where, over.prefix)
    refuse_nonfinite(enc, f"{where} ({copy} copy of the encoder)")  # a .ckpt is read without load_tensors
    cfg = _config(enc, stated, over, where)
    projector_src = copies.get("online", tensors)  # the official EMA covers the encoder only
    proj_keys = [k for k in projector_src if k.endswith(PROJECTOR_ANCHOR)]
    projector = None
    if len(proj_keys) == 1:
        p = proj_keys[0][: -len("net.0.weight")]
        refuse_nonfinite({k: v for k, v in projector_src.items() if k.startswith(p)}, f"{where} (projector)")
        projector = convert_projector({k[len(p) :]: v for k, v in projector_src.items() if k.startswith(p)})
        cfg = dataclasses.replace(
            cfg, proj_hidden=int(projector["net.0.weight"].shape[0]), proj_dim=int(projector["net.3.weight"].shape[0])
        )
    if copy == "ema":
        note = "the official EMA copy (state_dict_ema) of the encoder"
    elif copy == "online":
        note = "the official online weights (state_dict)" + (
            "" if "ema" in copies else "; this checkpoint has no EMA copy"
        )
    else:
        note = f"the one copy of the weights in {file.name}"
    if projector is not None:
        note += "; projector from the online state_dict" if copy == "ema" else "; with its projector"
    section = encoder_section(stated)
    return OfficialModel(
        config=cfg,
        encoder=convert_encoder(enc, cfg),
        projector=projector,
        source=where,
        copy=copy,
        note=note,
        stated={k: v for k, v in section.items() if isinstance(v, str | int | float | bool)},
    )
