"""Layer readouts (``--layers``, ``EncoderConfig.readout_layers``, issue 65): a readout at block ``L`` is the first
``L + 1`` blocks run by hand through the final norm; several blocks concatenate on channels in the order named;
the default readout (the last block) is bit for bit the encoder as it was — its features, function fingerprint,
extraction folders and kept probes; a readout is its own function (stores, caches, kept probes); streaming
equals the full forward at any readout; ``extract`` → ``probe`` → kept probe → ``classify`` → ``export`` →
``AutoModel`` give the same numbers at a non-default readout."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from levjepa.cli import main
from levjepa.config import ConfigError, to_dict
from levjepa.data.eval_clip import load_eval_video
from levjepa.eval.extract import read_rows
from levjepa.formats.load import load_encoder
from levjepa.infer import StreamingEncoder
from levjepa.infer.encode import encode
from levjepa.model import VideoEncoder, encoder_config
from levjepa.model.fingerprint import TRAINING_ONLY, function_fingerprint
from levjepa.model.readout_layers import HIERARCHICAL, hierarchical_layers, parse_layers
from levjepa.weights import load_tensors, weights_fingerprint
from test_classify import index_task  # noqa: F401 (a fixture)
from test_export import make_run_dir
from test_extract import _video


def _encoder(depth: int = 4, seed: int = 0) -> VideoEncoder:
    """A small encoder whose final norm is not the identity (so that a test of "through the norm" can fail)."""
    torch.manual_seed(seed)
    enc = VideoEncoder(encoder_config("vit-test", depth=depth)).eval()
    with torch.no_grad():
        enc.norm.weight.uniform_(0.5, 1.5)
    return enc


def _video_batch(seed: int = 1, frames: int = 4, side: int = 16) -> torch.Tensor:
    return torch.randn(2, 3, frames, side, side, generator=torch.Generator().manual_seed(seed))


def _by_hand(enc: VideoEncoder, video: torch.Tensor, block: int) -> torch.Tensor:
    """CLS + patch tokens after blocks ``0..block`` and the final norm, running each block by hand."""
    x, _, rope, attn_mask = enc._prepare(video, False, None, None, "video")
    for blk in list(enc.blocks)[: block + 1]:
        x = blk(x, rope, attn_mask)
    return enc.norm(x)


@torch.no_grad()
def test_a_readout_at_block_l_is_the_first_l_plus_1_blocks_by_hand_and_ignores_the_rest():
    enc, video = _encoder(), _video_batch()
    for block in (0, 1, 2, 3, -4, -2, -1):
        enc.set_readout_layers([block])
        got = enc.forward_features(video)
        want = _by_hand(enc, video, block % 4)
        assert torch.equal(torch.cat([got.cls[:, None], got.patches], 1), want), block
        assert enc.num_features == 32
    # the blocks after the one read are never run: changing them changes nothing
    enc.set_readout_layers([1])
    before = enc.forward_features(video).tokens
    for blk in list(enc.blocks)[2:]:
        for p in blk.parameters():
            p.add_(1.0)
    assert torch.equal(enc.forward_features(video).tokens, before)
    enc.set_readout_layers(None)
    assert not torch.allclose(enc.forward_features(video).tokens, before)  # the last block does read them


@torch.no_grad()
def test_several_blocks_concatenate_on_channels_in_the_order_named():
    enc, video = _encoder(), _video_batch()
    single = {}
    for block in range(4):
        enc.set_readout_layers([block])
        single[block] = enc.forward_features(video).tokens  # [B, 1+L, 32]
    enc.set_readout_layers([2, 0, -1])
    assert enc.cfg.readout_layers == (2, 0, 3) and enc.num_features == 3 * 32 == enc.cfg.readout_dim
    out = enc.forward_features(video)
    assert out.cls.shape == (2, 96) and out.patches.shape == (2, 4 * 2 * 2, 96)
    for part, block in enumerate((2, 0, 3)):
        assert torch.equal(out.tokens[..., 32 * part : 32 * (part + 1)], single[block]), block
    enc.set_readout_layers([0, 2])  # another order is another function
    assert not torch.equal(enc.forward_features(video).tokens, out.tokens[..., :64])
    # the frozen forward's pooled features follow: the mean of the readout is the readout of the means
    enc.set_readout_layers([2, 0, -1])
    got = encode(enc, video, "cpu")
    torch.testing.assert_close(got.mean, torch.cat([single[b][:, 1:].mean(1) for b in (2, 0, 3)], 1))
    # V-JEPA 2.1's hierarchical readout: its table, and the quarter rule it follows at 12, 24 and 40 blocks
    assert hierarchical_layers(24) == (5, 11, 17, 23) == parse_layers("hierarchical", 24)
    for depth in (12, 24, 40):
        assert tuple(sorted({-(-depth * k // 4) - 1 for k in (1, 2, 3, 4)})) == HIERARCHICAL[depth]
    assert parse_layers("hierarchical", 4) == (0, 1, 2, 3) and parse_layers(" -1 ", 4) is None


def _old_fingerprint(enc: VideoEncoder) -> str:
    """The function fingerprint as levjepa computed it before readout layers existed (a config without them)."""
    config = {k: v for k, v in to_dict(enc.cfg).items() if k not in (*TRAINING_ONLY, "readout_layers")}
    text = json.dumps(config, sort_keys=True)
    return hashlib.sha256(f"{text}\n{weights_fingerprint(enc)}".encode()).hexdigest()[:16]


@torch.no_grad()
def test_the_default_readout_is_the_encoder_as_it_was_bit_for_bit():
    enc, video = _encoder(), _video_batch()
    x, _, rope, attn_mask = enc._prepare(video, False, None, None, "video")
    want = enc.norm(enc.blocks(x, rope, attn_mask))  # the forward as it was: every block, then the norm
    before = encode(enc, video, "cpu")
    assert torch.equal(enc.forward_features(video).tokens, want)
    for spelled in (None, [-1], [3], (3,)):
        enc.set_readout_layers(spelled)
        assert enc.cfg.readout_layers is None and enc.num_features == 32
        assert function_fingerprint(enc) == _old_fingerprint(enc)  # old stores, caches, kept probes stay valid
        again = encode(enc, video, "cpu")
        assert all(torch.equal(getattr(again, k), getattr(before, k)) for k in ("cls", "mean", "tokens"))
    prints = {function_fingerprint(enc)}
    for layers in ([0], [2], [0, 3], [3, 0]):
        prints.add(function_fingerprint(enc.set_readout_layers(layers)))
    assert len(prints) == 5  # every readout of the same weights is its own function
    assert weights_fingerprint(enc) == weights_fingerprint(enc.set_readout_layers(None))


def test_a_block_the_model_does_not_have_is_one_line_naming_its_depth(tmp_path, capsys):
    enc = _encoder()
    for bad, said in (([4], "depth 4"), ([-5], "depth 4"), ([1, 1], "given twice"), ([], "no block")):
        with pytest.raises(ConfigError, match=said):
            enc.set_readout_layers(bad)
    with pytest.raises(ConfigError, match="expected block indices"):
        parse_layers("5;11", 4)
    run = make_run_dir(tmp_path, steps=(5,), depth=3)
    (tmp_path / "v").mkdir()
    _video(tmp_path / "v" / "a.mp4", 8)
    for layers in ("3", "-4", "0,0", "x"):
        out = tmp_path / f"o{layers}"
        code = main(["extract", str(run), str(tmp_path / "v"), "--out", str(out), "--layers", layers, "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0 and err.startswith("levjepa extract: --layers"), err
        assert "depth 3" in err or "twice" in err or "block indices" in err
        assert not (out / "store.json").exists()


@pytest.mark.parametrize("window", [None, 2])
@torch.no_grad()
def test_streaming_equals_the_full_forward_at_any_readout(window):
    enc = _encoder(depth=3)
    video = _video_batch(frames=5, side=32)
    for layers in ([1], [2, 0]):
        enc.set_readout_layers(layers)
        stream, seen = StreamingEncoder(enc, window=window), []
        for t in range(video.shape[2]):
            seen.append(stream.push(video[:, :, t : t + 1]))
            full = enc.forward_features(video[:, :, : t + 1], window=window)
            torch.testing.assert_close(torch.cat(seen, 1), full.patches, rtol=0.0, atol=1e-5)
            torch.testing.assert_close(stream.cls(), full.cls, rtol=0.0, atol=1e-5)
        assert seen[0].shape[-1] == 32 * len(layers)
        if layers == [1]:  # no block after the one read runs: its cache stays empty
            assert stream._caches[2].k is None and stream._caches[1].k is not None


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_extract_at_a_readout_and_the_default_extraction_unchanged(tmp_path, capsys):
    run = make_run_dir(tmp_path, steps=(5,), depth=3)
    media = tmp_path / "v"
    media.mkdir()
    _video(media / "a.mp4", 12)
    _video(media / "b.mp4", 7)
    common = [str(run), str(media), "--window", "4", "--stride", "2", "--frame-stride", "1", "--size", "16"]
    common += ["--patch", "--no-progress", "--workers", "0"]
    outs = {}
    for name, extra in (("plain", []), ("minus1", ["--layers", "-1"]), ("last", ["--layers", "2"])):
        assert main(["extract", *common, "--out", str(tmp_path / name), *extra]) == 0
        outs[name] = _files(tmp_path / name)
    assert outs["plain"] == outs["minus1"] == outs["last"]  # byte for byte: store.json, shards, index
    assert "readout_layers" not in json.loads(outs["plain"]["store.json"])
    assert main(["extract", *common, "--out", str(tmp_path / "l"), "--layers", "0,-1"]) == 0
    assert "read at blocks 0, 2 of 3" in capsys.readouterr().out
    store = json.loads((tmp_path / "l" / "store.json").read_text())
    assert store["readout_layers"] == [0, 2]
    assert store["encoder"] != json.loads(outs["plain"]["store.json"])["encoder"]
    shard, _ = load_tensors(tmp_path / "l" / "features-00000.safetensors")
    plain, _ = load_tensors(tmp_path / "plain" / "features-00000.safetensors")
    assert shard["cls"].shape[1] == shard["patches"].shape[2] == 64
    assert torch.equal(shard["cls"][:, 32:], plain["cls"]) and torch.equal(shard["patches"][..., 32:], plain["patches"])
    rows = read_rows(tmp_path / "l")
    enc = load_encoder(run).encoder.set_readout_layers([0, -1])
    first = rows[0]
    video = load_eval_video(first["file"], size=16, patch=8, frame_stride=1)
    clip = video.frames[first["start_frame"] : first["start_frame"] + 4].permute(3, 0, 1, 2)[None]
    torch.testing.assert_close(shard["cls"][0], encode(enc, clip, "cpu").cls[0])
    # a folder holds one readout: the default extraction into it is refused in one line
    assert main(["extract", *common, "--out", str(tmp_path / "l")]) == 2
    assert "another encoder" in capsys.readouterr().err
    # streaming rows at a readout: the first window is the windowed row
    assert main(["extract", *common, "--out", str(tmp_path / "s"), "--layers", "0,-1", "--stream"]) == 0
    streamed, _ = load_tensors(tmp_path / "s" / "features-00000.safetensors")
    torch.testing.assert_close(streamed["cls"][0], shard["cls"][0], rtol=1e-4, atol=1e-5)


def test_the_plan_counts_the_readouts_wider_channels(tmp_path, index_task):  # noqa: F811
    from levjepa.eval.config import EvalConfig
    from levjepa.eval.dataset_task import dataset_task
    from levjepa.eval.plan import plan
    from levjepa.formats.reading import model_views

    run = make_run_dir(tmp_path, steps=(5,), depth=3)
    files = [str(f) for f in index_task]
    disks = {}
    for layers in (None, [0, -1]):
        loaded = load_encoder(run).with_readout(layers)
        views, _ = model_views(loaded, size=16, frames=4)
        task = dataset_task(files, views=views, workers=0, features_dir=tmp_path / "f")
        cfg = EvalConfig(tasks=(task.name,), probes=("attentive", "linear"))
        said = plan(task, loaded, cfg)
        task.prepare({"e": loaded.encoder}, cfg)
        for split in said.splits:  # what the store then takes, byte for byte
            stored = sum(np.load(p, mmap_mode="r").nbytes for p in task.stores["e"][split.split].glob("*-0*.npy"))
            assert split.disk == stored, (layers, split.split)
        disks[layers is None] = [s.disk for s in said.splits]
    assert disks[False] == [2 * d for d in disks[True]]  # two blocks: twice the channels of every array


def test_a_continued_run_keeps_its_own_readout(tmp_path):
    from levjepa.train.start import StartWeights, with_architecture

    cfg = encoder_config("vit-test", depth=3)
    start = StartWeights(dataclasses.replace(cfg, readout_layers=(0, 2)), {}, None, "an export read at 0, 2")
    assert with_architecture(cfg, start).readout_layers is None
