"""A classifier on disk: a kept probe (``levjepa probe``) or a fine-tuned classifier (``levjepa finetune``).

A classifier directory holds::

    DIR/classifier.json    format "levjepa-classifier/1"; "head" (every HeadConfig field), "labels" (class
                           names, index order), "protocol" (a levjepa.data.eval_clip.ViewSpec: size,
                           frames, frame_stride, segments, crops: how ``classify`` cuts a file into views),
                           "encoder" (source path, weights copy, fingerprint, whether the weights are in
                           DIR) and "trained" (how the head was trained and scored)
    DIR/head.safetensors   a kept probe's head: its state dict (levjepa.model.probe_heads, one row)

A kept probe reads a frozen encoder that stays where it is: ``encoder.source`` and ``encoder.weights`` name it,
``readout_layers`` the blocks its head reads (``levjepa probe --layers``; left out for the last block, as records
were written before), and :func:`load_classifier` reads the encoder at those blocks and refuses, in one line, an
encoder whose function fingerprint (``levjepa.model.fingerprint``: its weights and the config that says what they
compute) differs from the one the head was trained on (a record written before function fingerprints is checked
against the weights). A fine-tuned classifier changed its encoder, so the encoder is in ``DIR`` too, in the hub
layout (``model.safetensors`` + ``config.json`` with ``id2label`` / ``label2id``, ``levjepa.formats.writing.export``),
and its head is written once, as the ``head.*`` tensors of that ``model.safetensors`` (the names transformers'
``save_pretrained`` writes; no ``head.safetensors``; an export written before, which holds both, reads the
same): ``levjepa.load(DIR)`` reads it as a plain encoder, and ``levjepa export DIR`` writes it again with its head.

This module is the one reader and writer of a classifier's head: :func:`write_classifier` writes it (kept probes,
``levjepa.formats.writing.export`` for a fine-tuned classifier), :func:`read_head` reads it back (``load_classifier``
for ``levjepa classify``, fine-tuning's ``head_from``), :func:`head_module` turns head weights into the module
(:func:`export_head_state` reads the ``head.*`` tensors of a classifier export's ``model.safetensors``, for
``read_head`` and ``levjepa.formats.transformers.hub`` alike), and
:func:`check_encoder` is the one compatibility check of a head and an encoder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from levjepa.config import OMIT_DEFAULT, ConfigError, from_dict, to_dict
from levjepa.data.eval_clip import ViewSpec
from levjepa.formats.reading.load import LoadedEncoder, freeze, load_encoder
from levjepa.model.classifier import HeadConfig, VideoClassifier, build_head
from levjepa.model.fingerprint import matches
from levjepa.weights import HUB_WEIGHTS, WeightsError, load_tensors, prefixed, read_json, save_tensors, write_json

__all__ = [
    "CLASSIFIER",
    "CLASSIFIER_FORMAT",
    "HEAD_WEIGHTS",
    "ClassifierRecord",
    "LoadedClassifier",
    "check_encoder",
    "export_head_state",
    "head_module",
    "id2label",
    "is_classifier",
    "load_classifier",
    "read_classifier",
    "read_head",
    "write_classifier",
]

CLASSIFIER = "classifier.json"
HEAD_WEIGHTS = "head.safetensors"
CLASSIFIER_FORMAT = "levjepa-classifier/1"


@dataclass(frozen=True)
class ClassifierRecord:
    """``classifier.json`` (see the module doc); written with ``to_dict``, read back with ``from_dict``."""

    head: HeadConfig
    labels: tuple[str, ...]
    protocol: ViewSpec  # the views its scores were measured with, and that classify cuts every file into
    encoder_source: str  # the run / checkpoint / export the encoder is read from ("." : this directory)
    encoder_weights: str  # which copy of it: ema, online
    encoder_fingerprint: str
    trained: dict[str, Any] = field(default_factory=dict)
    format: str = CLASSIFIER_FORMAT
    tokens: str = "full"  # what the head reads of the tokens: every one, or a compact store's (features/compact.py)
    # the encoder's blocks the head reads, concatenated on channels (EncoderConfig.readout_layers; None: the last,
    # left out of classifier.json: a record as it was before readout layers)
    readout_layers: tuple[int, ...] | None = field(default=None, metadata={OMIT_DEFAULT: True})


def id2label(labels: Sequence[str]) -> dict[str, Any]:
    """The hub's ``id2label`` / ``label2id`` of ``labels``."""
    return {"id2label": {str(i): n for i, n in enumerate(labels)}, "label2id": {n: i for i, n in enumerate(labels)}}


def is_classifier(path: str | Path) -> bool:
    return (Path(path) / CLASSIFIER).is_file()


def write_classifier(
    out: str | Path, record: ClassifierRecord, head_state: Mapping[str, torch.Tensor] | None = None
) -> Path:
    """Write ``classifier.json`` into ``out`` (created), and ``head.safetensors`` for a kept probe's
    ``head_state``; ``None``: the head is in ``out``'s ``model.safetensors`` (a classifier export, whose
    encoder is there too: ``levjepa.formats.writing.export`` writes both)."""
    out = Path(out)
    if (head_state is None) != (record.encoder_source == "."):
        raise ValueError("write_classifier: a kept probe's head goes to head.safetensors, an export's to its weights")
    out.mkdir(parents=True, exist_ok=True)
    if head_state is not None:
        save_tensors(out / HEAD_WEIGHTS, head_state, {"format": "pt", "levjepa_format": CLASSIFIER_FORMAT})
    write_json(out / CLASSIFIER, to_dict(record))
    return out


def read_classifier(path: str | Path) -> ClassifierRecord:
    p = Path(path)
    if not is_classifier(p):
        raise WeightsError(f"{p}: not a classifier (no {CLASSIFIER}): give a kept probe or a fine-tuned classifier")
    data = read_json(p / CLASSIFIER)
    if data.get("format") != CLASSIFIER_FORMAT:
        raise WeightsError(f"{p / CLASSIFIER}: format {data.get('format')!r}, this levjepa reads {CLASSIFIER_FORMAT}")
    return from_dict(ClassifierRecord, data)


def head_module(cfg: HeadConfig, state: Mapping[str, torch.Tensor], where: str | Path) -> nn.Module:
    """The head ``cfg`` describes holding ``state`` (strict): the one place a classifier's head weights become a
    module, whether they come from ``head.safetensors`` or from the ``head.*`` tensors of a classifier export's
    ``model.safetensors`` (:func:`export_head_state`). Weights that do not fit ``cfg`` are refused in one
    line naming ``where``."""
    head = build_head(cfg)
    try:
        head.load_state_dict(dict(state), strict=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise WeightsError(f"{where}: the head's weights do not fit its config: {first}") from err
    return head


def export_head_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """The head's weights of the classifier export in ``folder``: the ``head.*`` tensors of its
    ``model.safetensors``, refused in one line when there are none."""
    file = Path(folder) / HUB_WEIGHTS
    state = prefixed(load_tensors(file)[0], "head.")
    if not state:
        raise WeightsError(f"{file}: a classifier's export without its head's weights (head.*)")
    return state


def read_head(
    path: str | Path, *, token_dtype: Literal["float32", "float16"] | None = None
) -> tuple[ClassifierRecord, nn.Module]:
    """The record and the head of the classifier in ``path`` (``classifier.json``, and the head's weights:
    ``head.safetensors`` of a kept probe, the ``head.*`` of a classifier export's ``model.safetensors``);
    ``token_dtype`` replaces the recorded one (fine-tuning reads a kept probe's head in float32). The record
    returned carries the head config the module was built from."""
    p = Path(path)
    rec = read_classifier(p)
    if token_dtype is not None:
        rec = replace(rec, head=replace(rec.head, token_dtype=token_dtype))
    if rec.encoder_source == ".":
        return rec, head_module(rec.head, export_head_state(p), p / HUB_WEIGHTS)
    return rec, head_module(rec.head, load_tensors(p / HEAD_WEIGHTS)[0], p / HEAD_WEIGHTS)


def check_encoder(rec: ClassifierRecord, encoder: nn.Module, *, where: str, other: str) -> None:
    """Refuse (``WeightsError``, one line) to put the head of ``rec`` on ``encoder`` unless it computes the
    function the head was trained on (``levjepa.model.fingerprint.matches``: the function fingerprint; a record
    written before function fingerprints is checked against the weights). ``where`` names the classifier,
    ``other`` the encoder offered (``"fine-tuning starts from ..."``, ``"DIR holds"``)."""
    same, fingerprint = matches(rec.encoder_fingerprint, encoder)
    if not same:
        raise WeightsError(
            f"{where}: its head was trained on the encoder {rec.encoder_fingerprint[:12]} ({rec.encoder_weights} "
            f"weights of {rec.encoder_source}), but {other} {fingerprint[:12]}: a head reads only the encoder it was "
            "trained on"
        )


@dataclass
class LoadedClassifier:
    model: VideoClassifier
    record: ClassifierRecord
    encoder: LoadedEncoder


def load_classifier(
    path: str | Path, *, encoder: str | Path | None = None, device: str | torch.device = "cpu"
) -> LoadedClassifier:
    """The classifier in ``path`` on ``device`` (eval mode): its head, and the encoder it reads — ``encoder``
    when given, else the one the record names. An encoder whose weights are not those the head was trained
    on is refused (``WeightsError``, one line)."""
    p = Path(path)
    rec = read_classifier(p)
    src = Path(encoder) if encoder is not None else p if rec.encoder_source == "." else Path(rec.encoder_source)
    if not src.exists():
        raise WeightsError(f"{p}: its encoder {rec.encoder_source} is gone; give it with --encoder PATH")
    loaded = load_encoder(src, weights=rec.encoder_weights, device=device)  # type: ignore[arg-type]
    try:  # read at the blocks the head was trained on
        loaded = loaded.with_readout(rec.readout_layers)
    except ConfigError as err:
        blocks = ", ".join(map(str, rec.readout_layers or ()))
        raise WeightsError(
            f"{p}: its head reads blocks {blocks}, which {src} (depth {loaded.config.depth}) does not have: a head "
            "reads only the encoder it was trained on"
        ) from err
    check_encoder(rec, loaded.encoder, where=str(p), other=f"{src} holds")
    rec, head = read_head(p)
    return LoadedClassifier(freeze(VideoClassifier(loaded.encoder, rec.head, head).to(device)), rec, loaded)
