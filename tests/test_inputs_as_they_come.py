"""Inputs as users bring them: file names in any bytes the file system allows, images and videos of every common
pixel format read at their true range (16-bit, grayscale, palette, full range, transparency over white), and
labels checked — missing, negative, unseen in TRAIN — in one line each before any file is encoded."""

from __future__ import annotations

import io
import os
import warnings

import av
import numpy as np
import pytest
import torch
from PIL import Image

from levjepa.commands import main as cli_main
from levjepa.data import DataError, decode_clip, load_image
from levjepa.data.sources import list_media, parse_index
from levjepa.eval.labelled import read_task
from levjepa.features.extract import extract
from levjepa.features.feature_set import read_rows
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config
from test_extract import _video, windows

LATIN1 = b"caf\xe9.mp4"  # "café" in Latin-1: not UTF-8, so Python holds it as "caf\udce9.mp4"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    _video(root / "a.mp4", 12)
    _video(os.fsdecode(os.path.join(os.fsencode(root), LATIN1)), 12)
    return root


# ------------------------------------------------------------------------------------------------ file names


@pytest.mark.parametrize("fmt", ["safetensors", "per_video"])
def test_a_file_name_that_is_not_utf8_is_extracted_like_any_other(folder, tmp_path, fmt, one_thread):
    enc = random_encoder(encoder_config("vit-test"), seed=0).encoder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = extract(enc, str(folder), tmp_path / "x", windows(4, 4, workers=0, format=fmt), progress=False)
    rows = read_rows(tmp_path / "x")
    names = {os.fsencode(r["file"]).rsplit(b"/", 1)[-1] for r in rows}
    assert names == {b"a.mp4", LATIN1} and res.bad_files == 0
    a = [r for r in rows if r["file"].endswith("a.mp4")]
    b = [r for r in rows if not r["file"].endswith("a.mp4")]
    assert len(a) == len(b)  # the same video under both names: the same rows


def test_an_index_file_may_name_such_a_file(folder, tmp_path):
    index = tmp_path / "index.txt"
    index.write_bytes(os.fsencode(folder) + b"/" + LATIN1 + b" 1\n" + os.fsencode(folder / "a.mp4") + b" 0\n")
    items = parse_index(str(index))
    assert [os.fsencode(it.path).rsplit(b"/", 1)[-1] for it in items] == [LATIN1, b"a.mp4"]
    assert [it.label for it in items] == [1, 0] and all(os.path.isfile(it.path) for it in items)
    assert {it.path for it in items} == {it.path for it in list_media(str(folder))}
    (tmp_path / "video.txt").write_bytes(b"\x00\x00\x00 ftypisom" + bytes(range(256)))
    with pytest.raises(DataError, match="is not text"):
        parse_index(str(tmp_path / "video.txt"))


def test_printing_such_a_name_on_a_strict_utf8_terminal_writes_its_bytes(folder, monkeypatch):
    raw = io.BytesIO()
    strict = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", line_buffering=True)
    monkeypatch.setattr("sys.stdout", strict)
    assert cli_main(["data", "check", str(folder), "--workers", "0"]) == 0
    strict.flush()
    assert b"2 videos" in raw.getvalue()
    index = folder.parent / "idx.txt"
    index.write_bytes(os.fsencode(folder) + b"/" + LATIN1 + b" 1\n" + b"missing-\xff.mp4 0\n")
    assert cli_main(["data", "check", str(index), "--workers", "0"]) == 0
    strict.flush()
    assert b"missing-\xff.mp4" in raw.getvalue()  # the name as its bytes, where the report lists it


# ---------------------------------------------------------------------------------------------------- images


def _gradient(h=24, w=40):
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 6) % 256, (y * 9) % 256, (x + y) % 256], -1).astype(np.uint8)


def test_16_bit_grayscale_is_read_at_its_range(tmp_path):
    g8 = _gradient()[..., 0]
    Image.fromarray(g8.astype(np.uint16) * 257).save(tmp_path / "g16.png")  # mode I;16, values 0..65535
    Image.fromarray(g8).save(tmp_path / "g8.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I")
    got, want = load_image(tmp_path / "g16.png"), load_image(tmp_path / "g8.png")
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(got, torch.from_numpy(np.repeat(g8[..., None], 3, -1)), atol=0, rtol=0)


def _write_png(path, frame, pix_fmt, src):
    """One PNG through FFmpeg's encoder (16-bit RGB, which Pillow cannot write)."""
    with av.open(str(path), "w", format="image2") as c:
        s = c.add_stream("png")
        s.width, s.height, s.pix_fmt = frame.shape[1], frame.shape[0], pix_fmt
        for p in [*s.encode(av.VideoFrame.from_ndarray(frame, format=src)), *s.encode()]:
            c.mux(p)


def test_16_bit_rgb_palette_and_grayscale_read_as_their_8_bit_twins(tmp_path):
    rgb = _gradient()
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    _write_png(tmp_path / "rgb16.png", rgb.astype(np.uint16) * 257, "rgb48be", "rgb48le")
    Image.fromarray(rgb).quantize(64).save(tmp_path / "p.png")  # a palette
    Image.fromarray(rgb[..., 1]).save(tmp_path / "l.png")
    want = load_image(tmp_path / "rgb.png")
    assert torch.equal(load_image(tmp_path / "rgb16.png"), want)
    palette = Image.open(tmp_path / "p.png")
    assert palette.mode == "P" and torch.equal(
        load_image(tmp_path / "p.png"), torch.from_numpy(np.array(palette.convert("RGB")))
    )
    assert torch.equal(load_image(tmp_path / "l.png"), want[..., 1:2].expand(-1, -1, 3))


def test_transparent_pixels_show_white_whatever_colour_they_hold(tmp_path):
    rgb = _gradient()
    alpha = np.full(rgb.shape[:2], 255, np.uint8)
    alpha[:8] = 0  # transparent top rows
    alpha[8:12] = 128  # half transparent
    for hidden in (0, 200):
        hid = rgb.copy()
        hid[:8] = hidden
        Image.fromarray(np.dstack([hid, alpha])).save(tmp_path / f"rgba{hidden}.png")
        Image.fromarray(np.dstack([hid[..., 0], alpha]), "LA").save(tmp_path / f"la{hidden}.png")
    a, b = load_image(tmp_path / "rgba0.png"), load_image(tmp_path / "rgba200.png")
    assert torch.equal(a, b) and bool((a[:8] == 255).all())
    assert torch.equal(a[12:], torch.from_numpy(rgb[12:]))  # opaque pixels as they are
    half = (rgb[8:12].astype(np.int64) * 128 + 255 * 127 + 127) // 255
    assert torch.equal(a[8:12], torch.from_numpy(half.astype(np.uint8)))
    assert torch.equal(load_image(tmp_path / "la0.png"), load_image(tmp_path / "la200.png"))
    p = Image.fromarray(rgb).quantize(16)
    p.info["transparency"] = 0  # palette entry 0 transparent
    p.save(tmp_path / "pt.png", transparency=0)
    got = load_image(tmp_path / "pt.png").numpy()
    index = np.asarray(Image.open(tmp_path / "pt.png"))
    assert (got[index == 0] == 255).all() and (index == 0).any()


# ---------------------------------------------------------------------------------------------------- videos

T, H, W = 4, 32, 48


def _flat(k):
    """Frame k: one flat colour (chroma subsampling keeps it), distinct per frame."""
    return (30 + 50 * k, 200 - 40 * k, 90 + 20 * k)


def _frames8():
    f = np.zeros((T, H, W, 3), np.uint8)
    for k in range(T):
        f[k] = _flat(k)
    return f


def _write(path, codec, pix_fmt, src, frames, fmt=None, options=None):
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=10)
        s.width, s.height, s.pix_fmt = W, H, pix_fmt
        if options:
            s.options = options
        for frame in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format=src)):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


FORMATS = [  # name, codec, stored pixel format, what the frames are given as, container
    ("rgb48.mov", "png", "rgb48be", "rgb48le", None),
    ("gbrp16.mkv", "ffv1", "rgb48le", "rgb48le", None),
    ("gray16.mkv", "ffv1", "gray16le", "gray16le", None),
    ("gray.mov", "png", "gray", "gray", None),
    ("yuv10.mkv", "ffv1", "yuv420p10le", "rgb24", None),
    ("fullrange.mp4", "libx264", "yuvj420p", "rgb24", {"crf": "0"}),
    ("limited.mp4", "libx264", "yuv420p", "rgb24", {"crf": "0"}),
    ("rgba.mov", "png", "rgba", "rgba", None),
]


@pytest.mark.parametrize(("name", "codec", "pix_fmt", "src", "options"), FORMATS, ids=[f[0] for f in FORMATS])
def test_every_pixel_format_is_read_at_its_true_range(tmp_path, name, codec, pix_fmt, src, options):
    f8 = _frames8()
    if src.startswith("gray"):
        f8 = np.repeat(f8[..., :1], 3, -1)
    given = {"rgb48le": lambda: f8.astype(np.uint16) * 257, "gray16le": lambda: f8[..., 0].astype(np.uint16) * 257}
    given["gray"] = lambda: f8[..., 0]
    given["rgba"] = lambda: np.concatenate([f8, np.full((T, H, W, 1), 255, np.uint8)], -1)
    frames = given.get(src, lambda: f8)()
    _write(tmp_path / name, codec, pix_fmt, src, frames, options=options)
    clip = decode_clip(str(tmp_path / name), num_frames=T, frame_stride=1, start_frame=0, short_side=None)
    err = (clip.to(torch.int64) - torch.from_numpy(f8).to(torch.int64)).abs()
    assert int(err.max()) <= 3, (name, int(err.max()))  # 16 -> 8 bits rounds; RGB -> YUV -> RGB by a few levels


def test_transparent_video_pixels_show_white_whatever_colour_they_hold(tmp_path):
    clips = []
    for hidden in (0, 77):
        f8 = _frames8()
        rgba = np.concatenate([f8, np.full((T, H, W, 1), 255, np.uint8)], -1)
        rgba[:, :8, :, 3] = 0
        rgba[:, :8, :, :3] = hidden
        _write(tmp_path / f"a{hidden}.mov", "png", "rgba", "rgba", rgba)
        clips.append(decode_clip(str(tmp_path / f"a{hidden}.mov"), num_frames=T, frame_stride=1, short_side=None))
    assert torch.equal(clips[0], clips[1]) and bool((clips[0][:, :8] == 255).all())
    assert torch.equal(clips[0][:, 8:], torch.from_numpy(_frames8()[:, 8:]))


# ---------------------------------------------------------------------------------------------------- labels


@pytest.fixture
def splits(tmp_path):
    for i in range(6):
        (tmp_path / f"v{i}.mp4").write_bytes(b"x")  # never decoded: labels are checked first
    return tmp_path


def _task(root, train, val):
    (root / "train.txt").write_text("".join(f"v{i}.mp4 {label}\n".replace(" None", "") for i, label in train))
    (root / "val.txt").write_text("".join(f"v{i}.mp4 {label}\n".replace(" None", "") for i, label in val))
    return [str(root / "train.txt"), str(root / "val.txt")]


@pytest.mark.parametrize(
    ("train", "val", "needle"),
    [
        ([(0, 0), (1, -1), (2, 1)], [(3, 0)], r"train\.txt: 1 row\(s\) have a negative label \(e\.g\. .*v1\.mp4 -1\)"),
        ([(0, 0), (1, 1)], [(3, 0), (4, -1)], r"val\.txt: 1 row\(s\) have a negative label"),
        ([(0, 0), (1, 1), (2, None)], [(3, 0)], r"train\.txt: 1 row\(s\) have no integer label, e\.g\. .*v2\.mp4"),
        ([(0, 0), (1, 1)], [(3, 0), (4, 2)], r"val\.txt: label\(s\) \[2\] never occur in TRAIN"),
    ],
)
def test_labels_are_checked_in_one_line_before_anything_is_read(splits, train, val, needle):
    with pytest.raises(DataError, match=needle) as err:
        read_task(_task(splits, train, val))
    assert "\n" not in str(err.value)


def test_probe_refuses_a_negative_label_before_encoding_anything(splits, tmp_path, capsys):
    from test_export import make_run_dir

    run = make_run_dir(tmp_path / "r", steps=(5,))
    paths = _task(splits, [(0, 0), (1, 1), (2, -1)], [(3, 0), (4, 1)])
    features = tmp_path / "features"
    argv = ["probe", str(run), "--task", f"index:{paths[0]},{paths[1]}", "--features", str(features), "--no-save"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "negative label" in err[0] and "train.txt" in err[0]
    assert not any(features.rglob("*.npy"))  # nothing encoded
