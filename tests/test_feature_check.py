"""A feature set checks itself (``levjepa.features.check``): every file a unit writes is recorded with its size
and CRC-32 and verified on the first read in a process; a changed byte, a truncation, a changed index or a
non-finite row is named in one line with the way to rebuild it, and the rebuild it names gives back the same
set; a unit with a non-finite row is never written; a set written before checksums is re-verified (sizes,
finite rows) instead of trusted."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import levjepa.features.check as feature_check
from levjepa.data import DataError
from levjepa.data.eval_clip import ViewSpec
from levjepa.data.sources import parse_index
from levjepa.features.extract import extract
from levjepa.features.feature_set import FeatureSet, Unit
from levjepa.features.store import StoreConfig, build_store
from levjepa.features.writer import file_checksum
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config
from test_extract import _video, windows
from test_feature_store import make_media

LAYOUTS = ("npy", "safetensors", "per_video")


def _encoder():
    return random_encoder(encoder_config("vit-test"), seed=3).encoder


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("v")
    _video(root / "a.mp4", 24)
    _video(root / "b.mp4", 16)
    return root


def _extract(src, out, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = windows(4, 4, patches=True, batch_size=2, workers=0, format=fmt, shard_rows=4)
        return extract(_encoder(), str(src), out, cfg, progress=False)


@pytest.fixture(autouse=True)
def fresh_process():
    """Each test reads as a new process would: nothing verified yet."""
    feature_check._verified.clear()
    feature_check._noted.clear()


def _everything(path):
    fs = FeatureSet(path)
    rows = np.arange(len(fs))
    out = {name: fs.read(name, rows) for name in ("mean", "patches", "cls") if fs.has(name)}
    fs.close()
    return out


def _one_line(err):
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("fmt", LAYOUTS)
def test_every_file_of_every_unit_is_recorded_with_its_size_and_crc(videos, tmp_path, fmt, one_thread):
    _extract(videos, tmp_path / "x", fmt)
    meta = json.loads((tmp_path / "x" / "store.json").read_text())
    files = {name for unit in meta["checksums"].values() for name in unit}
    arrays = {p.name for p in (tmp_path / "x").iterdir() if p.suffix in (".npy", ".safetensors")}
    assert files == arrays and len(meta["checksums"]) >= 2
    for unit in meta["checksums"].values():
        for name, recorded in unit.items():
            assert file_checksum(tmp_path / "x" / name) == recorded
    assert file_checksum(tmp_path / "x" / "index.jsonl") == meta["index"]
    assert _everything(tmp_path / "x")  # a set as written reads


@pytest.mark.parametrize("fmt", LAYOUTS)
def test_a_changed_byte_is_named_and_the_rebuild_it_names_gives_the_same_set(videos, tmp_path, fmt, one_thread):
    out = tmp_path / "x"
    _extract(videos, out, fmt)
    want = _everything(out)
    meta = json.loads((out / "store.json").read_text())
    unit, files = list(meta["checksums"].items())[-1]
    victim = out / sorted(files)[0]
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0x10  # one flipped bit in the last row
    victim.write_bytes(bytes(data))
    feature_check._verified.clear()
    with pytest.raises(DataError) as err:
        _everything(out)
    text = _one_line(err)
    assert str(victim) in text and "changed since it was written" in text and "delete " in text
    index = text.split("delete ", 1)[1].split(" and run", 1)[0]
    assert unit in index
    (out / index.rsplit("/", 1)[-1]).unlink()  # what the message says
    _extract(videos, out, fmt)
    feature_check._verified.clear()
    again = _everything(out)
    for name, values in want.items():
        np.testing.assert_array_equal(again[name], values)


def test_a_truncated_file_and_a_changed_index_are_named(videos, tmp_path, one_thread):
    out = tmp_path / "x"
    _extract(videos, out, "npy")
    victim = out / "patches-00000.npy"
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"patches-00000\.npy has \d+ bytes, \d+ when it was written") as err:
        _everything(out)
    assert "index-00000.jsonl" in _one_line(err)
    lines = (out / "index.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"label": null', '"label": 3')
    (out / "index.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"index\.jsonl changed since it was written"):
        FeatureSet(out)


def test_each_file_is_verified_once_per_process(videos, tmp_path, monkeypatch, one_thread):
    out = tmp_path / "x"
    _extract(videos, out, "npy")
    calls = []
    real = feature_check.file_checksum
    monkeypatch.setattr(feature_check, "file_checksum", lambda p: calls.append(p.name) or real(p))
    _everything(out)
    first = sorted(calls)
    assert first == sorted(p.name for p in out.glob("*.npy"))
    _everything(out)  # a reader opened again: nothing read twice for checking
    assert sorted(calls) == first


def test_a_unit_with_a_non_finite_row_is_never_written(tmp_path):
    unit = Unit("00000")
    rows = [{"file": f"clip{i}.mp4", "label": None, "item": i} for i in range(3)]
    cls = torch.zeros(3, 4)
    cls[1, 2] = float("nan")
    unit.add(rows, {"cls": cls, "mean": torch.zeros(3, 4)})
    with pytest.raises(DataError) as err:
        unit.write(tmp_path, "npy")
    text = _one_line(err)
    assert "'cls'" in text and "clip1.mp4" in text and "clip0.mp4" not in text and "1 of 3 rows" in text
    assert list(tmp_path.iterdir()) == []
    tokens = torch.full((3, 2, 4), 7e4).half()  # past float16's range: inf on disk
    unit = Unit("00000")
    unit.add(rows, {"cls": torch.zeros(3, 4), "tokens": tokens})
    with pytest.raises(DataError, match="non-finite 'tokens'"):
        unit.write(tmp_path, "npy")


def _as_written_before_checksums(out):
    meta = json.loads((out / "store.json").read_text())
    meta.pop("checksums"), meta.pop("index")
    (out / "store.json").write_text(json.dumps(meta))
    for p in out.glob("sums-*.json"):
        p.unlink()


def test_a_set_written_before_checksums_is_reverified_not_trusted(videos, tmp_path, capsys, one_thread):
    out = tmp_path / "x"
    _extract(videos, out, "npy")
    want = _everything(out)
    _as_written_before_checksums(out)
    again = _everything(out)
    for name, values in want.items():
        np.testing.assert_array_equal(again[name], values)
    assert "written before feature sets carried checksums" in capsys.readouterr().err
    victim = out / "mean-00000.npy"
    array = np.load(victim)
    array[2, 5] = np.nan
    np.save(victim, array)
    feature_check._verified.clear()
    with pytest.raises(DataError, match=r"mean-00000\.npy: rows 2 \(of its 4\) are not finite numbers") as err:
        _everything(out)
    assert f"delete {out}" in _one_line(err)
    array[2, 5] = 0.0
    np.save(victim, array)
    victim.write_bytes(victim.read_bytes()[:-10])  # cut short of what its header says
    feature_check._verified.clear()
    with pytest.raises(DataError, match=r"mean-00000\.npy has \d+ bytes, its header says \d+"):
        _everything(out)


def test_a_probe_store_records_and_checks_its_units_too(tmp_path, one_thread):
    items = parse_index(make_media(tmp_path / "m", videos=3, images=0))
    cfg = StoreConfig(ViewSpec(16, 4, 2), shard_items=2, workers=0)
    res = build_store(_encoder(), items, tmp_path / "s", cfg)
    meta = json.loads((tmp_path / "s" / "store.json").read_text())
    assert sorted(meta["checksums"]) == ["00000", "00001", "00002"] and res.rows == 3
    want = _everything(tmp_path / "s")
    victim = tmp_path / "s" / "cls-00001.npy"
    victim.write_bytes(victim.read_bytes()[:-7])
    feature_check._verified.clear()
    with pytest.raises(DataError, match=r"index-00001\.jsonl"):
        _everything(tmp_path / "s")
    (tmp_path / "s" / "index-00001.jsonl").unlink()
    assert build_store(_encoder(), items, tmp_path / "s", cfg).shards_done == 1  # that unit only
    feature_check._verified.clear()
    again = _everything(tmp_path / "s")
    for name, values in want.items():
        np.testing.assert_array_equal(again[name], values)
