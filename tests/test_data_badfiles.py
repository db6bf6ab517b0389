"""Bad files never crash a run: each kind is skipped (or padded), shown once in one plain line (the first
``SHOWN``, then a pointer to bad_files.json), counted and named in the report; a source in which every file
is bad stops with a clear error instead of looping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from data_media import LOSSLESS, read_uniform, uniform_frames, write_uniform
from dist_utils import run_gloo
from levjepa.data import (
    BadFileReport,
    DataConfig,
    DataError,
    PretrainLoader,
    decode_all,
    decode_clip,
)
from levjepa.data.badfiles import SHOWN, bad_file_line
from levjepa.data.encode import write_video


def _audio_only(path: Path) -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        samples = (np.sin(np.arange(16000) / 5.0)[None, :] * 0.3).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _truncated_copy(src: Path, dst: Path, keep: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A folder of 3 good videos and one file of each bad kind; returns (index file, {path: kind})."""
    root = tmp_path_factory.mktemp("bad")
    good = [write_uniform(root / f"good{i}.mp4", 40) for i in range(3)]
    kinds = {}
    (root / "empty.mp4").write_bytes(b"")
    kinds["empty.mp4"] = "empty"
    (root / "notes.mp4").write_text("this is not a video\n" * 50)
    kinds["notes.mp4"] = "unreadable"
    _truncated_copy(good[0], root / "cut.mp4", 0.5)  # moov atom at the end: cut off
    kinds["cut.mp4"] = "truncated"
    _audio_only(root / "speech.mp4")
    kinds["speech.mp4"] = "no-video"
    write_uniform(root / "still.mp4", 1)
    kinds["still.mp4"] = "short"
    write_video(root / "sliver.mp4", uniform_frames(20, height=8, width=128), options=LOSSLESS)
    kinds["sliver.mp4"] = "resolution"
    kinds["gone.mp4"] = "missing"
    index = root / "index.txt"
    rows = [f"{p.name} 0" for p in good] + [f"{name} 1" for name in kinds]
    index.write_text("\n".join(rows) + "\n")
    return index, {str(root / name): kind for name, kind in kinds.items()}


def _one_epoch(index: Path, capsys: Any, **kw: Any) -> tuple[BadFileReport, list, list[str]]:
    """Two epochs of the loader over ``index``: the report, the batches and the lines it showed on stderr."""
    cfg = DataConfig(
        sources=(str(index),),
        num_frames=4,
        frame_stride=2,
        global_size=16,
        local_size=8,
        num_local=1,
        batch_size=2,
        num_workers=0,
        **kw,
    )
    report = BadFileReport()
    capsys.readouterr()
    loader = PretrainLoader(cfg, seed=0, bad_files=report)
    batches = [next(loader) for _ in range(2 * loader.batches_per_epoch)]  # two epochs: no line said twice
    return report, batches, capsys.readouterr().err.splitlines()


def test_every_bad_kind_is_skipped_reported_once_and_counted(bad_dir, tmp_path, capsys):
    index, expected = bad_dir
    report, batches, lines = _one_epoch(index, capsys, short_videos="skip")
    assert {p: r.split(":", 1)[0] for p, r in report.files.items()} == expected
    assert len(lines) == len(expected)  # one line per file: the path once, no kind prefix, no Python source line
    for line in lines:
        path = next(p for p in expected if p in line)
        assert line.startswith(("bad file skipped: ", "bad file: ")) and line.count(path) == 1, line
        assert f": {expected[path]}:" not in line and "Warning" not in line and "self.add" not in line, line
    assert report.counts == {
        "empty": 1,
        "missing": 1,
        "no-video": 1,
        "resolution": 1,
        "short": 1,
        "truncated": 1,
        "unreadable": 1,
    }
    for batch in batches:  # every clip of every batch comes from a good file (a 40-frame coded video)
        for b in range(batch.batch_size):
            frames = batch.views[0][0, b].permute(1, 2, 3, 0)  # [T, H, W, C]
            idx = read_uniform(frames)
            assert idx == [idx[0] + 2 * k for k in range(4)] and idx[-1] < 40
    out = report.write(tmp_path / "run" / "bad_files.json")
    data = json.loads(out.read_text())
    assert data["total"] == len(expected) and {f["path"] for f in data["files"]} == set(expected)


def test_short_videos_are_padded_and_still_reported_in_pad_mode(bad_dir, capsys):
    index, _ = bad_dir
    report, _, _ = _one_epoch(index, capsys, short_videos="pad")
    still = [p for p in report.files if p.endswith("still.mp4")]
    assert len(still) == 1 and "padded" in report.files[still[0]]


def test_a_source_where_every_file_is_bad_stops_with_a_clear_error(tmp_path):
    for name in ("a.mp4", "b.mp4"):
        (tmp_path / name).write_text("garbage")
    (tmp_path / "c.mp4").write_bytes(b"")
    cfg = DataConfig(sources=(str(tmp_path),), global_size=16, local_size=8, batch_size=1, num_workers=0)
    with pytest.raises(DataError, match="every one of its 3 file"):
        next(PretrainLoader(cfg, seed=0))
    with pytest.raises(DataError, match="every one of its 3 file"):  # same from a worker process
        next(PretrainLoader(DataConfig(**{**cfg.__dict__, "num_workers": 1}), seed=0))
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(DataError, match="holds no video or image"):
        PretrainLoader(DataConfig(sources=(str(empty),), batch_size=1, num_workers=0), seed=0)


def test_a_truncated_file_whose_header_survives_is_reported_as_truncated(tmp_path):
    path = tmp_path / "full.mp4"
    with av.open(str(path), "w", options={"movflags": "faststart"}) as container:  # index first, data after
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = dict(LOSSLESS)
        for frame in uniform_frames(120):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    cut = _truncated_copy(path, tmp_path / "cut.mp4", 0.3)
    assert read_uniform(decode_clip(cut, num_frames=4, frame_stride=2, start_frame=0)) == [0, 2, 4, 6]
    readable = decode_all(cut).frames.shape[0]  # frames before the cut
    assert 8 < readable < 100
    for start in (100, readable - 3):  # beyond the cut, and a window that crosses it
        with pytest.raises(DataError, match=r"^truncated:"):
            decode_clip(cut, num_frames=4, frame_stride=2, start_frame=start)


def test_report_deduplicates_merges_and_counts():
    report = BadFileReport(warn=False)
    assert report.extend([("a", "empty: a"), ("b", "missing: b"), ("a", "empty: a")]) == 2
    other = BadFileReport(warn=False)
    other.add("c", "weird thing")
    report.merge(other)
    assert report.total == 3 and report.counts == {"empty": 1, "missing": 1, "other": 1}
    assert report.gather().files == report.files  # one process: gathering is the identity


def test_the_bad_file_lines_stop_after_shown_with_one_pointer_to_the_report(capsys):
    report = BadFileReport()
    pairs = [(f"/data/v{i}.mp4", f"unreadable: /data/v{i}.mp4 is not a readable video (InvalidDataError: "
              f"Invalid data found when processing input: '/data/v{i}.mp4')") for i in range(SHOWN + 30)]  # fmt: skip
    assert report.extend(pairs) == SHOWN + 30 and report.total == SHOWN + 30  # all counted
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == SHOWN + 1 and "bad_files.json" in lines[-1] and str(SHOWN) in lines[-1]
    assert lines[0] == (
        "bad file skipped: /data/v0.mp4 is not a readable video (InvalidDataError: Invalid data found when "
        "processing input)"
    )
    report.extend(pairs[:3])  # known files: nothing new to say
    merged = BadFileReport()
    merged.merge(report)  # a resumed run's earlier files are not shown again, nor do they use up the lines
    merged.add("/data/new.mp4", "empty: /data/new.mp4 has 0 bytes")
    assert capsys.readouterr().err == "bad file skipped: /data/new.mp4 has 0 bytes\n"
    assert bad_file_line("/x.mp4", "weird thing") == "bad file skipped: /x.mp4: weird thing"
    assert (
        bad_file_line("/s.mp4", "short: /s.mp4 has 1 frame(s), ...; padded")
        == "bad file: /s.mp4 has 1 frame(s), ...; padded"
    )


def _gather_worker(rank: int, world: int) -> dict[str, str]:
    report = BadFileReport(warn=False)
    report.add(f"/data/rank{rank}.mp4", f"empty: /data/rank{rank}.mp4 has 0 bytes")
    report.add("/data/shared.mp4", "missing: /data/shared.mp4 does not exist")
    return report.gather().files


@pytest.mark.distributed
def test_gather_merges_the_reports_of_every_rank():
    merged = run_gloo(_gather_worker, 2)
    assert merged[0] == merged[1] and sorted(merged[0]) == ["/data/rank0.mp4", "/data/rank1.mp4", "/data/shared.mp4"]


# ---------------------------------------------------------------- unreadable permissions (root included)

# Run in a fresh interpreter that first drops every capability of its own (as root, CAP_DAC_OVERRIDE
# would let it read a mode-000 file; a normal user has none to drop). A fresh process, not a fork: forking
# this multi-threaded test process can deadlock the child.
_PERMISSION_SCRIPT = r"""
import ctypes, json, os, sys
sys.path[:0] = json.loads(sys.argv[3])
if os.geteuid() == 0:
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Data(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
from levjepa.data import BadFileReport, DataConfig, DataError, PretrainLoader, decode_clip
folder, locked = sys.argv[1], sys.argv[2]
try:
    decode_clip(locked, num_frames=2)
    direct = "read"
except DataError as exc:
    direct = str(exc)
cfg = DataConfig(sources=(folder,), num_frames=2, global_size=16, local_size=8, batch_size=1, num_workers=0)
report = BadFileReport(warn=False)
loader = PretrainLoader(cfg, seed=0, bad_files=report)
batches = [next(loader) for _ in range(2)]
print(json.dumps({"direct": direct, "files": report.files}))
"""


def test_an_unreadable_file_is_skipped_and_reported(tmp_path):
    write_uniform(tmp_path / "a_ok.mp4", 10)
    locked = write_uniform(tmp_path / "b_locked.mp4", 10)
    os.chmod(locked, 0)
    try:
        args = [sys.executable, "-c", _PERMISSION_SCRIPT, str(tmp_path), str(locked), json.dumps(sys.path)]
        run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(locked, 0o644)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["direct"].startswith("permission:")
    assert list(result["files"]) == [str(locked)] and result["files"][str(locked)].startswith("permission:")


# -- the one bad-file rule: every reader skips the same files and reports them in the same line -------------


def _decode_raising_index_error(real: Any, bad: str) -> Any:
    """A decoder (outside levjepa, as PyAV or a user's is) that raises IndexError on the file named ``bad``."""

    def decode(source: Any, *args: Any, **kwargs: Any) -> Any:
        if str(source).endswith(bad):
            raise IndexError("list index out of range")
        return real(source, *args, **kwargs)

    return decode


def _index_error_on_key_1(key: int) -> int:
    if key == 1:
        raise IndexError("list index out of range")
    return key


@pytest.fixture
def three_videos(tmp_path) -> tuple[Path, Path]:
    """An index of three good videos; the second is the one a decoder will fail on."""
    paths = [write_uniform(tmp_path / f"v{i}.mp4", 20) for i in range(3)]
    index = tmp_path / "index.txt"
    index.write_text("".join(f"{p.name} 0\n" for p in paths))
    return index, paths[1]


def test_a_decoders_index_error_is_the_same_bad_file_for_every_reader(three_videos, capsys, monkeypatch):
    from levjepa.data import check as data_check
    from levjepa.data import sources
    from levjepa.data.workers import safe_map

    index, broken = three_videos
    expected = "unreadable: IndexError: list index out of range"
    line = f"bad file skipped: {broken}: IndexError: list index out of range"
    # pretraining's loader
    monkeypatch.setattr(sources, "decode_windows", _decode_raising_index_error(sources.decode_windows, broken.name))
    report, batches, lines = _one_epoch(index, capsys)
    assert report.files == {str(broken): expected} and lines == [line] and batches
    # levjepa data check
    monkeypatch.setattr(data_check, "probe_video", _decode_raising_index_error(data_check.probe_video, broken.name))
    rows = data_check.check_source(str(index), workers=1).rows
    assert [r["reason"] for r in rows if not r["ok"]] == [expected] and sum(r["ok"] for r in rows) == 2
    assert f"  {bad_file_line(str(broken), expected)[len('bad file skipped: ') :]}" in data_check.format_report(
        data_check.CheckReport(str(index), rows)
    )
    # the worker map of probe, extract, classify and fine-tuning, in this process and in a worker
    for workers in (0, 1):
        got = list(safe_map(_index_error_on_key_1, [0, 1, 2], workers))
        assert got == [(0, 0, ""), (1, None, expected), (2, 2, "")]
    assert bad_file_line(str(broken), got[1][2]) == line


def test_a_bug_in_levjepa_or_an_interrupt_still_ends_every_reader(three_videos, capsys, monkeypatch):
    from levjepa.data import check as data_check
    from levjepa.data import sources
    from levjepa.data.badfiles import bad_file_kind, is_bad_file
    from levjepa.data.workers import safe_map

    with pytest.raises(AttributeError):  # raised inside levjepa's own code: a bug, not a bad file
        list(safe_map(bad_file_kind, [3], 0))
    index, _ = three_videos
    # levjepa's decode_media calls a decoder with arguments it does not take: a TypeError of levjepa's own call
    monkeypatch.setattr(sources, "decode_windows", bad_file_kind)
    with pytest.raises(TypeError):
        _one_epoch(index, capsys)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(data_check, "probe_video", interrupted)
    with pytest.raises(KeyboardInterrupt):
        data_check.check_source(str(index), workers=1)
    assert not is_bad_file(MemoryError()) and not is_bad_file(KeyboardInterrupt())
    assert is_bad_file(DataError("empty: x")) and is_bad_file(OSError("gone"))
    try:
        [][1]  # an IndexError raised here, in a test (outside levjepa): a decoder's
    except IndexError as err:
        assert is_bad_file(err)
