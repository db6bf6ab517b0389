"""Compact token stores (issue 45, ``levjepa.features.compact``): what a codec keeps, that the store on disk, the
features in memory and a kept probe at inference read the same numbers, and the bytes it saves."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from levjepa.cli import main
from levjepa.config import ConfigError
from levjepa.data import MediaItem
from levjepa.data.eval_clip import ViewSpec
from levjepa.features.compact import FULL, TokenCodec, grid_of, rotation
from levjepa.features.feature_set import FeatureSet
from levjepa.features.store import StoreConfig, build_store
from levjepa.infer.encode import encode
from levjepa.model import encoder_config
from levjepa.model.vit import VideoEncoder
from levjepa.rng import seeded_init
from test_classify import PROTOCOLS, TINY, write_index
from test_export import make_run_dir


def _tokens(n: int = 3, grid: tuple[int, int, int] = (2, 4, 6), d: int = 8) -> torch.Tensor:
    t, h, w = grid
    return torch.randn(n, 1 + t * h * w, d, generator=torch.Generator().manual_seed(0))


def test_codecs_parse_name_and_count_their_bytes():
    for name in (
        "full",
        "pool2",
        "int8",
        "pool2-int8",
        "last",
        "last-int8",
        "pool3-last-int8",
        "tpool2-pool2-int8",
        "tpool2-int4",
    ):
        assert TokenCodec.parse(name).name == name
    assert TokenCodec.parse("full") == FULL and FULL.lossless
    with pytest.raises(ConfigError, match="pool2-int8"):
        TokenCodec.parse("pool2-fp8")
    grid, d = (8, 14, 14), 768  # ViT-B at 16 frames of 224 px, tubelet 2
    full = FULL.bytes_per_view(grid, d)
    assert full == (1 + 8 * 14 * 14) * d * 2
    small = TokenCodec.parse("pool2-int8").bytes_per_view(grid, d)
    assert small == (1 + 8 * 7 * 7) * (d + 2) and full / small > 7.9  # about 8x fewer
    assert TokenCodec.parse("last").kept(grid) == 1 + 14 * 14
    assert TokenCodec.parse("int4").bytes_per_view(grid, d) == (1 + 8 * 14 * 14) * (d // 2 + 2)


def test_reduce_pools_each_slot_and_keeps_cls():
    grid = (2, 4, 6)
    x = _tokens(grid=grid)
    pooled = TokenCodec(pool=2).reduce(x, grid)
    assert pooled.shape == (3, 1 + 2 * 2 * 3, 8) and torch.equal(pooled[:, 0], x[:, 0])
    patches = x[:, 1:].reshape(3, 2, 4, 6, 8)
    want = patches[:, 1, 2:4, 4:6].mean((1, 2))  # slot 1, pooled row 1, column 2
    torch.testing.assert_close(pooled[:, 1 + 3 * 2 + 1 * 3 + 2], want)
    last = TokenCodec(slots="last").reduce(x, grid)
    assert torch.equal(last[:, 1:], x[:, 1 + 24 :])  # the second (last) slot's 24 patches, in order
    both = TokenCodec.parse("tpool2-pool2").reduce(x, grid)  # the two slots averaged, then 2 × 2 pooling
    assert both.shape == (3, 1 + 6, 8) and TokenCodec.parse("tpool2-pool2").kept(grid) == 7
    torch.testing.assert_close(both[:, 1 + 1 * 3 + 2], patches[:, :, 2:4, 4:6].mean((1, 2, 3)))


def test_int8_round_trip_error_is_within_half_a_step_per_token():
    x = _tokens()
    back = TokenCodec(bits=8).roundtrip(x, (2, 4, 6)).float()
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((back - x).abs() <= step / 2 + 1e-3 * step + 2e-3 * x.abs()).all()  # float16 scale and output
    arrays = TokenCodec(bits=8).encode(x)
    assert arrays["tokens"].dtype == torch.int8 and arrays["scales"].shape == (3, 49)


def test_int4_packs_two_values_a_byte_within_half_a_step():
    x = _tokens()
    arrays = TokenCodec(bits=4).encode(x)
    assert arrays["tokens"].dtype == torch.uint8 and arrays["tokens"].shape == (3, 49, 4)
    back = TokenCodec.decode(arrays["tokens"], arrays["scales"]).float()
    step = arrays["scales"].float()[..., None]
    assert ((back - x).abs() <= step / 2 + 2e-3 * x.abs()).all()
    assert (back.abs().amax(-1) - x.abs().amax(-1)).abs().max() < 2e-3 * x.abs().max()  # the extreme is exact
    levels = (back / step).round()  # every value is one of the 15 levels, the channel order kept
    assert levels.abs().max() == 7 and torch.equal(levels.sign(), (x / step).round().sign())
    with pytest.raises(ValueError, match="odd"):
        TokenCodec(bits=4).encode(torch.randn(2, 3, 5))


@pytest.mark.parametrize("name", ["pool2-int8", "tpool2-int4", "tpool2-int4g4"])
def test_a_compact_store_holds_what_the_codec_keeps_of_the_in_memory_tokens(tmp_path, name):
    from levjepa.data import write_video

    rng = np.random.default_rng(0)
    items = []
    for i in range(3):
        write_video(tmp_path / f"v{i}.mp4", rng.integers(0, 256, (8, 32, 40, 3), dtype=np.uint8), fps=10)
        items.append(MediaItem(str(tmp_path / f"v{i}.mp4"), i % 2, "video"))
    with seeded_init(0):
        enc = VideoEncoder(encoder_config("vit-test"))
    views = ViewSpec(size=32, frames=4, frame_stride=1)
    codec = TokenCodec.parse(name)
    res = build_store(enc, items, tmp_path / "s", StoreConfig(views, codec=codec, workers=0))
    store = FeatureSet(tmp_path / "s")
    assert store.config["token_codec"] == name
    got = store.read("tokens", np.arange(res.rows))
    clips = torch.cat([views.load(it.path, enc.cfg.patch_size) for it in items])
    mem = encode(enc, clips, "cpu")
    want = codec.roundtrip(mem.tokens, grid_of(mem.positions))
    assert got.dtype == np.float16 and np.array_equal(got, want.numpy())
    full = build_store(enc, items, tmp_path / "f", StoreConfig(views, workers=0))
    size = {p.name.split("-")[0]: p.stat().st_size for p in (tmp_path / "s").glob("*-00000.npy")}
    full_size = next(p.stat().st_size for p in (tmp_path / "f").glob("tokens-00000.npy"))
    assert (
        full.rows == res.rows and full_size / (size["tokens"] + size["scales"]) > 2.5
    )  # 17 of 65 tokens at 8 bit; 33 at 4


def test_a_probe_kept_from_a_compact_store_classifies_as_it_was_scored(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(PROTOCOLS, "tiny", TINY)
    monkeypatch.chdir(tmp_path)
    media = tmp_path / "media"
    files = [write_index(media, s, n, seed) for s, n, seed in (("train", 12, 0), ("val", 6, 1), ("test", 9, 2))]
    run = make_run_dir(tmp_path, steps=(5,))
    out = tmp_path / "probe.json"
    args = ["probe", str(run), "--task", "index:" + ",".join(map(str, files)), "--protocol", "tiny", "--slots", "4"]
    args += ["--probe", "attentive", "--no-baseline", "--workers", "0", "--set", "epochs=3", "--tokens", "pool2-int8"]
    assert main([*args, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["info"]["tokens"] == "pool2-int8" and "pool2-int8 tokens (a compact store)" in capsys.readouterr().out
    kept = run / "probes" / "media" / "attentive"
    assert json.loads((kept / "classifier.json").read_text())["tokens"] == "pool2-int8"
    assert main(["classify", str(kept), str(files[2]), "--workers", "0"]) == 0
    test_acc = result["results"]["pretrained-ema"]["media"]["attentive"]["best"]["test_acc"]
    assert f"accuracy {test_acc:.1f} %" in capsys.readouterr().out


# ------------------------------------------------------------------ grouped scales and rotation (issue 53)

NEW = ("int4g32", "int4g16", "rot-int4", "rot-int4g32", "int8g32", "rot-int8", "tpool3-rot-int4", "tpool3-int4g16")


def _adversarial(d: int = 128) -> dict[str, torch.Tensor]:
    """Tokens [4, 9, d] that break a careless codec: one channel 100× the others, near-constant, zeros."""
    g = torch.Generator().manual_seed(1)
    outlier = torch.randn(4, 9, d, generator=g)
    outlier[..., 7] = 100 * outlier[..., 7].sign()  # one channel at 100, the others ~ N(0, 1)
    constant = 3.0 + 1e-3 * torch.randn(4, 9, d, generator=g)
    mixed = torch.randn(4, 9, d, generator=g)
    mixed[:, :3] = 0.0  # zero tokens among others
    # tokens from 1e-8 to 1e-2 in size: a scale amax / 127 below float16's smallest normal would round coarsely
    tiny = torch.randn(4, 9, d, generator=g) * torch.logspace(-8, -2, 36).reshape(4, 9, 1)
    return {"outlier": outlier, "constant": constant, "zeros": torch.zeros(4, 9, d), "mixed": mixed, "tiny": tiny}


def _steps(codec: TokenCodec, x: torch.Tensor) -> torch.Tensor:
    """The quantisation step of every channel [..., D] (in the rotated channels with ``rot``)."""
    scales = codec.encode(x)["scales"].float().abs()  # rot codecs store them negated
    return scales[..., None].expand(*x.shape) if scales.dim() < x.dim() else scales.repeat_interleave(codec.group, -1)


def test_new_codecs_parse_name_and_refuse_what_means_nothing():
    for name in NEW:
        codec = TokenCodec.parse(name)
        assert codec.name == name and TokenCodec.parse(codec.name) == codec
    assert TokenCodec.parse("int4g32") == TokenCodec(bits=4, group=32)
    assert TokenCodec.parse("rot-int4") == TokenCodec(bits=4, rotate=True)
    for bad in ("rot", "int4g0", "int4g", "pool2-rot", "int16g8"):
        with pytest.raises(ConfigError):
            TokenCodec.parse(bad)
    with pytest.raises(ConfigError):
        TokenCodec(group=32)  # float16 tokens have no scale to group
    with pytest.raises(ValueError, match="divide"):
        TokenCodec.parse("int4g48").encode(torch.randn(2, 3, 128))


@pytest.mark.parametrize("name", ["int8", "int4", *NEW])
def test_bytes_per_view_are_the_bytes_encoded(name):
    codec, grid, d = TokenCodec.parse(name), (8, 4, 4), 128  # the demo's token grid and width
    x = torch.randn(5, 1 + 8 * 4 * 4, d)
    arrays = codec.encode(codec.reduce(x, grid))
    held = sum(a.numel() * a.element_size() for a in arrays.values())
    assert held == 5 * codec.bytes_per_view(grid, d)
    values = d // 2 if codec.bits == 4 else d
    assert codec.bytes_per_view(grid, d) == codec.kept(grid) * (values + 2 * codec.scales_per_token(d))


def test_old_codec_names_keep_their_bytes_and_their_arrays():
    """Stores written before issue 53 stay readable: same bytes, per-token scales [N, kept], the static decode."""
    grid, d = (8, 14, 14), 768
    for name, per_token in (("int8", d + 2), ("int4", d // 2 + 2), ("pool2-int8", d + 2), ("tpool3-int4", d // 2 + 2)):
        codec = TokenCodec.parse(name)
        assert codec.bytes_per_view(grid, d) == codec.kept(grid) * per_token
        x = torch.randn(2, 9, 16)
        arrays = codec.encode(x)
        assert arrays["scales"].shape == (2, 9)
        assert torch.equal(TokenCodec.decode(arrays["tokens"], arrays["scales"]), codec.restore(**arrays))


@pytest.mark.parametrize("name", ["int8", "int4", *[n for n in NEW if "pool" not in n]])
@pytest.mark.parametrize("case", ["outlier", "constant", "zeros", "mixed", "tiny"])
def test_round_trip_error_is_within_half_a_step_on_adversarial_tokens(name, case):
    """Per token ``‖x̂ − x‖₂ ≤ ½ √(Σ_c step_c²)`` (the rotation is orthonormal), and per channel without it
    ``|x̂_c − x_c| ≤ step_c / 2``; zeros come back as zeros. Slack: float16 scales and output."""
    codec, x = TokenCodec.parse(name), _adversarial()[case]
    back = codec.roundtrip(x, (1, 2, 4)).float()
    step = _steps(codec, x @ rotation(128) if codec.rotate else x)
    slack = 2e-3 * x.abs() + 1e-3 * step
    bound = 0.5 * step.pow(2).sum(-1).sqrt() + slack.pow(2).sum(-1).sqrt() + 1e-3 * x.norm(dim=-1)
    assert ((back - x).norm(dim=-1) <= bound).all()
    if not codec.rotate:
        assert ((back - x).abs() <= step / 2 + slack).all()
    zero = x.abs().amax(-1) == 0
    assert (back[zero] == 0).all()


def test_a_rotated_store_is_refused_by_the_static_decode_and_read_by_restore():
    """``rot`` scales carry their sign bit (zeros included), so a reader that forgets the rotation fails loudly."""
    x = _adversarial()["mixed"]
    rot, plain = TokenCodec.parse("rot-int4g32"), TokenCodec.parse("int4g32")
    arrays = rot.encode(x)
    assert torch.signbit(arrays["scales"]).all()
    with pytest.raises(ValueError, match="restore"):
        TokenCodec.decode(arrays["tokens"], arrays["scales"])
    with pytest.raises(ValueError, match="not written by a 'rot' codec"):
        rot.restore(**plain.encode(x))
    with pytest.raises(ValueError, match="restore"):
        plain.restore(**arrays)
    torch.testing.assert_close(rot.restore(**arrays).float(), x, atol=0.6, rtol=0)


def test_rotation_is_orthonormal_exact_and_fixed():
    for d in (128, 192, 768, 6):
        r = rotation(d)
        torch.testing.assert_close(r @ r.T, torch.eye(d), atol=1e-6, rtol=0)
        block = d & -d
        entries = r[r != 0].abs().unique()
        assert len(entries) == 1 and entries.item() == pytest.approx(block**-0.5)
        assert (r != 0).sum() == d * block  # block-diagonal: b entries in each row
    assert torch.equal(rotation(128), rotation.__wrapped__(128))  # a function of the width alone


@pytest.mark.parametrize("better", ["int4g32", "int4g16", "rot-int4", "rot-int4g32"])
def test_grouped_or_rotated_int4_beat_per_token_int4_on_an_outlier_channel(better):
    """One channel 100× the others sets a per-token scale that rounds every other channel to 0; a scale per
    group confines it to its group, a rotation spreads it over every channel before the scale is taken."""
    x = _adversarial()["outlier"]
    err = {n: (TokenCodec.parse(n).roundtrip(x, (1, 2, 4)).float() - x).pow(2).sum(-1) for n in ("int4", better)}
    assert (err[better] < err["int4"]).all()
    assert err[better].mean() < 0.6 * err["int4"].mean()


def test_a_rotated_store_on_disk_is_read_back_by_restore(tmp_path):
    """What a ``rot`` store writes is ``encode`` of the in-memory tokens, and ``restore`` of the arrays on disk is
    the in-memory round trip (the store's reader must call ``codec.restore``, not the static ``decode``); its
    files hold ``bytes_per_view`` per row."""
    from levjepa.data import write_video

    rng = np.random.default_rng(0)
    items = []
    for i in range(3):
        write_video(tmp_path / f"v{i}.mp4", rng.integers(0, 256, (8, 32, 40, 3), dtype=np.uint8), fps=10)
        items.append(MediaItem(str(tmp_path / f"v{i}.mp4"), i % 2, "video"))
    with seeded_init(0):
        enc = VideoEncoder(encoder_config("vit-test"))
    views = ViewSpec(size=32, frames=4, frame_stride=1)
    codec = TokenCodec.parse("tpool2-rot-int4g16")
    res = build_store(enc, items, tmp_path / "s", StoreConfig(views, codec=codec, workers=0))
    assert FeatureSet(tmp_path / "s").config["token_codec"] == codec.name
    q, scales = (np.load(next((tmp_path / "s").glob(f"{a}-*.npy"))) for a in ("tokens", "scales"))  # one shard
    clips = torch.cat([views.load(it.path, enc.cfg.patch_size) for it in items])
    mem = encode(enc, clips, "cpu")
    grid = grid_of(mem.positions)
    assert np.array_equal(codec.restore(torch.from_numpy(q), torch.from_numpy(scales)).numpy(),
                          codec.roundtrip(mem.tokens, grid).numpy())  # fmt: skip
    assert q.nbytes + scales.nbytes == res.rows * codec.bytes_per_view(grid, enc.cfg.dim)


def test_the_store_reader_reads_a_rotated_store_as_the_in_memory_round_trip(tmp_path):
    """``FeatureSet.read("tokens")`` of a ``rot`` store gives what the probe trained in memory reads
    (``codec.roundtrip``): the reader restores the rotation instead of refusing the arrays."""
    from levjepa.data import write_video

    rng = np.random.default_rng(1)
    items = []
    for i in range(2):
        write_video(tmp_path / f"v{i}.mp4", rng.integers(0, 256, (8, 32, 40, 3), dtype=np.uint8), fps=10)
        items.append(MediaItem(str(tmp_path / f"v{i}.mp4"), i, "video"))
    with seeded_init(0):
        enc = VideoEncoder(encoder_config("vit-test"))
    views = ViewSpec(size=32, frames=4, frame_stride=1)
    codec = TokenCodec.parse("tpool2-rot-int4g16")
    build_store(enc, items, tmp_path / "s", StoreConfig(views, codec=codec, workers=0))
    store = FeatureSet(tmp_path / "s")
    got = store.read("tokens", np.arange(len(store)))
    clips = torch.cat([views.load(it.path, enc.cfg.patch_size) for it in items])
    mem = encode(enc, clips, "cpu")
    assert np.array_equal(got, codec.roundtrip(mem.tokens, grid_of(mem.positions)).numpy())
