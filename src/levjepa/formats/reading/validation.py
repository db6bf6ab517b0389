"""Imported weights checked against the official forward: the numbers behind an import card's validation table.

The official code cannot ship with levjepa (CC BY-NC 4.0), so the official forward enters as its numbers: a
*reference file* (safetensors) holding a fixed clip ``input.video`` ``[B, C, T, H, W]`` and the official
model's ``last_hidden_state`` on it for an attention mode, ``output.<mode>`` ``[B, 1+N, D]`` (``block_causal``,
``full``), made by running the official ``module.py`` on the same weights — the layout of
``tests/fixtures/official`` (its README says how those were made). ``levjepa import SRC --reference REF``
runs the imported encoder on that clip (float32, CPU, nothing dropped) and records, for the output of its own
attention mode, the largest and the mean absolute difference over every token, with the reference file's
SHA-256 and how it was measured (:class:`Validation`); the export's ``config.json`` keeps it under
``imported_from.validation`` and the card prints it as a table (``levjepa.formats.writing.card``). An import whose
difference exceeds the tolerance is refused in one line rather than exported.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from levjepa.config import field_names, from_dict, to_dict
from levjepa.infer.encode import encode
from levjepa.model import VideoEncoder
from levjepa.weights import WeightsError, load_tensors

__all__ = ["TOLERANCE", "Validation", "validate"]

TOLERANCE = 1e-4  # float32 on the CPU; the conversion is tested at 1e-5 against the official outputs
# levjepa's attention modes -> the official attn_mode a reference file's output.<mode> is named by
REFERENCE_MODES = {"block_causal": "block_causal", "bidirectional": "full"}


@dataclass(frozen=True)
class Validation:
    """One comparison of the imported encoder with the official forward (module doc)."""

    reference: str  # the reference file's name
    reference_sha256: str
    mode: str  # the attention mode compared (the imported encoder's)
    input_shape: tuple[int, ...]
    tokens: int  # tokens compared per clip (CLS + patches)
    max_abs_diff: float
    mean_abs_diff: float
    tolerance: float
    measured: str  # how: dtype, device, torch version

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    @staticmethod
    def of(record: Any) -> Validation | None:
        """The validation an on-disk record (:meth:`record`) describes; ``None`` for none or a malformed one."""
        if not isinstance(record, dict):
            return None
        try:  # keys a later version adds are left out, as before
            return from_dict(Validation, {k: v for k, v in record.items() if k in field_names(Validation)})
        except (TypeError, ValueError):  # a key missing or of another type (ConfigError is a ValueError)
            return None

    def record(self) -> dict[str, Any]:
        """The on-disk record (``config.json``'s ``imported_from.validation``)."""
        return to_dict(self)


def validate(encoder: VideoEncoder, reference: str | Path, tolerance: float = TOLERANCE) -> Validation:
    """Compare ``encoder`` with the official outputs in ``reference`` (module doc); a ``WeightsError`` in one
    line for a reference without the clip or without the output of the encoder's attention mode, one of
    another shape (another model), or a difference above ``tolerance``."""
    path = Path(reference)
    if not path.is_file():
        raise WeightsError(f"--reference {path}: no such file (a safetensors file of input.video + output.<mode>)")
    tensors, _ = load_tensors(path)
    mode = REFERENCE_MODES[encoder.cfg.attention]
    key = f"output.{mode}"
    if "input.video" not in tensors or key not in tensors:
        has = ", ".join(sorted(k for k in tensors if k.startswith(("input.", "output.")))) or "neither"
        raise WeightsError(f"{path}: needs input.video and {key} (this encoder's attention), it holds {has}")
    video, want = tensors["input.video"].float(), tensors[key].float()
    encoded = encode(encoder.float(), video, "cpu", token_dtype=torch.float32)  # the frozen forward, in fp32
    assert encoded.tokens is not None
    got = encoded.tokens
    if got.shape != want.shape:
        raise WeightsError(
            f"{path}: {key} is {tuple(want.shape)}, the imported encoder gives {tuple(got.shape)} on its clip: a "
            "reference made with another model"
        )
    diff = (got - want).abs()
    result = Validation(
        reference=path.name,
        reference_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        mode=mode,
        input_shape=tuple(video.shape),
        tokens=int(want.shape[1]),
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        tolerance=tolerance,
        measured=f"float32, CPU ({platform.machine()}), torch {torch.__version__}, every token of every clip",
    )
    if not result.passed:
        raise WeightsError(
            f"{path}: the imported encoder differs from the official {key} by up to {result.max_abs_diff:.3g} "
            f"(tolerance {tolerance:g}): check --heads / --attention / --norm-eps, or the reference's weights"
        )
    return result
