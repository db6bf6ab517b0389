"""Deployment graphs of an encoder: the clip encoder and the streaming step, as ONNX or ``torch.export``.

``levjepa export RUN --out DIR --format onnx`` (or ``pt2``) writes, beside the hub layout
(``levjepa.formats.writing.export``)::

    DIR/clip_encoder.onnx   pixel_values [B, C, T, H, W] (normalised float) -> cls [B, D], patches [B, N, D]
                            (N = T/τ·H/p·W/p, (t, y, x) order); B, T, H and W dynamic (multiples of τ and p)
    DIR/stream_step.onnx    one tubelet of frames plus the KV cache in -> CLS over the window, the new patch
                            tokens and the updated cache out (below); the whole streaming loop runs outside
                            Python, with the window of ``levjepa stream --window W``
    DIR/config.json         "deploy": file names, window, frame size, dtype, quantization, opset, the
                            inputs and outputs with their shapes; "preprocessing": mean, std, size (the
                            graphs take normalised frames: nothing is hidden in them)

**The streaming step** (:class:`StreamStep`) is :class:`levjepa.infer.StreamingEncoder` with a window of
``W`` frames (``S = W/τ`` temporal slots of ``P = H/p·W/p`` tokens), written with fixed shapes::

    inputs   frames   [B, C, τ, H, W]   the new tubelet, normalised
             slot     [1] int64         its temporal slot: 0, 1, 2, ... since the stream began
             cache_k  [depth, B, heads, (S−1)·P, head_dim]   rotated keys of the last S−1 slots (zeros at start)
             cache_v  [depth, B, heads, (S−1)·P, head_dim]
    outputs  cls      [B, D]            CLS over the last S slots (the new one included)
             patches  [B, P, D]         the new slot's patch features (after the final norm)
             cache_k, cache_v           the same shapes: the oldest slot dropped, the new one appended

Cached tokens of slots before 0 (the first S−1 steps) are masked out, so from the first frame on each
step equals ``StreamingEncoder(window=W).push`` then ``cls()`` (``tests/test_deploy.py``). Block-causal
attention only: with bidirectional attention a frame's features depend on the future.

**Precision.** fp32 by default; ``dtype="fp16"`` exports the half-precision graph (for GPU runtimes; CPU
runtimes run few ops in fp16). ``quantize="int8"`` quantizes every graph written
(``levjepa.formats.deployment.quantize``): dynamically (int8 weights, activations quantized per call), or, with
calibration clips, statically (``DeployConfig.int8``: activation ranges measured once on the user's clips).
The graphs are traced with ``torch.export`` (``strict=False``) and written with ``torch.onnx.export``, at opset 23
by default: every attention is one fused ``Attention`` op (``attention.attend`` takes SDPA while exporting), and
the clip graphs compute their block-causal attention frame by frame as PyTorch does
(``levjepa.formats.deployment.frame_attention``), so the graphs run at PyTorch's speed (``bench/deploy.md``). The
streaming step's CLS pass reads the keys and values its patch pass assembled (one concatenation per layer, not two).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from levjepa.formats.deployment.frame_attention import frame_attention, frame_loop_pays
from levjepa.formats.deployment.quantize import Feeds, Int8Config, int8_record, quantize_graph
from levjepa.model import VideoEncoder
from levjepa.model.attention import TokenMeta, build_attn_mask
from levjepa.version import __version__
from levjepa.weights import WeightsError

__all__ = [
    "CLIP_ONNX",
    "DEFAULT_OPSET",
    "GRAPH_FILES",
    "STREAM_ONNX",
    "ClipEncoder",
    "check_deploy",
    "DeployConfig",
    "StreamStep",
    "export_onnx",
    "export_pt2",
    "frame_loop",
    "initial_cache",
    "onnx_metadata",
    "stream_feeds",
    "write_graph",
]

CLIP_ONNX, STREAM_ONNX = "clip_encoder.onnx", "stream_step.onnx"
CLIP_PT2, STREAM_PT2 = "clip_encoder.pt2", "stream_step.pt2"
GRAPH_FILES = (CLIP_ONNX, STREAM_ONNX, CLIP_PT2, STREAM_PT2)  # every name an encoder's graphs take
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
MIN_OPSET, MAX_OPSET = 18, 23  # what torch.onnx's exporter writes / what the onnx package knows here
# 23: attention as one fused ``Attention`` op (onnxruntime >= 1.23 runs it on the CPU); 18 writes MatMul/Softmax
DEFAULT_OPSET = 23


@dataclass(frozen=True)
class DeployConfig:
    """What a deployment export fixes: the streaming window (frames), the frame size (pixels), dtype, int8."""

    window: int = 16
    height: int = 224
    width: int = 224
    dtype: Literal["fp32", "fp16"] = "fp32"
    quantize: Literal["none", "int8"] = "none"
    opset: int = DEFAULT_OPSET
    int8: Int8Config = field(default_factory=Int8Config)  # with quantize="int8": dynamic, or static on clips


class ClipEncoder(nn.Module):
    """``pixel_values [B, C, T, H, W] -> (cls [B, D], patches [B, N, D])``: the encoder's inference forward."""

    def __init__(self, encoder: VideoEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, Tensor]:
        out = self.encoder.forward_features(pixel_values)
        return out.cls, out.patches


class StreamStep(nn.Module):
    """One step of the windowed KV-cache stream with explicit cache tensors (module docstring)."""

    def __init__(self, encoder: VideoEncoder, window: int, height: int, width: int) -> None:
        super().__init__()
        cfg = encoder.cfg
        if cfg.attention != "block_causal":
            raise WeightsError(
                f"stream step: the encoder's attention is {cfg.attention}; streaming needs block_causal "
                "(with bidirectional attention past features depend on future frames)"
            )
        self.slots = encoder.window_slots(window)  # ValueError unless a positive multiple of the tubelet
        if height % cfg.patch_size or width % cfg.patch_size:
            raise WeightsError(
                f"stream step: frame size {height}x{width} is not a multiple of the patch {cfg.patch_size}"
            )
        self.encoder, self.tubelet = encoder, cfg.tubelet
        self.height, self.width = height, width
        self.per_slot = (height // cfg.patch_size) * (width // cfg.patch_size)
        self.cached = (int(self.slots or 0) - 1) * self.per_slot  # tokens of the S−1 previous slots

    def cache_shape(self, batch: int) -> tuple[int, int, int, int, int]:
        c = self.encoder.cfg
        return (c.depth, batch, c.heads, self.cached, c.head_dim)

    def state_shapes(self, batch: int) -> list[tuple[int, ...]]:
        """The shapes of the state a stream carries from step to step: ``cache_k``, ``cache_v``."""
        return [self.cache_shape(batch)] * 2

    def forward(
        self, frames: Tensor, slot: Tensor, cache_k: Tensor, cache_v: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        enc, p = self.encoder, self.per_slot
        dev = frames.device
        x, positions = enc.patch_embed(frames)  # [B, P, D], positions at slot 0
        positions = positions + torch.stack([slot[0], slot[0] * 0, slot[0] * 0])  # at the stream's slot
        past = slot[0] - (int(self.slots or 0) - 1) + torch.arange(self.cached, device=dev) // p  # [Lc] slots
        valid = past >= 0  # cached tokens from before the stream began are zeros: masked out
        patch_meta = TokenMeta.patches(positions[:1, :, 0])
        past_meta = TokenMeta.patches(past[None])
        mask = _mask(patch_meta, past_meta.cat(patch_meta), self.slots)  # [1, 1, P, Lc + P]
        mask = mask & torch.cat([valid, torch.ones(p, dtype=torch.bool, device=dev)])
        rope = enc.rope(positions[:1])
        window_k, window_v = [], []  # per layer: the window's keys and values, the old slots then the new one
        for i, blk in enumerate(enc.blocks):

            def with_cache(k: Tensor, v: Tensor, i: int = i) -> tuple[Tensor, Tensor]:
                window_k.append(torch.cat([cache_k[i], k], dim=2))
                window_v.append(torch.cat([cache_v[i], v], dim=2))
                return window_k[i], window_v[i]

            x = blk(x, rope, mask, with_cache)
        patches = enc.norm(x)
        # CLS over the window: the cache as updated (S−1 old slots + the new one), then CLS itself
        b = frames.shape[0]
        cls_x = enc.cls_token.expand(b, 1, -1).to(x.dtype)
        rotated_at = slot[0] if enc.cfg.rope_layout == "levjepa" else slot[0] * 0
        cls_rope = enc.rope(torch.stack([rotated_at, slot[0] * 0, slot[0] * 0]).view(1, 1, 3))
        cls_meta = TokenMeta(slot.view(1, 1), torch.ones(1, 1, dtype=torch.bool, device=dev))
        keys_meta = TokenMeta.patches(torch.cat([past, positions[0, :, 0]])[None]).cat(cls_meta)
        cls_mask = _mask(cls_meta, keys_meta, self.slots)
        cls_mask = cls_mask & torch.cat([valid, torch.ones(p + 1, dtype=torch.bool, device=dev)])
        for i, blk in enumerate(enc.blocks):

            def read_cache(k: Tensor, v: Tensor, i: int = i) -> tuple[Tensor, Tensor]:
                return torch.cat([window_k[i], k], dim=2), torch.cat([window_v[i], v], dim=2)

            cls_x = blk(cls_x, cls_rope, cls_mask, read_cache)
        new_k, new_v = torch.stack(window_k)[:, :, :, p:], torch.stack(window_v)[:, :, :, p:]  # the oldest slot out
        return enc.norm(cls_x)[:, 0], patches, new_k, new_v


def _mask(q: TokenMeta, k: TokenMeta, window: int | None) -> Tensor:
    mask = build_attn_mask("block_causal", q, k, window)
    assert mask is not None  # block-causal attention always has a mask
    return mask


def initial_cache(step: StreamStep, batch: int = 1, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """The empty cache a stream starts with: zeros (masked out by ``slot``)."""
    shape = step.cache_shape(batch)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def _example(encoder: VideoEncoder, dc: DeployConfig) -> tuple[Tensor, StreamStep, tuple[Tensor, ...]]:
    c = encoder.cfg
    dtype = DTYPES[dc.dtype]
    clip = torch.zeros(2, c.in_chans, 2 * c.tubelet, dc.height, dc.width, dtype=dtype)
    step = StreamStep(encoder, dc.window, dc.height, dc.width)
    k, v = initial_cache(step, 1, dtype)
    frames = torch.zeros(1, c.in_chans, c.tubelet, dc.height, dc.width, dtype=dtype)
    return clip, step, (frames, torch.tensor([0]), k, v)


def check_deploy(encoder: VideoEncoder, dc: DeployConfig) -> None:
    """One-line ``WeightsError`` for a deployment export that cannot be written as asked."""
    if dc.dtype not in DTYPES:
        raise WeightsError(f"--dtype {dc.dtype}: valid choices are {', '.join(DTYPES)}")
    if dc.quantize not in ("none", "int8"):
        raise WeightsError(f"--quantize {dc.quantize}: valid choices are none, int8")
    if dc.quantize == "int8" and dc.dtype != "fp32":
        raise WeightsError("--quantize int8 quantizes the fp32 graph: drop --dtype fp16")
    if dc.quantize == "int8":
        dc.int8.check()
    elif dc.int8.calibration:
        raise WeightsError("--calibrate: calibration clips make a static int8 graph; add --quantize int8")
    if not MIN_OPSET <= dc.opset <= MAX_OPSET:
        raise WeightsError(f"--opset {dc.opset}: the exporter writes opsets {MIN_OPSET}..{MAX_OPSET}")
    if encoder.cfg.attention != "block_causal":
        raise WeightsError("the streaming step needs a block_causal encoder (this one is bidirectional)")
    c = encoder.cfg
    if dc.window < c.tubelet or dc.window % c.tubelet:
        raise WeightsError(f"--window {dc.window}: expected a positive multiple of the tubelet ({c.tubelet} frames)")
    if dc.height % c.patch_size or dc.width % c.patch_size or min(dc.height, dc.width) < c.patch_size:
        raise WeightsError(f"--size {dc.height}x{dc.width}: expected a multiple of the patch size {c.patch_size}")


def _dims(encoder: VideoEncoder) -> dict[str, dict[int, Any]]:
    from torch.export import Dim

    c = encoder.cfg
    t, h, w = Dim("slots", min=1, max=4096), Dim("rows", min=1, max=512), Dim("cols", min=1, max=512)
    return {"pixel_values": {0: Dim("batch", min=1, max=4096), 2: c.tubelet * t, 3: c.patch_size * h,
                             4: c.patch_size * w}}  # fmt: skip


def _quiet() -> Any:
    """The exporters' and the quantizer's chatter (progress lines, warnings, log records) kept off the terminal."""
    import contextlib
    import io
    import logging
    import warnings

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    for name in ("", "torch.onnx"):  # the root logger (onnxruntime's quantizer) and the exporter's own
        logger = logging.getLogger(name)
        stack.callback(logger.setLevel, logger.level)
        logger.setLevel(logging.ERROR)
    return stack


def export_onnx(
    encoder: VideoEncoder,
    out: str | Path,
    dc: DeployConfig,
    *,
    preprocessing: Mapping[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
    calibration: Tensor | None = None,
) -> dict[str, Any]:
    """Write ``clip_encoder.onnx`` and ``stream_step.onnx`` to ``out``; returns the config's "deploy" record.
    Each graph carries its contract in ONNX ``metadata_props`` (:func:`onnx_metadata`: the preprocessing, the
    tubelet, what ``slot`` counts, the inputs and outputs), so a runtime needs no ``config.json``. ``say``
    hears a line before and after each graph (the export takes tens of seconds). ``calibration``: normalised
    clips ``[N, C, window, H, W]`` that a static int8 export measures its activation ranges on (the stream
    step on a stream through them)."""
    if dc.quantize == "int8" and dc.int8.method == "static" and calibration is None:
        raise WeightsError("static int8: give the calibration clips (--calibrate DATA)")
    check_deploy(encoder, dc)
    out = Path(out)
    enc = _cast(encoder, dc)
    clip, step, step_args = _example(enc, dc)
    # one self-contained file per graph while protobuf's 2 GB allows it (ViT-L in fp32 does), external data beyond
    external = sum(p.numel() * p.element_size() for p in enc.parameters()) > 1.5 * 2**30
    tell = say or (lambda line: None)
    record = _record(enc, step, dc, {"clip_encoder": CLIP_ONNX, "stream_step": STREAM_ONNX}, "onnx")
    clips = None if calibration is None else calibration.to(DTYPES[dc.dtype])
    for name, graph, args, inputs, outputs, dims, feeds in (
        (CLIP_ONNX, ClipEncoder(enc), (clip,), ["pixel_values"], ["cls", "patches"], _dims(enc),
         None if clips is None else lambda: ({"pixel_values": c[None].numpy()} for c in clips)),
        (STREAM_ONNX, step, step_args, ["frames", "slot", "cache_k", "cache_v"],
         ["cls", "patches", "new_cache_k", "new_cache_v"], None,
         None if clips is None else lambda: stream_feeds(step, clips, ["frames", "slot", "cache_k", "cache_v"])),
    ):  # fmt: skip
        write_graph(graph, args, out / name, inputs=inputs, outputs=outputs, dims=dims, dc=dc, external=external,
                    metadata=onnx_metadata(record, name, preprocessing), feeds=feeds, say=tell,
                    frames=frame_loop(enc, dc) if name == CLIP_ONNX else None)  # fmt: skip
    return record


def write_graph(
    module: nn.Module,
    args: tuple[Tensor, ...],
    path: Path,
    *,
    inputs: list[str],
    outputs: list[str],
    dims: dict[str, Any] | None,
    dc: DeployConfig,
    external: bool,
    metadata: Mapping[str, str],
    feeds: Feeds | None = None,
    say: Callable[[str], None] = lambda line: None,
    frames: tuple[int, int] | None = None,
) -> None:
    """Trace ``module`` on ``args`` (``torch.export``), write it to ``path`` (``torch.onnx``), quantize it as
    ``dc`` says (``feeds``: its calibration inputs for static int8) and write ``metadata`` into it. ``frames``:
    ``(tubelet, patch)`` of a clip graph, whose first input is whole frames: its block-causal attention is
    written as a loop over temporal slots (``levjepa.formats.deployment.frame_attention``; opset 23)."""
    q = f", int8 {dc.int8.method}" if dc.quantize == "int8" else ""
    say(f"exporting {path.name} ({dc.dtype}{q}, opset {dc.opset}) ...")
    start = time.perf_counter()
    with _quiet():
        program = torch.export.export(module, args, dynamic_shapes=dims, strict=False)
        torch.onnx.export(program, args, str(path), input_names=inputs, output_names=outputs,
                          opset_version=dc.opset, dynamo=True, external_data=external)  # fmt: skip
        if frames is not None and dc.opset >= 23:
            _rewrite(path, lambda model: frame_attention(model, input_name=inputs[0], tubelet=frames[0],
                                                         patch=frames[1]))  # fmt: skip
        if dc.quantize == "int8":
            quantize_graph(path, dc.int8, feeds if dc.int8.method == "static" else None)
    _write_metadata(path, metadata)
    size = sum(f.stat().st_size for f in path.parent.glob(path.name + "*")) / 2**20
    say(f"wrote {path} ({size:.1f} MiB, {time.perf_counter() - start:.0f} s)")


def frame_loop(encoder: VideoEncoder, dc: DeployConfig) -> tuple[int, int] | None:
    """``write_graph``'s ``frames`` for a clip graph of ``encoder`` at ``dc``'s frame size: ``(tubelet, patch)``
    where the loop over slots pays (``frame_attention.frame_loop_pays``), else None (the dense masked op)."""
    c = encoder.cfg
    return (c.tubelet, c.patch_size) if frame_loop_pays(dc.height, dc.width, c.patch_size) else None


def _rewrite(path: Path, change: Callable[[Any], object]) -> None:
    """Load the ONNX graph at ``path`` (its external tensors left where they are), ``change`` it, save it."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    change(model)
    onnx.save(model, str(path))


def stream_feeds(step: nn.Module, clips: Tensor, inputs: list[str]) -> Iterator[dict[str, Any]]:
    """The inputs of every step of one stream through ``clips`` [N, C, T, H, W] (one after the other, the slot
    counting on), as the fp32 ``step`` module (a streaming graph: ``frames``, ``slot``, then its state tensors,
    which its last outputs return updated) sees them: a static int8 graph's calibration inputs."""
    tau = int(step.tubelet)  # type: ignore[arg-type]
    state = [torch.zeros(s) for s in step.state_shapes(1)]  # type: ignore[operator]
    slot = 0
    with torch.no_grad():
        for clip in clips:
            for t in range(0, clip.shape[1] - tau + 1, tau):
                frames = clip[None, :, t : t + tau]
                args = (frames, torch.tensor([slot]), *state)
                yield {name: a.numpy() for name, a in zip(inputs, args, strict=True)}
                state = list(step(*args)[-len(state) :])
                slot += 1


def onnx_metadata(record: Mapping[str, Any], name: str, preprocessing: Mapping[str, Any] | None) -> dict[str, str]:
    """The ``metadata_props`` of graph ``name``: strings (JSON for structures) a runtime reads with
    ``InferenceSession.get_modelmeta().custom_metadata_map``."""
    graph = "clip_encoder" if name == CLIP_ONNX else "stream_step"
    pre = dict(preprocessing or {})
    meta: dict[str, Any] = {
        "levjepa_version": __version__,
        "graph": graph,
        "inputs": record[graph]["inputs"],
        "outputs": record[graph]["outputs"],
        "dtype": record["dtype"],
        "quantize": record["quantize"],
        "int8": record["int8"] if record["quantize"] == "int8" else None,
        "tubelet": record["tubelet"],
        "patch_size": record["patch_size"],
        "height": record["height"],
        "width": record["width"],
        "mean": pre.get("mean"),
        "std": pre.get("std"),
        "preprocessing": "RGB frames / 255, minus mean, over std (per channel); resized on the short side and "
        "centre-cropped to height x width; frames in [B, C, T, H, W]",
    }
    if pre:
        meta.update({"num_frames": pre.get("num_frames"), "frame_stride": pre.get("frame_stride")})
        if pre.get("fps") is not None:  # the rate the model was trained at (the released weights: 7.5)
            meta["fps"] = pre["fps"]
    if graph == "stream_step":
        meta.update(
            {
                "window": record["window"],
                "slot": "int64 [1]: the temporal slot of this step's tubelet, 0, 1, 2, ... since the stream began "
                f"(one slot = tubelet = {record['tubelet']} frame(s)); feed `frames` one tubelet at a time",
                "cache": "cache_k / cache_v: zeros at the start; feed back new_cache_k / new_cache_v each step",
            }
        )
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items() if v is not None}


def _write_metadata(path: Path, meta: Mapping[str, str]) -> None:
    def write(model: Any) -> None:
        del model.metadata_props[:]
        for key, value in meta.items():
            model.metadata_props.add(key=key, value=value)

    _rewrite(path, write)


def export_pt2(encoder: VideoEncoder, out: str | Path, dc: DeployConfig) -> dict[str, Any]:
    """Write ``clip_encoder.pt2`` and ``stream_step.pt2`` (``torch.export`` programs) to ``out``."""
    check_deploy(encoder, dc)
    if dc.quantize != "none":
        raise WeightsError("--quantize int8 applies to --format onnx only")
    out = Path(out)
    enc = _cast(encoder, dc)
    clip, step, step_args = _example(enc, dc)
    with _quiet():
        torch.export.save(
            torch.export.export(ClipEncoder(enc), (clip,), dynamic_shapes=_dims(enc), strict=False), out / CLIP_PT2
        )
        torch.export.save(torch.export.export(step, step_args, strict=False), out / STREAM_PT2)
    return _record(enc, step, dc, {"clip_encoder": CLIP_PT2, "stream_step": STREAM_PT2}, "pt2")


def _cast(encoder: VideoEncoder, dc: DeployConfig) -> VideoEncoder:
    import copy

    enc = copy.deepcopy(encoder).eval().requires_grad_(False)
    return enc.to(DTYPES[dc.dtype])


def _record(enc: VideoEncoder, step: StreamStep, dc: DeployConfig, files: dict[str, str], fmt: str) -> dict[str, Any]:
    c = enc.cfg
    lc = step.cached
    return {
        "format": fmt,
        "files": files,
        **dataclasses.asdict(dc),
        "int8": int8_record(dc.int8) if dc.quantize == "int8" else dataclasses.asdict(dc.int8),
        "tubelet": c.tubelet,
        "patch_size": c.patch_size,
        "clip_encoder": {
            "inputs": {"pixel_values": ["batch", c.in_chans, "frames", "height", "width"]},
            "outputs": {"cls": ["batch", c.dim], "patches": ["batch", "frames/τ·height/p·width/p", c.dim]},
        },
        "stream_step": {
            "inputs": {
                "frames": [1, c.in_chans, c.tubelet, dc.height, dc.width],
                "slot": [1],
                "cache_k": [c.depth, 1, c.heads, lc, c.head_dim],
                "cache_v": [c.depth, 1, c.heads, lc, c.head_dim],
            },
            "outputs": {
                "cls": [1, c.dim],
                "patches": [1, step.per_slot, c.dim],
                "new_cache_k": [c.depth, 1, c.heads, lc, c.head_dim],
                "new_cache_v": [c.depth, 1, c.heads, lc, c.head_dim],
            },
        },
    }
