"""The deployment graphs run by onnxruntime: what ``levjepa stream --backend onnx`` and ``levjepa classify
--backend onnx`` execute, beside the graphs (``graphs.py``, ``classifier_graphs.py``) that write them.

* :func:`read_deploy` — the ``deploy`` record an export's ``config.json`` holds (file names, shapes, dtype,
  quantization), the one contract between writer and runner;
* :class:`OnnxStream` — the streaming step (or the streaming classifier), its cache fed back push after push;
  :func:`stream_video_onnx` streams a whole video through it as ``levjepa.infer.stream.stream_video`` does;
* :class:`OnnxClassifier` — ``classifier.onnx``: class probabilities of the views ``levjepa.eval.predict`` cuts.

Every session is opened by :func:`_session` (onnxruntime missing: one line naming the extra), and an int8
export warns when its graphs saturate on this CPU (:func:`warn_int8`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from levjepa.data.views import normalize
from levjepa.formats.deployment.quantize import int8_warning
from levjepa.weights import CONFIG, WeightsError, read_json

__all__ = ["OnnxClassifier", "OnnxStream", "read_deploy", "stream_video_onnx", "warn_int8"]


def read_deploy(export_dir: str | Path) -> dict[str, Any]:
    """The "deploy" record of an export's ``config.json`` (``WeightsError`` when it has none)."""
    path = Path(export_dir) / CONFIG
    data = read_json(path) if path.is_file() else {}
    record = data.get("deploy")
    if not isinstance(record, dict):
        raise WeightsError(
            f"{export_dir}: no deployment graphs here (config.json has no 'deploy'); write them into a new folder "
            f"with `levjepa export {export_dir} --out EXPORT_DIR --format onnx` and stream EXPORT_DIR"
        )
    return record


def warn_int8(record: Mapping[str, Any]) -> None:
    """A ``UserWarning`` when the export's int8 graphs saturate on this CPU (``quantize.int8_warning``)."""
    note = int8_warning(record.get("int8") if record.get("quantize") == "int8" else None)
    if note:
        warnings.warn(note, stacklevel=3)


def _session(path: Path, record: Mapping[str, Any], providers: list[str] | None, options: Any = None) -> Any:
    """An onnxruntime session of the graph at ``path`` (of the export whose ``record`` it is), on the CPU
    unless ``providers`` say otherwise."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise WeightsError("--backend onnx needs onnxruntime (pip install 'levjepa[deploy]')") from err
    session = ort.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])
    warn_int8(record)
    return session


def _dtype(record: Mapping[str, Any]) -> str:
    return "float16" if record["dtype"] == "fp16" else "float32"


class OnnxStream:
    """An exported streaming graph run by onnxruntime: ``push(frames [1, C, τ, H, W])`` returns the new patch
    features; ``cls`` holds the CLS over the window after the last push, and for a streaming classifier
    (``graph="stream_classifier"``, ``levjepa.formats.deployment.classifier_graphs``) ``logits`` its class
    scores (numpy arrays throughout). The state the graph carries (every input named ``cache_*``, returned as
    ``new_cache_*``) starts at zeros and is fed back after each push. ``options``: onnxruntime's
    ``SessionOptions`` (threads, spinning)."""

    def __init__(
        self,
        export_dir: str | Path,
        providers: list[str] | None = None,
        graph: str = "stream_step",
        options: Any = None,
    ) -> None:
        self.record = record = read_deploy(export_dir)
        if record.get("format") != "onnx":
            raise WeightsError(f"{export_dir}: its deployment graphs are {record.get('format')!r}, not onnx")
        if graph not in record["files"]:
            raise WeightsError(f"{export_dir}: no {graph} graph here (a classifier's export writes one)")
        self.session = _session(Path(export_dir) / record["files"][graph], record, providers, options)
        self.contract = record[graph]
        self.frames_shape = tuple(self.contract["inputs"]["frames"])
        self.state_shapes = {k: tuple(v) for k, v in self.contract["inputs"].items() if k.startswith("cache_")}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.dtype = _dtype(record)
        self.reset()

    def reset(self) -> None:
        self.state = {k: np.zeros(shape, self.dtype) for k, shape in self.state_shapes.items()}
        self.slot = 0
        self.cls: Any = None
        self.logits: Any = None

    def push(self, frames: Any) -> Any:
        if tuple(frames.shape) != self.frames_shape:
            raise WeightsError(
                f"frames of shape {tuple(frames.shape)}: this export streams {self.frames_shape} "
                f"([1, C, τ, H, W], fixed at export: levjepa export --size)"
            )
        feeds = {"frames": np.ascontiguousarray(frames, dtype=self.dtype), "slot": np.array([self.slot], np.int64)}
        out = dict(zip(self.outputs, self.session.run(None, {**feeds, **self.state}), strict=True))
        self.state = {k: out["new_" + k] for k in self.state}
        self.cls, self.logits = out["cls"], out.get("logits")
        self.slot += 1
        return out["patches"]


def stream_video_onnx(export_dir: str | Path, frames: Tensor, *, every: int) -> dict[str, Tensor]:
    """:func:`levjepa.infer.stream.stream_video` through the exported step: uint8 frames ``[F, H, W, 3]`` pushed
    one tubelet at a time by onnxruntime; the same readouts and per-push latencies."""
    stream = OnnxStream(export_dir)
    tau = int(stream.record["tubelet"])
    cls, at, latency = [], [], []
    usable = (frames.shape[0] // tau) * tau
    for start in range(0, usable, tau):
        clip = normalize(frames[start : start + tau].permute(3, 0, 1, 2).unsqueeze(0)).numpy()  # [1, C, τ, H, W]
        t0 = time.perf_counter()
        stream.push(clip)
        latency.append((time.perf_counter() - t0) * 1e3)
        seen = start + tau
        if seen % every == 0 or seen == usable:
            cls.append(torch.from_numpy(stream.cls[0]).float())
            at.append(seen - 1)
    return {"cls": torch.stack(cls), "frame": torch.tensor(at), "latency_ms": torch.tensor(latency)}


class OnnxClassifier:
    """The exported ``classifier.onnx`` run by onnxruntime, for ``levjepa classify --backend onnx``:
    :meth:`probabilities` takes the uint8 views ``levjepa.eval.predict`` cuts and gives the class
    probabilities of each file, as ``VideoClassifier.probabilities_from`` does in PyTorch."""

    def __init__(self, export_dir: str | Path, providers: list[str] | None = None) -> None:
        try:
            self.record = record = read_deploy(export_dir)
        except WeightsError:
            record = {}
        if record.get("format") != "onnx" or "classifier" not in record.get("files", {}):
            raise WeightsError(
                f"{export_dir}: no classifier graph here; write one with "
                f"`levjepa export {export_dir} --out DIR --format onnx` and classify with DIR"
            )
        self.session = _session(Path(export_dir) / record["files"]["classifier"], record, providers)
        self.labels = tuple(record["labels"])
        self.patch_size, self.tubelet = int(record["patch_size"]), int(record["tubelet"])
        self.dtype = _dtype(record)

    def probabilities(self, views: Tensor, segments: int = 1, crops: int = 1) -> Tensor:
        """``views`` uint8 (or normalised float) ``[B·S·K, C, T, H, W]``, file-, segment-, crop-major ->
        probabilities ``[B, classes]``."""
        x = normalize(views) if views.dtype == torch.uint8 else views.float()
        pixels = x.view(-1, segments, crops, *x.shape[1:]).numpy().astype(self.dtype)
        _, probs = self.session.run(None, {"pixel_values": pixels})
        return torch.from_numpy(probs).float()
