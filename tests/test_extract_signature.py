"""An extraction output never mixes two encoders or two settings: its manifest (``store.json``, the one
feature-set format) records the encoder's fingerprint and the settings from the start; a job into the same
folder continues only what matches and refuses (or, with ``overwrite``, deletes) the rest, an older
extraction's folder included. Only unreadable files is an error; progress lines off a terminal."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from levjepa.cli import main
from levjepa.data import DataError
from levjepa.features.extract import extract
from levjepa.features.feature_set import FeatureSet, read_rows
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config
from levjepa.model.fingerprint import function_fingerprint
from test_export import make_run_dir
from test_extract import _video, killed_while_writing, windows

BASE = dict(window=8, stride=4, workers=0)


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
        return extract(enc, str(media), out, windows(**{**BASE, **kw}), progress=False, overwrite=overwrite)


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
    record = json.loads((out / "store.json").read_text())
    assert record["complete"] and record["encoder"] == function_fingerprint(enc) and record["cutter"] == "extract"
    before = _files(out)
    with pytest.raises(DataError, match=r"another setting \(frames 8 -> 4, stride 4 -> 2\).*--overwrite"):
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


def _old_extraction(out, media):
    """A folder as ``levjepa extract --format npy`` wrote it before the one feature-set format (levjepa at
    9055897): ``extract.json`` with its signature, ``index.jsonl`` rows keyed ``path``, one shard of arrays."""
    out.mkdir()
    np.save(out / "cls-00000.npy", np.zeros((2, 32), np.float32))
    np.save(out / "mean-00000.npy", np.zeros((2, 32), np.float32))
    rows = [{"row": r, "shard": 0, "offset": r, "path": str(media / "a.mp4"), "kind": "video", "label": None,
             "window": r, "start_frame": 8 * r, "end_frame": 8 * r + 14, "start_time": 0.8 * r,
             "end_time": 0.8 * r + 1.4, "num_frames": 8, "padded": False} for r in range(2)]  # fmt: skip
    (out / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "bad_files.json").write_text(json.dumps({"total": 0, "counts": {}, "files": []}))
    signature = {"encoder": "0" * 16, "window": 8, "stride": 4, "format": "npy", "files": "1" * 40}
    (out / "extract.json").write_text(json.dumps({"signature": signature, "status": "complete", "rows": 2}))


def test_an_older_extraction_is_refused_in_one_line_never_misread(media, tmp_path):
    out = tmp_path / "old"
    _old_extraction(out, media)
    before = _files(out)
    for read in (FeatureSet, read_rows):
        with pytest.raises(DataError) as err:
            read(out)
        line = str(err.value)
        assert "\n" not in line and str(out) in line and "extract.json" in line and "delete it" in line
    with pytest.raises(DataError, match=r"older levjepa extract \(extract.json\).*--overwrite") as err:
        _run(_encoder(), media, out, format="npy")
    assert str(out) in str(err.value) and "\n" not in str(err.value)
    assert _files(out) == before  # refused: nothing touched
    _run(_encoder(), media, out, format="npy", overwrite=True)  # recomputed in this format, nothing old left
    fresh = _run(_encoder(), media, tmp_path / "fresh", format="npy")
    assert _files(out) == _files(tmp_path / "fresh") and fresh.rows == len(read_rows(out))


def test_a_job_killed_mid_shard_ends_as_an_uninterrupted_one_and_leaves_no_old_shard(media, tmp_path):
    out = tmp_path / "rows"
    enc = _encoder()
    first = _run(enc, media, out, format="safetensors", shard_rows=2)
    whole = _files(out)
    assert len(first.shards) == 3  # 4 + 2 rows in shards of 2: killed after the first, writing the second
    killed_while_writing(out, "index-00001.jsonl", "index-00002.jsonl", "features-00002.safetensors")
    (out / ".features-00001.safetensors.x1y2.tmp").write_bytes(b"half a shard")
    (out / "features-00099.safetensors").write_bytes(b"stale")  # no index: never part of this job
    again = _run(enc, media, out, format="safetensors", shard_rows=2)
    assert again.shards == first.shards and _files(out) == whole
    assert [r["row"] for r in read_rows(out)] == list(range(first.rows))


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
        extract(_encoder(), str(media), tmp_path / "o", windows(**BASE), progress=True)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("extract:")]
    assert lines and lines[-1].startswith("extract: 2/2 files  ") and "files/s" in lines[-1]


def test_an_index_with_class_names_writes_its_label_map_beside_the_features(media, tmp_path):
    index = tmp_path / "train.txt"
    index.write_text(f"{media / 'a.mp4'} walking\n{media / 'b.mp4'} jumping\n")
    out = tmp_path / "o"
    _run(_encoder(), index, out, format="npy")
    assert json.loads((out / "labels.json").read_text()) == {"jumping": 0, "walking": 1}
    labels = {Path(r["file"]).name: r["label"] for r in read_rows(out)}
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
    assert sorted({Path(r["file"]).name for r in read_rows(out)}) == ["a.mp4", "a2.mp4", "b.mp4"]
    assert again.files == 3


KILL_SCRIPT = """
import sys, time, warnings, torch
torch.set_num_threads(1)
import levjepa.features.feature_set as fs
from levjepa.data.eval_clip import ViewSpec
from levjepa.features.extract import ExtractConfig, extract
if len(sys.argv) > 3:  # hold still once shard 1 is written, until the test kills the job: the cut is exact
    write = fs.atomic_write_text
    def write_then_hold(path, *args, **kwargs):
        write(path, *args, **kwargs)
        if path.name == "index-00001.jsonl":
            time.sleep(600)
    fs.atomic_write_text = write_then_hold
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config
enc = random_encoder(encoder_config("vit-test"), seed=3).encoder
cfg = ExtractConfig(ViewSpec(size=16, frames=8, frame_stride=2), stride=4, patches=True, shard_rows=2, workers=1)
warnings.simplefilter("ignore")
extract(enc, sys.argv[1], sys.argv[2], cfg, progress=False)
"""


def test_kill_9_then_the_same_command_gives_the_same_files(media, tmp_path):
    """Decoding in a worker process; the whole process group is killed once the second shard is written."""
    import os
    import signal
    import subprocess
    import sys
    import time

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def run(out, *hold):
        args = [sys.executable, "-c", KILL_SCRIPT, str(media), str(out), *hold]
        return subprocess.Popen(args, env=env, start_new_session=True)

    assert run(tmp_path / "full").wait(timeout=300) == 0
    proc = run(tmp_path / "cut", "hold")
    deadline = time.monotonic() + 300
    while not (tmp_path / "cut" / "index-00001.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "cut" / "index.jsonl").exists() and not json.loads(
        (tmp_path / "cut" / "store.json").read_text()
    ).get("complete")  # it really stopped half-way
    with pytest.raises(DataError, match="incomplete; run the same command again"):
        FeatureSet(tmp_path / "cut")
    assert run(tmp_path / "cut").wait(timeout=300) == 0
    assert _files(tmp_path / "cut") == _files(tmp_path / "full")
