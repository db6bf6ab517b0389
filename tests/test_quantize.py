"""Static int8: calibrated on one set of clips, the clip encoder and the streaming step stay within a stated
tolerance of fp32 on held-out clips; the parts kept in float are the ones named, found by module path; the
calibration clips are the files asked for; what cannot be calibrated is one line with exit 2."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from levjepa.cli import main
from levjepa.formats.deploy import CLIP_ONNX, STREAM_ONNX, OnnxStream
from levjepa.formats.quantize import calibration_clips, float_nodes
from test_classify import write_index
from test_export import make_run_dir

WINDOW, SIZE = 4, 16
TOLERANCE = 0.05  # relative L2 error of CLS and patch features, int8 vs fp32, on clips it was not calibrated on


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    write_index(root / "cal", "cal", 8, 5)
    write_index(root / "held", "held", 4, 6)
    run = make_run_dir(root)
    args = ["export", str(run), "--format", "onnx", "--window", str(WINDOW), "--size", str(SIZE)]
    assert main([*args, "--out", str(root / "fp32")]) == 0
    static = ["--quantize", "int8", "--calibrate", str(root / "cal"), "--calibration-clips", "6"]
    assert main([*args, "--out", str(root / "static"), *static]) == 0
    held = calibration_clips(str(root / "held"), 4, frames=WINDOW, size=SIZE, patch=8)
    return root, held


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_static_int8_clip_encoder_is_within_tolerance_of_fp32_on_held_out_clips(graphs):
    root, held = graphs
    fp32, int8 = (ort.InferenceSession(str(root / d / CLIP_ONNX)) for d in ("fp32", "static"))
    ops = Counter(n.op_type for n in onnx.load(str(root / "static" / CLIP_ONNX)).graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0  # activations quantized with fixed ranges
    errors = []
    for clip in held:
        x = clip[None].numpy()
        (ca, pa), (cb, pb) = fp32.run(None, {"pixel_values": x}), int8.run(None, {"pixel_values": x})
        errors += [_rel(cb, ca), _rel(pb, pa)]
    assert max(errors) < TOLERANCE and min(errors) > 0  # quantized: close, not identical
    meta = int8.get_modelmeta().custom_metadata_map
    assert json.loads(meta["int8"])["method"] == "static" and json.loads(meta["int8"])["clips"] == 6


def test_static_int8_streaming_step_is_within_tolerance_of_fp32_on_a_held_out_stream(graphs):
    root, held = graphs
    a, b = OnnxStream(root / "fp32"), OnnxStream(root / "static")
    video = torch.cat(list(held), dim=1)[None]  # the held-out clips one after the other: 16 frames
    for i in range(video.shape[2]):
        pa, pb = a.push(video[:, :, i : i + 1].numpy()), b.push(video[:, :, i : i + 1].numpy())
        assert _rel(pb, pa) < TOLERANCE and _rel(b.cls, a.cls) < TOLERANCE, i


def test_parts_kept_in_float_are_found_by_module_path(graphs):
    root, _ = graphs
    model = onnx.load(str(root / "fp32" / STREAM_ONNX))
    depth = 2  # vit-test
    by_name = {n.name: n for n in model.graph.node}
    attention = [by_name[n] for n in float_nodes(model, ["attention"])]
    # the stream step runs every block twice (patches, then CLS): q·kᵀ and softmax·v and the softmax each time
    assert Counter(n.op_type for n in attention) == {"MatMul": 2 * 2 * depth, "Softmax": 2 * depth}
    inits = {t.name for t in model.graph.initializer}
    assert not any(i in inits for n in attention for i in n.input)  # no weight among them
    embed = [by_name[n] for n in float_nodes(model, ["patch_embed"])]
    assert [n.op_type for n in embed if n.op_type == "MatMul"] == ["MatMul"]  # the tubelet projection
    last = set(float_nodes(model, ["last_block"]))
    first = {n.name for n in model.graph.node if "encoder.blocks.0." in str(n.metadata_props)}
    assert last and not last & first and len(last) < len(model.graph.node) / 2
    # and the static graph left them in float: no weightless MatMul reads a dequantized input
    static = onnx.load(str(root / "static" / STREAM_ONNX))
    made_by = {o: n.op_type for n in static.graph.node for o in n.output}
    weightless = [n for n in static.graph.node if n.op_type == "MatMul" and not set(n.input) & inits]
    dequantized = [n for n in weightless if "DequantizeLinear" in {made_by.get(i) for i in n.input}]
    assert weightless and len(dequantized) < len(weightless)


def test_calibration_clips_are_the_files_asked_for(tmp_path):
    write_index(tmp_path / "m", "a", 5, 1)
    clips = calibration_clips(str(tmp_path / "m" / "a.txt"), 3, frames=4, size=16, patch=8, seed=1)
    assert clips.shape == (3, 3, 4, 16, 16) and clips.dtype == torch.float32
    assert clips.mean().abs() < 3 and clips.std() > 0.1  # normalised pixels, not raw bytes
    again = calibration_clips(str(tmp_path / "m" / "a.txt"), 3, frames=4, size=16, patch=8, seed=1)
    other = calibration_clips(str(tmp_path / "m" / "a.txt"), 3, frames=4, size=16, patch=8, seed=2)
    assert torch.equal(clips, again) and not torch.equal(clips, other)
    assert len(calibration_clips(str(tmp_path / "m"), 99, frames=4, size=16, patch=8)) == 5  # every file, once


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--calibrate", "DATA"], "add --quantize int8"),
        (["--quantize", "int8", "--keep-float", "attention"], "add --calibrate DATA"),
        (["--quantize", "int8", "--calibrate", "DATA", "--keep-float", "softmax"], "--keep-float softmax"),
        (["--quantize", "int8", "--calibrate", "DATA", "--calibration-clips", "0"], "--calibration-clips 0"),
        (["--quantize", "int8", "--calibrate", "EMPTY"], "no readable clip"),
    ],
)
def test_static_int8_refuses_what_it_cannot_calibrate_in_one_line(tmp_path, capsys, extra, message):
    run = make_run_dir(tmp_path)
    write_index(tmp_path / "data", "x", 2, 0)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.mp4").write_bytes(b"not a video")
    extra = [str(tmp_path / "data") if e == "DATA" else str(tmp_path / "empty") if e == "EMPTY" else e for e in extra]
    args = ["export", str(run), "--out", str(tmp_path / "out"), "--format", "onnx", "--size", "16", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out" / CLIP_ONNX).exists()
