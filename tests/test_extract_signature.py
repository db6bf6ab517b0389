"""An extraction output never mixes two encoders or two settings: ``extract.json`` records the encoder's
fingerprint and the settings from the start; a job into the same folder continues only what matches and
refuses (or, with ``overwrite``, deletes) the rest. Only unreadable files is an error; progress lines off a
terminal."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from levjepa.cli import main
from levjepa.data import DataError
from levjepa.eval.extract import ExtractConfig, extract, read_index
from levjepa.formats.load import random_encoder
from levjepa.model import encoder_config
from levjepa.model.fingerprint import function_fingerprint
from test_export import make_run_dir
from test_extract import _video

BASE = dict(window=8, stride=4, frame_stride=2, size=16, workers=0)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    _video(root / "a.mp4", 40)
    _video(root / "b.mp4", 24)
    return root


def _encoder(seed=3):
    return random_encoder(encoder_config("vit-test"), seed=seed).encoder


def _run(enc, media, out, *, overwrite=False, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return extract(enc, str(media), out, ExtractConfig(**{**BASE, **kw}), progress=False, overwrite=overwrite)


def _files(out):
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_the_fingerprint_names_the_weights_and_the_config():
    a, b = _encoder(3), _encoder(3)
    assert function_fingerprint(a) == function_fingerprint(b)
    assert function_fingerprint(a) != function_fingerprint(_encoder(4))
    with torch.no_grad():
        b.blocks[0].attn.qkv.weight[0, 0] += 1e-6  # one weight, one ulp-scale change
    assert function_fingerprint(a) != function_fingerprint(b)


def test_per_video_with_other_settings_or_another_encoder_is_refused_then_rewritten_whole(media, tmp_path):
    out = tmp_path / "pv"
    enc = _encoder()
    _run(enc, media, out, format="per_video")
    record = json.loads((out / "extract.json").read_text())
    assert record["status"] == "complete" and record["signature"]["encoder"] == function_fingerprint(enc)
    before = _files(out)
    with pytest.raises(DataError, match=r"another setting \(window 8 -> 4, stride 4 -> 2\).*--overwrite"):
        _run(enc, media, out, format="per_video", window=4, stride=2)
    with pytest.raises(DataError, match="another encoder"):
        _run(_encoder(4), media, out, format="per_video")
    assert _files(out) == before  # refused: nothing touched
    _run(enc, media, out, format="per_video", window=4, stride=2, overwrite=True)
    fresh = tmp_path / "fresh"
    _run(enc, media, fresh, format="per_video", window=4, stride=2)
    assert sorted(_files(out)) == sorted(_files(fresh))
    for name in ("a.npy", "b.npy"):
        np.testing.assert_array_equal(np.load(out / name), np.load(fresh / name))  # no old row left


def test_a_folder_of_features_without_a_signature_is_refused(media, tmp_path):
    out = tmp_path / "old"
    _run(_encoder(), media, out, format="npy")
    (out / "extract.json").write_text(json.dumps({"rows": 9}))  # written by a levjepa before signatures
    with pytest.raises(DataError, match="without a recorded encoder"):
        _run(_encoder(), media, out, format="npy")


def test_shards_of_the_same_job_are_rewritten_whole_and_leave_no_old_shard(media, tmp_path):
    out = tmp_path / "rows"
    enc = _encoder()
    first = _run(enc, media, out, format="safetensors", shard_rows=2)
    assert len(first.shards) > 2
    (out / "features-00099.safetensors").write_bytes(b"stale")  # as if from a longer earlier job
    again = _run(enc, media, out, format="safetensors", shard_rows=2)
    assert again.shards == first.shards and not (out / "features-00099.safetensors").exists()
    assert [r["row"] for r in read_index(out)] == list(range(first.rows))


def test_only_unreadable_files_exit_2_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.mp4").write_text("not a video")
    (bad / "y.mp4").write_bytes(b"")
    run = make_run_dir(tmp_path, steps=(5,))
    code = main(["extract", str(run), str(bad), "--out", str(tmp_path / "o"), "--size", "16", "--workers", "0"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("levjepa")]
    assert code == 2 and len(err) == 1 and "none of the 2 file(s)" in err[0] and "bad_files.json" in err[0]


def test_progress_lines_off_a_terminal(media, tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        extract(_encoder(), str(media), tmp_path / "o", ExtractConfig(**BASE), progress=True)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("extract:")]
    assert lines and lines[-1].startswith("extract: 2/2 files  ") and "files/s" in lines[-1]


def test_an_index_with_class_names_writes_its_label_map_beside_the_features(media, tmp_path):
    index = tmp_path / "train.txt"
    index.write_text(f"{media / 'a.mp4'} walking\n{media / 'b.mp4'} jumping\n")
    out = tmp_path / "o"
    _run(_encoder(), index, out, format="npy")
    assert json.loads((out / "labels.json").read_text()) == {"jumping": 0, "walking": 1}
    labels = {Path(r["path"]).name: r["label"] for r in read_index(out)}
    assert labels == {"a.mp4": 1, "b.mp4": 0}


def test_shards_continue_only_over_the_same_list_of_files(media, tmp_path):
    # the shard formats continue at a position in the list of files: a source that lists other files is
    # refused (it was taken for the same job: a file added was counted and never extracted)
    import shutil

    src = tmp_path / "src"
    shutil.copytree(media, src)
    out = tmp_path / "rows"
    enc = _encoder()
    _run(enc, src, out, format="safetensors", shard_rows=2)
    shutil.copy(src / "a.mp4", src / "a2.mp4")
    with pytest.raises(DataError, match=r"another list of files .*--overwrite"):
        _run(enc, src, out, format="safetensors", shard_rows=2)
    again = _run(enc, src, out, format="safetensors", shard_rows=2, overwrite=True)
    assert sorted({Path(r["path"]).name for r in read_index(out)}) == ["a.mp4", "a2.mp4", "b.mp4"]
    assert again.files == 3
