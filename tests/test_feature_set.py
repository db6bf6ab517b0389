"""The one feature-set format (``levjepa.features.feature_set``): extraction's rows are the frozen forward's features of
their windows, the one reader reads every layout alike, and a store written before the format (``store.json``
version 1) is read and reused as it is, or refused in one line when it cannot be."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from levjepa.data import DataError
from levjepa.data.eval_clip import ViewSpec, load_eval_clip
from levjepa.data.sources import parse_index
from levjepa.features.extract import extract
from levjepa.features.feature_set import FeatureSet, read_rows
from levjepa.features.store import StoreConfig, build_store
from levjepa.formats.reading.load import random_encoder
from levjepa.infer.encode import encode
from levjepa.model import encoder_config
from test_extract import _video, windows
from test_feature_store import make_media


def _encoder():
    return random_encoder(encoder_config("vit-test"), seed=3).encoder


def _extract(enc, src, out, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return extract(enc, str(src), out, windows(8, 4, patches=True, batch_size=3, workers=0, **kw), progress=False)


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = tmp_path_factory.mktemp("v") / "a.mp4"
    _video(path, 40)
    return path


def test_extraction_rows_are_the_frozen_forward_of_their_windows_in_every_layout(video, tmp_path, one_thread):
    """Each row equals ``encode()`` (the store core's definition of a row) on its window decoded on its own,
    bit for bit, and the one reader returns the same values from safetensors, npy and per_video."""
    enc = _encoder()
    for fmt in ("safetensors", "npy", "per_video"):
        _extract(enc, video, tmp_path / fmt, format=fmt, shard_rows=3)
    rows = read_rows(tmp_path / "npy")
    assert [r["start_frame"] for r in rows] == [0, 8, 16, 24] and {r["item"] for r in rows} == {0}
    clips = [
        load_eval_clip(str(video), num_frames=8, size=16, patch=8, frame_stride=2, start=r["start_frame"]) for r in rows
    ]
    want = encode(enc, torch.stack(clips).permute(0, 4, 1, 2, 3), "cpu", tokens=True)
    idx = np.array([3, 0, 2, 1])  # any rows, in any order, across shards
    for fmt in ("safetensors", "npy", "per_video"):
        fs = FeatureSet(tmp_path / fmt)
        assert fs.cutter == "extract" and fs.layout == fmt and len(fs) == 4
        assert list(fs.column("start_frame")[idx]) == [rows[i]["start_frame"] for i in idx]
        names = ("mean", "patches") if fmt == "per_video" else ("cls", "mean", "patches")
        for name in names:
            got = torch.from_numpy(fs.read(name, idx))
            assert torch.equal(got, getattr(want, name)[idx]), (fmt, name)
        assert fs.has("patches") and fs.has("mean") and (fs.has("cls") == (fmt != "per_video"))
        fs.close()


def _as_version_1(out):
    """Rewrite a store's manifest as levjepa wrote it before the one format (9055897): version 1, no cutter or
    layout; its other files are the same (bench/eval.md, issue 52), but every shard had its ``bad-KKKKK.json``."""
    meta = json.loads((out / "store.json").read_text())
    del meta["cutter"], meta["layout"]
    meta["version"] = 1
    (out / "store.json").write_text(json.dumps(meta, indent=2) + "\n")
    for k in range(len(meta.get("shard_rows", [0, 0]))):
        if not (out / f"bad-{k:05d}.json").exists():
            (out / f"bad-{k:05d}.json").write_text("[]\n")
    return meta


def test_a_store_of_the_older_format_is_read_and_reused_as_it_is(tmp_path, one_thread):
    items = parse_index(make_media(tmp_path / "media", videos=2, images=2))
    cfg = StoreConfig(ViewSpec(16, 4, 2, segments=2, crops=1), batch_size=4, workers=0, shard_items=2)
    enc = _encoder()
    build_store(enc, items, tmp_path / "new", cfg)
    build_store(enc, items, tmp_path / "old", cfg)
    meta = _as_version_1(tmp_path / "old")
    before = {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()}
    again = build_store(enc, items, tmp_path / "old", cfg)  # the same settings: nothing recomputed or rewritten
    assert again.shards_done == 0 and again.rows == meta["rows"] == 8
    assert {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()} == before
    old, new = FeatureSet(tmp_path / "old"), FeatureSet(tmp_path / "new")
    assert old.cutter == "store" and old.layout == "npy" and old.meta["version"] == 1
    rows = np.arange(len(new))[::-1]
    for name in ("cls", "mean", "tokens"):
        assert np.array_equal(old.read(name, rows), new.read(name, rows))
    for col in ("label", "item", "segment", "crop"):
        assert np.array_equal(old.column(col), new.column(col))
    assert old.files == new.files


def test_an_unfinished_store_of_the_older_format_is_refused_in_one_line(tmp_path, one_thread):
    items = parse_index(make_media(tmp_path / "media", videos=2, images=1))
    cfg = StoreConfig(ViewSpec(16, 4, 2), workers=0, shard_items=2)
    build_store(_encoder(), items, tmp_path / "s", cfg)
    meta = _as_version_1(tmp_path / "s")
    for key in ("complete", "rows", "shard_rows", "bad_files"):
        del meta[key]
    (tmp_path / "s" / "store.json").write_text(json.dumps(meta))
    for attempt in (lambda: build_store(_encoder(), items, tmp_path / "s", cfg), lambda: FeatureSet(tmp_path / "s")):
        with pytest.raises(DataError) as err:
            attempt()
        line = str(err.value)
        assert "\n" not in line and str(tmp_path / "s") in line
    with pytest.raises(DataError, match=r"older levjepa \(store.json version 1\): delete it"):
        build_store(_encoder(), items, tmp_path / "s", cfg)
    (tmp_path / "s" / "store.json").write_text(json.dumps({**meta, "version": 7}))  # a format not known here
    with pytest.raises(DataError, match=r"store.json version 7.*compute them again"):
        FeatureSet(tmp_path / "s")
