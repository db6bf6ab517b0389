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
from levjepa.features.feature_set import read_rows
from levjepa.formats.reading.classifier import check_encoder, load_classifier, read_classifier
from levjepa.formats.reading.load import load_encoder
from levjepa.infer import StreamingEncoder
from levjepa.infer.encode import encode
from levjepa.model import VideoEncoder, encoder_config
from levjepa.model.fingerprint import TRAINING_ONLY, function_fingerprint
from levjepa.model.readout_layers import HIERARCHICAL, hierarchical_layers, parse_layers
from levjepa.weights import WeightsError, load_tensors, weights_fingerprint
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


def test_probe_kept_probe_classify_and_export_round_trip_at_a_readout(tmp_path, index_task, capsys):  # noqa: F811
    import transformers

    import levjepa

    run = make_run_dir(tmp_path, steps=(5,), depth=3)
    task = "index:" + ",".join(map(str, index_task))
    base = ["probe", str(run), "--task", task, "--protocol", "tiny", "--slots", "4", "--workers", "0", "--no-baseline"]
    args = [*base, "--probe", "attentive,linear", "--set", "epochs=2"]
    out = tmp_path / "res" / "p.json"
    assert main([*args, "--layers", "0,-1", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "read at blocks 0, 2 of 3" in said and "encoders read at blocks 0, 2 of 3, concatenated" in said  # caption
    reported = json.loads(out.read_text())["results"]["pretrained-ema"]["media"]
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "res" / "features").rglob("store.json")]
    assert manifests and all(m["readout_layers"] == [0, 2] for m in manifests)
    for probe in ("attentive", "linear"):
        kept = run / "probes" / "media" / probe
        rec = read_classifier(kept)
        assert rec.readout_layers == (0, 2) and rec.head.dim == 64
        assert json.loads((kept / "classifier.json").read_text())["readout_layers"] == [0, 2]
        preds = tmp_path / f"{probe}.jsonl"
        assert main(["classify", str(kept), str(index_task[2]), "--workers", "0", "--out", str(preds)]) == 0
        rows = [json.loads(line) for line in preds.read_text().splitlines()]
        acc = 100.0 * sum(r["classes"][0] == r["truth"] for r in rows) / len(rows)
        assert acc == pytest.approx(reported[probe]["best"]["test_acc"], abs=1e-9), probe
    capsys.readouterr()
    kept = run / "probes" / "media" / "linear"
    # the kept probe refuses another readout: on the command line, and against an encoder read elsewhere
    assert main(["classify", str(kept), str(index_task[2]), "--workers", "0", "--layers", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "blocks 0, 2 of 3" in err
    rec = read_classifier(kept)
    for other in (None, [1], [2, 0]):
        with pytest.raises(WeightsError, match="a head reads only the encoder it was trained on"):
            check_encoder(rec, load_encoder(run).encoder.set_readout_layers(other), where="kept", other="it is")
    # a probe of the default readout keeps the record of before (no readout key) and refuses the layered encoder
    assert main([*base, "--probe", "linear", "--set", "epochs=2", "--probes-dir", str(tmp_path / "d")]) == 0
    default = tmp_path / "d" / "media" / "linear"
    assert "readout_layers" not in json.loads((default / "classifier.json").read_text())
    with pytest.raises(WeightsError, match="a head reads only the encoder it was trained on"):
        layered = load_encoder(run).encoder.set_readout_layers([0, 2])
        check_encoder(read_classifier(default), layered, where="kept", other="it is")
    # the export of the kept probe and of the encoder at that readout: the same features and logits everywhere
    clf = load_classifier(kept)
    x = torch.randn(2, 3, 4, 16, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = clf.model.encoder.forward_features(x).tokens
        want_logits = clf.model(x)
    capsys.readouterr()
    assert main(["export", str(kept), "--out", str(tmp_path / "ce")]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "e"), "--layers", "0,-1"]) == 0
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    assert config["encoder"]["readout_layers"] == [0, 2]
    with torch.no_grad():
        for model in (levjepa.from_pretrained(tmp_path / "e"), transformers.AutoModel.from_pretrained(tmp_path / "e")):
            got = model(pixel_values=x)
            assert torch.equal(got.last_hidden_state, want) and torch.equal(got.pooler_output, want[:, 0])
            hidden = model(pixel_values=x, output_hidden_states=True)
            torch.testing.assert_close(hidden.last_hidden_state, want, rtol=0, atol=1e-6)
            assert len(hidden.hidden_states) == 3 + 1 and hidden.hidden_states[-1].shape[-1] == 32
        assert torch.equal(levjepa.load(tmp_path / "e").forward_features(x).tokens, want)
        plain = levjepa.from_pretrained(run, layers=[0, -1])(pixel_values=x).last_hidden_state
        assert torch.equal(plain, want)
        # transformers' own override, on the export (its recorded readout replaced)
        auto = transformers.AutoModel.from_pretrained(tmp_path / "e", readout_layers=[1])(pixel_values=x)
        block1 = load_encoder(run).encoder.set_readout_layers([1]).forward_features(x).tokens
        assert torch.equal(auto.last_hidden_state, block1)
        # ... which save_pretrained keeps, and levjepa reads back
        transformers.AutoModel.from_pretrained(tmp_path / "e", readout_layers=[1]).save_pretrained(tmp_path / "s")
        assert torch.equal(levjepa.load(tmp_path / "s").forward_features(x).tokens, block1)
        classifier = transformers.AutoModelForVideoClassification.from_pretrained(tmp_path / "ce")
        torch.testing.assert_close(classifier(pixel_values=x).logits, want_logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(levjepa.from_pretrained(tmp_path / "ce")(pixel_values=x).logits, want_logits)
    capsys.readouterr()
    assert main(["export", str(kept), "--out", str(tmp_path / "bad"), "--layers", "1"]) == 2
    assert "whose head reads blocks 0, 2 of 3" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(tmp_path / "g"), "--layers", "1", "--format", "onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the deployment graphs compute the last block's readout" in err


def test_the_plan_counts_the_readouts_wider_channels(tmp_path, index_task):  # noqa: F811
    from levjepa.eval.config import EvalConfig
    from levjepa.eval.dataset_task import dataset_task
    from levjepa.eval.plan import plan
    from levjepa.formats.reading.views import model_views

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


def test_fine_tuning_refuses_an_encoder_read_at_other_blocks(tmp_path):
    from levjepa.formats.writing.finetuned import Start, start_encoder

    run = make_run_dir(tmp_path, steps=(5,), depth=3)
    assert main(["export", str(run), "--out", str(tmp_path / "e"), "--layers", "1"]) == 0
    with pytest.raises(ConfigError, match="fine-tuning trains the encoder on its last block"):
        start_encoder(Start(str(tmp_path / "e"), "ema", False, 0), "cpu")
    assert start_encoder(Start(str(run), "ema", False, 0), "cpu").config.readout_layers is None


def test_a_continued_run_keeps_its_own_readout(tmp_path):
    from levjepa.train.start import StartWeights, with_architecture

    cfg = encoder_config("vit-test", depth=3)
    start = StartWeights(dataclasses.replace(cfg, readout_layers=(0, 2)), {}, None, "an export read at 0, 2")
    assert with_architecture(cfg, start).readout_layers is None


@torch.no_grad()
def test_the_released_layout_read_at_other_blocks_through_automodel_and_from_pretrained(tmp_path):
    import transformers

    import levjepa
    from test_official import fixture, released_folder

    t = fixture(1)
    folder = released_folder(tmp_path / "released", t, 1, "block_causal")
    auto = transformers.AutoModel.from_pretrained(str(folder), readout_layers=[0, -1])  # the official layout
    ours = levjepa.from_pretrained(folder, layers=[0, -1])  # imported on the fly into levjepa's layout
    got = auto(pixel_values=t["input.video"]).last_hidden_state
    want = ours(pixel_values=t["input.video"]).last_hidden_state
    d = ours.encoder.cfg.dim
    assert got.shape[-1] == want.shape[-1] == 2 * d and (got - want).abs().max().item() < 1e-5
    # save_pretrained keeps the readout in the released layout, and levjepa reads it back
    auto.save_pretrained(tmp_path / "saved")
    again = levjepa.from_pretrained(tmp_path / "saved")(pixel_values=t["input.video"]).last_hidden_state
    assert (again - got).abs().max().item() < 1e-5
    # its last block's part is the official model's own output; its first block's is not
    assert (got[..., d:] - t["output.block_causal"]).abs().max().item() < 1e-5
    assert (got[..., :d] - t["output.block_causal"]).abs().max().item() > 1e-2


def test_a_config_reading_the_last_block_is_written_as_before_and_read_back():
    from levjepa.config import from_dict

    cfg = encoder_config("vit-test", depth=3)
    assert "readout_layers" not in to_dict(cfg)  # runs, checkpoints and exports of the default: as before
    layered = dataclasses.replace(cfg, readout_layers=(0, -1))
    assert to_dict(layered)["readout_layers"] == [0, 2]
    assert from_dict(type(cfg), to_dict(layered)) == layered and from_dict(type(cfg), to_dict(cfg)) == cfg
