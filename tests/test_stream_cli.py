"""`levjepa stream`: the KV-cache encoder over a real video file reads out the CLS of the full forward; an image
streams as a clip of its repeated frame, a video shorter than a tubelet is padded, and `--max-frames` below
the tubelet is one line."""

from __future__ import annotations

import argparse
import contextlib

import pytest
import torch
from PIL import Image

from data_media import pattern_frames, write_pattern
from levjepa.cli import main
from levjepa.commands import stream as cli
from levjepa.data import decode_all, normalize
from levjepa.data.eval_clip import center_square, load_eval_clip
from levjepa.formats.reading.load import load_encoder
from levjepa.infer import encode as encode_module
from levjepa.infer import stream as stream_module
from levjepa.infer.encode import encode
from levjepa.infer.stream import StreamingEncoder
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


@pytest.fixture(scope="module")
def tubelet2(tmp_path_factory):
    """A run whose encoder reads tubelets of 2 frames (as the demo's), a one-frame video and an image."""
    root = tmp_path_factory.mktemp("tubelet2")
    run = make_run_dir(root, tubelet=2)
    one = write_pattern(root / "one.mp4", 1, height=40, width=48)
    image = root / "image.png"
    Image.fromarray(pattern_frames(1, 40, 48)[0]).save(image)
    return run, one, image


def _full_cls(run, frames: torch.Tensor) -> torch.Tensor:
    """CLS of the full forward on uint8 frames [T, S, S, 3]."""
    encoder = load_encoder(run).encoder
    with torch.no_grad():
        return encoder.forward_features(normalize(frames.permute(3, 0, 1, 2).unsqueeze(0))).cls[0]


def test_an_image_streams_as_a_clip_of_its_repeated_frame(tubelet2, tmp_path, capsys):
    run, _, image = tubelet2
    out = tmp_path / "s.safetensors"
    assert main(["stream", str(run), str(image), "--size", "32", "--every", "4", "--out", str(out)]) == 0
    got, _ = load_tensors(out)
    assert got["frame"].tolist() == [3, 7, 11, 15]  # 16 repeats (the in1k protocol's clip), read every 4
    assert torch.equal(got["time_s"], torch.zeros(4))
    clip = load_eval_clip(str(image), num_frames=16, size=32, patch=8)  # the evaluation's clip of the image
    assert torch.equal(clip[0], clip[15])
    torch.testing.assert_close(got["cls"][-1], _full_cls(run, clip), rtol=1e-5, atol=1e-5)
    again = ["stream", str(run), str(image), "--size", "32", "--max-frames", "4", "--out", str(out)]
    assert main([*again, "--overwrite"]) == 0  # the stream written above: replaced only when asked
    assert load_tensors(out)[0]["frame"].tolist() == [1, 3]


def test_a_video_shorter_than_a_tubelet_is_padded_with_its_last_frame(tubelet2, tmp_path, capsys):
    run, one, _ = tubelet2
    out = tmp_path / "s.safetensors"
    assert main(["stream", str(run), str(one), "--size", "32", "--out", str(out)]) == 0
    assert "padded with its last frame" in capsys.readouterr().err
    got, _ = load_tensors(out)
    assert got["frame"].tolist() == [1] and got["time_s"].tolist() == [0.0]  # the padded frame's source time
    frame = center_square(decode_all(one, short_side=32).frames, 32, 8)
    torch.testing.assert_close(got["cls"][0], _full_cls(run, frame.expand(2, -1, -1, -1)), rtol=1e-5, atol=1e-5)


def test_max_frames_below_the_tubelet_is_one_line(tubelet2, capsys):
    run, one, image = tubelet2
    for source in (one, image):
        assert main(["stream", str(run), str(source), "--size", "32", "--max-frames", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--max-frames 1" in err and "tubelets of 2 frames" in err


def test_a_bidirectional_encoder_or_a_window_off_the_tubelet_is_one_line(tubelet2, tmp_path, capsys):
    run, one, _ = tubelet2
    assert main(["stream", str(run), str(one), "--size", "32", "--window", "3"]) == 2
    assert (
        capsys.readouterr().err.strip() == "levjepa stream: --window 3: expected a multiple of the tubelet (2 frames)"
    )
    bidirectional = make_run_dir(tmp_path, attention="bidirectional")
    assert main(["stream", str(bidirectional), str(one), "--size", "32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "attends bidirectionally" in err[0] and "levjepa extract" in err[0]


def _stream(run, video, out, *extra: str) -> dict:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([str(run), str(video), "--size", "32", "--out", str(out), *extra])
    assert cli.main(args) == 0
    return load_tensors(out)[0]


def test_the_stream_command_reads_what_encode_reads_on_the_first_window(tmp_path):
    """One precision rule for every frozen forward: on CPU both run float32, so the stream's CLS after the first
    window is encode()'s CLS of that window, to float32 rounding."""
    run = make_run_dir(tmp_path)
    video = write_pattern(tmp_path / "clip.mp4", 6, height=40, width=48)
    got = _stream(run, video, tmp_path / "s.safetensors", "--window", "4", "--every", "4")
    assert got["frame"].tolist()[0] == 3
    encoder = load_encoder(run).encoder
    frames = center_square(decode_all(video, short_side=32).frames, 32, encoder.cfg.patch_size)
    ref = encode(encoder, frames[:4].permute(3, 0, 1, 2).unsqueeze(0), "cpu", tokens=False)
    assert got["cls"].dtype == ref.cls.dtype == torch.float32
    torch.testing.assert_close(got["cls"][0], ref.cls[0], rtol=1e-5, atol=1e-5)


def test_the_stream_path_runs_under_the_frozen_forwards_precision(tmp_path, monkeypatch):
    """`levjepa stream` enters levjepa.infer.encode.precision(device) around every push and readout."""
    entered: list[str] = []
    inside = [False]
    real_push, real_cls = StreamingEncoder.push, StreamingEncoder.cls

    @contextlib.contextmanager
    def recording(device):
        entered.append(str(device))
        inside[0] = True
        try:
            with encode_module.precision(device):
                yield
        finally:
            inside[0] = False

    def push(self, frames):
        assert inside[0], "push outside precision()"
        return real_push(self, frames)

    def readout(self):
        assert inside[0], "cls() outside precision()"
        return real_cls(self)

    monkeypatch.setattr(stream_module, "precision", recording)
    monkeypatch.setattr(StreamingEncoder, "push", push)
    monkeypatch.setattr(StreamingEncoder, "cls", readout)
    run = make_run_dir(tmp_path)
    video = write_pattern(tmp_path / "clip.mp4", 4, height=40, width=48)
    got = _stream(run, video, tmp_path / "s.safetensors", "--every", "2")
    assert entered and set(entered) == {"cpu"} and len(entered) == 4 + 2  # 4 pushes, 2 readouts
    assert got["cls"].shape[0] == 2


def test_frames_past_the_last_whole_tubelet_are_said_as_left_out(tubelet2, capsys):
    # 5 repeats of the image at tubelet 2: 4 are streamed, and the line says so (it was silent)
    run, _, image = tubelet2
    assert main(["stream", str(run), str(image), "--size", "32", "--max-frames", "5"]) == 0
    captured = capsys.readouterr()
    assert "5 frames adjusted to 4, whole tubelets of 2 (the last 1 left out)" in captured.err
    assert '"frames": 4' in captured.out
