"""Deployment graphs: the ONNX clip encoder equals PyTorch, the exported streaming step run frame by frame
equals ``levjepa stream`` (and so the full forward), the ``torch.export`` programs equal PyTorch, int8 stays
close and is smaller, and what cannot be exported or streamed is one line with exit 2."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from levjepa.cli import main
from levjepa.data import write_video
from levjepa.formats.deployment.frame_attention import frame_attention, frame_loop_pays
from levjepa.formats.deployment.graphs import STREAM_ONNX
from levjepa.formats.deployment.runner import OnnxStream
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.writing.export import export_encoder
from levjepa.infer.stream import StreamingEncoder
from test_export import make_run_dir

WINDOW, SIZE = 4, 16  # vit-test: patch 8, a 2x2 grid per frame


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    run = make_run_dir(root)
    export_encoder(run, root / "onnx", graphs="onnx", window=WINDOW, size=SIZE)
    return run, root / "onnx"


def test_onnx_graphs_carry_their_contract_in_metadata_props(exported):
    """A runtime with only the .onnx file reads the preprocessing, the tubelet and what `slot` counts; the values
    are the export's config.json's, so a graph of another geometry or preprocessing would disagree."""
    _, out = exported
    config = json.loads((out / "config.json").read_text())
    pre, deploy = config["preprocessing"], config["deploy"]
    for name, graph in (("clip_encoder.onnx", "clip_encoder"), (STREAM_ONNX, "stream_step")):
        meta = ort.InferenceSession(str(out / name)).get_modelmeta().custom_metadata_map
        assert meta["graph"] == graph and json.loads(meta["inputs"]) == deploy[graph]["inputs"]
        assert json.loads(meta["mean"]) == pre["mean"] and json.loads(meta["std"]) == pre["std"]
        assert int(meta["tubelet"]) == deploy["tubelet"] and int(meta["height"]) == SIZE
        assert int(meta["num_frames"]) == pre["num_frames"] and meta["levjepa_version"] == config["levjepa_version"]
    assert int(meta["window"]) == WINDOW and "temporal slot" in meta["slot"]
    assert "slot" not in ort.InferenceSession(str(out / "clip_encoder.onnx")).get_modelmeta().custom_metadata_map


def test_export_onnx_says_a_line_before_and_after_each_graph_and_opset_18_writes_unfused_equal_graphs(tmp_path, capsys):
    run = make_run_dir(tmp_path)
    args = ["export", str(run), "--out", str(tmp_path / "x"), "--format", "onnx", "--window", "2", "--size", "16"]
    assert main([*args, "--opset", "18"]) == 0
    err = capsys.readouterr().err.splitlines()
    said = [line.split()[0:2] for line in err if line.startswith(("exporting", "wrote"))]
    assert said == [["exporting", "clip_encoder.onnx"], ["wrote", str(tmp_path / "x" / "clip_encoder.onnx")],
                    ["exporting", "stream_step.onnx"], ["wrote", str(tmp_path / "x" / "stream_step.onnx")]]  # fmt: skip
    # opset 18 (runtimes without the Attention op): MatMul / Softmax, the same function
    session = ort.InferenceSession(str(tmp_path / "x" / "clip_encoder.onnx"))
    assert (
        "Attention" not in _ops(tmp_path / "x" / "clip_encoder.onnx") and _ops(tmp_path / "x" / STREAM_ONNX)["Softmax"]
    )
    x = _video(5, frames=6, batch=2)
    cls, patches = session.run(None, {"pixel_values": x.numpy()})
    with torch.no_grad():
        want = load_encoder(run).encoder.forward_features(x)
    assert np.abs(cls - want.cls.numpy()).max() < 1e-4 and np.abs(patches - want.patches.numpy()).max() < 1e-4


def _ops(path: Path) -> Counter:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def _video(seed: int, frames: int = 10, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, frames, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("frame_loop", [False, True])
def test_onnx_clip_encoder_equals_pytorch_with_dynamic_batch_and_geometry(exported, tmp_path, frame_loop):
    """The default graph (opset 23) has one fused Attention op per block, under the dense block-causal mask at the
    export's 4 tokens a frame; with frames of more tokens the writer makes each a loop over temporal slots of
    unmasked Attention ops (levjepa.formats.deployment.frame_attention): both the same function as PyTorch."""
    import onnx

    run, out = exported
    enc = load_encoder(run).encoder
    path = out / "clip_encoder.onnx"
    assert not frame_loop_pays(SIZE, SIZE, enc.cfg.patch_size) and frame_loop_pays(32, 32, enc.cfg.patch_size)
    if frame_loop:
        model = onnx.load(str(path))
        assert frame_attention(model, input_name="pixel_values", tubelet=1, patch=enc.cfg.patch_size) == enc.cfg.depth
        onnx.save(model, str(tmp_path / "loop.onnx"))
        path = tmp_path / "loop.onnx"
    ops = _ops(path)
    assert ops["Attention"] == enc.cfg.depth and not ops["Softmax"] and ops["Loop"] == enc.cfg.depth * frame_loop
    session = ort.InferenceSession(str(path))
    for shape in ((1, 3, 4, 16, 16), (3, 3, 6, 24, 16), (2, 3, 1, 8, 32), (1, 3, 3, 32, 32)):  # all dimensions vary
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
        cls, patches = session.run(None, {"pixel_values": x.numpy()})
        with torch.no_grad():
            want = enc.forward_features(x)
        assert np.abs(cls - want.cls.numpy()).max() < 1e-4
        assert np.abs(patches - want.patches.numpy()).max() < 1e-4


def test_onnx_streaming_step_frame_by_frame_equals_levjepa_stream_and_the_windowed_forward(exported):
    run, out = exported
    enc = load_encoder(run).encoder
    ops = _ops(out / STREAM_ONNX)
    assert ops["Attention"] == 2 * enc.cfg.depth and not ops["Softmax"]  # fused: the patches' pass and CLS's
    video = _video(1)
    stream, reference = OnnxStream(out), StreamingEncoder(enc, window=WINDOW)
    for i in range(video.shape[2]):
        frame = video[:, :, i : i + 1]
        patches = stream.push(frame.numpy())
        assert np.abs(patches - reference.push(frame).numpy()).max() < 1e-4
        assert np.abs(stream.cls - reference.cls().numpy()).max() < 1e-4
    with torch.no_grad():
        full = enc.forward_features(video, window=WINDOW)  # the banded block-causal forward of the whole stream
    assert np.abs(stream.cls - full.cls.numpy()).max() < 1e-4  # CLS over the last window
    record = json.loads((out / "config.json").read_text())["deploy"]
    assert record["window"] == WINDOW and record["stream_step"]["inputs"]["cache_k"][3] == (WINDOW - 1) * 4
    assert json.loads((out / "config.json").read_text())["preprocessing"]["mean"] == [0.485, 0.456, 0.406]


def test_stream_command_with_the_onnx_backend_matches_the_torch_backend(exported, tmp_path, capsys):
    _, out = exported
    frames = (torch.rand(12, SIZE, SIZE, 3, generator=torch.Generator().manual_seed(2)) * 255).to(torch.uint8)
    video = tmp_path / "clip.mp4"
    write_video(video, frames.numpy(), fps=10)
    args = ["stream", str(out), str(video), "--every", "4"]
    assert main([*args, "--backend", "onnx", "--out", str(tmp_path / "onnx.safetensors")]) == 0
    assert main([*args, "--window", str(WINDOW), "--size", str(SIZE), "--out", str(tmp_path / "pt.safetensors")]) == 0
    from safetensors.torch import load_file

    a, b = load_file(str(tmp_path / "onnx.safetensors")), load_file(str(tmp_path / "pt.safetensors"))
    assert a["cls"].shape[0] == 3 and torch.equal(a["frame"], b["frame"])
    assert (a["cls"] - b["cls"]).abs().max() < 1e-4
    assert '"backend": "onnx"' in capsys.readouterr().out


def test_pt2_programs_equal_pytorch(tmp_path):
    run = make_run_dir(tmp_path)
    export_encoder(run, tmp_path / "pt2", graphs="pt2", window=WINDOW, size=SIZE)
    enc = load_encoder(run).encoder
    clip = torch.export.load(tmp_path / "pt2" / "clip_encoder.pt2").module()
    step = torch.export.load(tmp_path / "pt2" / "stream_step.pt2").module()
    x = _video(3, frames=6, batch=2)
    with torch.no_grad():
        assert torch.allclose(clip(x)[0], enc.forward_features(x).cls, atol=1e-5)
        reference = StreamingEncoder(enc, window=WINDOW)
        shape = json.loads((tmp_path / "pt2" / "config.json").read_text())["deploy"]["stream_step"]["inputs"]
        k, v = torch.zeros(shape["cache_k"]), torch.zeros(shape["cache_v"])
        for i in range(6):
            frame = x[:1, :, i : i + 1]
            cls, patches, k, v = step(frame, torch.tensor([i]), k, v)
            assert torch.allclose(patches, reference.push(frame), atol=1e-5)
            assert torch.allclose(cls, reference.cls(), atol=1e-5)


def test_int8_is_smaller_and_close(exported, tmp_path):
    run, fp32 = exported
    export_encoder(run, tmp_path / "int8", graphs="onnx", window=WINDOW, size=SIZE, quantize="int8")
    weights = {d: _initializer_bytes(d / STREAM_ONNX) for d in (fp32, tmp_path / "int8")}
    assert weights[fp32].get("int8", 0) == 0 and weights[tmp_path / "int8"]["int8"] > 0
    # every weight matrix is stored as int8 (a tiny model's biases, norms and tables stay fp32: not the full 4x)
    assert weights[tmp_path / "int8"]["float32"] < 0.35 * weights[fp32]["float32"]
    assert sum(weights[tmp_path / "int8"].values()) < 0.5 * sum(weights[fp32].values())
    video = _video(4, frames=6)
    a, b = OnnxStream(fp32), OnnxStream(tmp_path / "int8")
    for i in range(6):
        a.push(video[:, :, i : i + 1].numpy())
        b.push(video[:, :, i : i + 1].numpy())
    cos = float((a.cls * b.cls).sum() / (np.linalg.norm(a.cls) * np.linalg.norm(b.cls)))
    assert cos > 0.99 and np.abs(a.cls - b.cls).max() > 0  # quantized: close, not identical


def _initializer_bytes(path: Path) -> dict[str, int]:
    import onnx

    out: dict[str, int] = {}
    for init in onnx.load(str(path)).graph.initializer:
        name = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name
        out[name] = out.get(name, 0) + len(init.raw_data)
    return out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--format", "onnx", "--opset", "99"], "--opset 99"),
        (["--format", "onnx", "--quantize", "int8", "--dtype", "fp16"], "drop --dtype fp16"),
        (["--format", "onnx", "--window", "0"], "--window 0"),
        (["--format", "onnx", "--size", "20"], "multiple of the patch size 8"),
        (["--window", "8"], "graphs"),
    ],
)
def test_export_refuses_what_it_cannot_write_in_one_line(tmp_path, capsys, extra, message):
    run = make_run_dir(tmp_path)
    assert main(["export", str(run), "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "out").exists()  # nothing written


def test_stream_refuses_a_window_or_size_the_export_does_not_have(exported, tmp_path, capsys):
    _, out = exported
    video = tmp_path / "clip.mp4"
    write_video(video, np.zeros((4, SIZE, SIZE, 3), np.uint8), fps=10)
    assert main(["stream", str(out), str(video), "--backend", "onnx", "--window", "8"]) == 2
    assert "window of 4 frames" in capsys.readouterr().err
    assert main(["stream", str(out), str(video), "--backend", "onnx", "--size", "32"]) == 2
    assert "16-px frames" in capsys.readouterr().err
    run_only = make_run_dir(tmp_path)  # a run, not an export with graphs
    assert main(["stream", str(run_only), str(video), "--backend", "onnx"]) == 2
    assert "--format onnx" in capsys.readouterr().err


def test_a_bidirectional_encoder_has_no_streaming_step(tmp_path, capsys):
    run = make_run_dir(tmp_path)
    config = json.loads((run / "config.json").read_text())
    for path in [run / "config.json", *Path(run / "checkpoints").glob("*/meta.json")]:
        data = json.loads(path.read_text())
        section = data["model"] if "model" in data else data["encoder_config"]
        section["attention"] = "bidirectional"
        path.write_text(json.dumps(data))
    assert config["model"]["attention"] == "block_causal"
    assert main(["export", str(run), "--out", str(tmp_path / "out"), "--format", "onnx"]) == 2
    assert "block_causal" in capsys.readouterr().err


def test_a_recorded_rate_travels_to_the_graphs_and_the_processor_config(exported):
    # the released weights were trained at 7.5 fps: a runtime reading only the .onnx file or
    # preprocessor_config.json must see the rate, not only the stride (which means 7.5 fps only at 15 fps)
    from levjepa.formats.deployment.graphs import onnx_metadata
    from levjepa.formats.reading.load import Preprocessing
    from levjepa.formats.writing.export import preprocessor_config

    _, out = exported
    config = json.loads((out / "config.json").read_text())
    meta = onnx_metadata(config["deploy"], STREAM_ONNX, {**config["preprocessing"], "fps": 7.5})
    assert json.loads(meta["fps"]) == 7.5
    assert "fps" not in onnx_metadata(config["deploy"], STREAM_ONNX, {**config["preprocessing"], "fps": None})
    assert preprocessor_config(Preprocessing(fps=7.5))["fps"] == 7.5
    assert "fps" not in preprocessor_config(Preprocessing())
