"""Load a frozen encoder from a run directory, a checkpoint or an export (the layout of ``levjepa.weights``).

``load_encoder(path, weights="ema")`` accepts:

* a **run directory** (holds ``checkpoints/``): the checkpoint named by ``checkpoints/latest``, else the
  highest ``step_*`` that has a ``meta.json``;
* a **checkpoint directory** (``step_000500/``) or one of its files (``model.safetensors`` = online weights,
  ``ema.safetensors`` = the Polyak/EMA copy; the file then decides ``weights``);
* an **export** directory in the hub layout (``config.json`` with ``model_type: levjepa`` +
  ``model.safetensors``, ``levjepa.formats.writing.export``) or written before it (``encoder.safetensors``), or its
  weights file (one set of weights, chosen at export time and recorded in its metadata; ``weights`` is then
  ignored); imported official weights (``levjepa import``) are such an export;
* any safetensors file whose metadata carries ``encoder_config``.

``weights="ema"`` (the default, what the papers evaluate) or ``"online"``. The EMA copy is a weighted
average of the online weights the run trained (its decay warms up from 0, see ``levjepa.train.ema``), so
it is a meaningful default; :meth:`LoadedEncoder.describe` says which copy was read and what it averages,
and every command prints it. Checkpoints written before the warm-up hold an EMA that started at the random
initialisation with the full decay: loading one says how much of it is still the initialisation, with a
``UserWarning`` (use ``weights="online"``) when that is more than half. The encoder config comes from
the checkpoint's ``meta.json`` (``encoder_config``), the run's ``config.json`` (``model``) or the export's
metadata. Files beside the weights are parsed into the typed configs that wrote them: a run's ``config.json``
into its ``PretrainConfig`` (:func:`read_run_config`, ``LoadedEncoder.run_config``), an export's into its
:class:`ExportRecord`; an unknown key is an error naming the file. Every weights file goes through
:func:`levjepa.weights.load_tensors`, which refuses a pickle (``.pt``/``.pth``, ``torch.save`` zips)
*before* reading it: nothing is ever unpickled. The state dict must match the architecture exactly
(``strict``): a missing or unexpected key is an error, not a warning (one exception: weights written
before the final LayerNorm lost its bias carry ``norm.bias`` and are rebuilt with ``final_norm_bias=True``,
so older runs and exports load exactly as they were trained).

The returned encoder is **frozen**: ``eval()`` mode and ``requires_grad=False`` on every parameter;
:func:`load` (``levjepa.load``) returns it alone, with a ``weights_info`` string.
:func:`random_encoder` builds the same architecture at random initialisation (the baseline every probe
table shows), seeded without touching the global RNG state.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from levjepa.config import ConfigError, from_dict, to_dict
from levjepa.data.views import IMAGENET_MEAN, IMAGENET_STD
from levjepa.formats.reading.official import Overrides, is_released_schema, read_official
from levjepa.formats.reading.origin import Origin
from levjepa.model import EncoderConfig, VideoEncoder
from levjepa.model.readout_layers import layers_text
from levjepa.rng import seeded_init
from levjepa.train.config import PretrainConfig
from levjepa.train.start import StartWeights
from levjepa.weights import (
    CHECKPOINTS,
    CONFIG,
    EMA_WEIGHTS,
    EXPORT_WEIGHTS,
    HUB_WEIGHTS,
    META,
    ONLINE_WEIGHTS,
    PREPROCESSOR,
    PROJECTOR_WEIGHTS,
    WeightsError,
    checkpoint_step,
    latest_checkpoint,
    load_tensors,
    prefixed,
    read_json,
    refuse_pickle,
)

__all__ = [
    "EXPORT_FORMAT",
    "HUB_FORMAT",
    "HUB_WEIGHTS",
    "OFFICIAL_PREPROCESSING",
    "PREPROCESSOR",
    "PROJECTOR_WEIGHTS",
    "ExportRecord",
    "LoadedEncoder",
    "Preprocessing",
    "WEIGHTS_MEANING",
    "WeightsKind",
    "ema_note",
    "freeze",
    "load",
    "is_official_folder",
    "load_encoder",
    "load_init_weights",
    "load_official",
    "load_projector",
    "random_encoder",
    "read_hub_config",
    "read_export_record",
    "read_run_config",
]

WeightsKind = Literal["ema", "online"]
SourceKind = Literal["run", "checkpoint", "export", "file", "official", "random"]
M = TypeVar("M", bound=torch.nn.Module)
WEIGHTS_MEANING = {
    "ema": "the EMA copy, a weighted average of the online weights trained so far",
    "online": "the weights the optimizer trained",
}
EXPORT_FORMAT = "levjepa-encoder/1"  # exports before the hub layout
HUB_FORMAT = "levjepa-hub/1"


@dataclass(frozen=True)
class Preprocessing:
    """How a clip is prepared for the encoder: uint8 RGB frames ``/ 255``, minus ``mean``, over ``std``
    (ImageNet's), ``frames`` frames every ``frame_stride``-th — or ``fps`` frames per second, the rate the model
    was trained at when it is known — resized and centre-cropped to ``size``. Every reader takes its defaults
    from it (``levjepa.formats.reading.views``). How frames are taken is spelled as ``levjepa.data.eval_clip.ViewSpec``
    spells it (``size``, ``frames``, ``frame_stride``, ``fps``); on disk (``config.json``'s ``preprocessing``,
    ``preprocessor_config.json``) the count is transformers' ``num_frames``, and :meth:`record` /
    :meth:`from_record` are the one place that converts."""

    size: int = 224
    frames: int = 16
    frame_stride: int = 2
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    fps: float | None = None  # the training rate, when the model records one (the released weights: 7.5)

    def record(self) -> dict[str, Any]:
        """The on-disk ``preprocessing`` record (``frames`` written as ``num_frames``, the field order kept)."""
        return {DISK_NAMES.get(k, k): v for k, v in to_dict(self).items()}

    @staticmethod
    def from_record(data: dict[str, Any]) -> Preprocessing:
        """The preprocessing an on-disk record describes (:meth:`record`'s inverse); unknown keys raise, and so
        does an in-memory name that has another name on disk (``frames``)."""
        wrong = [k for k in data if k in DISK_NAMES]
        if wrong:
            raise ConfigError(f"unknown key(s) {', '.join(wrong)} (on disk: {', '.join(DISK_NAMES[k] for k in wrong)})")
        memory = {v: k for k, v in DISK_NAMES.items()}
        return from_dict(Preprocessing, {memory.get(k, k): v for k, v in data.items()})


DISK_NAMES = {"frames": "num_frames"}  # Preprocessing's name -> the on-disk (transformers) name


# The released LeVJEPA weights were trained on every 2nd frame of 15 fps video (SPEC §3; the official code's
# frame_stride 2, its notebook's 16 frames at ~7.5 fps), 16 × 224² clips
OFFICIAL_PREPROCESSING = Preprocessing(size=224, frames=16, frame_stride=2, fps=7.5)


@dataclass(frozen=True)
class ExportRecord:
    """An export's ``config.json``: the encoder config, which copy of the weights it holds and where they came
    from (``levjepa.formats.writing.export`` writes it with ``to_dict``; readers parse it back with ``from_dict``)."""

    model: EncoderConfig
    format: str = EXPORT_FORMAT
    weights: str = "unknown"  # "ema" or "online"
    weights_note: str = ""  # what the copy averages (LoadedEncoder.note)
    step: int | None = None
    source: str = ""  # the weights file exported
    exported_at: str = ""
    run_config: PretrainConfig | None = None  # the config of the run it came from, when known


def preprocessing_of(run: PretrainConfig | None) -> Preprocessing:
    """The clip geometry a run trained on (its global views); the paper's 16 × 224² every 2nd frame otherwise."""
    if run is None:
        return Preprocessing()
    data = run.data
    if "synthetic" in data.sources:
        return Preprocessing(size=data.synthetic.size, frames=data.synthetic.num_frames, frame_stride=1)
    return Preprocessing(
        size=data.global_size, frames=data.num_frames, frame_stride=data.frame_stride, fps=data.target_fps
    )


@dataclass
class LoadedEncoder:
    """A frozen encoder and where it came from."""

    encoder: VideoEncoder
    config: EncoderConfig
    source: str  # the weights file read
    kind: SourceKind
    weights: str  # "ema", "online" or "random"
    step: int | None = None
    run_dir: str | None = None
    run_config: PretrainConfig | None = field(default=None, repr=False)  # the run's config.json, parsed
    note: str = ""  # what the copy is, e.g. "EMA: weighted average of the online weights over 25 updates"
    imported_from: dict[str, Any] | None = field(default=None, repr=False)  # official weights: what was read
    preprocessing: Preprocessing | None = None  # as recorded by a hub export

    def describe(self) -> str:
        step = f" step {self.step}" if self.step is not None else ""
        note = f" ({self.note})" if self.note else ""
        origin = self.imported_from or {}
        at = f"@{origin['revision']}" if origin.get("revision") else ""
        digest = f" (sha256 {origin['sha256']})" if origin.get("sha256") else ""
        c = self.config
        read = "" if c.readout_layers is None else f"; read at {layers_text(c.readout_layers, c.depth)}"
        if self.kind == "official":  # the file read is the official one: its revision and hash
            return f"{self.weights} weights{step}{note} from {self.source}{at}{digest}{read}"
        # a copy of official weights (an import, an export of it): the revision and hash are the original's
        imported = f"; imported from {origin.get('source', '?')}{at}{digest}" if origin else ""
        return f"{self.weights} weights{step}{note} from {self.source}{imported}{read}"

    def with_readout(self, layers: Sequence[int] | None) -> LoadedEncoder:
        """This encoder read at the blocks ``layers`` (``VideoEncoder.set_readout_layers``: negative from the end,
        ``None`` the last; ``ConfigError`` naming the depth for a block out of range), its ``config`` with it."""
        self.encoder.set_readout_layers(layers)
        return dataclasses.replace(self, config=self.encoder.cfg)


def ema_note(meta: dict[str, str], step: int | None, run_cfg: PretrainConfig | None, where: str) -> str:
    """What an ``ema.safetensors`` holds, from its metadata (the checkpoint writes ``ema_updates`` and
    ``ema_decay`` beside the tensors); older copies are described from the run's ``train`` section. A copy
    that is still mostly its initial weights (before its first update, or a fixed decay — ``train.ema_warmup=0``,
    the paper's 0.9999 — over too few updates) is named with a warning: its readout is a random encoder's."""
    if "ema_updates" in meta:
        updates, decay = int(meta["ema_updates"]), float(meta["ema_decay"])
        fixed = float(meta.get("ema_warmup", 1.0)) == 0  # train.ema_warmup=0: the fixed decay from the start
        _warn_if_initial(1.0 if updates == 0 else decay**updates if fixed else 0.0, where, updates, decay, fixed)
        if updates == 0:
            return "EMA before its first update: the initial weights, no training in them yet"
        if fixed:
            share = f"{decay**updates:.0%} of it still the initialisation"
            return f"EMA: {updates} update(s) at a fixed decay {decay} from the initial weights, {share}"
        return f"EMA: weighted average of the online weights over {updates} update(s), decay warming up to {decay}"
    if run_cfg is None or step is None:
        return "EMA written before the decay warm-up; how much of it is still the initialisation is unknown"
    decay, every = run_cfg.train.ema_decay, run_cfg.train.ema_every
    initial = float(decay) ** (step // every)
    _warn_if_initial(initial, where, step // every, decay, True)
    return f"EMA written before the decay warm-up: {initial:.0%} of it is still the random initialisation"


def _warn_if_initial(initial: float, where: str, updates: int, decay: float, fixed: bool) -> None:
    """Warn when more than half of an EMA copy is still its initial weights (the share ``initial``)."""
    if initial <= 0.5:
        return
    how = f"{updates} update(s) at a fixed decay {decay}" if fixed and updates else "no update yet"
    warnings.warn(
        f"{where}: this EMA copy is still {initial:.0%} its initial (random) weights ({how}): evaluate the online "
        "weights instead (weights='online', --weights online), or train longer, with train.ema_warmup > 0 or a "
        "lower train.ema_decay",
        UserWarning,
        stacklevel=3,
    )


C = TypeVar("C")


def _parsed(parse: Callable[[Any], C], data: Any, where: str | Path, what: str) -> C:
    """``parse(data)``; its ``ConfigError`` (an unknown key, a bad value) as a :class:`WeightsError` naming
    ``where`` and ``what``."""
    try:
        return parse(data)
    except ConfigError as err:
        raise WeightsError(f"{where}: {what}: {err}") from err


def read_run_config(run_dir: str | Path) -> PretrainConfig:
    """A run's ``config.json`` parsed into the :class:`PretrainConfig` that wrote it (missing keys take their
    defaults; an unknown key or a bad value is a :class:`WeightsError` naming the file and the key)."""
    path = Path(run_dir) / CONFIG
    return _parsed(functools.partial(from_dict, PretrainConfig), read_json(path), path, "not a levjepa run config")


def _latest_checkpoint(run_dir: Path) -> Path:
    found = latest_checkpoint(run_dir)
    if found is None:
        raise WeightsError(f"{run_dir}: the run has no complete checkpoint yet (checkpoints/step_*/meta.json)")
    return found


def freeze(encoder: M) -> M:
    """``eval()`` and ``requires_grad=False`` on every parameter (frozen evaluation)."""
    encoder.eval()
    encoder.requires_grad_(False)
    return encoder


def _encoder_config(data: dict[str, Any] | str, where: str) -> EncoderConfig:
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise WeightsError(f"{where}: encoder config is not JSON ({err})") from err
    if not isinstance(data, dict):
        raise WeightsError(f"{where}: encoder config must be a JSON object, got {type(data).__name__}")
    try:
        return from_dict(EncoderConfig, data)
    except ValueError as err:
        raise WeightsError(f"{where}: bad encoder config: {err}") from err


def _legacy_norm_bias(cfg: EncoderConfig, state: dict[str, torch.Tensor]) -> EncoderConfig:
    """Weights written before the final LayerNorm lost its bias hold ``norm.bias``: rebuild them with it.

    Their configs predate ``final_norm_bias`` (it defaults to ``False``), so the weights decide: such an
    encoder loads exactly as it was trained and evaluated (its bias was stepped on rounding noise only).
    """
    bias = "norm.bias" if cfg.final_norm else f"blocks.{cfg.depth - 1}.mlp.fc2.bias"  # no final norm: the last block's
    return dataclasses.replace(cfg, final_norm_bias=True) if not cfg.final_norm_bias and bias in state else cfg


def _build(
    cfg: EncoderConfig, state: dict[str, torch.Tensor], source: Path, device: str | torch.device
) -> VideoEncoder:
    encoder = VideoEncoder(cfg)
    expected = set(encoder.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise WeightsError(
            f"{source}: weights do not match the encoder config (missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})"
        )
    try:
        encoder.load_state_dict(state, strict=True)
    except RuntimeError as err:  # shape mismatch
        raise WeightsError(f"{source}: weights do not fit the encoder config: {err}") from err
    return freeze(encoder.to(device))


def _from_checkpoint(ckpt: Path, weights: str, device: str | torch.device, kind: SourceKind) -> LoadedEncoder:
    if weights not in ("ema", "online"):
        raise ValueError(f"weights={weights!r}: valid choices are ema, online")
    run_dir = ckpt.parent.parent if ckpt.parent.name == CHECKPOINTS else None
    run_cfg = read_run_config(run_dir) if run_dir and (run_dir / CONFIG).is_file() else None
    meta = read_json(ckpt / META) if (ckpt / META).is_file() else {}
    if "encoder_config" in meta:
        cfg = _encoder_config(meta["encoder_config"], str(ckpt / META))
    elif run_cfg is not None:
        cfg = run_cfg.model
    else:
        raise WeightsError(f"{ckpt}: no encoder config (neither meta.json 'encoder_config' nor the run's config.json)")
    file = ckpt / (EMA_WEIGHTS if weights == "ema" else ONLINE_WEIGHTS)
    if not file.is_file():
        hint = " (this checkpoint has no EMA copy: use weights='online')" if weights == "ema" else ""
        raise WeightsError(f"{file}: missing{hint}")
    tensors, file_meta = load_tensors(file)
    state = prefixed(tensors, "encoder.")
    if not state:
        raise WeightsError(f"{file}: no 'encoder.*' tensors (keys start with {sorted(tensors)[:3]})")
    cfg = _legacy_norm_bias(cfg, state)
    encoder = _build(cfg, state, file, device)
    try:
        step: int | None = checkpoint_step(ckpt)
    except WeightsError:  # a loose checkpoint folder without meta.json and not named step_N
        step = None
    note = ema_note(file_meta, step, run_cfg, str(file)) if weights == "ema" else WEIGHTS_MEANING["online"]
    return LoadedEncoder(
        encoder=encoder,
        config=cfg,
        source=str(file),
        kind=kind,
        weights=weights,
        step=step,
        run_dir=str(run_dir) if run_dir else None,
        run_config=run_cfg,
        note=note,
    )


def read_export_record(export_dir: str | Path) -> ExportRecord:
    """An export's ``config.json`` parsed into its :class:`ExportRecord`."""
    path = Path(export_dir) / CONFIG
    return _parsed(functools.partial(from_dict, ExportRecord), read_json(path), path, "not a levjepa export record")


def _from_export_file(file: Path, device: str | torch.device, kind: SourceKind) -> LoadedEncoder:
    """An export's weights file; what it is comes from its metadata (the file travels alone) or, for what the
    metadata lacks, from the ``config.json`` beside it."""
    tensors, meta = load_tensors(file)
    record = read_export_record(file.parent) if (file.parent / CONFIG).is_file() else None
    if "encoder_config" in meta:
        cfg = _encoder_config(meta["encoder_config"], f"{file} metadata")
    elif record is not None:
        cfg = record.model
    else:
        raise WeightsError(f"{file}: no encoder config in its metadata ('encoder_config') or beside it (config.json)")
    cfg = _legacy_norm_bias(cfg, tensors)
    encoder = _build(cfg, tensors, file, device)
    record = record or ExportRecord(model=cfg)  # a bare weights file: what its metadata lacks is unknown
    return LoadedEncoder(
        encoder=encoder,
        config=cfg,
        source=str(file),
        kind=kind,
        weights=meta.get("weights", record.weights),
        step=json.loads(meta["step"]) if "step" in meta else record.step,
        run_config=record.run_config,
        note=meta.get("weights_note", record.weights_note),
    )


def read_hub_config(export_dir: str | Path) -> dict[str, Any] | None:
    """A directory's ``config.json`` when it is a levjepa hub export, else ``None``; a model directory of
    another type is a :class:`WeightsError` that says how to import it."""
    path = Path(export_dir) / CONFIG
    if not path.is_file():
        return None
    data = read_json(path)
    kind = data.get("model_type")
    if kind == "levjepa":
        if not isinstance(data.get("encoder"), dict):
            raise WeightsError(
                f"{path}: model_type levjepa without an 'encoder' section or the released checkpoint's keys "
                f"(embed_dim, depth, num_heads, ...): not a levjepa export nor official weights"
            )
        return data
    if kind is not None or ((Path(export_dir) / HUB_WEIGHTS).is_file() and not (Path(export_dir) / META).is_file()):
        what = f"a model of type {kind!r}" if kind else "a model directory without a levjepa config"
        raise WeightsError(
            f"{path}: {what}, not a levjepa export; official LeVJEPA weights are read with "
            f"`levjepa import {export_dir} --out DIR` first"
        )
    return None


def _section(parse: Callable[[Any], C], data: dict[str, Any], key: str, where: Path) -> C | None:
    """``data[key]`` parsed (``None`` when absent); a bad value names the file and the key."""
    return _parsed(parse, data[key], where, f"bad {key}") if isinstance(data.get(key), dict) else None


def encoder_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a hub-layout weights file: as levjepa writes them (no prefix), or under
    ``encoder.`` as transformers' ``save_pretrained`` writes them; a classifier's ``head.*`` left out."""
    if any(k.startswith("encoder.") for k in tensors):
        return prefixed(tensors, "encoder.")
    return {k: v for k, v in tensors.items() if not k.startswith("head.")}


def _from_hub(export_dir: Path, data: dict[str, Any], device: str | torch.device) -> LoadedEncoder:
    file = export_dir / HUB_WEIGHTS
    cfg = _encoder_config(data["encoder"], str(export_dir / CONFIG))
    tensors = encoder_tensors(load_tensors(file)[0])
    encoder = _build(cfg, tensors, file, device)
    run_cfg = _section(functools.partial(from_dict, PretrainConfig), data, "run_config", export_dir / CONFIG)
    pre = _section(Preprocessing.from_record, data, "preprocessing", export_dir / CONFIG)
    loaded = LoadedEncoder(
        encoder=encoder,
        config=cfg,
        source=str(file),
        kind="export",
        weights=str(data.get("weights", "unknown")),
        step=data.get("step"),
        run_config=run_cfg,
        note=str(data.get("weights_note", "")),
        imported_from=data.get("imported_from"),
        preprocessing=pre,
    )
    return _saved_readout(loaded, export_dir / CONFIG)


def load_encoder(
    path: str | Path, *, weights: WeightsKind = "ema", device: str | torch.device = "cpu"
) -> LoadedEncoder:
    """A frozen encoder from a run dir, checkpoint (dir or file), export (dir or file). See the module doc.
    Its ``pretrained_cfg`` (timm's name) says what clips the weights expect: the export's preprocessing, or
    the geometry the run trained on."""
    loaded = _load_encoder(path, weights, device)
    if loaded.preprocessing is None:
        loaded.preprocessing = preprocessing_of(loaded.run_config)
    pre = loaded.preprocessing
    loaded.encoder.pretrained_cfg = {
        "mean": tuple(pre.mean),
        "std": tuple(pre.std),
        "input_size": (loaded.config.in_chans, pre.frames, pre.size, pre.size),
        "num_frames": pre.frames,
        "frame_stride": pre.frame_stride,
        "fps": pre.fps,
    }
    return loaded


def _saved_readout(loaded: LoadedEncoder, config: Path) -> LoadedEncoder:
    """``loaded`` read at the blocks a model folder's ``config.json`` names at its top level: transformers'
    ``save_pretrained`` of a model loaded with ``AutoModel.from_pretrained(..., readout_layers=[...])`` writes
    them there (``LeVJEPAConfig``), over the encoder section's, in either schema."""
    layers = read_json(config).get("readout_layers") if config.is_file() else None
    if layers is None:
        return loaded
    try:
        return loaded.with_readout(tuple(layers))
    except (ConfigError, TypeError) as err:
        raise WeightsError(f"{config}: readout_layers {layers!r}: {err}") from err


def _load_encoder(path: str | Path, weights: WeightsKind, device: str | torch.device) -> LoadedEncoder:
    p = Path(path)
    if not p.exists():
        raise WeightsError(f"{p}: no such run directory, checkpoint or export")
    if p.is_dir():
        if (p / CHECKPOINTS).is_dir():
            return _from_checkpoint(_latest_checkpoint(p), weights, device, "run")
        if is_official_folder(p):
            return load_official(Origin(p, str(p)), weights=weights, device=device)
        hub = read_hub_config(p)
        if hub is not None:
            return _from_hub(p, hub, device)
        if (p / EXPORT_WEIGHTS).is_file():
            return _from_export_file(p / EXPORT_WEIGHTS, device, "export")
        if any((p / name).is_file() for name in (META, ONLINE_WEIGHTS, EMA_WEIGHTS)):
            return _from_checkpoint(p, weights, device, "checkpoint")
        raise WeightsError(
            f"{p}: not a run directory (checkpoints/), a checkpoint (meta.json, model.safetensors) or an export "
            "(encoder.safetensors)"
        )
    refuse_pickle(p)  # before looking at anything else in the file
    if p.name == HUB_WEIGHTS and is_official_folder(p.parent):  # the official folder's weights file: the folder
        return load_official(Origin(p.parent, str(p.parent)), weights=weights, device=device)
    hub = read_hub_config(p.parent) if p.name == HUB_WEIGHTS else None
    if hub is not None:
        return _from_hub(p.parent, hub, device)
    if p.name in (ONLINE_WEIGHTS, EMA_WEIGHTS):
        return _from_checkpoint(p.parent, "ema" if p.name == EMA_WEIGHTS else "online", device, "checkpoint")
    return _from_export_file(p, device, "export" if p.name == EXPORT_WEIGHTS else "file")


def load(path: str | Path, weights: WeightsKind = "ema", device: str | torch.device = "cpu") -> VideoEncoder:
    """A ready, frozen ``VideoEncoder`` from an export, a checkpoint or a run directory (``levjepa.load``).

    Its ``weights_info`` attribute says which copy was read and what it is (``LoadedEncoder.describe``), e.g.
    ``"ema weights step 800 (EMA: weighted average of the online weights over 800 update(s), …) from …"``.
    """
    loaded = load_encoder(path, weights=weights, device=device)
    loaded.encoder.weights_info = loaded.describe()
    return loaded.encoder


def random_encoder(config: EncoderConfig, *, seed: int = 0, device: str | torch.device = "cpu") -> LoadedEncoder:
    """The same architecture at random initialisation (seeded; the global RNG state is left as it was)."""
    with seeded_init(seed):
        encoder = VideoEncoder(config)
    return LoadedEncoder(
        encoder=freeze(encoder.to(device)),
        config=config,
        source=f"random init (seed {seed})",
        kind="random",
        weights="random",
    )


def random_like(loaded: LoadedEncoder, *, seed: int = 0) -> LoadedEncoder:
    """``loaded``'s architecture at random initialisation, reading what ``loaded`` reads: the run's config
    and the recorded preprocessing travel with it, so the baseline sees the same views (size, frames, rate)
    as the weights it stands beside."""
    rand = random_encoder(loaded.config, seed=seed, device=next(loaded.encoder.parameters()).device)
    return dataclasses.replace(rand, run_config=loaded.run_config, preprocessing=loaded.preprocessing)


def load_projector(path: str | Path) -> dict[str, torch.Tensor] | None:
    """The training projector's state dict kept beside an encoder (a run's latest checkpoint, a checkpoint,
    an export written with its projector), or ``None`` when there is none."""
    p = Path(path)
    if p.is_file():
        p = p.parent
    if (p / CHECKPOINTS).is_dir():
        p = _latest_checkpoint(p)
    if (p / META).is_file() and (p / ONLINE_WEIGHTS).is_file():
        state = prefixed(load_tensors(p / ONLINE_WEIGHTS)[0], "projector.")
        return state or None
    if (p / PROJECTOR_WEIGHTS).is_file():
        return load_tensors(p / PROJECTOR_WEIGHTS)[0]
    return None


def is_official_folder(p: Path) -> bool:
    """A model folder of official LeVJEPA weights: the released checkpoint's schema (``model_type: levjepa``
    with the official VisionTransformer's arguments) or another model type, with weights and no levjepa
    checkpoint beside them."""
    cfg = p / CONFIG
    if not (p.is_dir() and cfg.is_file()) or (p / CHECKPOINTS).is_dir() or (p / META).is_file():
        return False
    if not ((p / HUB_WEIGHTS).is_file() or (p / "model.safetensors.index.json").is_file()):
        return False
    data = read_json(cfg)
    return data.get("model_type") != "levjepa" or is_released_schema(data)


def load_official(
    origin: Origin,
    *,
    weights: str = "ema",
    device: str | torch.device = "cpu",
    overrides: Overrides | None = None,
    sha256: str | None = None,
) -> LoadedEncoder:
    """Official weights (a model folder, a ``.ckpt``, a safetensors file) imported on the fly: the encoder
    computes the official function (``levjepa.formats.reading.official``), and ``imported_from`` records the source,
    revision, file and SHA-256 (``Origin.record``, checked against ``sha256`` and the pinned releases)."""
    try:
        official = read_official(origin.path, overrides, weights=weights)
    except WeightsError as err:
        raise WeightsError(
            f"{err}; or import it once with `levjepa import {origin.source} --out DIR` and the options it names"
        ) from err
    record = origin.record(sha256)
    encoder = VideoEncoder(official.config)
    encoder.load_state_dict(official.encoder, strict=True)
    loaded = LoadedEncoder(
        encoder=freeze(encoder.to(device)),
        config=official.config,
        source=str(record["source"]),
        kind="official",
        weights=official.copy,
        note=f"{official.note}; official LeVJEPA weights, imported on the fly",
        imported_from={
            **record,
            "copy": official.copy,
            "stated": official.stated,
            "layout": "MLO-lab/LeVJEPA module.py (encoder.*, projector.net.*)",
        },
        preprocessing=OFFICIAL_PREPROCESSING,
    )
    folder = origin.path if origin.path.is_dir() else origin.path.parent
    return _saved_readout(loaded, folder / CONFIG) if is_official_folder(folder) else loaded


OFFICIAL_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")  # files load_init_weights reads as official checkpoints


def load_init_weights(path: str | Path) -> StartWeights:
    """What ``model.init_from=PATH`` reads: the copy ``levjepa.load(PATH)`` reads (the EMA of a run's latest
    checkpoint by default; name ``checkpoints/step_N/model.safetensors`` for the online weights) and the
    projector beside it, or an official checkpoint (``.ckpt``, an official model directory) converted by
    ``levjepa.formats.reading.official`` with what it states (use ``levjepa import`` first when it states too
    little)."""
    p = Path(path)
    if not p.exists():
        raise WeightsError(f"{p}: no such run, export or checkpoint (model.init_from)")
    if (p.is_file() and p.suffix in OFFICIAL_SUFFIXES) or is_official_folder(p):
        official = read_official(p)
        return StartWeights(official.config, official.encoder, official.projector, f"{official.note} from {p}")
    loaded = load_encoder(p)
    state = {k: v.detach().clone() for k, v in loaded.encoder.state_dict().items()}
    return StartWeights(loaded.config, state, load_projector(p), loaded.describe())
