"""int8 deployment graphs: onnxruntime's dynamic quantization, or static quantization calibrated on clips.

``levjepa export RUN --out DIR --format onnx --quantize int8`` quantizes every graph it writes
(``levjepa.formats.deployment.graphs``), in place, after onnxruntime's pre-processing (which folds the Transposes the
exporter puts in front of some weights, so that the quantizer sees every weight MatMul):

* **dynamic** (``--quantize int8`` alone): weights of every MatMul/Gemm stored as int8, activations quantized on
  every call from their own range (``quantize_dynamic``). No data needed, but each call pays for finding the
  range and quantizing, so on a CPU it can be slower than fp32 (``bench/deploy.md``).
* **static** (``--quantize int8 --calibrate DATA``): the activations' ranges are measured once, on
  ``--calibration-clips`` clips of ``DATA`` (a folder, an index file or one video: :func:`calibration_clips`)
  run through the fp32 graph (``quantize_static`` with a ``CalibrationDataReader``), and written into the graph
  as QuantizeLinear/DequantizeLinear pairs (``QDQ``; onnxruntime fuses them into int8 kernels) with per-channel
  weight scales. A streaming graph is calibrated on the steps of a stream through the clips (its KV cache as
  it fills), a classifier on the views it classifies.

**One scheme for every CPU.** Activations are uint8 (asymmetric, per tensor), weights int8 (symmetric; per
channel in static graphs) **in 7 bits** (``reduce_range``, the default): x86 CPUs without an int8 dot product
(AVX2, AVX-512 without VNNI; ``levjepa.infer.cpu``) multiply uint8 × int8 with ``vpmaddubsw``, which sums pairs
of products in int16 and saturates when full 8-bit weights meet large activations; 7-bit weights never reach
the limit. So the graph computes the same numbers on AVX2, AVX-512, VNNI and AMX alike — those of onnxruntime's
reference path, ``DequantizeLinear`` then a float product (``tests/test_quantize.py`` checks both) — and a graph
exported on one machine is right on every other one of a fleet. int8 activations (S8S8) do not avoid it:
onnxruntime's x86 kernels shift them to uint8 and run the same products. ``reduce_range=False`` keeps 8-bit
weights, a little closer to fp32 on CPUs with VNNI or AMX and wrong on the others (the runtimes here warn when
such a graph is loaded on one: :func:`int8_warning`). The scheme is recorded in the graph's metadata
(``int8``: ``scheme``, and the CPU it was exported on); ``bench/deploy.md`` has the measurements behind it.

Only the matrix products (MatMul, Gemm, Conv) are quantized; elementwise ops, LayerNorm and the softmax stay
float. ``keep_float`` (``--keep-float``) leaves parts of the network in float entirely, named by the module
they come from (the exporter records each node's module path):

    patch_embed   the tubelet embedding (raw pixels in)
    attention     the two activation × activation products of every attention (q·kᵀ and softmax·v), whose
                  inputs have the widest and least regular ranges of the network (graphs of opset 23 compute
                  attention as one fused ``Attention`` op, which stays float whatever this says)
    last_block    the last transformer block (its outputs are the features probes read)
    head          a classifier's head

Which parts the default keeps is measured, not guessed: ``bench/deploy.md`` has the accuracy and speed of each
choice on the demo run and the command that made them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from levjepa.data import BadFileReport, MediaItem, list_media
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.views import normalize
from levjepa.data.workers import safe_map
from levjepa.rng import make_generator
from levjepa.weights import WeightsError

__all__ = [
    "KEEP_FLOAT_PARTS",
    "Int8Config",
    "calibration_clips",
    "float_nodes",
    "int8_record",
    "int8_warning",
    "node_scope",
    "quantize_graph",
]

KEEP_FLOAT_PARTS = ("patch_embed", "attention", "last_block", "head")
Feeds = Callable[[], Iterable[Mapping[str, Any]]]  # a fresh pass over the calibration inputs of one graph


@dataclass(frozen=True)
class Int8Config:
    """How an int8 graph is made (module doc): ``static`` needs calibration clips (``calibration``: a folder, an
    index file or a video; ``clips`` of them, ``seed`` picks which when there are more). ``reduce_range``:
    7-bit weights, right on every CPU (module doc); False only for a fleet whose CPUs all have VNNI or AMX."""

    method: Literal["dynamic", "static"] = "dynamic"
    calibration: str | None = None
    clips: int = 32
    seed: int = 0
    format: Literal["qdq", "qoperator"] = "qdq"
    per_channel: bool = True
    calibrate_method: Literal["minmax", "percentile", "entropy"] = "minmax"
    keep_float: tuple[str, ...] = ("attention",)
    reduce_range: bool = True

    def check(self) -> None:
        """One-line ``WeightsError`` for a configuration that cannot be applied."""
        if self.method not in ("dynamic", "static"):
            raise WeightsError(f"int8 method {self.method!r}: valid choices are dynamic, static")
        if self.method == "static" and not self.calibration:
            raise WeightsError("static int8 needs calibration clips: give --calibrate DATA (a folder or an index)")
        if self.method == "dynamic" and self.calibration:
            raise WeightsError("--calibrate: calibration makes static int8; it needs --quantize int8")
        if self.clips < 1:
            raise WeightsError(f"--calibration-clips {self.clips}: must be >= 1")
        unknown = [p for p in self.keep_float if p not in KEEP_FLOAT_PARTS]
        if unknown:
            raise WeightsError(f"--keep-float {','.join(unknown)}: valid parts are {', '.join(KEEP_FLOAT_PARTS)}")
        if self.format not in ("qdq", "qoperator") or self.calibrate_method not in ("minmax", "percentile", "entropy"):
            raise WeightsError(f"int8: format {self.format!r}, calibration {self.calibrate_method!r} not known")


def int8_record(cfg: Int8Config) -> dict[str, Any]:
    """What a graph's metadata and ``config.json`` say of its int8 scheme: the configuration, the scheme in
    words and the CPU it was exported (and calibrated) on."""
    from levjepa.infer.cpu import cpu_info

    weights = "int8 per channel" if cfg.per_channel and cfg.method == "static" else "int8 per tensor"
    if cfg.reduce_range:
        bits = "in 7 bits (reduce_range): no int16 saturation, the same results on every x86 CPU"
    else:
        bits = "in 8 bits: exact only on CPUs with int8 dot products (VNNI, AMX), saturating on the others"
    ranges = "calibrated ranges" if cfg.method == "static" else "ranges found on every call"
    scheme = f"{cfg.format.upper()}; activations uint8 per tensor ({ranges}); weights {weights} {bits}"
    return {**dataclasses.asdict(cfg), "scheme": scheme, "exported_on": cpu_info().describe()}


def int8_warning(record: Mapping[str, Any] | None) -> str | None:
    """A sentence when an int8 graph whose ``int8`` record (:func:`int8_record`; None for a float graph) has
    8-bit weights runs on this CPU without int8 dot products, whose kernels saturate on it (module doc);
    graphs written before the scheme was recorded have 8-bit weights."""
    from levjepa.infer.cpu import cpu_info

    if not record or record.get("reduce_range", False):
        return None
    cpu = cpu_info()
    if cpu.int8_dot or cpu.vector not in ("AVX2", "AVX-512"):
        return None
    return (
        f"this int8 graph has 8-bit weights, whose int8 kernels can saturate on this CPU ({cpu.describe()}): "
        "its outputs may be several % off; export it again with this levjepa (7-bit weights, right on every CPU)"
    )


def _views(spec: ViewSpec, patch: int, item: MediaItem) -> Tensor:
    """The one centre view of ``item`` that ``spec`` cuts (a module-level function: ``safe_map`` pickles it)."""
    return spec.load(item.path, patch, item.kind)[0]


def calibration_clips(
    source: str, count: int, *, frames: int, size: int, patch: int, frame_stride: int = 1,
    fps: float | None = None, seed: int = 0, bad: BadFileReport | None = None,
) -> Tensor:  # fmt: skip
    """``count`` normalised clips ``[N, C, frames, size, size]`` of the files of ``source`` (a folder, an index
    file or one file), each read as every frozen reader reads it (``ViewSpec.load``: its centre window at the
    model's sampling, ``frame_stride`` or ``fps``, the short side resized to ``size`` and centre-cropped). With
    more files than ``count``, a ``seed``-drawn subset; with fewer, every file (a clip of a longer video is not
    repeated). A bad file — by the one bad-file rule (``levjepa.data.badfiles``; a bug still ends the export),
    or frames smaller than the graph's — is skipped, named and counted in ``bad`` (a fresh report, one line a
    file, when not given) as every reader reports it; none readable is a ``WeightsError`` saying how many were
    bad."""
    items = list_media(source)
    order = torch.randperm(len(items), generator=make_generator(seed, "calibration clips")).tolist()
    spec = ViewSpec(size=size, frames=frames, frame_stride=frame_stride, fps=fps)
    report = BadFileReport() if bad is None else bad
    clips: list[Tensor] = []
    stream = safe_map(functools.partial(_views, spec, patch), [items[i] for i in order], 0)
    try:
        for item, view, reason in stream:
            if view is None:
                report.add(item.path, reason)
            elif view.shape[-1] != size:  # a source smaller than the frames the graph takes
                report.add(item.path, f"resolution: {item.path}: {view.shape[-1]}-px frames, the graph takes {size}")
            else:
                clips.append(normalize(view))  # [C, T, S, S]
            if len(clips) == count:
                break
    finally:
        stream.close()
    if not clips:
        first = next(iter(report.files), None)
        skipped = f" ({report.total} bad: {report.counts_text()}; first {first})" if first else ""
        raise WeightsError(f"--calibrate {source}: no readable clip of {frames} frames at {size} px in it{skipped}")
    return torch.stack(clips)


def float_nodes(model: Any, parts: Iterable[str]) -> list[str]:
    """The names of the nodes of the exported (un-preprocessed) ONNX ``model`` that belong to ``parts``
    (module doc), read from the module path the exporter records in each node's ``metadata_props``."""
    parts = set(parts)
    initializers = {t.name for t in model.graph.initializer}
    scopes = {n.name: node_scope(n) for n in model.graph.node}
    blocks = [int(s.split("encoder.blocks.")[1].split(".")[0]) for s in scopes.values() if "encoder.blocks." in s]
    last = max(blocks, default=-1)
    out = []
    last_modules = (f"encoder.blocks.{last}.", "encoder.norm")
    for node in model.graph.node:
        module = scopes[node.name]
        weightless = node.op_type == "MatMul" and not any(i in initializers for i in node.input)
        if (
            ("patch_embed" in parts and "patch_embed" in module)
            or ("attention" in parts and (weightless or node.op_type in ("Softmax", "Attention")) and ".attn" in module)
            or ("last_block" in parts and last >= 0 and any(m in module + "." for m in last_modules))
            or ("head" in parts and (module == "head" or module.startswith(("head.", "model.head"))))
        ):
            out.append(node.name)
    return out


def node_scope(node: Any) -> str:
    """The innermost module path of a node (``encoder.blocks.3.attn``), '' when the exporter recorded none."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                names = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return ""
            modules = [n for n in names if (n and "." in n) or n in ("head", "encoder", "model")]
            return modules[-1] if modules else ""
    return ""


class _Reader:
    """onnxruntime's ``CalibrationDataReader`` over one pass of ``feeds``."""

    def __init__(self, feeds: Feeds) -> None:
        self.feeds = feeds
        self.rewind()

    def get_next(self) -> dict[str, Any] | None:
        return next(self.it, None)

    def rewind(self) -> None:  # the entropy / percentile calibrators may read twice
        self.it: Iterator[dict[str, Any]] = (dict(f) for f in self.feeds())


def quantize_graph(path: Path, cfg: Int8Config, feeds: Feeds | None = None) -> None:
    """Quantize the ONNX graph at ``path`` in place (module doc); ``feeds`` gives the calibration inputs of a
    static quantization, one dict of numpy arrays per run of the fp32 graph. The quantizer logs and warns:
    the caller keeps that off the terminal (``levjepa.formats.deployment.graphs``)."""
    try:
        import onnx
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_dynamic,
            quantize_static,
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as err:
        raise WeightsError("--quantize int8 needs onnxruntime (pip install 'levjepa[deploy]')") from err
    cfg.check()
    if cfg.method == "static" and feeds is None:
        raise WeightsError(f"{path.name}: static int8 needs calibration inputs")
    tmp, folded = path.with_suffix(".fp32.onnx"), path.with_suffix(".folded.onnx")
    path.rename(tmp)
    try:
        exclude = float_nodes(onnx.load(str(tmp), load_external_data=False), cfg.keep_float)
        quant_pre_process(str(tmp), str(folded), skip_symbolic_shape=True)
        if cfg.method == "dynamic":
            # the weight products only: the quantizer would take opset 23's Attention for its contrib namesake
            quantize_dynamic(str(folded), str(path), weight_type=QuantType.QInt8, reduce_range=cfg.reduce_range,
                             op_types_to_quantize=["MatMul", "Gemm"])  # fmt: skip
            return
        assert feeds is not None
        method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
                  "entropy": CalibrationMethod.Entropy}[cfg.calibrate_method]  # fmt: skip
        quantize_static(
            str(folded),
            str(path),
            _Reader(feeds),
            quant_format=QuantFormat.QDQ if cfg.format == "qdq" else QuantFormat.QOperator,
            op_types_to_quantize=["MatMul", "Gemm", "Conv"],
            per_channel=cfg.per_channel,
            reduce_range=cfg.reduce_range,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=exclude,
            calibrate_method=method,
            extra_options={"MatMulConstBOnly": False},
        )
    finally:
        tmp.unlink(missing_ok=True)
        folded.unlink(missing_ok=True)
        for stray in path.parent.glob("augmented_model*.onnx"):  # the calibrator's scratch graph
            stray.unlink(missing_ok=True)
