"""Extraction's readouts (``levjepa.features.readout``): each equals its definition — on a known tensor, and through
``extract`` in every layout against the encoder's own output reduced by hand —; images read as one frame or
repeated give the documented shapes; the manifest records the readout, a default extraction's manifest is the
one it always was, and a reader asking for a readout the manifest does not hold is refused in one line."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from levjepa.config import ConfigError
from levjepa.data import DataError, decode_clip, normalize
from levjepa.data.eval_clip import ViewSpec, center_square
from levjepa.features.compact import TokenCodec
from levjepa.features.extract import ExtractConfig, extract
from levjepa.features.feature_set import FeatureSet, read_rows
from levjepa.features.readout import Readout
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config
from test_extract import _video

SIZE = 32  # 4 × 4 patches of 8 px: a grid 2 × 2 pooling halves


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    _video(root / "a.mp4", 24, h=SIZE, w=SIZE + 8)  # 12 kept frames at stride 2: windows of 4 at stride 4
    return root


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    root = tmp_path_factory.mktemp("image")
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    Image.fromarray(np.stack([x * 7 % 256, y * 5 % 256, (x + y) * 3 % 256], -1).astype(np.uint8)).save(root / "i.png")
    return root


def _encoder(tubelet=1):
    return random_encoder(encoder_config("vit-test", tubelet=tubelet), seed=5).encoder


def _cfg(readout=None, frames=4, **kw):
    return ExtractConfig(ViewSpec(size=SIZE, frames=frames, frame_stride=2, **kw.pop("views", {})), stride=4,
                         readout=readout or Readout(), workers=0, **kw)  # fmt: skip


def _extract(enc, src, out, cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return extract(enc, src if isinstance(src, list) else str(src), out, cfg, progress=False)


def test_each_readout_equals_its_definition_on_a_known_tensor():
    t, h, w, d = 3, 4, 4, 6
    tokens = torch.arange(2 * (1 + t * h * w) * d, dtype=torch.float32).reshape(2, 1 + t * h * w, d) % 17 - 8
    patches = tokens[:, 1:].reshape(2, t, h, w, d)
    out = Readout(frames=True, last=True, tokens="pool2-last").compute(tokens, (t, h, w))
    assert set(out) == {"frames", "last_mean", "tokens"}
    for s in range(t):  # frames[s]: slot s's h·w patch tokens averaged
        for b in range(2):
            want = torch.stack([patches[b, s, y, x] for y in range(h) for x in range(w)]).sum(0) / (h * w)
            torch.testing.assert_close(out["frames"][b, s], want)
    torch.testing.assert_close(out["last_mean"], patches[:, -1].mean((1, 2)))
    # pool2-last: CLS, then the last slot's 4 × 4 patches averaged over 2 × 2 blocks, row-major (2 × 2 kept)
    blocks = [patches[:, -1, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].mean((1, 2)) for i in range(2) for j in range(2)]
    want = torch.cat([tokens[:, :1], torch.stack(blocks, 1)], 1).half()
    assert out["tokens"].shape == (2, 1 + 4, d) and out["tokens"].dtype == torch.float16
    torch.testing.assert_close(out["tokens"], want)
    # a quantising codec stores the compact store's arrays: the same bytes as TokenCodec itself writes
    q = Readout(tokens="int8").compute(tokens, (t, h, w))
    ref = TokenCodec.parse("int8").encode(tokens.half())
    assert set(q) == {"tokens", "scales"} and torch.equal(q["tokens"], ref["tokens"])
    assert torch.equal(q["scales"], ref["scales"])
    with pytest.raises(ValueError, match="not CLS"):
        Readout(frames=True).compute(tokens, (t, h, w + 1))


def test_readout_names_are_checked_in_one_line():
    assert Readout.parse("frames,last", "pool2") == Readout(True, True, "pool2")
    assert Readout.parse(None) == Readout() and Readout().default
    with pytest.raises(ConfigError, match="valid readouts are frames, last"):
        Readout.parse("frames,cls")
    with pytest.raises(ConfigError, match="--tokens 'pool2-int3'"):
        Readout(tokens="pool2-int3")


def _clip(row, frames):
    """The window of ``row`` decoded on its own, through the evaluation transform: [1, C, T, S, S] float."""
    clip = decode_clip(row["file"], num_frames=frames, frame_stride=2, start_frame=row["start_frame"], short_side=SIZE)
    return normalize(center_square(clip, SIZE, 8).permute(3, 0, 1, 2)[None])


@pytest.mark.parametrize("layout", ["safetensors", "npy", "per_video"])
def test_every_readout_of_every_layout_is_the_encoders_output_reduced_by_hand(media, tmp_path, layout):
    enc = _encoder()
    readout = Readout(frames=True, last=True, tokens="pool2-last")
    res = _extract(enc, media, tmp_path / "out", _cfg(readout, format=layout, shard_rows=2))
    fs = FeatureSet(tmp_path / "out")
    assert fs.config["readout"] == ["frames", "last"] and fs.config["token_codec"] == "pool2-last"
    assert res.rows == len(fs) == 3  # 12 kept frames, windows of 4 at stride 4
    rows = np.arange(len(fs))
    frames, last, tokens = fs.read("frames", rows), fs.read("last_mean", rows), fs.read("tokens", rows)
    assert frames.shape == (3, 4, 32) and frames.dtype == np.float32 and last.shape == (3, 32)
    assert tokens.shape == (3, 1 + 2 * 2, 32) and tokens.dtype == np.float16
    for r in read_rows(tmp_path / "out"):
        with torch.no_grad():
            out = enc.forward_features(_clip(r, 4))
        p = out.patches[0].reshape(4, 4, 4, 32)  # [T', h, w, D]
        i = r["row"]
        torch.testing.assert_close(torch.from_numpy(frames[i]), p.mean((1, 2)), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.from_numpy(last[i]), p[-1].mean((0, 1)), rtol=1e-4, atol=1e-5)
        pooled = p[-1].reshape(2, 2, 2, 2, 32).permute(0, 2, 1, 3, 4).reshape(4, 4, 32).mean(1)  # 2 × 2 blocks
        want = torch.cat([out.cls[0][None], pooled])
        torch.testing.assert_close(torch.from_numpy(tokens[i]).float(), want, rtol=1e-2, atol=2e-3)
    if layout == "per_video":
        assert np.load(tmp_path / "out" / "a.frames.npy").shape == (3, 4, 32)


def test_codec_tokens_are_the_bytes_a_compact_store_keeps(media, tmp_path):
    enc = _encoder()
    res = _extract(enc, media, tmp_path / "out", _cfg(Readout(tokens="tpool2-int4g8"), format="npy"))
    fs = FeatureSet(tmp_path / "out")
    r = read_rows(tmp_path / "out")[1]
    from levjepa.infer.encode import encode

    e = encode(enc, _clip(r, 4), "cpu")
    codec = TokenCodec.parse("tpool2-int4g8")
    want = codec.encode(codec.reduce(e.tokens, (4, 4, 4)))
    q = np.load(tmp_path / "out" / "tokens-00000.npy")
    s = np.load(tmp_path / "out" / "scales-00000.npy")
    np.testing.assert_array_equal(q[r["offset"]], want["tokens"][0].numpy())
    np.testing.assert_array_equal(s[r["offset"]], want["scales"][0].numpy())
    restored = fs.read("tokens", np.array([r["row"]]), codec="tpool2-int4g8")[0]
    np.testing.assert_array_equal(restored, codec.restore(want["tokens"], want["scales"])[0].numpy())
    assert res.shards == ["{cls,mean,tokens,scales}-00000.npy"]


def test_a_default_extraction_keeps_its_manifest_and_a_mismatched_reader_is_refused(media, tmp_path):
    enc = _encoder()
    _extract(enc, media, tmp_path / "plain", _cfg())
    config = json.loads((tmp_path / "plain" / "store.json").read_text())["config"]
    # exactly the settings an extraction recorded before readouts existed: its folders are still reused
    assert list(config) == ["frames", "frame_stride", "fps", "size", "stride", "patches", "stream", "shard_rows"]
    plain = FeatureSet(tmp_path / "plain")
    assert plain.read("mean", np.array([0])).shape == (1, 32)
    with pytest.raises(DataError, match=r"holds the readouts cls, mean \(store.json\), not 'frames': .*--readout fr"):
        plain.read("frames", np.array([0]))
    with pytest.raises(DataError, match="--tokens CODEC"):
        plain.read("tokens", np.array([0]))
    _extract(enc, media, tmp_path / "pooled", _cfg(Readout(tokens="pool2-last")))
    pooled = FeatureSet(tmp_path / "pooled")
    assert pooled.read("tokens", np.array([0]), codec="last-pool2").shape == (1, 5, 32)  # the same codec
    with pytest.raises(DataError, match=r"holds tokens of codec 'pool2-last'.*not 'pool2-int8'"):
        pooled.read("tokens", np.array([0]), codec="pool2-int8")
    with pytest.raises(DataError, match=r"not 'last_mean'.*--readout last"):
        pooled.read("last_mean", np.array([0]))
    # the same folder with another readout is another job: refused, naming the setting
    with pytest.raises(DataError, match="token_codec"):
        _extract(enc, media, tmp_path / "pooled", _cfg(Readout(tokens="pool2")))


@pytest.mark.parametrize("tubelet", [1, 2])
def test_an_image_as_one_frame_or_repeated_gives_the_documented_shapes(image, tmp_path, tubelet):
    enc = _encoder(tubelet)
    readout = Readout(frames=True, last=True, tokens="last")
    one = _extract(enc, image, tmp_path / "one", _cfg(readout, frames=8, patches=True, views={"image_frames": tubelet}))
    rep = _extract(enc, image, tmp_path / "rep", _cfg(readout, frames=8, patches=True))
    f1, fr = FeatureSet(tmp_path / "one"), FeatureSet(tmp_path / "rep")
    assert one.rows == rep.rows == 1 and f1.config["image_frames"] == tubelet and "image_frames" not in fr.config
    row = np.array([0])
    # one slot: frames [1, D], patches h·w; repeated: 8 frames -> 8 / τ slots
    assert f1.read("frames", row).shape == (1, 1, 32) and f1.read("patches", row).shape == (1, 16, 32)
    assert (
        fr.read("frames", row).shape == (1, 8 // tubelet, 32) and fr.read("patches", row).shape[1] == 16 * 8 // tubelet
    )
    assert read_rows(tmp_path / "one")[0]["num_frames"] == tubelet and read_rows(tmp_path / "rep")[0]["num_frames"] == 8
    img = center_square(torch.from_numpy(np.array(Image.open(image / "i.png")))[None], SIZE, 8)
    with torch.no_grad():
        want = enc.forward_features(normalize(img.expand(tubelet, -1, -1, -1).permute(3, 0, 1, 2)[None]))
    torch.testing.assert_close(torch.from_numpy(f1.read("cls", row)[0]), want.cls[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(f1.read("frames", row)[0, 0]), want.patches[0].mean(0), rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    # a block-causal encoder's first slot never sees the later repeats: slot 0 of the repeated image is the
    # one-frame image's slot
    torch.testing.assert_close(fr.read("frames", row)[0, 0], f1.read("frames", row)[0, 0], rtol=1e-4, atol=1e-5)
    assert f1.read("tokens", row).shape == fr.read("tokens", row).shape == (1, 1 + 16, 32)


def test_one_frame_images_beside_videos_are_refused_when_an_array_would_change_length(media, image, tmp_path):
    enc = _encoder()
    both = [str(media / "a.mp4"), str(image / "i.png")]
    with warnings.catch_warnings(), pytest.raises(ValueError, match="two folders"):
        warnings.simplefilter("ignore")
        extract(enc, both, tmp_path / "x", _cfg(Readout(frames=True), views={"image_frames": 1}), progress=False)
    # CLS, mean and the last slot have one length whatever the slots: allowed, and the image's row is its own batch
    res = _extract(enc, both, tmp_path / "y", _cfg(Readout(last=True, tokens="last"), views={"image_frames": 1}))
    fs = FeatureSet(tmp_path / "y")
    assert res.rows == 4 and fs.read("tokens", np.arange(4)).shape == (4, 17, 32)
    with pytest.raises(ValueError, match="tubelet is 2"):
        _extract(_encoder(2), image, tmp_path / "z", _cfg(views={"image_frames": 1}))


def test_streamed_rows_give_the_readouts_of_their_own_patch_tokens(media, tmp_path):
    enc = _encoder()
    cfg = _cfg(Readout(frames=True, last=True, tokens="last"), patches=True, stream=True)
    res = _extract(enc, media, tmp_path / "s", cfg)
    fs = FeatureSet(tmp_path / "s")
    rows = np.arange(res.rows)
    patches = torch.from_numpy(fs.read("patches", rows)).float().reshape(res.rows, 4, 16, 32)
    torch.testing.assert_close(torch.from_numpy(fs.read("frames", rows)), patches.mean(2), rtol=1e-2, atol=2e-3)
    torch.testing.assert_close(torch.from_numpy(fs.read("last_mean", rows)), patches[:, -1].mean(1), rtol=1e-2,
                               atol=2e-3)  # fmt: skip
    tokens = torch.from_numpy(fs.read("tokens", rows)).float()
    torch.testing.assert_close(tokens[:, 1:], patches[:, -1])
    torch.testing.assert_close(tokens[:, 0], torch.from_numpy(fs.read("cls", rows)), rtol=1e-2, atol=2e-3)


def test_the_command_line_records_the_readout_and_refuses_a_bad_one_in_one_line(media, tmp_path, capsys):
    from levjepa.cli import main
    from test_export import make_run_dir

    run = make_run_dir(tmp_path, steps=(5,))
    args = ["extract", str(run), str(media), "--window", "4", "--stride", "4", "--frame-stride", "2", "--size",
            str(SIZE), "--workers", "0", "--no-progress"]  # fmt: skip
    out = tmp_path / "cli"
    assert main([*args, "--out", str(out), "--readout", "frames,last", "--tokens", "pool2-int8"]) == 0
    said = capsys.readouterr().out
    assert "arrays: cls, mean, frames, last_mean, tokens, scales (tokens: pool2-int8)" in said
    config = json.loads((out / "store.json").read_text())["config"]
    assert config["readout"] == ["frames", "last"] and config["token_codec"] == "pool2-int8"
    assert FeatureSet(out).read("tokens", np.array([0])).shape == (1, 1 + 4 * 2 * 2, 32)
    assert main([*args, "--out", str(tmp_path / "bad"), "--readout", "patches"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "valid readouts are frames, last" in err
    assert main([*args, "--out", str(tmp_path / "bad"), "--tokens", "pool0"]) == 2
    assert "--tokens 'pool0'" in capsys.readouterr().err
