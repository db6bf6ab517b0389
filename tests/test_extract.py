"""Feature extraction: windows cover every frame at the stated stride, the index maps each row back to the
exact clip it encodes, shards/npy/stream modes agree, bad files are reported and never fatal."""

from __future__ import annotations

import argparse
import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from levjepa.commands import extract as cli_extract
from levjepa.data import decode_clip, normalize, write_video
from levjepa.data.eval_clip import ViewSpec, center_square
from levjepa.features.extract import ExtractConfig, extract, window_starts
from levjepa.features.feature_set import read_rows
from levjepa.formats.reading.load import random_encoder
from levjepa.formats.writing.export import export_encoder
from levjepa.model import encoder_config
from levjepa.weights import load_tensors
from test_export import make_run_dir


@pytest.mark.parametrize("window,stride", [(16, 8), (16, 16), (8, 3), (5, 1), (4, 4)])
def test_windows_cover_the_video_with_the_stated_stride(window, stride):
    for n in [1, 3, window - 1, window, window + 1, 2 * window + 5, 57, 100]:
        if n < 1:
            continue
        starts = window_starts(n, window, stride)
        covered = set()
        for s in starts:
            covered.update(range(s, min(s + window, n)))
            assert s >= 0 and (s + window <= n or n <= window)
        assert covered == set(range(n)), (n, starts)
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert all(g == stride for g in gaps[:-1]) and all(0 < g <= stride for g in gaps[-1:])
        assert starts == sorted(set(starts))
    with pytest.raises(ValueError, match="stride"):
        window_starts(10, 4, 5)
    with pytest.raises(ValueError, match="stride"):
        ExtractConfig(ViewSpec(frames=4), stride=5)


def _video(path, n, h=24, w=40, fps=10):
    """Frame i is a smooth gradient whose colours depend on i, so windows differ."""
    y, x = np.mgrid[0:h, 0:w]
    frames = np.stack(
        [np.stack([(x * 6 + 9 * i) % 256, (y * 9 + 5 * i) % 256, (x + y + 13 * i) % 256], -1) for i in range(n)]
    ).astype(np.uint8)
    write_video(path, frames, fps=fps)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    _video(root / "a.mp4", 40)  # 20 kept frames at stride 2
    _video(root / "b.mp4", 9)  # 5 kept frames: shorter than a window, padded
    Image.fromarray(np.full((20, 30, 3), 120, np.uint8)).save(root / "c.png")
    (root / "empty.mp4").write_bytes(b"")
    (root / "text.mp4").write_text("not a video")
    return root


def windows(window, stride, frame_stride=2, size=16, **kw):
    """The extraction settings of these tests: ``window`` frames every ``frame_stride``-th, at ``size`` px."""
    return ExtractConfig(ViewSpec(size=size, frames=window, frame_stride=frame_stride), stride=stride, **kw)


def _encoder():
    return random_encoder(encoder_config("vit-test"), seed=3).encoder


def test_index_maps_rows_back_to_their_clips(media, tmp_path):
    enc = _encoder()
    cfg = windows(8, 4, patches=True, batch_size=3, shard_rows=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = extract(enc, str(media), tmp_path / "out", cfg, progress=False)
    rows = read_rows(tmp_path / "out")
    by_file = {}
    for r in rows:
        by_file.setdefault(r["file"].rsplit("/", 1)[-1], []).append(r)
    # a: 20 kept frames, window 8 stride 4 -> starts 0, 4, 8, 12; b: one padded window; c: one image row
    assert [r["start_frame"] for r in by_file["a.mp4"]] == [0, 8, 16, 24]
    assert [r["end_frame"] for r in by_file["a.mp4"]] == [14, 22, 30, 38]
    assert by_file["a.mp4"][1]["start_time"] == pytest.approx(0.8) and by_file["a.mp4"][1]["end_time"] == pytest.approx(
        2.2
    )
    assert len(by_file["b.mp4"]) == 1 and by_file["b.mp4"][0]["padded"] and by_file["b.mp4"][0]["end_frame"] == 8
    assert len(by_file["c.png"]) == 1 and by_file["c.png"][0]["kind"] == "image"
    assert res.rows == len(rows) == 6 and res.files == 3 and res.bad_files == 2
    bad = json.loads((tmp_path / "out" / "bad_files.json").read_text())
    assert {f["path"].rsplit("/", 1)[-1] for f in bad["files"]} == {"empty.mp4", "text.mp4"}
    # rows are spread over shards of 3; (shard, offset) finds each row, and its features are exactly the
    # encoder's features of the clip decoded independently for that window
    shards = [load_tensors(tmp_path / "out" / s)[0] for s in res.shards]
    assert len(shards) == 2 and [r["row"] for r in rows] == list(range(6))
    for r in by_file["a.mp4"]:
        t = shards[r["shard"]]
        clip = decode_clip(r["file"], num_frames=8, frame_stride=2, start_frame=r["start_frame"], short_side=16)
        x = normalize(center_square(clip, 16, 8).permute(3, 0, 1, 2)[None])
        with torch.no_grad():
            out = enc.forward_features(x)
        torch.testing.assert_close(t["cls"][r["offset"]], out.cls[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(t["mean"][r["offset"]], out.patches[0].mean(0), rtol=1e-4, atol=1e-5)
        assert t["patches"][r["offset"]].dtype == torch.float16 and t["patches"].shape[1] == 8 * 2 * 2
        torch.testing.assert_close(t["patches"][r["offset"]].float(), out.patches[0], rtol=1e-2, atol=1e-2)
    # the image row is the image repeated along time
    img = center_square(torch.full((1, 20, 30, 3), 120, dtype=torch.uint8), 16, 8).expand(8, -1, -1, -1)
    with torch.no_grad():
        want = enc.forward_features(normalize(img.permute(3, 0, 1, 2)[None])).cls[0]
    c = by_file["c.png"][0]
    torch.testing.assert_close(shards[c["shard"]]["cls"][c["offset"]], want, rtol=1e-4, atol=1e-5)


def test_stream_mode_and_npy_format_via_the_cli(media, tmp_path, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    export_encoder(run, tmp_path / "export")
    parser = argparse.ArgumentParser()
    cli_extract.add_arguments(parser)
    common = ["--window", "8", "--stride", "4", "--frame-stride", "2", "--size", "16", "--no-progress"]
    for name, extra in (("win", ["--format", "npy"]), ("stream", ["--stream", "--format", "npy"])):
        args = parser.parse_args(
            [str(tmp_path / "export"), str(media / "a.mp4"), "--out", str(tmp_path / name), *common, *extra]
        )
        assert cli_extract.main(args) == 0
        assert "encoder: ema weights step 5" in capsys.readouterr().out  # which copy it read
    win, stream = read_rows(tmp_path / "win"), read_rows(tmp_path / "stream")
    assert [(r["start_frame"], r["end_frame"]) for r in win] == [(r["start_frame"], r["end_frame"]) for r in stream]
    cls_w, cls_s = np.load(tmp_path / "win" / "cls-00000.npy"), np.load(tmp_path / "stream" / "cls-00000.npy")
    mean_w, mean_s = np.load(tmp_path / "win" / "mean-00000.npy"), np.load(tmp_path / "stream" / "mean-00000.npy")
    # the first window is the same computation in both modes; later stream rows also saw earlier frames
    np.testing.assert_allclose(cls_s[0], cls_w[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean_s[0], mean_w[0], rtol=1e-4, atol=1e-5)
    assert cls_w.shape == cls_s.shape == (4, 32)


def test_per_video_npy_files_match_the_shards_and_resume(media, tmp_path):
    """One <video>.npy [windows, D] per file (the TAD layout), equal to the sharded rows; fp16 patches; a
    second run after losing one video's files recomputes only that video, to the same bytes."""
    enc = _encoder()
    base = dict(patches=True, batch_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        extract(enc, str(media), tmp_path / "rows", windows(8, 4, **base, format="npy"), progress=False)
        cfg = windows(8, 4, **base, format="per_video", workers=1)
        res = extract(enc, str(media), tmp_path / "pv", cfg, progress=False)
    out = tmp_path / "pv"
    rows = read_rows(tmp_path / "rows")
    mean = np.load(tmp_path / "rows" / "mean-00000.npy")
    a = np.load(out / "a.npy")
    want = [r["row"] for r in rows if r["file"].endswith("a.mp4")]
    assert a.shape == (4, 32) and a.dtype == np.float32
    np.testing.assert_allclose(a, mean[want], rtol=1e-5, atol=1e-6)
    patches = np.load(out / "a.patches.npy")
    assert patches.dtype == np.float16 and patches.shape == (4, 8 * 2 * 2, 32)
    index = read_rows(out)
    assert [(r["shard"], r["offset"], r["start_frame"]) for r in index if r["shard"] == "a"] == [
        ("a", 0, 0),
        ("a", 1, 8),
        ("a", 2, 16),
        ("a", 3, 24),
    ]
    assert res.rows == len(index) == 6 and res.bad_files == 2
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    killed_while_writing(out, "b.jsonl", "b.npy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = extract(enc, str(media), out, cfg, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert again.rows == 6 and again.bad_files == 2


def killed_while_writing(out, *lost):
    """Make ``out`` what a job killed while writing a unit leaves: the files ``lost`` not (yet) written, the
    manifest not complete, no merged index or report."""
    meta = json.loads((out / "store.json").read_text())
    for key in ("complete", "rows", "shard_rows", "bad_files"):
        del meta[key]
    (out / "store.json").write_text(json.dumps(meta, indent=2) + "\n")
    for name in ("index.jsonl", "bad_files.json", *lost):
        (out / name).unlink()


def test_per_video_names_stay_unique():
    from levjepa.data.sources import MediaItem
    from levjepa.features.extract import video_names

    items = [
        MediaItem("/d/x/clip.mp4", None, "video"),
        MediaItem("/d/y/clip.mp4", None, "video"),
        MediaItem("/d/y/other.mp4", None, "video"),
    ]
    assert video_names(items) == ["x__clip", "y__clip", "other"]


def test_per_video_via_the_cli(media, tmp_path, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    parser = argparse.ArgumentParser()
    cli_extract.add_arguments(parser)
    args = parser.parse_args(
        [str(run), str(media / "a.mp4"), "--out", str(tmp_path / "pv"), "--format", "per_video",
         "--per-video-feature", "cls", "--window", "8", "--stride", "4", "--frame-stride", "2", "--size", "16",
         "--workers", "0",
         "--device", "auto", "--no-progress"]
    )  # fmt: skip
    assert cli_extract.main(args) == 0
    assert "4 rows from 1 file(s)" in capsys.readouterr().out
    index = read_rows(tmp_path / "pv")
    assert np.load(tmp_path / "pv" / "a.npy").shape == (4, 32) and [r["shard"] for r in index] == ["a"] * 4


def _per_video_rank(rank, world, media, out):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        extract(_encoder(), media, out, windows(8, 4, patches=True, format="per_video", workers=0), progress=False)
    return sorted(p.name for p in Path(out).iterdir())


@pytest.mark.distributed
def test_per_video_over_two_gloo_ranks_writes_the_files_of_one_process(media, tmp_path, one_thread):
    from dist_utils import run_gloo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        extract(_encoder(), str(media), tmp_path / "one", windows(8, 4, patches=True, format="per_video", workers=0))
    names = run_gloo(_per_video_rank, 2, str(media), str(tmp_path / "two"))
    one = {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()}
    assert names[0] == names[1] == sorted(one)
    assert {p.name: p.read_bytes() for p in (tmp_path / "two").iterdir()} == one
    assert [r["item"] for r in read_rows(tmp_path / "two")] == [
        0,
        0,
        0,
        0,
        1,
        2,
    ]  # a, b, c: the two bad files have no row
