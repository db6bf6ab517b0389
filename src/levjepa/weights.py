"""The run-directory contract: what levjepa leaves on disk, and the one module that reads and writes it.

Layout (the contract between training, evaluation, extraction and export; the names below are constants of
this module, so writers and readers cannot drift apart)::

    RUN_DIR/
      config.json                      the resolved PretrainConfig (readers parse it back with from_dict)
      env.json, git.json (+ git_diff.patch)   where and from what source the run ran
      metrics.jsonl                    one JSON object per logging step: {"step": ..., "loss": ..., ...}
      tb/                              TensorBoard event files
      bad_files.json                   unreadable inputs met by the data pipeline, with reasons
      probe_results.json               frozen-probe evaluation (when the run ends with one)
      checkpoints/latest               text: the name of the newest complete checkpoint, e.g. step_000500
      checkpoints/step_000500/
        model.safetensors              online weights: "encoder.<param>", "projector.<param>"
        ema.safetensors                Polyak/EMA copy (fp32): "encoder.<param>"; metadata: its update count
        meta.json                      {"step": 500, "encoder_config": {...}, "metrics": {...}}, written last
        trainer.safetensors, trainer.json   optimizer state, step, skip count (training only)
    EXPORT_DIR/                        the Hugging Face hub layout (levjepa.formats.writing.export)
      config.json                      model_type "levjepa", every encoder field, preprocessing, provenance
      model.safetensors                "<param>" of the VideoEncoder; metadata: format "pt", the encoder config
      preprocessor_config.json, video_preprocessor_config.json, README.md (YAML front matter + model card)
      projector.safetensors            optional: the training projector, for continued pretraining
    OLD_EXPORT_DIR/                    exports written before the hub layout (still read)
      encoder.safetensors, config.json, MODEL_CARD.md

A checkpoint is *complete* when its ``meta.json`` exists (it is written last, then the directory is
renamed into place): :func:`list_checkpoints` is the one lister and ``step_N`` the one name pattern.
:func:`read_json` / :func:`read_metrics` read the JSON files; typed readers (``levjepa.formats.reading.load``,
``levjepa.train.checkpoint``) parse config sections into their dataclasses with ``levjepa.config.from_dict``.

Why safetensors: a ``.pt`` file is a pickle, and unpickling runs code. Every loader here reads with
``safetensors`` and refuses anything else *before* touching its contents (:func:`refuse_pickle`).
Writes go to a temporary name in the same directory, are flushed to disk, then renamed, so a crash or a
full disk leaves the previous file intact. The files and folders made so get the permissions ``open()`` and
``mkdir()`` would give them under the process's umask (``tempfile`` alone makes them private to their owner,
and a team on a shared cluster could not read a run).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as _st_save

__all__ = [
    "BAD_FILES",
    "CHECKPOINTS",
    "CONFIG",
    "EMA_WEIGHTS",
    "EXPORT_WEIGHTS",
    "HUB_WEIGHTS",
    "LATEST",
    "META",
    "METRICS",
    "MODEL_CARD",
    "ONLINE_WEIGHTS",
    "PREPROCESSOR",
    "PROBE_RESULTS",
    "PROJECTOR_WEIGHTS",
    "TRAINER_STATE",
    "TRAINER_TENSORS",
    "VIDEO_PREPROCESSOR",
    "WeightsError",
    "atomic_write_bytes",
    "atomic_write_text",
    "checkpoint_name",
    "current_umask",
    "is_pickle",
    "checkpoint_step",
    "latest_checkpoint",
    "list_checkpoints",
    "load_tensors",
    "make_temp_dir",
    "prefixed",
    "read_json",
    "read_metrics",
    "refuse_nonfinite",
    "refuse_pickle",
    "safetensors_bytes",
    "save_tensors",
    "tensor_names",
    "truncate_metrics",
    "weights_fingerprint",
    "write_json",
]

# run directory
CONFIG = "config.json"
METRICS = "metrics.jsonl"
BAD_FILES = "bad_files.json"
PROBE_RESULTS = "probe_results.json"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
# checkpoint directory
META = "meta.json"
ONLINE_WEIGHTS = "model.safetensors"
EMA_WEIGHTS = "ema.safetensors"
TRAINER_TENSORS = "trainer.safetensors"
TRAINER_STATE = "trainer.json"
# export directory, hub layout (its config.json is CONFIG, its weights file is named as ONLINE_WEIGHTS)
HUB_WEIGHTS = "model.safetensors"
PREPROCESSOR = "preprocessor_config.json"
VIDEO_PREPROCESSOR = "video_preprocessor_config.json"  # transformers' VIDEO_PROCESSOR_NAME (AutoVideoProcessor)
PROJECTOR_WEIGHTS = "projector.safetensors"
# export directory before the hub layout
EXPORT_WEIGHTS = "encoder.safetensors"
MODEL_CARD = "MODEL_CARD.md"


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


def current_umask() -> int:
    """The process's umask (read from ``/proc`` where it can be, so no other thread sees a changed one)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A fresh directory in ``parent`` with the permissions ``mkdir`` gives under the umask (not 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(tmp, 0o777 & ~current_umask())
    return tmp


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file + fsync + rename (the old file survives any failure); the
    file gets the permissions ``open(path, "wb")`` would give it (0666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        if err.filename is None and err.errno is not None:  # a write or fsync says no path: name the file
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
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
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata))


def safetensors_bytes(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (what :func:`save_tensors` writes)."""
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    return _st_save(cpu, metadata=meta)


_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def is_pickle(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a pickle or a torch zip archive (which holds a pickle), from its first bytes only:
    nothing in the file is executed."""
    with open(path, "rb") as f:
        head = f.read(2)
    return head in _PICKLE_MAGIC or zipfile.is_zipfile(path)


def refuse_pickle(path: str | os.PathLike) -> None:
    """Raise :class:`WeightsError` if ``path`` is a pickle or a torch zip archive (:func:`is_pickle`)."""
    if is_pickle(path):
        raise WeightsError(
            f"{path}: this file carries a pickle payload (a torch.save / .pt / .pth file); levjepa never "
            "unpickles weights because unpickling can run arbitrary code. Convert trusted weights to "
            "safetensors (safetensors.torch.save_file) and load that instead."
        )


def refuse_nonfinite(tensors: Mapping[str, torch.Tensor], where: str | os.PathLike) -> None:
    """Raise :class:`WeightsError` naming the first tensor that holds a NaN or an infinity (and how many others
    do): such weights cannot be right, and an encoder built from them gives NaN features, every probe at chance
    and no error anywhere else. Only floating-point tensors holding data are looked at (not meta tensors)."""
    bad = [
        name
        for name, t in tensors.items()
        if t.is_floating_point() and not t.is_meta and not bool(torch.isfinite(t).all())
    ]
    if not bad:
        return
    t = tensors[bad[0]]
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    others = f" (and {len(bad) - 1} other tensor(s), e.g. {bad[1]!r})" if len(bad) > 1 else ""
    raise WeightsError(
        f"{where}: tensor {bad[0]!r} holds {nan} NaN and {inf} infinite value(s) of {t.numel()}{others}: weights "
        "that cannot be right (a run that diverged, or a damaged file); load an earlier checkpoint "
        "(RUN/checkpoints/step_N) or the file again"
    )


def load_tensors(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a safetensors file: (tensors, metadata). Pickles are refused unread, and a tensor holding a NaN or
    an infinity is refused by name (:func:`refuse_nonfinite`): weights, checkpoints and caches alike."""
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
    refuse_nonfinite(tensors, path)
    return tensors, meta


def weights_fingerprint(module: torch.nn.Module) -> str:
    """SHA-1 over ``module``'s state dict (names, shapes, dtypes and bytes): equal weights <=> equal fingerprint.

    The name of "these weights" (an export's record, a copy's provenance). What the weights compute also
    depends on the config (attention mode, head split, RoPE layout): that is
    ``levjepa.model.fingerprint.function_fingerprint``, which keys every feature cache, store and kept probe."""
    h = hashlib.sha1()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def tensor_names(path: str | os.PathLike) -> list[str]:
    """The tensor names of a safetensors file, from its header alone (the data are not read): whether the file
    reads at all. Raises :class:`WeightsError` on a file that is not safetensors (a truncated one included)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except FileNotFoundError:
        raise
    except Exception as err:  # safetensors raises its own errors on a bad header
        raise WeightsError(f"{path}: not a readable safetensors file ({err})") from err


def prefixed(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix`` (e.g. ``"encoder."``) with the prefix removed."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


# ------------------------------------------------------------------------------------------------- JSON


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from ``path``; :class:`WeightsError` naming the file when it is unreadable or not an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise WeightsError(f"{path}: not a readable JSON file ({err})") from err
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def write_json(path: str | os.PathLike, data: Mapping[str, Any], indent: int | None = 2) -> None:
    """Write a JSON object atomically (a crash never leaves half a file)."""
    atomic_write_text(path, json.dumps(data, indent=indent) + "\n")


def _metric_rows(run_dir: str | os.PathLike) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each line of ``metrics.jsonl`` that is a JSON object with a numeric ``step``, with that object."""
    path = Path(run_dir) / METRICS
    for line in path.read_text().splitlines() if path.is_file() else ():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int | float):
            yield line, row


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON objects of ``metrics.jsonl`` that carry a numeric ``step`` (malformed lines are skipped)."""
    return [row for _, row in _metric_rows(run_dir)]


def truncate_metrics(run_dir: str | os.PathLike, step: int) -> None:
    """Drop the ``metrics.jsonl`` lines logged after ``step`` (a resumed run logs them again), and any line a
    kill cut in half; the file is replaced atomically, so a crash here loses nothing."""
    if (Path(run_dir) / METRICS).is_file():
        keep = "".join(line + "\n" for line, row in _metric_rows(run_dir) if row["step"] <= step)
        atomic_write_text(Path(run_dir) / METRICS, keep)


# ------------------------------------------------------------------------------------------ checkpoints

_CHECKPOINT = re.compile(r"^step_(\d+)$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_step(ckpt_dir: str | os.PathLike) -> int:
    """The step of a checkpoint directory: its ``meta.json`` ``step``, else the ``step_N`` in its name."""
    ckpt_dir = Path(ckpt_dir)
    if (ckpt_dir / META).is_file():
        step = read_json(ckpt_dir / META).get("step")
        if isinstance(step, int):
            return step
    m = _CHECKPOINT.match(ckpt_dir.name)
    if m:
        return int(m.group(1))
    raise WeightsError(f"{ckpt_dir}: cannot tell the checkpoint's step (no meta.json 'step', name not step_N)")


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The complete checkpoints of a run (``checkpoints/step_N/`` holding ``meta.json``), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _CHECKPOINT.match(p.name) and (p / META).is_file()]
    return sorted(found, key=lambda p: int(p.name[len("step_") :]))


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names, or the newest complete one; None when there is none."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if (candidate / META).is_file():
            return candidate
    found = list_checkpoints(run_dir)
    return found[-1] if found else None
