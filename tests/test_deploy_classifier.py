"""A classifier as one graph: the exported ``classifier.onnx`` gives the PyTorch classifier's logits for every
kind of kept probe (attentive on float16 tokens, linear on the mean, linear on CLS), ``classify --backend onnx``
gives ``classify``'s labels on the test index, and the streaming classifier, step by step, gives the clip
classifier's logits on the frames of its window."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from levjepa.cli import main
from levjepa.eval.protocols import PROTOCOLS
from levjepa.formats.deployment.classifier_graphs import CLASSIFIER_ONNX
from levjepa.formats.deployment.frame_attention import frame_attention
from levjepa.formats.deployment.quantize import Int8Config, calibration_clips, int8_record, node_scope, quantize_graph
from levjepa.formats.deployment.runner import OnnxClassifier, OnnxStream
from levjepa.formats.reading.classifier import load_classifier
from levjepa.model.classifier import view_inputs
from test_classify import TINY, write_index
from test_export import make_run_dir

PROBES = ("attentive", "linear", "linear_cls")
# the attentive probe (every token, float16 tokens, the stream's key mask) runs by default; the linear probes'
# graphs (mean, CLS) add two exports of four graphs each: -m slow
CASES = [PROBES[0], *(pytest.param(p, marks=pytest.mark.slow) for p in PROBES[1:])]


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """Three probes kept on a tiny index task (tiny protocol: 2 segments × 3 crops of 4 frames at 16 px);
    ``exported(probe)`` writes a probe's ONNX export the first time it is asked for."""
    root = tmp_path_factory.mktemp("clf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(PROTOCOLS, "tiny", TINY)
        mp.chdir(root)
        media = root / "media"
        index = [write_index(media, s, n, seed) for s, n, seed in (("train", 12, 0), ("val", 6, 1), ("test", 9, 2))]
        run = make_run_dir(root, steps=(5,))
        task = "index:" + ",".join(map(str, index))
        args = ["probe", str(run), "--task", task, "--protocol", "tiny", "--slots", "4", "--no-baseline"]
        assert main([*args, "--workers", "0", "--probe", ",".join(PROBES), "--set", "epochs=3"]) == 0
        probes = {p: run / "probes/media" / p for p in PROBES}

        def exported(probe: str) -> Path:
            if not (root / probe).is_dir():
                assert main(["export", str(probes[probe]), "--out", str(root / probe), "--format", "onnx"]) == 0
            return root / probe

        yield {"run": run, "index": index, "probes": probes, "exported": exported}


@pytest.mark.parametrize("probe", CASES)
def test_classifier_graph_gives_the_pytorch_classifiers_logits_and_names_its_labels(kept, probe):
    clf = load_classifier(kept["probes"][probe])
    out = kept["exported"](probe)
    session = ort.InferenceSession(str(out / CLASSIFIER_ONNX))
    meta = session.get_modelmeta().custom_metadata_map
    assert tuple(json.loads(meta["labels"])) == clf.record.labels
    assert json.loads(meta["head"])["kind"] == clf.record.head.kind
    assert json.loads(meta["protocol"])["segments"] == 2
    for files, segments, crops, frames in ((2, 2, 3, 4), (1, 1, 1, 8)):  # the protocol's views, and one longer view
        gen = torch.Generator().manual_seed(files + frames)
        views = torch.randn(files, segments, crops, 3, frames, 16, 16, generator=gen)
        logits, probs = session.run(None, {"pixel_values": views.numpy()})
        with torch.no_grad():
            want = clf.model(views.flatten(0, 2), segments=segments, crops=crops).view(files, crops, -1)
        assert np.abs(logits - want.numpy()).max() < 1e-4
        assert np.abs(probs - want.softmax(-1).mean(1).numpy()).max() < 1e-5
        assert np.ptp(want.numpy()) > 0.01  # the logits compared are not all alike


@pytest.mark.parametrize("probe", CASES)
def test_classify_with_the_onnx_backend_gives_the_pytorch_labels_on_the_test_index(kept, probe, tmp_path, capsys):
    rows = {}
    for backend, model in (("torch", kept["probes"][probe]), ("onnx", kept["exported"](probe))):
        preds = tmp_path / f"{probe}-{backend}.jsonl"
        args = ["classify", str(model), str(kept["index"][2]), "--workers", "0", "--out", str(preds)]
        assert main([*args, "--backend", backend]) == 0
        rows[backend] = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(rows["onnx"]) == 9 and len({r["labels"][0] for r in rows["onnx"]}) > 1  # not one label for all
    for a, b in zip(rows["torch"], rows["onnx"], strict=True):
        assert a["labels"] == b["labels"] and a["path"] == b["path"]
        assert np.abs(np.array(a["probs"]) - np.array(b["probs"])).max() < 1e-4
    assert "onnx" in capsys.readouterr().err
    assert main(["classify", str(kept["probes"]["linear"]), str(kept["index"][2]), "--backend", "onnx"]) == 2
    assert "no classifier graph here" in capsys.readouterr().err


def test_the_frame_loop_rewrites_the_encoders_attention_and_leaves_the_heads(kept, tmp_path):
    """levjepa.formats.deployment.frame_attention on the attentive classifier graph (written with the dense mask at
    these 4-token frames): the encoder's attention becomes loops over slots, the head's cross-attention is left as it
    was, and the logits are still the PyTorch classifier's."""
    import onnx

    clf = load_classifier(kept["probes"]["attentive"])
    model = onnx.load(str(kept["exported"]("attentive") / CLASSIFIER_ONNX))

    def head_ops() -> Counter:
        return Counter(n.op_type for n in model.graph.node if node_scope(n).startswith(("head", "model.head")))

    before, depth = head_ops(), clf.model.encoder.cfg.depth
    assert frame_attention(model, input_name="pixel_values", tubelet=1, patch=8) == depth
    assert Counter(n.op_type for n in model.graph.node)["Loop"] == depth
    assert head_ops() == before and before["MatMul"] > 0  # the head's attention and layers, as they were
    onnx.save(model, str(tmp_path / "loop.onnx"))
    views = torch.randn(2, 2, 3, 3, 6, 16, 16, generator=torch.Generator().manual_seed(3))
    logits, _ = ort.InferenceSession(str(tmp_path / "loop.onnx")).run(None, {"pixel_values": views.numpy()})
    with torch.no_grad():
        want = clf.model(views.flatten(0, 2), segments=2, crops=3).view(2, 3, -1)
    assert np.abs(logits - want.numpy()).max() < 1e-4


def test_a_calibrated_int8_classifier_gives_the_fp32_labels(kept, tmp_path, capsys):
    """What a user of an int8 classifier needs beside the features' error: its labels, on files it was not
    calibrated on, are the fp32 classifier's, on this CPU's int8 kernels (whichever ISA: tests/test_quantize.py).
    The classifier graph of the fp32 export is quantized as ``export --quantize int8 --calibrate TRAIN`` does
    (the export's other graphs, quantized the same way, are tests/test_quantize.py's)."""
    shutil.copytree(kept["exported"]("attentive"), tmp_path / "int8")
    index, cfg = kept["index"], Int8Config("static", str(kept["index"][0]), 8)
    clips = calibration_clips(str(index[0]), 8, frames=4, size=16, patch=8)
    quantize_graph(tmp_path / "int8" / CLASSIFIER_ONNX, cfg, lambda: ({"pixel_values": c[None, None, None].numpy()}
                                                                       for c in clips))  # fmt: skip
    config = json.loads((tmp_path / "int8" / "config.json").read_text())
    config["deploy"].update(quantize="int8", int8=int8_record(cfg))
    (tmp_path / "int8" / "config.json").write_text(json.dumps(config))
    rows = {}
    for backend, model in (("torch", kept["probes"]["attentive"]), ("onnx", tmp_path / "int8")):
        preds = tmp_path / f"{backend}.jsonl"
        args = ["classify", str(model), str(index[2]), "--workers", "0", "--out", str(preds), "--backend", backend]
        assert main(args) == 0
        rows[backend] = [json.loads(line) for line in preds.read_text().splitlines()]
    assert "int8 static" in capsys.readouterr().err
    assert len({r["labels"][0] for r in rows["torch"]}) > 1  # not one label for all
    gaps = [abs(np.array(a["probs"]) - np.array(b["probs"])).max() for a, b in zip(*rows.values(), strict=True)]
    assert [r["labels"][0] for r in rows["onnx"]] == [r["labels"][0] for r in rows["torch"]]
    assert 0 < max(gaps) < 0.05  # quantized, and close


@pytest.mark.parametrize("probe", CASES)
def test_stream_classifier_equals_the_clip_classifier_on_its_window(kept, probe):
    """Step t reads the last min(t, W) frames: before the window is full the clip classifier on every frame so
    far (the empty slots masked), at W the clip classifier on the window, and after it the head on the window
    of the banded stream (each frame's features from the window that ended at it)."""
    clf = load_classifier(kept["probes"][probe])
    enc, cfg = clf.model.encoder, clf.model.head_cfg
    stream = OnnxStream(kept["exported"](probe), graph="stream_classifier")
    window = int(stream.record["window"])
    per_slot = 4  # 16 px frames of 8-px patches
    video = torch.randn(1, 3, 10, 16, 16, generator=torch.Generator().manual_seed(7))
    got = []
    for t in range(1, 11):
        stream.push(video[:, :, t - 1 : t].numpy())
        got.append(stream.logits)
        with torch.no_grad():
            if t <= window:  # the clip classifier on the frames seen so far
                want = clf.model(video[:, :, :t])
            else:
                out = enc.forward_features(video[:, :, :t], window=window)
                patches = out.patches[:, -window * per_slot :]
                tokens = torch.cat([out.cls[:, None], patches], 1)
                want = clf.model.head(view_inputs(out.cls, patches.mean(1), tokens, cfg))[0]
        assert np.abs(stream.logits - want.numpy()).max() < 1e-4, t
    assert np.ptp(np.concatenate(got)) > 0.01
    meta = stream.session.get_modelmeta().custom_metadata_map
    assert int(meta["window"]) == window == 4 and len(json.loads(meta["labels"])) == 3


def test_an_encoder_export_has_no_classifier_graph(tmp_path, capsys):
    run = make_run_dir(tmp_path)
    main(["export", str(run), "--out", str(tmp_path / "enc"), "--format", "onnx", "--window", "2", "--size", "16"])
    capsys.readouterr()
    with pytest.raises(Exception, match="no classifier graph here"):
        OnnxClassifier(tmp_path / "enc")
    with pytest.raises(Exception, match="no stream_classifier graph"):
        OnnxStream(tmp_path / "enc", graph="stream_classifier")
