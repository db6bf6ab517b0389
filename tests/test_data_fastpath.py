"""The fast data path gives the frames and views of the plain one: fixed-GOP files decoded with
skip_frame=NONREF give bit-identical frames (and a lying marker cannot make them wrong); several windows
decoded together equal each window decoded alone; views cut on the device equal PyTorch's antialiased
resize exactly (float64) and the worker's uint8 views within one level; repeated sampling shares a window
across a group, nothing else."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data_media import pattern_frames, read_pattern_index, uniform_frames, write_pattern
from levjepa.data import DataConfig, PretrainLoader
from levjepa.data.encode import write_video
from levjepa.data.prepare import PrepareOptions, prepare_file
from levjepa.data.resize import crop_resize
from levjepa.data.sources import MediaItem
from levjepa.data.video import FIXED_GOP_COMMENT, DecodeOptions, decode_clip, decode_windows, window_indices
from levjepa.data.views import IMAGENET_MEAN, IMAGENET_STD, cut_view


def _textured(num_frames: int, height: int = 64, width: int = 96) -> np.ndarray:
    """Moving texture: frames that H.264 codes with real residuals (so a wrong reference would show)."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (height, width + num_frames * 3, 3), dtype=np.uint8)
    return np.stack([base[:, 3 * k : 3 * k + width] for k in range(num_frames)])


@pytest.fixture(scope="module")
def fixed_gop(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fixed")
    write_video(root / "src.mp4", _textured(70), options={"crf": "18", "preset": "ultrafast"})
    out = root / "prepared.mp4"
    prepare_file(MediaItem(str(root / "src.mp4"), None, "video"), out, PrepareOptions(short_side=64, keyint=8))
    return out


def test_prepare_writes_the_fixed_gop_and_marks_it(fixed_gop):
    with av.open(str(fixed_gop)) as container:
        assert container.metadata.get("comment") == FIXED_GOP_COMMENT
        types = ["?IPB"[int(frame.pict_type)] for frame in container.decode(container.streams.video[0])]
    for k, kind in enumerate(types[:64]):
        if k % 8 == 0:
            assert kind == "I", (k, types)
        elif k % 2 == 1 and k % 8 != 7:
            assert kind == "B", (k, types)  # every odd frame but a GOP's last: a (non-reference) B-frame
        else:
            assert kind == "P", (k, types)


def test_skip_nonref_gives_bit_identical_frames(fixed_gop):
    opts = DecodeOptions(num_frames=16, frame_stride=2, short_side=None)
    for start in (0, 2, 6, 8, 14, 30, 38):
        fast = decode_windows(fixed_gop, opts, start_frame=start)
        plain = decode_clip(
            fixed_gop, num_frames=16, frame_stride=2, start_frame=start, short_side=None, skip_nonref=False
        )
        assert fast.skipped_nonref
        assert torch.equal(fast.frames[fast.index[0]], plain), start
    odd = decode_windows(fixed_gop, DecodeOptions(num_frames=4, frame_stride=2, short_side=None), start_frame=3)
    assert not odd.skipped_nonref  # odd frames are wanted: nothing may be skipped
    assert torch.equal(
        odd.frames, decode_clip(fixed_gop, num_frames=4, start_frame=3, short_side=None, skip_nonref=False)
    )


def test_fixed_gop_windows_start_on_even_frames(fixed_gop):
    starts = set()
    for seed in range(40):
        out = decode_windows(fixed_gop, DecodeOptions(num_frames=8), generator=torch.Generator().manual_seed(seed))
        starts.add(out.source_index[0])
    assert all(s % 2 == 0 for s in starts) and len(starts) > 5


def test_a_lying_marker_cannot_change_the_frames(tmp_path):
    # adaptive B-frames with a B-pyramid: some even frames are non-reference too, yet marked as fixed-GOP
    path = tmp_path / "liar.mp4"
    options = {"crf": "18", "preset": "ultrafast", "x264-params": "bframes=3:b-pyramid=none:b-adapt=0"}
    write_video(path, _textured(40), options=options, keyint=40)
    with av.open(str(path)) as c:
        assert "comment" not in c.metadata
    liar = tmp_path / "marked.mp4"
    from levjepa.data.encode import VideoWriter

    with av.open(str(path)) as inp, VideoWriter(liar, width=96, height=64, options=options, keyint=40,
                                                metadata={"comment": FIXED_GOP_COMMENT}) as w:  # fmt: skip
        for frame in inp.decode(inp.streams.video[0]):
            w.write(frame.to_ndarray(format="rgb24"))
    for start in (0, 4, 10):
        fast = decode_clip(liar, num_frames=8, frame_stride=2, start_frame=start, short_side=None)
        plain = decode_clip(liar, num_frames=8, frame_stride=2, start_frame=start, short_side=None, skip_nonref=False)
        assert torch.equal(fast, plain), start


def test_windows_decoded_together_equal_each_decoded_alone(fixed_gop):
    opts = DecodeOptions(num_frames=6, frame_stride=2, shift=12, short_side=None)
    out = decode_windows(fixed_gop, opts, count=3, generator=torch.Generator().manual_seed(3))
    starts = [out.source_index[int(w[0])] for w in out.index]
    assert len(set(starts)) > 1 and max(starts) - min(starts) <= 12
    for w, start in zip(out.index, starts, strict=True):
        alone = decode_clip(fixed_gop, num_frames=6, frame_stride=2, start_frame=start, short_side=None)
        assert torch.equal(out.frames[w], alone)
    same, _ = window_indices(100, num_frames=4, step=2, count=3, shift=0, generator=torch.Generator().manual_seed(0))
    assert same[0] == same[1] == same[2]


def test_device_cut_is_pytorchs_antialiased_resize():
    g = torch.Generator().manual_seed(0)
    frames = torch.rand(3, 2, 40, 70, 3, generator=g, dtype=torch.float64) * 255
    boxes = torch.tensor([[[3, 5, 30, 50], [0, 0, 40, 70], [10, 20, 7, 9]]])  # down, down, up
    flips = torch.tensor([[False, True, False]])
    out = crop_resize(frames, boxes, 24, flips)[0]
    for b in range(3):
        top, left, h, w = boxes[0, b].tolist()
        crop = frames[b].permute(0, 3, 1, 2)[:, :, top : top + h, left : left + w]
        ref = F.interpolate(crop, size=(24, 24), mode="bilinear", antialias=True, align_corners=False)
        ref = ref.flip(-1) if flips[0, b] else ref
        assert torch.allclose(out[b], ref.permute(1, 0, 2, 3), atol=1e-9, rtol=0)
    u8 = frames.to(torch.uint8)
    device = crop_resize(u8, boxes, 24, flips)[0]
    for b in range(3):
        worker = cut_view(u8[b].permute(0, 3, 1, 2), tuple(boxes[0, b].tolist()), 24, bool(flips[0, b]))
        assert (device[b] - worker.float()).abs().max() <= 1.0


@pytest.fixture(scope="module")
def pattern_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pattern")
    for i in range(4):
        write_pattern(root / f"clip{i}.mp4", 20 + i, width=96, height=64)
    return root


def _cfg(root: Path, **kw) -> DataConfig:
    base = dict(sources=(str(root),), num_frames=4, frame_stride=2, global_size=32, local_size=16, num_local=3,
                batch_size=4, num_workers=0, samples_per_epoch=16, resize_on="worker")  # fmt: skip
    return DataConfig(**{**base, **kw})


def _pixels(views: list[torch.Tensor]) -> list[torch.Tensor]:
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1, 1)
    return [(v * std + mean) * 255 for v in views]


@pytest.mark.parametrize("repeats", [1, 2])
def test_device_views_equal_worker_views_within_one_level(pattern_dir, repeats, one_thread):
    cfg = _cfg(pattern_dir, repeats=repeats, jitter_p=0.0, grayscale_p=0.0)
    worker = next(PretrainLoader(cfg, seed=5))
    frames = next(PretrainLoader(replace(cfg, resize_on="device"), seed=5))
    assert type(frames).__name__ == "FrameBatch" and frames.frames.shape[0] == 4 // repeats  # one span per decode
    for w, d in zip(_pixels(worker.augment_to_device("cpu")), _pixels(frames.augment_to_device("cpu")), strict=True):
        assert (w - d).abs().max() <= 1.01
    with_colour = replace(cfg, resize_on="device", jitter_p=1.0, grayscale_p=0.5)
    a = PretrainLoader(replace(with_colour, resize_on="worker"), seed=5)
    b = PretrainLoader(with_colour, seed=5)
    for w, d in zip(next(a).augment_to_device("cpu"), next(b).augment_to_device("cpu"), strict=True):
        assert (w - d).abs().max() * 255 * 0.225 <= 2.0  # one level in, amplified by contrast at most 1.4x


def test_repeated_sampling_shares_the_window_not_the_crops(pattern_dir):
    cfg = _cfg(pattern_dir, repeats=2, num_global=1, num_local=2)
    batch = next(PretrainLoader(cfg, seed=2))
    glob, local = batch.views
    windows = [read_pattern_index(glob[0, b]) for b in range(4)]
    assert windows[0] == windows[1] and windows[2] == windows[3]  # positions 2m, 2m+1: one decode, one window
    assert not torch.equal(local[:, 0], local[:, 1])  # but their own crops
    shifted = next(PretrainLoader(replace(cfg, repeat_shift=6, samples_per_epoch=64), seed=2))
    starts = [read_pattern_index(shifted.views[0][0, b])[0] for b in range(4)]
    assert all(abs(starts[2 * m] - starts[2 * m + 1]) <= 6 for m in range(2))
    loader = PretrainLoader(replace(cfg, samples_per_epoch=None), seed=2)
    assert loader.samples_per_epoch == 2 * 4  # an epoch still visits every video once, with k view sets


def test_repeats_must_divide_the_batch(pattern_dir):
    with pytest.raises(ValueError, match=r"data\.repeats=3 does not divide data\.batch_size=4"):
        _cfg(pattern_dir, repeats=3)


def test_frame_batches_from_worker_processes_equal_in_process_ones(pattern_dir):
    cfg = _cfg(pattern_dir, resize_on="device", repeats=2)
    alone = PretrainLoader(cfg, seed=1)
    pooled = PretrainLoader(replace(cfg, num_workers=2), seed=1)
    for _ in range(3):
        a, b = next(alone), next(pooled)
        assert b.frames.is_shared()  # collated straight into shared memory
        for name in ("frames", "span", "frame_index", "boxes", "flips", "photometric", "index"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_images_ship_one_frame(tmp_path):
    from PIL import Image

    Image.fromarray(pattern_frames(1, 48, 64)[0]).save(tmp_path / "a.png")
    Image.fromarray(uniform_frames(1, 48, 64)[0]).save(tmp_path / "b.png")
    cfg = _cfg(tmp_path, resize_on="device", batch_size=2, samples_per_epoch=2)
    batch = next(PretrainLoader(cfg, seed=0))
    assert batch.frames.shape[1] == 1 and batch.frame_index.eq(0).all()
    glob, _ = batch.augment_to_device("cpu")
    assert glob.shape == (1, 2, 3, 4, 32, 32) and torch.equal(glob[:, :, :, 0], glob[:, :, :, 3])


def test_gpu_decoding_falls_back_to_the_cpu_with_a_message(pattern_dir, monkeypatch):
    import levjepa.data.loader as loader_module
    from levjepa.data.loader import resolve_devices
    from levjepa.data.video import hwaccel_status

    cfg = _cfg(pattern_dir, decode_device="cuda")
    monkeypatch.setattr(loader_module, "hwaccel_status", lambda _: "no NVDEC in this test")
    with pytest.warns(UserWarning, match=r"decode_device='cuda'.*no NVDEC in this test.*decoding on the CPU"):
        fallen = PretrainLoader(cfg, seed=3)
    assert fallen.cfg.decode_device == "cpu"
    plain = PretrainLoader(replace(cfg, decode_device="cpu"), seed=3)
    assert all(torch.equal(x, y) for x, y in zip(next(fallen).views, next(plain).views, strict=True))
    monkeypatch.undo()
    here = "cpu" if hwaccel_status("cuda") is not None else "cuda"  # this machine's answer, whichever it is
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warning, on a machine without NVDEC
        assert resolve_devices(replace(cfg, resize_on="worker")).decode_device == here
    assert resolve_devices(replace(cfg, decode_device="cpu")).resize_on == (
        "device" if torch.cuda.is_available() else "worker"
    )


@pytest.mark.gpu
def test_device_cut_on_cuda_equals_the_cpu_cut(pattern_dir):
    batch = next(PretrainLoader(_cfg(pattern_dir, resize_on="device", jitter_p=0.0, grayscale_p=0.0), seed=1))
    for cpu, gpu in zip(batch.augment_to_device("cpu"), batch.augment_to_device("cuda"), strict=True):
        assert (cpu - gpu.cpu()).abs().max() * 255 * 0.225 <= 0.5  # float16 products: well under a level
