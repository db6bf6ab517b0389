"""Decoding: the sampled frames are the right ones, in order, at the right stride or rate, from any start.

Videos are written here with PyAV, frame k painted in a flat colour that encodes k (``data_media.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data_media import read_uniform, uniform_frames, write_uniform
from levjepa.data import DataError, decode_all, decode_clip, probe_video
from levjepa.data.encode import write_video
from levjepa.data.video import DecodeOptions, clip_indices, decode_windows, resized_shape


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> Path:
    # 90 frames at 30 fps, a key frame every 8 frames: most windows start between key frames
    return write_uniform(tmp_path_factory.mktemp("video") / "coded.mp4", 90, keyint=8)


def test_full_decode_reads_every_frame_in_order_with_timestamps(video):
    out = decode_all(video)
    assert read_uniform(out.frames) == list(range(90))
    assert out.fps == 30.0
    assert torch.allclose(out.timestamps, torch.arange(90, dtype=torch.float64) / 30.0)


@pytest.mark.parametrize("start", [0, 1, 7, 8, 9, 31, 59])
def test_clip_from_any_start_is_consecutive_frames_at_the_stride(video, start):
    clip = decode_clip(video, num_frames=16, frame_stride=2, start_frame=start, short_side=None)
    assert clip.dtype == torch.uint8 and clip.shape == (16, 48, 64, 3)
    assert read_uniform(clip) == [start + 2 * k for k in range(16)]


def test_stride_three_and_one(video):
    assert read_uniform(decode_clip(video, num_frames=8, frame_stride=3, start_frame=10)) == list(range(10, 34, 3))
    assert read_uniform(decode_clip(video, num_frames=5, frame_stride=1, start_frame=85)) == [85, 86, 87, 88, 89]


def test_target_fps_equals_the_matching_stride(video):
    # 30 fps source at 15 fps = every 2nd frame; at 10 fps = every 3rd
    at15 = decode_clip(video, num_frames=16, target_fps=15.0, start_frame=4)
    assert read_uniform(at15) == read_uniform(decode_clip(video, num_frames=16, frame_stride=2, start_frame=4))
    at10 = decode_clip(video, num_frames=8, target_fps=10.0, start_frame=0)
    assert read_uniform(at10) == [0, 3, 6, 9, 12, 15, 18, 21]
    # a non-integer step (30 / 12 = 2.5 source frames) rounds each index
    at12 = decode_clip(video, num_frames=5, target_fps=12.0, start_frame=0)
    assert read_uniform(at12) == [round(2.5 * k) for k in range(5)]


def test_random_windows_stay_inside_the_video_and_are_reproducible(video):
    starts = set()
    for seed in range(30):
        clip = decode_clip(video, num_frames=16, frame_stride=2, generator=torch.Generator().manual_seed(seed))
        idx = read_uniform(clip)
        assert idx == [idx[0] + 2 * k for k in range(16)] and idx[0] >= 0 and idx[-1] <= 89
        starts.add(idx[0])
        again = decode_clip(video, num_frames=16, frame_stride=2, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(clip, again)
    assert len(starts) > 15  # the window start really varies (59 possible starts)


def test_clip_indices_start_is_uniform_over_the_valid_range():
    g = torch.Generator().manual_seed(0)
    starts = [clip_indices(40, num_frames=16, step=2, generator=g)[0][0] for _ in range(3000)]
    assert min(starts) == 0 and max(starts) == 9  # 40 - 1 - 30
    counts = torch.bincount(torch.tensor(starts), minlength=10).float()
    assert counts.min() > 0.7 * counts.mean()


def test_short_video_is_padded_with_its_last_frame_or_skipped(tmp_path):
    path = write_uniform(tmp_path / "short.mp4", 10)
    out = decode_windows(path, DecodeOptions(num_frames=8, frame_stride=2, short_videos="pad"))
    assert read_uniform(out.frames[out.index[0]]) == [0, 2, 4, 6, 8, 9, 9, 9]
    assert out.note is not None and out.note.startswith("short:")
    with pytest.raises(DataError, match=r"^short:"):
        decode_clip(path, num_frames=8, frame_stride=2, short_videos="skip")
    # a window that fits is not a short video
    assert decode_windows(path, DecodeOptions(num_frames=5, short_videos="skip")).note is None


def test_single_frame_video_pads_to_a_still_clip(tmp_path):
    path = write_uniform(tmp_path / "one.mp4", 1)
    assert read_uniform(decode_clip(path, num_frames=4, frame_stride=2)) == [0, 0, 0, 0]


def test_large_frames_are_resized_at_decode_time(tmp_path):
    frames = uniform_frames(12, height=96, width=160)
    path = tmp_path / "big.mp4"
    write_video(path, frames, options={"crf": "0"})
    clip = decode_clip(path, num_frames=4, frame_stride=2, start_frame=3, short_side=48)
    assert clip.shape == (4, 48, 80, 3)
    assert read_uniform(clip) == [3, 5, 7, 9]
    assert decode_clip(path, num_frames=2, short_side=256).shape[1:3] == (96, 160)  # never upscaled
    assert resized_shape(720, 1280, 256) == (256, 455)
    assert decode_all(path, short_side=48).frames.shape == (12, 48, 80, 3)


CONTAINERS = [
    ("mkv", "libx264", {"crf": "0"}),
    ("avi", "libx264", {"crf": "0"}),
    ("webm", "libvpx-vp9", {"lossless": "1"}),
    ("ts", "libx264", {"crf": "0"}),
]


@pytest.mark.parametrize("ext,codec,options", CONTAINERS)
def test_other_containers_seek_to_the_right_frames(tmp_path, ext, codec, options):
    # mkv/webm store no frame count (estimated from the duration), AVI H.264 timestamps are offset by one,
    # MPEG-TS seeks land after the target: each needs its own care in video.py
    path = tmp_path / f"coded.{ext}"
    write_video(path, uniform_frames(50), fps=25, codec=codec, options=options, keyint=10)
    assert probe_video(path).num_frames == 50
    assert read_uniform(decode_clip(path, num_frames=8, frame_stride=3, start_frame=21)) == list(range(21, 45, 3))
    assert read_uniform(decode_all(path, frame_stride=5).frames) == list(range(0, 50, 5))


def test_decode_all_at_a_target_rate(video):
    out = decode_all(video, target_fps=10.0)
    assert read_uniform(out.frames) == list(range(0, 90, 3))
    assert out.fps == 10.0
    assert torch.allclose(out.timestamps, torch.arange(0, 90, 3, dtype=torch.float64) / 30.0)


def test_a_video_without_frame_count_or_duration_is_decoded_in_full_once(video, monkeypatch):
    import dataclasses

    import levjepa.data.video as video_module

    real_info = video_module._info
    monkeypatch.setattr(video_module, "_info", lambda *a: dataclasses.replace(real_info(*a), num_frames=-1))
    clip = decode_clip(video, num_frames=6, frame_stride=3, start_frame=40)
    assert read_uniform(clip) == list(range(40, 58, 3))
    with pytest.raises(DataError, match=r"^short:"):
        decode_clip(video, num_frames=40, frame_stride=3, short_videos="skip")


def test_videos_open_on_a_pyav_without_the_metadata_errors_keyword(video, monkeypatch):
    """PyAV 19 dropped ``av.open(..., metadata_errors=)``; PyAV 12–18 take it. Both must decode."""
    import av

    real_open = av.open
    calls: list[dict] = []

    def pyav19_open(*args, **kwargs):
        calls.append(kwargs)
        if "metadata_errors" in kwargs:
            raise TypeError("open() got an unexpected keyword argument 'metadata_errors'")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(av, "open", pyav19_open)
    assert probe_video(video).num_frames == 90
    assert read_uniform(decode_all(video).frames) == list(range(90))
    assert any("metadata_errors" not in kwargs for kwargs in calls)
