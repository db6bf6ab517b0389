"""Streaming with a KV cache equals the full-clip forward on the same frames, for every prefix."""

from __future__ import annotations

import pytest
import torch

from levjepa.infer import StreamingEncoder
from levjepa.model import VideoEncoder, encoder_config

TOL = {"rtol": 0.0, "atol": 1e-5}


@pytest.fixture(scope="module")
def enc() -> VideoEncoder:
    torch.manual_seed(0)
    return VideoEncoder(encoder_config("vit-test", patch_size=16)).eval()  # 2 layers, dim 32


def check_every_prefix(enc: VideoEncoder, video: torch.Tensor, window: int | None, chunk: int) -> None:
    stream = StreamingEncoder(enc, window=window)
    seen = []
    for start in range(0, video.shape[2], chunk):
        seen.append(stream.push(video[:, :, start : start + chunk]))
        with torch.no_grad():
            full = enc.forward_features(video[:, :, : start + chunk], window=window)
        torch.testing.assert_close(torch.cat(seen, dim=1), full.patches, **TOL)
        torch.testing.assert_close(stream.cls(), full.cls, **TOL)


@pytest.mark.parametrize("size", [224, 96])
@pytest.mark.parametrize("window", [None, 4])  # 4 frames: the whole clip
def test_stream_equals_full_forward_for_every_prefix(enc, size, window):
    video = torch.randn(2, 3, 4, size, size)
    check_every_prefix(enc, video, window, chunk=1)


def test_a_window_covering_the_clip_changes_nothing(enc):
    video = torch.randn(1, 3, 5, 96, 96)
    with torch.no_grad():
        torch.testing.assert_close(enc.forward_features(video, window=5).cls, enc.forward_features(video).cls)


def test_short_window_equals_the_banded_block_causal_forward_and_bounds_the_cache(enc):
    video = torch.randn(1, 3, 7, 96, 96)
    check_every_prefix(enc, video, window=3, chunk=1)
    stream = StreamingEncoder(enc, window=3)
    sizes = []
    for t in range(7):
        stream.push(video[:, :, t : t + 1])
        sizes.append(stream.cached_tokens)
    assert sizes == [36, 72, 108, 108, 108, 108, 108]  # 36 tokens per frame, at most 3 frames
    with torch.no_grad():  # and the window does cut the past off (sanity: this check can fail)
        assert (enc.forward_features(video, window=3).cls - enc.forward_features(video).cls).abs().max() > 1e-4


def test_pushing_several_frames_at_once_and_tubelets(enc):
    check_every_prefix(enc, torch.randn(1, 3, 6, 96, 96), window=None, chunk=2)
    torch.manual_seed(1)
    tube = VideoEncoder(encoder_config("vit-test", patch_size=16, tubelet=2)).eval()
    check_every_prefix(tube, torch.randn(1, 3, 6, 96, 96), window=4, chunk=2)


def test_the_past_is_never_recomputed(enc):
    lengths = []
    hook = enc.blocks[0].register_forward_hook(lambda m, i, o: lengths.append(i[0].shape[1]))
    try:
        stream = StreamingEncoder(enc)
        for _ in range(3):
            stream.push(torch.randn(1, 3, 1, 96, 96))
            stream.cls()
        stream.push(torch.randn(1, 3, 2, 96, 96))
    finally:
        hook.remove()
    assert lengths == [36, 1, 36, 1, 36, 1, 72]  # only new frames' tokens (and CLS alone) enter the blocks
    assert stream.frames_seen == 5 and stream.cached_tokens == 5 * 36


def test_reset_starts_a_new_video(enc):
    video = torch.randn(1, 3, 2, 96, 96)
    stream = StreamingEncoder(enc)
    first = stream.push(video)
    stream.push(torch.randn(1, 3, 1, 96, 96))
    stream.reset()
    torch.testing.assert_close(stream.push(video), first, rtol=0, atol=0)
    assert stream.frames_seen == 2


def test_stream_refuses_what_it_cannot_do(enc):
    with pytest.raises(ValueError, match="needs 'block_causal'"):
        StreamingEncoder(VideoEncoder(encoder_config("vit-test", attention="bidirectional")))
    with pytest.raises(ValueError, match=r"window=3: expected .* a multiple of tubelet=2"):
        StreamingEncoder(VideoEncoder(encoder_config("vit-test", tubelet=2)), window=3)
    stream = StreamingEncoder(enc)
    with pytest.raises(RuntimeError, match="no frames pushed"):
        stream.cls()
    with pytest.raises(ValueError, match=r"^frames: .*dtype torch.uint8"):
        stream.push(torch.zeros(1, 3, 1, 96, 96, dtype=torch.uint8))
    stream.push(torch.randn(1, 3, 1, 96, 96))
    with pytest.raises(ValueError, match=r"frames: shape \(1, 3, 1, 64, 64\) does not continue .*\(1, 3, 96, 96\)"):
        stream.push(torch.randn(1, 3, 1, 64, 64))


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 2])
def test_stream_equals_full_forward_for_a_real_preset_at_224(window):
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-small")).eval()  # 12 layers, dim 384, patch 16
    check_every_prefix(enc, torch.randn(1, 3, 4, 224, 224), window=window, chunk=1)
