"""A classifier as one graph: encoder + head, for a runtime that has no levjepa and no Python head to write.

``levjepa export CLASSIFIER --out DIR --format onnx`` of a kept probe (``RUN/probes/TASK/PROBE``) or a
fine-tuned classifier writes, beside the encoder's graphs (``levjepa.formats.deployment.graphs``)::

    DIR/classifier.onnx         pixel_values [B, S, K, C, T, H, W] (normalised float: B files × S segments × K
                                crops, the views ``levjepa classify`` cuts a file into) -> logits [B, K, classes]
                                (one per crop), probs [B, classes] (the softmax of each crop, averaged: what
                                ``classify`` reports); B, S, K, T, H and W dynamic
    DIR/stream_classifier.onnx  the streaming step (``deploy.StreamStep``) with the head on top: one tubelet in ->
                                logits [1, classes] over the window, plus the step's cls, patches and caches,
                                and ``cache_patches`` [1, (S−1)·P, D], the patch features of the window's
                                older slots, which the head reads with the new ones

Both carry the label names (``labels``, JSON, index order), the head's kind and input and the views
(``protocol``) in their ONNX ``metadata_props``, so ``InferenceSession(...).get_modelmeta()`` is all a
runtime reads. The head computes what ``levjepa.model.classifier.VideoClassifier`` computes: a kept probe
trained on float16 tokens reads its tokens rounded to float16 (a Cast there and back in the graph).

**The streaming classifier** reads the window as the clip classifier reads a clip of those frames: the
attentive head every token of the window (CLS over the window, then the patch tokens of its slots, oldest
first), the linear heads their mean or the CLS. Until the window is full, the slots before the stream began
are masked out (the attentive head's ``key_mask``, a masked mean), so step ``t`` gives the clip classifier's
logits on the frames seen so far; from then on, on the window — each frame's features computed, as in every
stream, with the window that ended at that frame (``tests/test_deploy_classifier.py``). One view, no crops or
segments: a stream is one camera.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from levjepa.formats.deployment.graphs import (
    DTYPES,
    DeployConfig,
    StreamStep,
    frame_loop,
    stream_feeds,
    write_graph,
)
from levjepa.formats.reading.classifier import ClassifierRecord
from levjepa.model.classifier import VideoClassifier, view_inputs
from levjepa.version import __version__

__all__ = [
    "CLASSIFIER_ONNX",
    "STREAM_CLASSIFIER_ONNX",
    "ClipClassifier",
    "StreamClassifierStep",
    "export_classifier_onnx",
]

CLASSIFIER_ONNX, STREAM_CLASSIFIER_ONNX = "classifier.onnx", "stream_classifier.onnx"
VIEW_FIELDS = ("size", "frames", "frame_stride", "fps", "segments", "crops")  # what the metadata says of the views
STREAM_INPUTS = ["frames", "slot", "cache_k", "cache_v", "cache_patches"]
STREAM_OUTPUTS = ["logits", "cls", "patches", "new_cache_k", "new_cache_v", "new_cache_patches"]


class ClipClassifier(nn.Module):
    """``pixel_values [B, S, K, C, T, H, W] -> (logits [B, K, classes], probs [B, classes])`` (module doc)."""

    def __init__(self, model: VideoClassifier) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, Tensor]:
        b, s, k = pixel_values.shape[:3]
        out = self.model.encoder.forward_features(pixel_values.flatten(0, 2))  # views file-, segment-, crop-major
        cfg = self.model.head_cfg
        cls, patches = out.cls.float(), out.patches.float()
        tokens = torch.cat([cls[:, None], patches], 1) if cfg.input == "tokens" else None
        logits = self.model.head(view_inputs(cls, patches.mean(1), tokens, cfg, s, k))[0].float()
        logits = logits.view(b, k, logits.shape[-1])
        return logits, logits.softmax(-1).mean(1)


class StreamClassifierStep(nn.Module):
    """One step of the streaming classifier (module doc): ``(frames, slot, cache_k, cache_v, cache_patches) ->
    (logits, cls, patches, new_cache_k, new_cache_v, new_cache_patches)``."""

    def __init__(self, model: VideoClassifier, window: int, height: int, width: int) -> None:
        super().__init__()
        self.step = StreamStep(model.encoder, window, height, width)
        self.head, self.head_cfg = model.head, model.head_cfg
        self.tubelet = self.step.tubelet

    def state_shapes(self, batch: int) -> list[tuple[int, ...]]:
        """``cache_k``, ``cache_v`` (the step's) and ``cache_patches`` [B, (S−1)·P, D]."""
        return [*self.step.state_shapes(batch), (batch, self.step.cached, self.step.encoder.cfg.dim)]

    def forward(
        self, frames: Tensor, slot: Tensor, cache_k: Tensor, cache_v: Tensor, cache_patches: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        step, cfg = self.step, self.head_cfg
        cls, patches, new_k, new_v = step(frames, slot, cache_k, cache_v)
        window = torch.cat([cache_patches, patches], 1)  # [B, S·P, D], the oldest slot first
        past = slot[0] - (int(step.slots or 0) - 1) + torch.arange(step.cached, device=frames.device) // step.per_slot
        valid = torch.cat([past >= 0, torch.ones(step.per_slot, dtype=torch.bool, device=frames.device)])  # [S·P]
        b = frames.shape[0]
        if cfg.input == "tokens":
            tokens = torch.cat([cls[:, None], window], 1)
            if cfg.token_dtype == "float16":  # the kept probe's tokens as the feature store rounded them
                tokens = tokens.to(torch.float16)
            key_mask = torch.cat([valid.new_ones(1), valid])[None].expand(b, -1)
            logits = self.head(tokens, key_mask)[0]
        else:
            if cfg.input == "cls":
                x = cls.float()
            else:
                w = valid.to(window.dtype)[None, :, None]
                x = ((window.float() * w).sum(1) / w.sum(1)).float()
            logits = self.head(x)[0]
        return logits.float(), cls, patches, new_k, new_v, window[:, step.per_slot :]


def _metadata(
    rec: ClassifierRecord, graph: str, contract: Mapping[str, Any], record: Mapping[str, Any],
    preprocessing: Mapping[str, Any] | None,
) -> dict[str, str]:  # fmt: skip
    pre = dict(preprocessing or {})
    meta: dict[str, Any] = {
        "levjepa_version": __version__,
        "graph": graph,
        "labels": list(rec.labels),
        "head": {"kind": rec.head.kind, "input": rec.head.input, "token_dtype": rec.head.token_dtype},
        "protocol": {k: getattr(rec.protocol, k) for k in VIEW_FIELDS},
        "inputs": contract["inputs"],
        "outputs": contract["outputs"],
        "dtype": record["dtype"],
        "quantize": record["quantize"],
        "int8": record["int8"] if record["quantize"] == "int8" else None,
        "tubelet": record["tubelet"],
        "patch_size": record["patch_size"],
        "mean": pre.get("mean"),
        "std": pre.get("std"),
        "preprocessing": "RGB frames / 255, minus mean, over std (per channel); resized on the short side and "
        "centre-cropped; views [B, segments, crops, C, T, H, W]; probs: the crops' softmax averaged",
    }
    if graph == "stream_classifier":
        meta.update(
            window=record["window"], height=record["height"], width=record["width"],
            slot="int64 [1]: the temporal slot of this step's tubelet, 0, 1, 2, ... since the stream began",
            cache="cache_k / cache_v / cache_patches: zeros at the start; feed back the new_cache_* outputs",
        )  # fmt: skip
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items() if v is not None}


def export_classifier_onnx(
    model: VideoClassifier,
    rec: ClassifierRecord,
    out: str | Path,
    dc: DeployConfig,
    record: Mapping[str, Any],
    *,
    preprocessing: Mapping[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
    calibration: Tensor | None = None,
) -> dict[str, Any]:
    """Write ``classifier.onnx`` and ``stream_classifier.onnx`` (module doc) beside the encoder's graphs of
    ``record`` (``deploy.export_onnx``'s); returns that record with the two graphs added (files and
    contracts). ``calibration``: normalised clips ``[N, C, window, H, W]`` for static int8."""
    import copy

    out = Path(out)
    dtype = DTYPES[dc.dtype]
    model = copy.deepcopy(model).eval().requires_grad_(False).to(dtype)
    c, classes, labels = model.encoder.cfg, model.head_cfg.num_classes, list(rec.labels)
    clip_graph, step = ClipClassifier(model), StreamClassifierStep(model, dc.window, dc.height, dc.width)
    views = torch.zeros(2, 2, 2, c.in_chans, 2 * c.tubelet, dc.height, dc.width, dtype=dtype)
    state = [torch.zeros(s, dtype=dtype) for s in step.state_shapes(1)]
    frames = torch.zeros(1, c.in_chans, c.tubelet, dc.height, dc.width, dtype=dtype)
    step_args = (frames, torch.tensor([0]), *state)
    from torch.export import Dim

    dims = {"pixel_values": {0: Dim("files", min=1, max=4096), 1: Dim("segments", min=1, max=64),
                             2: Dim("crops", min=1, max=64), 4: c.tubelet * Dim("slots", min=1, max=4096),
                             5: c.patch_size * Dim("rows", min=1, max=512),
                             6: c.patch_size * Dim("cols", min=1, max=512)}}  # fmt: skip
    record = dict(record)
    record["files"] = {**record["files"], "classifier": CLASSIFIER_ONNX, "stream_classifier": STREAM_CLASSIFIER_ONNX}
    record["labels"] = labels
    record["classifier"] = {
        "inputs": {"pixel_values": ["files", "segments", "crops", c.in_chans, "frames", "height", "width"]},
        "outputs": {"logits": ["files", "crops", classes], "probs": ["files", classes]},
    }
    shapes = [list(s) for s in step.state_shapes(1)]
    record["stream_classifier"] = {
        "inputs": {"frames": list(frames.shape), "slot": [1], "cache_k": shapes[0], "cache_v": shapes[1],
                   "cache_patches": shapes[2]},
        "outputs": {"logits": [1, classes], "cls": [1, c.dim], "patches": [1, step.step.per_slot, c.dim],
                    "new_cache_k": shapes[0], "new_cache_v": shapes[1], "new_cache_patches": shapes[2]},
    }  # fmt: skip
    clips = None if calibration is None else calibration.to(dtype)
    external = sum(p.numel() * p.element_size() for p in model.parameters()) > 1.5 * 2**30
    for name, graph, args, inputs, outputs, graph_dims, feeds in (
        (CLASSIFIER_ONNX, clip_graph, (views,), ["pixel_values"], ["logits", "probs"], dims,
         None if clips is None else lambda: ({"pixel_values": x[None, None, None].numpy()} for x in clips)),
        (STREAM_CLASSIFIER_ONNX, step, step_args, STREAM_INPUTS, STREAM_OUTPUTS, None,
         None if clips is None else lambda: stream_feeds(step, clips, STREAM_INPUTS)),
    ):  # fmt: skip
        key = name.removesuffix(".onnx")
        write_graph(graph, args, out / name, inputs=inputs, outputs=outputs, dims=graph_dims, dc=dc,
                    external=external, metadata=_metadata(rec, key, record[key], record, preprocessing), feeds=feeds,
                    say=say or (lambda line: None),
                    frames=frame_loop(model.encoder, dc) if name == CLASSIFIER_ONNX else None)  # fmt: skip
    return record
