"""One path from a labelled file to frozen features (issue 44): one frozen forward (``levjepa.infer.encode``)
that every reader uses, one safe worker map (``levjepa.data.workers.safe_map``), one view spec
(``levjepa.data.eval_clip.ViewSpec``). In-memory features, a feature store's rows and a classifier's inputs
are the same numbers."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from levjepa.data import DataError, MediaItem, normalize, write_video
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.workers import safe_map
from levjepa.features.cache import compute_features
from levjepa.features.feature_set import FeatureSet
from levjepa.features.store import StoreConfig, build_store
from levjepa.infer.encode import encode
from levjepa.model import encoder_config
from levjepa.model.fingerprint import function_fingerprint
from levjepa.model.vit import VideoEncoder
from levjepa.rng import seeded_init
from levjepa.weights import weights_fingerprint

SRC = Path(__file__).resolve().parents[1] / "src" / "levjepa"

# modules that may call an encoder's forward_features: the model itself (definitions, the classifier's
# training forward, with gradients), the one frozen forward, the streaming encoder, and the wrappers that
# *are* models (the hub model, the exported graphs, the classifier graph), which frozen readers never call
FORWARD_OWNERS = {
    "model/vit.py",
    "model/classifier.py",
    "infer/encode.py",
    "infer/stream.py",
    "formats/transformers/outputs.py",
    "formats/deployment/graphs.py",
    "formats/deployment/classifier_graphs.py",
}


def _encoder(seed: int = 0) -> VideoEncoder:
    with seeded_init(seed):
        return VideoEncoder(encoder_config("vit-test"))


def test_no_frozen_forward_outside_the_one_function():
    """Every reader of a frozen encoder (probe, extract, classify, finetune's evaluation, visualize) goes
    through ``levjepa.infer.encode.encode``: no other module calls ``forward_features`` or opens an
    inference-mode context of its own."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr == "forward_features" and rel not in FORWARD_OWNERS:
                found.append(f"{rel}:{node.lineno} calls forward_features")
            if node.func.attr == "inference_mode" and rel not in FORWARD_OWNERS:
                found.append(f"{rel}:{node.lineno} opens inference_mode")
    assert found == []


def test_encode_is_the_frozen_forward_and_restores_the_mode():
    enc = _encoder().train()
    clips = torch.randint(0, 256, (3, 3, 4, 16, 16), dtype=torch.uint8)
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    out = encode(enc, clips, "cpu")
    assert enc.training and all(torch.equal(v, before[k]) for k, v in enc.state_dict().items())
    with torch.no_grad():
        ref = enc.eval().forward_features(normalize(clips))
    assert torch.equal(out.cls, ref.cls) and torch.equal(out.mean, ref.patches.mean(1))
    assert out.tokens is not None and out.tokens.dtype == torch.float16
    assert torch.equal(out.tokens, torch.cat([ref.cls[:, None], ref.patches], 1).half())
    assert torch.equal(out.patches, ref.patches.half()) and torch.equal(out.positions, ref.positions)
    float32 = encode(enc, normalize(clips), "cpu", tokens=False)  # normalised float views are taken as they are
    assert float32.tokens is None and torch.equal(float32.cls, out.cls)
    with pytest.raises(ValueError, match="kept no token"):
        float32.patches


def test_memory_and_store_features_are_the_same_numbers(tmp_path):
    """The in-memory path (``compute_features``) and a feature store on disk (``build_store``) of the same
    views hold bit-identical CLS, mean and float16 tokens."""
    rng = np.random.default_rng(0)
    items = []
    for i in range(3):
        frames = rng.integers(0, 256, (12, 20, 24, 3), dtype=np.uint8)
        write_video(tmp_path / f"v{i}.mp4", frames, fps=10)
        items.append(MediaItem(str(tmp_path / f"v{i}.mp4"), i % 2, "video"))
    views = ViewSpec(size=16, frames=4, frame_stride=2, segments=2, crops=3)
    enc = _encoder()
    build_store(enc, items, tmp_path / "store", StoreConfig(views, batch_size=4, workers=0))
    store = FeatureSet(tmp_path / "store")
    clips = torch.cat([views.load(it.path, enc.cfg.patch_size) for it in items])  # [files·6, C, T, S, S]
    mem = compute_features(enc, clips, batch_size=5)
    rows = np.arange(len(store))
    assert len(store) == len(clips) == 18
    for name, ours in (("cls", mem.cls), ("mean", mem.mean), ("tokens", mem.tokens)):
        assert ours is not None
        assert np.array_equal(store.read(name, rows), ours.numpy()), name
    store.close()


def _read(x: int) -> int:
    if x == 2:
        raise DataError(f"unreadable: item {x}")
    if x == 4:
        raise OSError("gone")
    if x == 5:
        from levjepa.eval.config import PROBE_INPUTS

        return len(PROBE_INPUTS[f"probe{x}"])  # a KeyError raised by levjepa's own code: a bug, not a bad file
    return x * 10


@pytest.mark.parametrize("workers", [0, 1])
def test_safe_map_turns_unreadable_items_into_reasons_in_order(workers):
    got = list(safe_map(_read, [0, 1, 2, 3, 4], workers))
    assert got == [
        (0, 0, ""),
        (1, 10, ""),
        (2, None, "unreadable: item 2"),
        (3, 30, ""),
        (4, None, "unreadable: OSError: gone"),
    ]
    with pytest.raises(KeyError):  # an error of levjepa's own code is a bug: it ends the job
        list(safe_map(_read, [5], 0))


def test_view_spec_checks_and_reads_like_a_protocol():
    assert ViewSpec(256, 16, 4, 2, 3).text == "16×2×3" and ViewSpec(256, 16, 4, 2, 3).views == 6
    from levjepa.config import ConfigError

    with pytest.raises(ConfigError, match="crops=2"):
        ViewSpec(crops=2)
    with pytest.raises(ConfigError, match="frames=0"):
        ViewSpec(frames=0)


def test_one_weights_fingerprint_and_one_function_fingerprint():
    a, b = _encoder(0), _encoder(0)
    assert weights_fingerprint(a) == weights_fingerprint(b) and function_fingerprint(a) == function_fingerprint(b)
    assert weights_fingerprint(a) != weights_fingerprint(_encoder(1))
    bidirectional = VideoEncoder(encoder_config("vit-test", attention="bidirectional"))
    bidirectional.load_state_dict(a.state_dict())
    # the same weights computing another function: one fingerprint says so, the other does not
    assert weights_fingerprint(bidirectional) == weights_fingerprint(a)
    assert function_fingerprint(bidirectional) != function_fingerprint(a)
