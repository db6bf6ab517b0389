"""Exports in the layout the Hugging Face tools read (``levjepa export``, ``levjepa import``).

An export is a directory ``huggingface_hub`` and its users recognise, holding nothing that can run code::

    DIR/config.json              model_type "levjepa", architectures ["LeVJEPAModel"], format "levjepa-hub/1",
                                 the levjepa version, "encoder": every EncoderConfig field (``readout_layers``:
                                 the blocks it reads, ``levjepa export --layers``), the usual HF
                                 aliases (hidden_size, num_hidden_layers, num_attention_heads, ...), the
                                 preprocessing, which weights (copy, note, step, source) and where they came
                                 from ("run_config", "imported_from", "init_from"), the licence and, for a
                                 run continued from other weights, "derived_from" (``weights_lineage``)
    DIR/model.safetensors        the VideoEncoder's state dict (levjepa names, no prefix; metadata format "pt");
                                 a classifier's: ``encoder.*`` + its head's ``head.*`` (the transformers names)
    DIR/preprocessor_config.json transformers' VideoMAEImageProcessor (AutoImageProcessor, no torchvision needed): mean,
                                 std, rescale, short-side resize + centre crop; frames and frame stride of a clip
    DIR/video_preprocessor_config.json  levjepa's video processor (AutoVideoProcessor, the video-classification
                                 pipeline; ``levjepa.formats.transformers.video_processor``): the same transform, the
                                 patch size, and how a clip's frames are sampled (``num_frames``, ``fps`` or
                                 ``frame_stride``), read by transformers with levjepa installed
    DIR/README.md                YAML front matter (library_name: levjepa, tags, pipeline_tag, license, the
                                 run's data) and the model card, with the run's probe table when it has one
    DIR/projector.safetensors    only when asked (``--with-projector``) or imported: the training projector,
                                 for continued pretraining (``model.init_from=DIR``)

A fine-tuned classifier's export adds ``classifier.json`` (``levjepa classify``), ``head`` and ``id2label`` in
``config.json`` and a classifier's card; its head's weights are written once, in ``model.safetensors``. ``levjepa
export --push-to-hub ORG/NAME`` publishes with huggingface_hub (``levjepa.formats.transformers.hub.push_to_hub``).
``levjepa.load(DIR)``, ``levjepa.from_pretrained(DIR)`` and, with transformers installed,
``AutoModel.from_pretrained(DIR)`` read it back; exports written before this layout (``encoder.safetensors`` +
``MODEL_CARD.md``) still load.

The EMA (Polyak) weights — a weighted average of the online weights the run trained — are exported by
default, as the papers evaluate them; the command prints which copy it exported.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from levjepa.config import to_dict
from levjepa.data.badfiles import SHOWN, BadFileReport, bad_file_line
from levjepa.data.eval_clip import ViewSpec
from levjepa.formats.deployment.classifier_graphs import CLASSIFIER_ONNX, STREAM_CLASSIFIER_ONNX, export_classifier_onnx
from levjepa.formats.deployment.graphs import (
    DEFAULT_OPSET,
    GRAPH_FILES,
    DeployConfig,
    check_deploy,
    export_onnx,
    export_pt2,
)
from levjepa.formats.deployment.quantize import Int8Config, calibration_clips
from levjepa.formats.reading.classifier import (
    CLASSIFIER,
    HEAD_WEIGHTS,
    ClassifierRecord,
    LoadedClassifier,
    id2label,
    is_classifier,
    load_classifier,
    read_classifier,
    read_head,
    write_classifier,
)
from levjepa.formats.reading.load import (
    HUB_FORMAT,
    OFFICIAL_SUFFIXES,
    LoadedEncoder,
    Preprocessing,
    WeightsKind,
    is_official_folder,
    load_encoder,
    load_projector,
    preprocessing_of,
    read_run_config,
)
from levjepa.formats.writing.card import CITATION, card_facts, render_card
from levjepa.model import EncoderConfig
from levjepa.model.classifier import VideoClassifier
from levjepa.model.readout_layers import layers_text, parse_layers
from levjepa.train.config import PretrainConfig
from levjepa.version import __version__
from levjepa.weights import (
    CHECKPOINTS,
    CONFIG,
    HUB_WEIGHTS,
    PREPROCESSOR,
    PROBE_RESULTS,
    PROJECTOR_WEIGHTS,
    VIDEO_PREPROCESSOR,
    WeightsError,
    atomic_write_text,
    read_json,
    read_metrics,
    save_tensors,
    write_json,
)

__all__ = [
    "CITATION",
    "EXPORT_FILES",
    "MODEL_TYPE",
    "README",
    "Preprocessing",
    "export_encoder",
    "is_export_record",
    "preprocessor_config",
    "preprocessing_of",
    "video_processor_config",
    "weights_lineage",
    "write_export",
    "write_loaded",
]

README = "README.md"
MODEL_TYPE = "levjepa"  # config.json's model_type: what transformers and levjepa.commands._outputs tell an export by
# every name an export writes (the graphs: formats.deployment.graphs, .classifier_graphs; head.safetensors: a
# classifier's export written before its head went into model.safetensors): what levjepa export claims, and replaces
EXPORT_FILES = (
    *(HUB_WEIGHTS, CONFIG, PREPROCESSOR, VIDEO_PREPROCESSOR, README, PROJECTOR_WEIGHTS, CLASSIFIER, HEAD_WEIGHTS),
    *(*GRAPH_FILES, CLASSIFIER_ONNX, STREAM_CLASSIFIER_ONNX),
)


def is_export_record(config: Mapping[str, Any]) -> bool:
    """``config.json`` as an export holds it (:func:`write_export`; ``exported_at``: written before the
    ``model_type``)."""
    return config.get("model_type") == MODEL_TYPE or "exported_at" in config


def _hf_aliases(config: EncoderConfig, pre: Preprocessing) -> dict[str, Any]:
    """The names the Hugging Face tools read for a ViT."""
    return {
        "hidden_size": config.dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.heads,
        "intermediate_size": config.mlp_hidden,
        "patch_size": config.patch_size,
        "tubelet_size": config.tubelet,
        "num_channels": config.in_chans,
        "layer_norm_eps": config.norm_eps,
        "qkv_bias": config.qkv_bias,
        "image_size": pre.size,
        "num_frames": pre.record()["num_frames"],
    }


def _transform(pre: Preprocessing, crop: int) -> dict[str, Any]:
    """The transform both processor files state in transformers' names: resize the short side to ``pre.size``
    (bilinear), centre-crop ``crop``², ``/ 255``, normalise."""
    return {
        "do_resize": True,
        "size": {"shortest_edge": pre.size},
        "resample": 2,  # PIL's bilinear (antialiased)
        "do_center_crop": True,
        "crop_size": {"height": crop, "width": crop},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(pre.mean),
        "image_std": list(pre.std),
    }


def preprocessor_config(pre: Preprocessing) -> dict[str, Any]:
    """``preprocessor_config.json``: transformers' ``VideoMAEImageProcessor`` with this export's geometry (its
    Pillow backend loads without torchvision: ``AutoImageProcessor.from_pretrained(DIR)``), plus the frames a
    clip takes and their stride (or rate, when recorded), which no image processor reads."""
    return {
        "image_processor_type": "VideoMAEImageProcessor",
        **_transform(pre, pre.size),
        **{k: v for k, v in pre.record().items() if k in ("num_frames", "frame_stride")},
        **({} if pre.fps is None else {"fps": pre.fps}),  # the training rate, when the model records one
        "levjepa_version": __version__,
    }


def video_processor_config(pre: Preprocessing, patch: int) -> dict[str, Any]:
    """``video_preprocessor_config.json``: levjepa's video processor (``LeVJEPAVideoProcessor``, registered with
    ``AutoVideoProcessor`` by levjepa) in transformers' names: the transform of :func:`preprocessor_config`
    (the crop the largest multiple of ``patch`` in the short side, as levjepa's readers cut it), the patch
    size, and the frames of a clip: ``num_frames`` at ``fps`` when the model records its training rate, else
    every ``frame_stride``-th."""
    return {
        "video_processor_type": "LeVJEPAVideoProcessor",
        **_transform(pre, (pre.size // patch) * patch),
        "do_sample_frames": False,  # frames given as arrays are the caller's; a path is always sampled
        "num_frames": pre.frames,
        "fps": pre.fps,
        "frame_stride": pre.frame_stride,
        "patch_size": patch,
        "levjepa_version": __version__,
    }


def _measured_with(pre: Preprocessing, views: ViewSpec) -> Preprocessing:
    """A classifier is read with the views its scores were measured with: their frames, size and sampling."""
    v = views
    return dataclasses.replace(pre, size=v.size, frames=v.frames, frame_stride=v.frame_stride, fps=v.fps)


def write_export(
    out: str | Path,
    *,
    config: EncoderConfig,
    encoder_state: Mapping[str, torch.Tensor],
    weights: str,
    note: str = "",
    step: int | None = None,
    source: str = "",
    run_config: PretrainConfig | None = None,
    metrics: list[dict[str, Any]] | None = None,
    probe_results: Mapping[str, Any] | None = None,
    projector_state: Mapping[str, torch.Tensor] | None = None,
    imported_from: Mapping[str, Any] | None = None,
    preprocessing: Preprocessing | None = None,
    license: str = "mit",
    classifier: ClassifierRecord | None = None,
    head_state: Mapping[str, torch.Tensor] | None = None,
    derived_from: Mapping[str, Any] | None = None,
) -> Path:
    """Write the hub layout (module docstring) to ``out`` (created; every file written atomically); ``derived_from``
    (:func:`weights_lineage`) records where the weights a run started from came from. A ``classifier`` (its record
    and ``head_state``) makes the export a classifier's: ``encoder.*`` and ``head.*`` in ``model.safetensors`` (the
    names of the transformers model), ``head`` and ``id2label`` in ``config.json`` (what
    ``AutoModelForVideoClassification`` reads), ``classifier.json`` (what ``levjepa classify`` reads, its head from
    ``model.safetensors``) and a classifier's card; its preprocessing (so both processors, and the pipeline's
    ``num_frames``) takes the frames, size and sampling of the views its scores were measured with
    (``ClassifierRecord.protocol``), as ``levjepa classify`` cuts them."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise WeightsError(f"{out}: exists and is not a directory; choose another --out")
    if (classifier is None) != (head_state is None):
        raise ValueError("write_export: a classifier needs both its record and its head's weights")
    out.mkdir(parents=True, exist_ok=True)
    pre = preprocessing or preprocessing_of(run_config)
    if classifier is not None:
        pre = _measured_with(pre, classifier.protocol)
    exported_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    record: dict[str, Any] = {
        "model_type": MODEL_TYPE,
        "architectures": ["LeVJEPAForVideoClassification" if classifier else "LeVJEPAModel"],
        "format": HUB_FORMAT,
        "levjepa_version": __version__,
        "encoder": to_dict(config),
        **_hf_aliases(config, pre),
        "preprocessing": pre.record(),
        "weights": weights,
        "weights_note": note,
        "step": step,
        "source": source,
        "exported_at": exported_at,
        "init_from": config.init_from,
        "imported_from": dict(imported_from) if imported_from else None,
        "run_config": to_dict(run_config) if run_config is not None else None,
        "license": license,
        "derived_from": dict(derived_from) if derived_from else None,
    }
    tensors = dict(encoder_state)
    if classifier is not None and head_state is not None:  # the names transformers' save_pretrained writes
        record.update({"head": to_dict(classifier.head), **id2label(classifier.labels)})
        tensors = {f"encoder.{k}": v for k, v in encoder_state.items()}
        tensors.update({f"head.{k}": v for k, v in head_state.items()})
    meta = {"format": "pt", "levjepa_format": HUB_FORMAT, "encoder_config": to_dict(config), "weights": weights}
    save_tensors(out / HUB_WEIGHTS, tensors, meta)
    if projector_state is not None:
        save_tensors(out / PROJECTOR_WEIGHTS, projector_state, {"format": "pt", "levjepa_format": HUB_FORMAT})
    if classifier is not None:  # its head is in model.safetensors
        write_classifier(out, classifier)
    write_json(out / CONFIG, record)
    write_json(out / PREPROCESSOR, preprocessor_config(pre))
    write_json(out / VIDEO_PREPROCESSOR, video_processor_config(pre, config.patch_size))
    facts = card_facts(
        config,
        weights=weights,
        note=note,
        step=step,
        source=source,
        run=run_config,
        metrics=metrics or [],
        probe_results=probe_results,
        imported_from=imported_from,
        classifier=classifier,
        params=sum(v.numel() for v in encoder_state.values()),
        license=license,
        derived_from=derived_from,
    )
    atomic_write_text(out / README, render_card(facts))
    return out


def write_loaded(
    out: str | Path,
    loaded: LoadedEncoder,
    *,
    lineage: tuple[str, Mapping[str, Any] | None],
    classifier: tuple[ClassifierRecord, Mapping[str, torch.Tensor]] | None = None,
    metrics: list[dict[str, Any]] | None = None,
    probe_results: Mapping[str, Any] | None = None,
    projector_state: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """The export of ``loaded`` as it stands — its encoder's weights (copied to the CPU), config, which copy
    (weights, note, step, source), run config, preprocessing and official origin — with the licence and
    ``derived_from`` of ``lineage`` (:func:`weights_lineage` of where it was read) and, for a classifier, its
    record and head weights: the one call that writes a classifier, both ``levjepa finetune``'s ``best/`` and
    ``levjepa export`` of it (:func:`export_encoder`)."""
    license, derived = lineage
    record, head_state = classifier if classifier is not None else (None, None)
    return write_export(
        out,
        config=loaded.config,
        encoder_state={k: v.detach().cpu().clone() for k, v in loaded.encoder.state_dict().items()},
        weights=loaded.weights,
        note=loaded.note,
        step=loaded.step,
        source=loaded.source,
        run_config=loaded.run_config,
        metrics=metrics,
        probe_results=probe_results,
        projector_state=projector_state,
        imported_from=loaded.imported_from,
        preprocessing=loaded.preprocessing,
        license=license,
        derived_from=derived,
        classifier=record,
        head_state=None if head_state is None else {k: v.detach().cpu().clone() for k, v in head_state.items()},
    )


OFFICIAL_LICENSE = "cc-by-nc-4.0"
UNKNOWN_LICENSE = "other"  # the weights a run started from are gone: their licence cannot be told


def _init_path(init: str, run_dir: Path | None) -> Path | None:
    """Where a recorded ``model.init_from`` is now: as written (absolute, or from the current directory), else
    beside the run that recorded it."""
    for path in (Path(init), *((run_dir / init, run_dir.parent / init) if run_dir is not None else ())):
        if path.exists():
            return path
    return None


def _lineage_of(path: Path, seen: set[Path]) -> tuple[str, dict[str, Any] | None] | None:
    """The licence of the weights at ``path`` (what ``model.init_from`` named) and the official weights they
    came from (their ``imported_from`` record), read from the files beside them without loading a weight;
    ``None`` when ``path`` is nothing levjepa reads."""
    key = path.resolve()
    if key in seen:  # a chain of runs that names itself: nothing more to learn
        return None
    seen = seen | {key}
    if path.is_file() and path.suffix in OFFICIAL_SUFFIXES:
        return OFFICIAL_LICENSE, {"source": str(key), "file": path.name}
    folder = path.parent if path.is_file() else path
    if is_official_folder(folder):
        return OFFICIAL_LICENSE, {"source": str(folder.resolve()), "file": HUB_WEIGHTS}
    data = read_json(folder / CONFIG) if (folder / CONFIG).is_file() else {}
    official = data.get("imported_from") or (data.get("derived_from") or {}).get("imported_from")
    if isinstance(data.get("license"), str):  # an export: what it recorded
        return str(data["license"]), dict(official) if isinstance(official, Mapping) else None
    if isinstance(data.get("imported_from"), Mapping):  # imported before the licence was recorded
        return OFFICIAL_LICENSE, dict(data["imported_from"])
    run_dir = folder if (folder / CHECKPOINTS).is_dir() else None  # a run, or one of its checkpoints
    if folder.parent.name == CHECKPOINTS:
        run_dir = folder.parent.parent
    try:
        if run_dir is not None and (run_dir / CONFIG).is_file():
            return _follow(read_run_config(run_dir).model.init_from, run_dir, seen)
    except WeightsError:  # not a run config levjepa reads: its licence cannot be told
        return None
    run = data.get("run_config")  # an export written before the licence was recorded: its run's start
    if isinstance(run, Mapping):
        return _follow((run.get("model") or {}).get("init_from"), None, seen)
    return None


def _follow(init: Any, run_dir: Path | None, seen: set[Path]) -> tuple[str, dict[str, Any] | None] | None:
    """The lineage of a run's ``model.init_from`` (levjepa's MIT when it started from scratch)."""
    if not init:
        return "mit", None
    path = _init_path(str(init), run_dir)
    return None if path is None else _lineage_of(path, seen)


def weights_lineage(source: str | Path, loaded: LoadedEncoder) -> tuple[str, dict[str, Any] | None]:
    """The licence an export of ``loaded`` (read from ``source``) inherits, and ``derived_from``: where the
    weights its run started from came from (``model.init_from``, followed through runs and exports to the
    official weights, whose ``imported_from`` it carries), ``None`` for weights trained from scratch.

    What the source's ``config.json`` records comes first; imported official weights are CC BY-NC 4.0; weights a
    levjepa run trained are levjepa's MIT unless the run started from others (``model.init_from``), whose
    licence they keep — CC BY-NC for a run continued from the official weights. A starting point that is gone
    makes the licence :data:`UNKNOWN_LICENSE` (the card says so) rather than a guess."""
    src = Path(source)
    cfg = (src.parent if src.is_file() else src) / CONFIG
    data = read_json(cfg) if cfg.is_file() else {}
    if isinstance(data.get("license"), str):
        derived = data.get("derived_from")
        return str(data["license"]), dict(derived) if isinstance(derived, Mapping) else None
    if loaded.imported_from or loaded.kind == "official":
        return OFFICIAL_LICENSE, None  # the export records imported_from itself
    init = (loaded.run_config.model.init_from if loaded.run_config is not None else None) or loaded.config.init_from
    if not init:
        return "mit", None
    run_dir = Path(loaded.run_dir) if loaded.run_dir else None
    found = _follow(init, run_dir, {run_dir.resolve()} if run_dir is not None else set())
    if found is None:
        return UNKNOWN_LICENSE, {"init_from": str(init), "imported_from": None, "found": False}
    license, official = found
    return license, {"init_from": str(init), "imported_from": official, "found": True}


def _kept_probe(source: str | Path, device: str) -> LoadedClassifier | None:
    """The probe kept at ``source`` with the encoder it reads (``load_classifier``: refused in one line unless
    it computes what the head was trained on), or ``None`` when ``source`` is no kept probe. A head trained on a
    compact store's tokens (``tokens`` not ``full``) is refused: transformers' forward gives it full tokens."""
    if not is_classifier(source) or read_classifier(source).encoder_source == ".":
        return None
    clf = load_classifier(source, device=device)
    if clf.record.tokens != "full":
        raise WeightsError(
            f"{source}: its head reads the tokens a compact store kept ({clf.record.tokens}), which the exported "
            "model's forward does not reproduce; export a probe trained on full tokens (probe --tokens full)"
        )
    return clf


def _read_at(loaded: LoadedEncoder, layers: str | None, source: str | Path, *, classifier: bool) -> LoadedEncoder:
    """``loaded`` read at ``layers`` (``--layers``; ``None``: as it stands); a classifier's at its own only."""
    if layers is None:
        return loaded
    c = loaded.config
    want = parse_layers(layers, c.depth)
    if classifier and want != c.readout_layers:
        raise WeightsError(
            f"--layers {layers}: {source} is a classifier whose head reads {layers_text(c.readout_layers, c.depth)}; "
            "drop --layers (its export reads those), or probe again with --layers"
        )
    return loaded.with_readout(want)


def _calibration(
    deploy: DeployConfig, patch: int, pre: Preprocessing, say: Callable[[str], None] | None
) -> torch.Tensor | None:
    """The clips static int8 is calibrated on (``None`` for other graphs), read at the model's sampling; the
    bad files among them are reported as every reader reports them, and counted in the line ``say`` gets."""
    if deploy.quantize != "int8" or deploy.int8.method != "static":
        return None
    assert deploy.int8.calibration is not None  # check_deploy: static int8 names its clips
    bad = BadFileReport(warn=False)  # its lines said once the clips are read: a refusal stays one line
    clips = calibration_clips(
        deploy.int8.calibration, deploy.int8.clips, frames=deploy.window, size=deploy.height, patch=patch,
        frame_stride=pre.frame_stride, fps=pre.fps, seed=deploy.int8.seed, bad=bad,
    )  # fmt: skip
    if say is not None:
        for path, reason in list(bad.files.items())[:SHOWN]:
            say(bad_file_line(path, reason))
        skipped = f" ({bad.total} bad file(s) skipped: {bad.counts_text()})" if bad.total else ""
        say(f"calibrating int8 on {len(clips)} clip(s) of {deploy.int8.calibration}{skipped}")
    return clips


def export_encoder(
    source: str | Path,
    out: str | Path,
    *,
    weights: WeightsKind = "ema",
    device: str = "cpu",
    with_projector: bool = False,
    graphs: Literal["none", "onnx", "pt2"] = "none",
    window: int | None = None,
    size: int | None = None,
    dtype: Literal["fp32", "fp16"] = "fp32",
    quantize: Literal["none", "int8"] = "none",
    opset: int = DEFAULT_OPSET,
    int8: Int8Config | None = None,
    layers: str | None = None,
    say: Callable[[str], None] | None = None,
) -> LoadedEncoder:
    """Write the hub layout to ``out`` for the encoder at ``source`` (a run, a checkpoint, an export, official
    weights, a fine-tuned classifier with its head, a kept probe with the encoder it reads), and with
    ``graphs`` the deployment graphs beside it (``levjepa.formats.deployment.graphs``: the streaming ``window`` in
    frames, default the clip length; the frame ``size``, default the clip size; ``dtype``, ``quantize``, ``opset``;
    ``int8``: how an int8 graph is made, static on calibration clips it reads here or dynamic). A classifier
    adds its own graphs (``levjepa.formats.deployment.classifier_graphs``: ``classifier.onnx``,
    ``stream_classifier.onnx``, onnx only), the window and frame size defaulting to the views it was scored with.

    A kept probe (``RUN/probes/TASK/PROBE``: a classifier whose encoder stays where it is) exports as a
    classifier: the encoder its record names (the copy it was trained on, whatever ``weights`` says; refused in
    one line unless it is the one the head was trained on), its head, its labels and views, with the licence
    and lineage of that encoder — what a fine-tuned ``best/`` exports as.

    ``layers`` (as ``--layers`` writes them, ``levjepa.model.readout_layers``): the blocks the export reads,
    recorded in its config (``encoder.readout_layers``), so that ``levjepa.load``, ``from_pretrained`` and
    ``AutoModel`` give the readout of those blocks; ``None`` keeps the source's. A classifier reads the blocks
    its head was trained on: other ``layers`` are refused in one line, as are deployment graphs of a readout
    other than the last block (they compute the last block's)."""
    kept = _kept_probe(source, device)
    if kept is not None:
        loaded = kept.encoder
    else:
        loaded = load_encoder(source, weights=weights, device=device)
    loaded = _read_at(loaded, layers, source, classifier=kept is not None or is_classifier(source))
    pre = loaded.preprocessing or preprocessing_of(loaded.run_config)
    views = kept.record.protocol if kept is not None else None
    if kept is None and is_classifier(source):
        views = read_classifier(source).protocol
    if views is not None:
        pre = _measured_with(pre, views)
    deploy = _deploy_config(graphs, loaded, pre, window, size, dtype, quantize, opset, int8)
    clips = _calibration(deploy, loaded.encoder.cfg.patch_size, pre, say) if deploy is not None else None
    run_dir = Path(loaded.run_dir) if loaded.run_dir else None
    probe = run_dir / PROBE_RESULTS if run_dir else None
    head: tuple[ClassifierRecord, torch.nn.Module] | None = None
    if kept is not None:  # the record as the export holds it: the encoder is in the folder now
        head = (dataclasses.replace(kept.record, encoder_source="."), kept.model.head)
    elif is_classifier(source):  # a fine-tuned classifier: its head too
        head = read_head(source)
    projector = load_projector(source) if with_projector else None
    if with_projector and projector is None:
        raise WeightsError(f"{source}: holds no projector weights to export (--with-projector)")
    write_loaded(
        out,
        loaded,
        lineage=weights_lineage(kept.record.encoder_source if kept is not None else source, loaded),
        metrics=read_metrics(run_dir) if run_dir else [],
        probe_results=read_json(probe) if probe is not None and probe.is_file() else None,
        projector_state=projector,
        classifier=None if head is None else (head[0], head[1].state_dict()),
    )
    if deploy is not None:
        _write_graphs(graphs, Path(out), loaded, deploy, head, pre, clips, say)
    return loaded


def _deploy_config(
    graphs: str, loaded: LoadedEncoder, pre: Preprocessing, window: int | None, size: int | None,
    dtype: Literal["fp32", "fp16"], quantize: Literal["none", "int8"], opset: int, int8: Int8Config | None,
) -> DeployConfig | None:  # fmt: skip
    """The deployment graphs asked for (``None``: none), checked before anything is written."""
    if graphs == "none":
        if (window, size, dtype, quantize, int8) != (None, None, "fp32", "none", None):
            raise WeightsError(
                "window, size, dtype and quantize shape the deployment graphs: export with --format onnx"
            )
        return None
    side = pre.size if size is None else size
    deploy = DeployConfig(
        pre.frames if window is None else window, side, side, dtype, quantize, opset, int8 or Int8Config()
    )
    if loaded.config.readout_layers is not None:
        raise WeightsError(
            f"--format {graphs}: the deployment graphs compute the last block's readout, not "
            f"{layers_text(loaded.config.readout_layers, loaded.config.depth)}; export the graphs without "
            "--layers (from an encoder read at its last block)"
        )
    check_deploy(loaded.encoder, deploy)
    return deploy


def _write_graphs(
    graphs: str, out: Path, loaded: LoadedEncoder, deploy: DeployConfig,
    head: tuple[ClassifierRecord, torch.nn.Module] | None, pre: Preprocessing, clips: torch.Tensor | None,
    say: Callable[[str], None] | None,
) -> None:  # fmt: skip
    """The deployment graphs beside the export (a classifier's too, in ONNX), recorded in its ``config.json``."""
    if graphs == "pt2":
        record = export_pt2(loaded.encoder, out, deploy)
    else:
        record = export_onnx(loaded.encoder, out, deploy, preprocessing=pre.record(), say=say, calibration=clips)
    if head is not None and graphs == "onnx":
        model = VideoClassifier(loaded.encoder, head[0].head, head[1]).eval()
        record = export_classifier_onnx(model, head[0], out, deploy, record, preprocessing=pre.record(), say=say,
                                        calibration=clips)  # fmt: skip
    write_json(out / CONFIG, {**read_json(out / CONFIG), "deploy": record})
