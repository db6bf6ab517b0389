"""``levjepa data check`` reports what a source holds and every unreadable file; ``levjepa data prepare``
re-encodes to the asked short side with frequent key frames, in parallel, and resumes by skipping what
is done."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest
from PIL import Image

from data_media import read_uniform, uniform_frames, write_uniform
from levjepa.cli import main as cli
from levjepa.data import decode_all, probe_video
from levjepa.data.encode import write_video


@pytest.fixture()
def src(tmp_path):
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    write_uniform(root / "a" / "small.mp4", 30, fps=15)
    write_video(root / "big.mkv", uniform_frames(40, height=96, width=128), fps=30, options={"crf": "0"})
    Image.fromarray(np.full((80, 120, 3), 90, np.uint8)).save(root / "a" / "photo.png")
    (root / "broken.mp4").write_text("not a video")
    return root


def test_check_reports_counts_resolutions_fps_and_unreadable_files(src, tmp_path, capsys):
    report = tmp_path / "check.json"
    assert cli(["data", "check", str(src), "--workers", "1", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "files: 4 (3 videos, 1 images); readable: 3, unreadable: 1" in out
    assert f"unreadable files (1):\n  {src / 'broken.mp4'} is not a readable video" in out  # in words, no kind prefix
    assert "64x48 (1)" in out and "128x96 (1)" in out
    assert "fps: " in out and "15 (1)" in out and "30 (1)" in out
    summary = json.loads(report.read_text())["summary"]
    assert summary["readable"] == 3 and summary["frames_total"] == 70
    assert abs(summary["total_duration_s"] - (2.0 + 40 / 30)) < 0.05
    assert [b["path"] for b in summary["bad_files"]] == [str(src / "broken.mp4")]


def test_check_exits_non_zero_when_nothing_is_readable(tmp_path, capsys):
    (tmp_path / "x.mp4").write_bytes(b"")
    assert cli(["data", "check", str(tmp_path), "--workers", "1"]) == 1
    assert f"  {tmp_path / 'x.mp4'} has 0 bytes" in capsys.readouterr().out
    assert cli(["data", "check", str(tmp_path / "nope")]) == 2  # a mistake, not a result


def _key_frame_gaps(path) -> list[int]:
    with av.open(str(path)) as container:
        keys = [i for i, f in enumerate(container.decode(video=0)) if f.key_frame]
    return np.diff(keys).tolist()


def test_prepare_resizes_sets_key_frames_runs_in_parallel_and_resumes(src, tmp_path, capsys):
    dst = tmp_path / "dst"
    args = ["data", "prepare", str(src), str(dst), "--short-side", "32", "--keyint", "4", "--workers", "2"]
    assert cli(args) == 1  # broken.mp4 failed, and is named
    out = capsys.readouterr().out
    assert "prepared 3 file(s), skipped 0 already done, failed 1" in out and "broken.mp4" in out
    small, big, photo = dst / "a" / "small.mp4", dst / "big.mp4", dst / "a" / "photo.png"
    assert probe_video(small).width == 42 and probe_video(small).height == 32  # 64x48 -> even 42x32
    assert (probe_video(big).width, probe_video(big).height) == (42, 32)
    assert probe_video(small).fps == 15.0 and probe_video(big).num_frames == 40
    assert read_uniform(decode_all(big).frames) == list(range(40))  # same frames, in order
    assert max(_key_frame_gaps(big)) <= 4
    assert Image.open(photo).size == (48, 32)
    report = json.loads((dst / "prepare_report.json").read_text())
    assert report["done"] == 3 and report["failed"][0]["path"] == str(src / "broken.mp4")

    # resume: a finished output is skipped, a missing one is redone, a stale partial file is cleaned up
    big.unlink()
    stale = dst / "a" / ".small.mp4.partial-99999.mp4"
    stale.write_bytes(b"half")
    assert cli(args) == 1
    out = capsys.readouterr().out
    assert "prepared 1 file(s), skipped 2 already done, failed 1" in out
    assert big.exists() and not stale.exists()


def test_prepare_can_resample_the_frame_rate(src, tmp_path):
    dst = tmp_path / "dst15"
    assert cli(["data", "prepare", str(src), str(dst), "--fps", "15", "--workers", "1"]) == 1
    out = dst / "big.mp4"
    assert probe_video(out).fps == 15.0 and probe_video(out).num_frames == 20
    assert read_uniform(decode_all(out).frames) == list(range(0, 40, 2))  # every 2nd frame of the 30 fps source


def test_check_prepare_and_pack_report_progress_off_a_terminal(src, tmp_path, capsys, monkeypatch):
    import levjepa.data.progress as progress

    assert cli(["data", "prepare", str(src), str(tmp_path / "dst"), "--short-side", "32", "--workers", "2"]) == 1
    lines = capsys.readouterr().err.splitlines()  # capsys is no terminal: lines, not a bar
    assert len(lines) == 1 and lines[0].startswith("prepare: 4/4 files  1 failed  ") and "eta" in lines[0]
    monkeypatch.setattr(progress, "EVERY", 0.0)  # a line after every file, as a long job gets every 30 s
    assert cli(["data", "prepare", str(src), str(tmp_path / "dst"), "--short-side", "32", "--workers", "1"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[0] for line in lines] == [f"prepare: {i}/4 files" for i in (1, 2, 3, 4, 4)]
    assert cli(["data", "check", str(src), "--workers", "1"]) == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith("check: 4/4 files  1 failed")
    assert (
        cli(["data", "pack", str(tmp_path / "dst"), str(tmp_path / "packed"), "--shards", "2", "--workers", "1"]) == 0
    )
    assert capsys.readouterr().err.splitlines()[-1].startswith("pack: 2/2 shards")
