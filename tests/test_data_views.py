"""Views: crops follow their box on every frame, photometric change touches local views only and is the
stated mathematics (checked against the standard library's colorsys), normalisation is ImageNet's."""

from __future__ import annotations

import colorsys
from dataclasses import replace

import pytest
import torch

from levjepa.data import DataConfig, normalize
from levjepa.data.views import (
    PHOTOMETRIC_FIELDS,
    apply_photometric,
    crop_box,
    cut_view,
    grayscale,
    hsv_to_rgb,
    make_views,
    rgb_to_hsv,
)


def _ramp_frames(t: int = 4, h: int = 40, w: int = 60) -> torch.Tensor:
    """uint8 [T, 3, H, W]: red = frame index code, green = x, blue = y (both exact integers)."""
    frames = torch.zeros(t, 3, h, w, dtype=torch.uint8)
    frames[:, 0] = (10 * torch.arange(t, dtype=torch.uint8))[:, None, None]
    frames[:, 1] = torch.arange(w, dtype=torch.uint8)[None, None, :]
    frames[:, 2] = torch.arange(h, dtype=torch.uint8)[None, :, None]
    return frames


def test_crop_box_fits_and_respects_the_scale_range():
    g = torch.Generator().manual_seed(0)
    areas = []
    for _ in range(500):
        top, left, h, w = crop_box(90, 160, (0.02, 0.4), (0.75, 4 / 3), g)
        assert top >= 0 and top + h <= 90 and left >= 0 and left + w <= 160 and h > 0 and w > 0
        areas.append(h * w / (90 * 160))
        assert 0.75 * 0.9 <= w / h <= 4 / 3 * 1.1 or h * w / (90 * 160) > 0.4  # rounding slack
    assert min(areas) >= 0.015 and max(areas) <= 0.43
    assert max(areas) > 0.3 and min(areas) < 0.05  # the range is really used


def test_a_crop_is_the_same_box_on_every_frame_and_a_flip_mirrors_it():
    frames = _ramp_frames()
    box = (5, 7, 20, 30)
    view = cut_view(frames, box, size=20)  # width 30 -> 20: resized
    assert view.shape == (3, 4, 20, 20)
    for t in range(4):
        assert torch.equal(view[1:, t], view[1:, 0])  # same crop (green/blue) on every frame
        assert (view[0, t] == 10 * t).all()  # and each frame's own content
    exact = cut_view(frames, (5, 7, 20, 20), size=20)  # no resize: the crop itself
    assert torch.equal(exact[1, 0], frames[0, 1, 5:25, 7:27]) and torch.equal(exact[2, 0], frames[0, 2, 5:25, 7:27])
    flipped = cut_view(frames, (5, 7, 20, 20), size=20, flip=True)
    assert torch.equal(flipped, exact.flip(-1))


def test_make_views_shapes_and_draw_reproducibility():
    cfg = DataConfig(num_global=2, num_local=3, global_size=32, local_size=16)
    frames = _ramp_frames()
    a = make_views(frames, cfg, torch.Generator().manual_seed(3))
    b = make_views(frames, cfg, torch.Generator().manual_seed(3))
    c = make_views(frames, cfg, torch.Generator().manual_seed(4))
    assert a[0].shape == (2, 3, 4, 32, 32) and a[1].shape == (3, 3, 4, 16, 16) and a[2].shape == (3, 6)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[1], c[1])
    # every view keeps the time window: red channel = 10 * frame index in every view
    for group in a[:2]:
        for view in group:
            assert [int(view[0, t].float().mean().round()) for t in range(4)] == [0, 10, 20, 30]


def test_photometric_parameter_ranges_follow_the_config():
    cfg = DataConfig(jitter_p=0.8, grayscale_p=0.2, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
    g = torch.Generator().manual_seed(0)
    small = replace(cfg, global_size=8, local_size=8, num_local=4)
    p = torch.cat([make_views(_ramp_frames(2, 8, 8), small, g)[2] for _ in range(200)])
    col = {name: p[:, i] for i, name in enumerate(PHOTOMETRIC_FIELDS)}
    assert abs(col["jitter"].mean().item() - 0.8) < 0.04
    assert abs(col["grayscale"].mean().item() - 0.2) < 0.04
    assert col["brightness"].min() >= 0.6 and col["brightness"].max() <= 1.4
    assert col["saturation"].min() >= 0.8 and col["saturation"].max() <= 1.2
    assert col["hue"].min() >= -0.1 and col["hue"].max() <= 0.1 and col["hue"].abs().max() > 0.09


def _params(n: int, jitter=1.0, b=1.0, c=1.0, s=1.0, h=0.0, gray=0.0) -> torch.Tensor:
    return torch.tensor([[jitter, b, c, s, h, gray]] * n, dtype=torch.float64)


def test_identity_parameters_and_no_jitter_leave_views_unchanged():
    x = torch.rand(3, 3, 2, 5, 6, dtype=torch.float64)
    assert torch.allclose(apply_photometric(x, _params(3)), x, atol=1e-12)
    off = _params(3, jitter=0.0, b=0.1, c=3.0, s=0.0, h=0.3)  # flag off: the other fields are ignored
    assert torch.equal(apply_photometric(x, off), x)


def test_brightness_contrast_saturation_equations():
    x = torch.rand(2, 3, 2, 4, 4, dtype=torch.float64) * 0.5
    assert torch.allclose(apply_photometric(x, _params(2, b=1.5)), (1.5 * x).clamp(0, 1))
    m = grayscale(x).mean(dim=(1, 2, 3, 4), keepdim=True)  # one mean per view, over all its frames
    assert torch.allclose(apply_photometric(x, _params(2, c=0.5)), (0.5 * x + 0.5 * m).clamp(0, 1))
    gray = apply_photometric(x, _params(2, s=0.0))
    assert torch.allclose(gray[:, 0], gray[:, 1]) and torch.allclose(gray[:, 1], gray[:, 2])


def test_hue_matches_colorsys_and_grayscale_matches_luma():
    x = torch.rand(1, 3, 1, 3, 4, dtype=torch.float64)
    out = apply_photometric(x, _params(1, h=0.25))
    for y in range(3):
        for w in range(4):
            h, s, v = colorsys.rgb_to_hsv(*x[0, :, 0, y, w].tolist())
            ref = colorsys.hsv_to_rgb((h + 0.25) % 1.0, s, v)
            assert torch.allclose(out[0, :, 0, y, w], torch.tensor(ref, dtype=torch.float64), atol=1e-6)
    hsv = rgb_to_hsv(x)
    assert torch.allclose(hsv_to_rgb(hsv), x, atol=1e-12)
    g = apply_photometric(x, _params(1, jitter=0.0, gray=1.0))
    luma = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    assert all(torch.allclose(g[:, c], luma) for c in range(3))


def test_normalize_is_imagenet_on_channel_dim_minus_four():
    x = torch.randint(0, 256, (2, 3, 4, 5, 6), dtype=torch.uint8)
    out = normalize(x)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1, 1)
    assert torch.allclose(out, (x.float() / 255 - mean) / std)
    assert torch.allclose(normalize(x.float() / 255), out)
    with pytest.raises(ValueError, match="channel dim -4"):
        normalize(torch.zeros(2, 4, 5, 6, 3))
