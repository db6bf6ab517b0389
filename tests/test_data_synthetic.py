"""The built-in benchmark: labels are what the pixels show (direction of motion on screen, forward =
decelerating), a reversed clip is the time-mirror of its forward twin with the opposite direction, labels
are independent, splits share no source image, and the image source is chosen as documented."""

from __future__ import annotations

import gzip
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from levjepa.data import DataError, SyntheticConfig
from levjepa.data.synthetic import find_fashion_mnist, load_image_pool, load_split, read_idx, render, sample_params

CFG = SyntheticConfig(image_source="digits", num_train=400, num_val=100, num_test=100)


def _plain(cfg: SyntheticConfig, params):
    """The same clips on a flat, still background (texture off, background velocity zero)."""
    flat = replace(cfg, texture_contrast=0.0)
    still = replace(params, bg_velocity=torch.zeros_like(params.bg_velocity))
    return flat, still


def _track(clips: torch.Tensor, bg: torch.Tensor, size: int) -> torch.Tensor:
    """Per-frame object position [N, T, 2] (y, x) as a circular (torus) mean of the pixels that differ from
    the flat background; unwrapped along time."""
    diff = (clips.to(torch.float32) - bg[:, :, None, None, None]).abs().sum(1)  # [N, T, S, S]
    mask = (diff > 60).to(torch.float64)
    angle = torch.arange(size, dtype=torch.float64) * (2 * math.pi / size)
    ey, ex = torch.exp(1j * angle)[:, None], torch.exp(1j * angle)[None, :]
    pos_y = torch.angle((mask * ey).sum((-2, -1))) * size / (2 * math.pi)
    pos_x = torch.angle((mask * ex).sum((-2, -1))) * size / (2 * math.pi)
    pos = torch.stack((pos_y, pos_x), -1)
    step = torch.remainder(pos.diff(dim=1) + size / 2, size) - size / 2
    return torch.cat((pos[:, :1], pos[:, :1] + step.cumsum(1)), 1)


def test_motion_label_is_the_direction_seen_on_screen_and_arrow_is_the_speed_trend():
    pool = load_image_pool(CFG)
    params = sample_params(CFG, "train", pool).select(slice(0, 120))
    flat, still = _plain(CFG, params)
    clips = render(flat, still, pool)
    pos = _track(clips, still.bg_colour * 255.0, CFG.size)
    disp = pos[:, -1] - pos[:, 0]  # (dy, dx), y down
    angle = torch.atan2(-disp[:, 0], disp[:, 1])  # counter-clockwise from east, screen north up
    seen = torch.remainder(torch.round(angle / (math.pi / 4)), 8).to(torch.int64)
    assert torch.equal(seen, params.motion)
    speed = pos.diff(dim=1).norm(dim=-1)  # [N, T-1] pixels per frame
    half = speed.shape[1] // 2
    accelerating = speed[:, half:].mean(1) > speed[:, :half].mean(1)
    assert torch.equal(accelerating, params.arrow.bool())  # forward decelerates, reversed accelerates


def test_a_reversed_clip_is_the_time_mirror_moving_the_opposite_way():
    pool = load_image_pool(CFG)
    params = sample_params(CFG, "val", pool)
    twin = replace(params, arrow=1 - params.arrow, motion=(params.motion + 4) % 8)  # same forward world
    clips, mirrored = render(CFG, params, pool), render(CFG, twin, pool)
    assert torch.equal(mirrored, clips.flip(2))


def test_labels_are_independent_and_balanced():
    data = load_split(CFG, "train")
    app, mot, arr = (data.labels[k] for k in ("appearance", "motion", "arrow"))
    assert data.num_classes == {"appearance": 10, "motion": 8, "arrow": 2}
    for a, b, na, nb in ((app, mot, 10, 8), (mot, arr, 8, 2), (app, arr, 10, 2)):
        table = torch.zeros(na, nb)
        table.index_put_((a, b), torch.ones(len(a)), accumulate=True)
        expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
        chi2 = float(((table - expected) ** 2 / expected).sum())
        dof = (na - 1) * (nb - 1)
        assert chi2 < dof + 5 * math.sqrt(2 * dof), (na, nb, chi2)  # no dependence beyond chance
    assert data.clips.shape == (400, 3, 16, 64, 64) and data.clips.dtype == torch.uint8


def test_splits_are_disjoint_by_source_image_and_deterministic():
    splits = {s: load_split(CFG, s) for s in ("train", "val", "test")}
    images = {s: set(d.source_image.tolist()) for s, d in splits.items()}
    assert not images["train"] & images["val"] and not images["train"] & images["test"]
    assert not images["val"] & images["test"]
    pool = load_image_pool(CFG)
    again = render(CFG, sample_params(CFG, "test", pool), pool)
    assert torch.equal(again, splits["test"].clips)
    other_seed = replace(CFG, seed=1)
    assert not torch.equal(render(other_seed, sample_params(other_seed, "test", pool), pool), again)
    assert splits["train"].image_source == "digits"


def _write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_image_source_chooser_prefers_fashion_mnist_and_falls_back_to_digits(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 28, 28), dtype=np.uint8)
    labels = np.arange(40) % 10
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
    assert np.array_equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), images)
    assert find_fashion_mnist(str(tmp_path)) == tmp_path

    auto = SyntheticConfig(image_source="auto", fashion_mnist_dir=str(tmp_path), num_train=8, num_val=2, num_test=2)
    pool = load_image_pool(auto)
    assert pool.name == "fashion-mnist" and torch.equal(pool.images, torch.from_numpy(images))
    assert load_split(auto, "train").image_source == "fashion-mnist"

    nowhere = str(tmp_path / "absent")
    assert find_fashion_mnist(nowhere) is None
    assert load_image_pool(replace(auto, fashion_mnist_dir=nowhere)).name == "digits"
    assert load_image_pool(replace(auto, image_source="digits")).name == "digits"  # forced, although found
    with pytest.raises(DataError, match="dataset-fashion-mnist"):
        load_image_pool(replace(auto, image_source="fashion-mnist", fashion_mnist_dir=nowhere))


def test_load_split_rejects_unknown_split():
    with pytest.raises(ValueError, match="train, val, test"):
        load_split(CFG, "training")  # type: ignore[arg-type]
