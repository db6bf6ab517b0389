"""The classifier fine-tuning trains: where its encoder and head start, and where its best copy goes.

* **Start** (:func:`start_encoder`): the encoder of a levjepa run, checkpoint, export or imported weights
  (``levjepa.formats.reading.load``), or, for the baseline, the same architecture at random initialisation
  (``random_init``), every parameter trainable.
* **Head** (:func:`start_head`): ``levjepa.model.classifier``'s attentive or linear head, initialised from
  ``(seed, "head")`` — or the head of a kept probe (``head_from``; LP-FT: Kumar et al., ICLR 2022, fine-tune
  from a trained probe), read by ``levjepa.formats.reading.classifier.read_head`` in float32 and refused unless it is a
  head of the kind and width asked for the task's classes, trained on this very encoder
  (``formats.reading.classifier.check_encoder``: the function fingerprint).
* **Best** (:class:`BestExport`): ``OUT/best``, the classifier with the best validation accuracy so far, written
  by the one call that writes a classifier's export (``levjepa.formats.writing.export.write_loaded``): the encoder in
  the hub layout with ``id2label``, its head and ``classifier.json`` — what ``levjepa classify`` runs and ``levjepa
  export`` writes again — with the licence and origin of the weights it started from (a classifier fine-tuned
  from the released checkpoint, or from a run continued from it, keeps its CC BY-NC licence) and their
  preprocessing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from torch import nn

from levjepa.config import ConfigError
from levjepa.data.eval_clip import ViewSpec
from levjepa.formats.reading.classifier import ClassifierRecord, check_encoder, read_head
from levjepa.formats.reading.load import LoadedEncoder, load_encoder, random_like
from levjepa.formats.writing.export import weights_lineage, write_loaded
from levjepa.model.classifier import HeadConfig, HeadInput, VideoClassifier, build_head
from levjepa.model.fingerprint import function_fingerprint
from levjepa.model.probe_kinds import head_kind
from levjepa.rng import make_generator
from levjepa.weights import WeightsError

__all__ = ["BestExport", "HeadStart", "Start", "start_encoder", "start_head"]

BEST = "best"


@dataclass(frozen=True)
class Start:
    """Where the encoder starts: ``weights`` of ``source``, or its architecture at random (``random_init``,
    seeded by ``seed``)."""

    source: str
    weights: Literal["ema", "online"]
    random_init: bool
    seed: int

    def describe(self) -> str:
        return "random init" if self.random_init else f"the {self.weights} weights of {self.source}"


@dataclass(frozen=True)
class HeadStart:
    """Which head (``kind``, ``depth``), and where it starts: ``(seed, "head")``, or the kept probe ``head_from``."""

    kind: str  # a kind of levjepa.model.probe_kinds
    depth: int
    head_from: str | None
    seed: int


def start_encoder(start: Start, device: str) -> LoadedEncoder:
    """The encoder fine-tuning starts from, trainable, on ``device``."""
    loaded = load_encoder(start.source, weights=start.weights, device="cpu")
    if loaded.config.readout_layers is not None:  # an export made with --layers (or a run with model.readout_layers)
        raise ConfigError(
            f"{start.source} is read at blocks {', '.join(map(str, loaded.config.readout_layers))} "
            "(readout_layers): fine-tuning trains the encoder on its last block; start from the run, or an export "
            "made without --layers"
        )
    if start.random_init:
        loaded = random_like(loaded, seed=start.seed)
    loaded.encoder = loaded.encoder.requires_grad_(True).to(device)
    return loaded


def start_head(h: HeadStart, loaded: LoadedEncoder, num_classes: int, start: Start) -> tuple[HeadConfig, nn.Module]:
    """A fresh head, or the kept probe's (module doc); a mismatch is refused in one line (``ConfigError``)."""
    want = HeadConfig(
        kind=h.kind,
        input=cast(HeadInput, head_kind(h.kind).inputs[0]),  # its first probe's: attentive tokens, linear mean
        dim=loaded.config.dim,
        num_classes=num_classes,
        depth=h.depth,
    )
    if h.head_from is None:
        return want, build_head(want, make_generator(h.seed, "head"))
    rec, head = read_head(h.head_from, token_dtype="float32")
    got = rec.head
    if (got.kind, got.dim, got.num_classes) != (want.kind, want.dim, want.num_classes):
        raise ConfigError(
            f"head_from={h.head_from}: a {got.kind} head of width {got.dim} for {got.num_classes} classes; this "
            f"fine-tuning needs a {want.kind} head of width {want.dim} for {want.num_classes} (--head, the task's "
            "classes)"
        )
    try:
        check_encoder(rec, loaded.encoder, where=f"head_from={h.head_from}", other=f"fine-tuning starts from "
                      f"{start.describe()}, which is")  # fmt: skip
    except WeightsError as err:
        raise ConfigError(str(err)) from err
    return got, head


@dataclass(frozen=True)
class BestExport:
    """``OUT/best`` (module doc): what the export records of the start, fixed for the run."""

    out: Path
    start: LoadedEncoder  # its preprocessing and origin travel with the fine-tuned weights
    source: str  # the start's path, resolved
    note: str
    lineage: tuple[str, Mapping[str, Any] | None]  # formats.writing.export.weights_lineage of the start

    @staticmethod
    def of(run: Path, start: Start, loaded: LoadedEncoder) -> BestExport:
        note = f"fine-tuned from {start.source} ({'random init' if start.random_init else start.weights})"
        source = str(Path(start.source).resolve())
        return BestExport(run / BEST, loaded, source, note, weights_lineage(start.source, loaded))

    def save(self, model: VideoClassifier, labels: tuple[str, ...], views: ViewSpec, trained: dict[str, Any]) -> Path:
        """Write ``model`` (its head read with ``views``, class names ``labels``) with ``trained`` (the step, the
        validation accuracy, the recipe) as ``OUT/best``."""
        enc = model.encoder
        record = ClassifierRecord(
            model.head_cfg, labels, views, ".", "finetuned", function_fingerprint(enc), trained=trained
        )
        finetuned = dataclasses.replace(
            self.start, encoder=enc, config=enc.cfg, weights="finetuned", note=self.note, step=trained["step"],
            source=self.source, run_config=None,
        )  # fmt: skip
        return write_loaded(self.out, finetuned, lineage=self.lineage, classifier=(record, model.head.state_dict()))
