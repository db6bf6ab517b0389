"""The evaluation transform: the centred window of a video, an image repeated, a square multiple of the patch."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from data_media import read_uniform, write_uniform
from levjepa.data.eval_clip import center_square, load_eval_clip, load_eval_video


def test_a_video_gives_its_centred_window_and_an_image_its_copies(tmp_path):
    video = write_uniform(tmp_path / "v.mp4", 30, height=48, width=64)
    clip = load_eval_clip(str(video), num_frames=4, frame_stride=3, size=32, patch=8)
    # 30 frames, a window spanning 10: it starts at (30 - 10) // 2 = 10
    assert clip.shape == (4, 32, 32, 3) and clip.dtype == torch.uint8
    assert read_uniform(clip) == [10, 13, 16, 19]
    assert read_uniform(load_eval_clip(str(video), num_frames=2, frame_stride=1, start=5, size=32, patch=8)) == [5, 6]
    # a short video is padded with its last frame
    assert read_uniform(load_eval_clip(str(video), num_frames=20, frame_stride=2, size=16, patch=8))[-3:] == [29] * 3

    image = tmp_path / "i.png"
    Image.fromarray(np.full((40, 60, 3), 77, np.uint8)).save(image)
    still = load_eval_clip(str(image), num_frames=3, size=24, patch=8)
    assert still.shape == (3, 24, 24, 3) and bool((still == 77).all())
    # the whole video, every 2nd frame, cropped the same way
    frames = load_eval_video(str(video), size=32, patch=8, frame_stride=2)
    assert frames.frames.shape == (15, 32, 32, 3) and read_uniform(frames.frames) == list(range(0, 30, 2))


def test_center_square_resizes_the_short_side_then_keeps_the_centre():
    frames = torch.zeros(1, 30, 50, 3, dtype=torch.uint8)
    frames[:, :, 20:30] = 200  # a bright vertical band in the centre columns
    out = center_square(frames, 15, 4)  # short side 15 -> 15 x 25, square side 12 (a multiple of 4)
    assert out.shape == (1, 12, 12, 3)
    band = out[0, 0, :, 0].float()
    assert band[4:8].min() > 150 and band[:2].max() < 50 and band[-2:].max() < 50
