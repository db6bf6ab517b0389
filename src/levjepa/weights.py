"""The on-disk format of levjepa weights: safetensors only, written atomically, never unpickled.

Layout (the contract between training, evaluation, extraction and export)::

    RUN_DIR/
      config.json                      resolved run config; its "model" section is the EncoderConfig
      checkpoints/latest               text: the name of the newest complete checkpoint, e.g. step_000500
      checkpoints/step_000500/
        model.safetensors              online weights: "encoder.<param>", "projector.<param>"
        ema.safetensors                Polyak/EMA copy (fp32): "encoder.<param>"
        meta.json                      {"step": 500, "encoder_config": {...}, ...}
        trainer.safetensors, trainer.json   optimizer, schedules, RNG states, data position (training only)
    EXPORT_DIR/
      encoder.safetensors              "<param>" of the VideoEncoder; metadata carries the encoder config
      config.json, MODEL_CARD.md

Why safetensors: a ``.pt`` file is a pickle, and unpickling runs code. Every loader here reads with
``safetensors`` and refuses anything else *before* touching its contents (:func:`refuse_pickle`).
Writes go to a temporary name in the same directory, are flushed to disk, then renamed, so a crash or a
full disk leaves the previous file intact.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as _st_save

__all__ = [
    "WeightsError",
    "atomic_write_bytes",
    "atomic_write_text",
    "save_tensors",
    "load_tensors",
    "refuse_pickle",
    "prefixed",
    "checkpoint_name",
    "list_checkpoints",
    "latest_checkpoint",
]


class WeightsError(ValueError):
    """A weights file is missing, unsafe (pickle) or not in levjepa's format."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file + fsync + rename (the old file survives any failure)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def save_tensors(
    path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, Any] | None = None
) -> None:
    """Save tensors as safetensors, atomically. Non-string metadata values are stored as JSON."""
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    atomic_write_bytes(path, _st_save(cpu, metadata=meta))


_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def refuse_pickle(path: str | os.PathLike) -> None:
    """Raise :class:`WeightsError` if ``path`` is a pickle or a torch zip archive (which holds a pickle).

    Only the first bytes are read; nothing in the file is executed.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:2] in _PICKLE_MAGIC or zipfile.is_zipfile(path):
        raise WeightsError(
            f"{path}: this file carries a pickle payload (a torch.save / .pt / .pth file); levjepa never "
            "unpickles weights because unpickling can run arbitrary code. Convert trusted weights to "
            "safetensors (safetensors.torch.save_file) and load that instead."
        )


def load_tensors(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a safetensors file: (tensors, metadata). Pickles are refused unread."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file")
    refuse_pickle(path)
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise WeightsError(f"{path}: not a readable safetensors file ({err})") from err
    return tensors, meta


def prefixed(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix`` (e.g. ``"encoder."``) with the prefix removed."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


_CHECKPOINT = re.compile(r"^step_(\d{6,})$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The complete checkpoints of a run (``checkpoints/step_N/`` holding ``meta.json``), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _CHECKPOINT.match(p.name) and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(_CHECKPOINT.match(p.name).group(1)))  # type: ignore[union-attr]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names, or the newest complete one; None when there is none."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if (candidate / "meta.json").is_file():
            return candidate
    found = list_checkpoints(run_dir)
    return found[-1] if found else None
