"""`levjepa stream`: the KV-cache encoder over a real video file reads out the CLS of the full forward."""

from __future__ import annotations

import argparse

import torch

from data_media import write_pattern
from levjepa.commands import stream as cli
from levjepa.data import decode_all, normalize
from levjepa.data.eval_clip import center_square
from levjepa.formats.load import load_encoder
from levjepa.weights import load_tensors
from test_export import make_run_dir


def test_stream_command_equals_full_forward_on_every_prefix(tmp_path):
    run = make_run_dir(tmp_path)
    video = write_pattern(tmp_path / "clip.mp4", 6, height=40, width=48)
    out = tmp_path / "stream.safetensors"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([str(run), str(video), "--size", "32", "--every", "2", "--out", str(out)])
    assert cli.main(args) == 0
    got, meta = load_tensors(out)
    assert got["frame"].tolist() == [1, 3, 5] and got["latency_ms"].numel() == 6
    assert torch.equal(got["time_s"], torch.as_tensor(decode_all(video).timestamps)[[1, 3, 5]].float())

    encoder = load_encoder(run).encoder
    frames = center_square(decode_all(video, short_side=32).frames, 32, encoder.cfg.patch_size)
    clip = normalize(frames.permute(3, 0, 1, 2).unsqueeze(0))  # [1, C, T, H, W]
    with torch.no_grad():
        for row, t in enumerate(got["frame"].tolist()):
            full = encoder.forward_features(clip[:, :, : t + 1]).cls[0]
            torch.testing.assert_close(got["cls"][row], full, rtol=1e-5, atol=1e-5)
    assert '"frames": 6' in meta["summary"]
    assert '"weights": "ema weights step' in meta["summary"]  # which copy the stream read
