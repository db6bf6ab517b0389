"""Load a frozen encoder from a run directory, a checkpoint or an export (the layout of ``levjepa.weights``).

``load_encoder(path, weights="ema")`` accepts:

* a **run directory** (holds ``checkpoints/``): the checkpoint named by ``checkpoints/latest``, else the
  highest ``step_*`` that has a ``meta.json``;
* a **checkpoint directory** (``step_000500/``) or one of its files (``model.safetensors`` = online weights,
  ``ema.safetensors`` = the Polyak/EMA copy; the file then decides ``weights``);
* an **export** directory or its ``encoder.safetensors`` (one set of weights, chosen at export time and
  recorded in its metadata; ``weights`` is then ignored);
* any safetensors file whose metadata carries ``encoder_config``.

``weights="ema"`` (the default, what the papers evaluate) or ``"online"``. The EMA copy is a weighted
average of the online weights the run trained (its decay warms up from 0, see ``levjepa.train.ema``), so
it is a meaningful default; :meth:`LoadedEncoder.describe` says which copy was read and what it averages,
and every command prints it. Checkpoints written before the warm-up hold an EMA that started at the random
initialisation with the full decay: loading one says how much of it is still the initialisation, with a
``UserWarning`` (use ``weights="online"``) when that is more than half. The encoder config comes from
the checkpoint's ``meta.json`` (``encoder_config``), the run's ``config.json`` (``model``) or the export's
metadata. Every weights file goes through :func:`levjepa.weights.load_tensors`, which refuses a pickle
(``.pt``/``.pth``, ``torch.save`` zips) *before* reading it: nothing is ever unpickled. The state dict
must match the architecture exactly (``strict``): a missing or unexpected key is an error, not a warning
(one exception: weights written before the final LayerNorm lost its bias carry ``norm.bias`` and are
rebuilt with ``final_norm_bias=True``, so older runs and exports load exactly as they were trained).

The returned encoder is **frozen**: ``eval()`` mode and ``requires_grad=False`` on every parameter.
:func:`random_encoder` builds the same architecture at random initialisation (the baseline every probe
table shows), seeded without touching the global RNG state.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from levjepa.config import from_dict, to_dict
from levjepa.weights import WeightsError, latest_checkpoint, list_checkpoints, load_tensors, prefixed, refuse_pickle

__all__ = [
    "LoadedEncoder",
    "WEIGHTS_MEANING",
    "ema_note",
    "WeightsKind",
    "checkpoint_step",
    "find_checkpoints",
    "freeze",
    "load_encoder",
    "random_encoder",
    "read_json",
]

WeightsKind = Literal["ema", "online"]
WEIGHTS_MEANING = {
    "ema": "the EMA copy, a weighted average of the online weights trained so far",
    "online": "the weights the optimizer trained",
}
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class LoadedEncoder:
    """A frozen encoder and where it came from."""

    encoder: Any  # levjepa.model.VideoEncoder (imported lazily: `import levjepa.eval` stays light)
    config: Any  # levjepa.model.EncoderConfig
    source: str  # the weights file read
    kind: Literal["run", "checkpoint", "export", "file", "random"]
    weights: str  # "ema", "online" or "random"
    step: int | None = None
    run_dir: str | None = None
    run_config: dict[str, Any] | None = field(default=None, repr=False)
    note: str = ""  # what the copy is, e.g. "EMA: weighted average of the online weights over 25 updates"

    def describe(self) -> str:
        step = f" step {self.step}" if self.step is not None else ""
        note = f" ({self.note})" if self.note else ""
        return f"{self.weights} weights{step}{note} from {self.source}"


def ema_note(meta: dict[str, str], step: int | None, run_cfg: dict[str, Any] | None, where: str) -> str:
    """What an ``ema.safetensors`` holds, from its metadata (warns when it is mostly the initialisation)."""
    if "ema_updates" in meta:
        updates = int(json.loads(meta["ema_updates"]))
        decay = json.loads(meta.get("ema_decay", "null"))
        return f"EMA: weighted average of the online weights over {updates} update(s), decay warming up to {decay}"
    train = (run_cfg or {}).get("train", {}) if isinstance(run_cfg, dict) else {}
    decay, every = train.get("ema_decay"), train.get("ema_every")
    if not isinstance(decay, float | int) or not isinstance(every, int) or step is None:
        return "EMA written before the decay warm-up; how much of it is still the initialisation is unknown"
    initial = float(decay) ** (step // every)
    if initial > 0.5:
        warnings.warn(
            f"{where}: this EMA copy was written before the EMA warm-up and is still {initial:.0%} the random "
            f"initialisation (decay {decay} over {step // every} updates from the initial weights); evaluate the "
            "online weights instead (weights='online', --weights online)",
            UserWarning,
            stacklevel=3,
        )
    return f"EMA written before the decay warm-up: {initial:.0%} of it is still the random initialisation"


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise WeightsError(f"{path}: not a readable JSON file ({err})") from err
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def checkpoint_step(ckpt_dir: Path) -> int:
    meta = ckpt_dir / "meta.json"
    if meta.is_file():
        step = read_json(meta).get("step")
        if isinstance(step, int):
            return step
    m = _STEP_DIR.match(ckpt_dir.name)
    if m:
        return int(m.group(1))
    raise WeightsError(f"{ckpt_dir}: cannot tell the checkpoint's step (no meta.json 'step', name not step_N)")


def find_checkpoints(run_dir: str | Path) -> list[Path]:
    """Every complete checkpoint of a run (a ``step_*`` dir with ``meta.json``), sorted by step."""
    if not (Path(run_dir) / "checkpoints").is_dir():
        raise WeightsError(f"{run_dir}: not a run directory (no checkpoints/ folder)")
    return list_checkpoints(run_dir)


def _latest_checkpoint(run_dir: Path) -> Path:
    found = latest_checkpoint(run_dir)
    if found is None:
        raise WeightsError(f"{run_dir}: the run has no complete checkpoint yet (checkpoints/step_*/meta.json)")
    return found


def freeze(encoder: torch.nn.Module) -> torch.nn.Module:
    """``eval()`` and ``requires_grad=False`` on every parameter (frozen evaluation)."""
    encoder.eval()
    encoder.requires_grad_(False)
    return encoder


def _encoder_config(data: dict[str, Any] | str, where: str) -> Any:
    from levjepa.model import EncoderConfig

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


def _legacy_norm_bias(cfg: Any, state: dict[str, torch.Tensor]) -> Any:
    """Weights written before the final LayerNorm lost its bias hold ``norm.bias``: rebuild them with it.

    Their configs predate ``final_norm_bias`` (it defaults to ``False``), so the weights decide: such an
    encoder loads exactly as it was trained and evaluated (its bias was stepped on rounding noise only).
    """
    if cfg.final_norm and not cfg.final_norm_bias and "norm.bias" in state:
        return dataclasses.replace(cfg, final_norm_bias=True)
    return cfg


def _build(cfg: Any, state: dict[str, torch.Tensor], source: Path, device: str | torch.device) -> torch.nn.Module:
    from levjepa.model import VideoEncoder

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


def _from_checkpoint(ckpt: Path, weights: str, device: str | torch.device, kind: str) -> LoadedEncoder:
    if weights not in ("ema", "online"):
        raise ValueError(f"weights={weights!r}: valid choices are ema, online")
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    run_cfg = read_json(run_dir / "config.json") if run_dir and (run_dir / "config.json").is_file() else None
    meta = read_json(ckpt / "meta.json") if (ckpt / "meta.json").is_file() else {}
    if "encoder_config" in meta:
        cfg = _encoder_config(meta["encoder_config"], str(ckpt / "meta.json"))
    elif run_cfg is not None and "model" in run_cfg:
        cfg = _encoder_config(run_cfg["model"], f"{run_dir}/config.json")
    else:
        raise WeightsError(f"{ckpt}: no encoder config (neither meta.json 'encoder_config' nor the run's config.json)")
    file = ckpt / ("ema.safetensors" if weights == "ema" else "model.safetensors")
    if not file.is_file():
        hint = " (this checkpoint has no EMA copy: use weights='online')" if weights == "ema" else ""
        raise WeightsError(f"{file}: missing{hint}")
    tensors, file_meta = load_tensors(file)
    state = prefixed(tensors, "encoder.")
    if not state:
        raise WeightsError(f"{file}: no 'encoder.*' tensors (keys start with {sorted(tensors)[:3]})")
    cfg = _legacy_norm_bias(cfg, state)
    encoder = _build(cfg, state, file, device)
    step = checkpoint_step(ckpt) if (ckpt / "meta.json").is_file() or _STEP_DIR.match(ckpt.name) else None
    note = ema_note(file_meta, step, run_cfg, str(file)) if weights == "ema" else WEIGHTS_MEANING["online"]
    return LoadedEncoder(
        encoder=encoder,
        config=cfg,
        source=str(file),
        kind=kind,  # type: ignore[arg-type]
        weights=weights,
        step=step,
        run_dir=str(run_dir) if run_dir else None,
        run_config=run_cfg,
        note=note,
    )


def _from_export_file(file: Path, device: str | torch.device, kind: str) -> LoadedEncoder:
    tensors, meta = load_tensors(file)
    side = file.parent / "config.json"
    side_cfg = read_json(side) if side.is_file() else {}
    if "encoder_config" in meta:
        cfg = _encoder_config(meta["encoder_config"], f"{file} metadata")
    elif "model" in side_cfg:
        cfg = _encoder_config(side_cfg["model"], str(side))
    else:
        raise WeightsError(f"{file}: no encoder config in its metadata ('encoder_config') or beside it (config.json)")
    cfg = _legacy_norm_bias(cfg, tensors)
    encoder = _build(cfg, tensors, file, device)
    step = meta.get("step")
    return LoadedEncoder(
        encoder=encoder,
        config=cfg,
        source=str(file),
        kind=kind,  # type: ignore[arg-type]
        weights=meta.get("weights", side_cfg.get("weights", "unknown")),
        step=int(step) if step not in (None, "null", "") else None,
        run_config=side_cfg.get("run_config"),
        note=meta.get("weights_note", side_cfg.get("weights_note", "")),
    )


def load_encoder(
    path: str | Path, *, weights: WeightsKind = "ema", device: str | torch.device = "cpu"
) -> LoadedEncoder:
    """A frozen encoder from a run dir, checkpoint (dir or file), export (dir or file). See the module doc."""
    p = Path(path)
    if not p.exists():
        raise WeightsError(f"{p}: no such run directory, checkpoint or export")
    if p.is_dir():
        if (p / "checkpoints").is_dir():
            return _from_checkpoint(_latest_checkpoint(p), weights, device, "run")
        if (p / "encoder.safetensors").is_file():
            return _from_export_file(p / "encoder.safetensors", device, "export")
        if (p / "meta.json").is_file() or (p / "model.safetensors").is_file() or (p / "ema.safetensors").is_file():
            return _from_checkpoint(p, weights, device, "checkpoint")
        raise WeightsError(
            f"{p}: not a run directory (checkpoints/), a checkpoint (meta.json, model.safetensors) or an export "
            "(encoder.safetensors)"
        )
    refuse_pickle(p)  # before looking at anything else in the file
    if p.name in ("model.safetensors", "ema.safetensors"):
        return _from_checkpoint(p.parent, "ema" if p.name == "ema.safetensors" else "online", device, "checkpoint")
    return _from_export_file(p, device, "export" if p.name == "encoder.safetensors" else "file")


def random_encoder(config: Any, *, seed: int = 0, device: str | torch.device = "cpu") -> LoadedEncoder:
    """The same architecture at random initialisation (seeded; the global RNG state is left as it was)."""
    from levjepa.model import VideoEncoder

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = VideoEncoder(config)
    return LoadedEncoder(
        encoder=freeze(encoder.to(device)),
        config=config,
        source=f"random init (seed {seed})",
        kind="random",
        weights="random",
        run_config={"model": to_dict(config)},
    )
