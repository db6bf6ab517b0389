"""V-JEPA's frozen-evaluation training transform (issue 65, ``levjepa.data.clip_augment``) against the reference's
definition: timm's ``rand-m7-n4-mstd0.5-inc1`` (op frequencies, magnitude histogram, signs, the level-to-argument
rules), the ops themselves against PIL (the library the reference's ops call), the same op on every frame, the crop's
areas and aspects, the erased areas, V-JEPA 2's temporal starts, and that nothing is ever flipped."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from levjepa.data import clip_augment as ca
from levjepa.rng import make_generator

N = 6000  # clips drawn for the distribution tests


def _draws() -> list[list[ca.OpDraw]]:
    g = make_generator("test-randaugment")
    return [ca.draw_ops(ca.RandAugment(), g) for _ in range(N)]


def test_op_choice_frequencies_and_application_probability_are_timms():
    draws = _draws()
    # each of the 4 layers picks one of 15 ops uniformly (with replacement) and applies it with p = 0.5:
    # the number applied per clip is Binomial(4, 0.5), each op's count per clip has mean 4 · 0.5 / 15
    applied = np.bincount([len(d) for d in draws], minlength=5) / N
    expected = np.array([math.comb(4, k) / 16 for k in range(5)])
    assert np.abs(applied - expected).max() < 0.02
    counts = np.array([sum(o.name == name for d in draws for o in d) for name in ca.OPS]) / N
    se = math.sqrt(4 * (0.5 / 15) * (1 - 0.5 / 15) / N)
    assert np.abs(counts - 4 * 0.5 / 15).max() < 4.5 * se, counts
    assert set(ca.OPS) == {o.name for d in draws for o in d} and len(ca.OPS) == 15


def test_magnitudes_are_normal_around_7_with_std_half_and_signs_are_fair():
    ops = [o for d in _draws() for o in d]
    m = np.array([o.magnitude for o in ops])
    assert abs(m.mean() - 7.0) < 0.02 and abs(m.std() - 0.5) < 0.02
    # the histogram against N(7, 0.5): the share within 1 and 2 standard deviations
    assert abs(np.mean(np.abs(m - 7) < 0.5) - 0.6827) < 0.02 and abs(np.mean(np.abs(m - 7) < 1) - 0.9545) < 0.01
    signed = [o.sign for o in ops if o.name in ca.SIGNED]
    assert abs(np.mean(np.array(signed) < 0) - 0.5) < 0.02
    assert all(o.sign == 1 for o in ops if o.name not in ca.SIGNED)
    assert {"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel", "ColorIncreasing",
                         "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"} == ca.SIGNED  # fmt: skip


def test_level_to_argument_rules_at_magnitude_7():
    arg = {name: ca.op_argument(ca.OpDraw(name, 7.0, -1)) for name in ca.OPS}
    assert arg["Rotate"] == pytest.approx(-21.0) and arg["ShearX"] == pytest.approx(-0.21)
    assert arg["TranslateXRel"] == pytest.approx(-0.315)
    assert arg["PosterizeIncreasing"] == 2 and arg["SolarizeIncreasing"] == 256 - 179 and arg["SolarizeAdd"] == 77
    assert arg["ColorIncreasing"] == pytest.approx(1 - 0.63) and arg["SharpnessIncreasing"] == pytest.approx(0.37)
    assert ca.op_argument(ca.OpDraw("BrightnessIncreasing", 10.0, 1)) == pytest.approx(1.9)
    assert ca.op_argument(ca.OpDraw("PosterizeIncreasing", 5.4)) == 2 and ca.op_argument(ca.OpDraw("Invert", 7)) == 0


def _frames(t: int = 3, h: int = 20, w: int = 28, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(30, 200, (t, h // 4, w // 4, 3), generator=g).float()
    up = torch.nn.functional.interpolate(base.permute(0, 3, 1, 2), size=(h, w), mode="bilinear")
    noise = torch.randint(-20, 21, (t, 3, h, w), generator=g)
    return (up + noise).clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def _pil(frame: torch.Tensor, name: str, arg: float) -> np.ndarray:
    img = Image.fromarray(frame.numpy())
    if name == "AutoContrast":
        out = ImageOps.autocontrast(img)
    elif name == "Equalize":
        out = ImageOps.equalize(img)
    elif name == "Invert":
        out = ImageOps.invert(img)
    elif name == "PosterizeIncreasing":
        out = ImageOps.posterize(img, int(arg))
    elif name == "SolarizeIncreasing":
        out = ImageOps.solarize(img, arg)
    elif name == "SolarizeAdd":
        lut = [min(255, i + int(arg)) if i < 128 else i for i in range(256)]
        out = img.point(lut * 3)
    else:
        enhance = {
            "ColorIncreasing": ImageEnhance.Color,
            "ContrastIncreasing": ImageEnhance.Contrast,
            "BrightnessIncreasing": ImageEnhance.Brightness,
            "SharpnessIncreasing": ImageEnhance.Sharpness,
        }
        out = enhance[name](img).enhance(arg)  # fmt: skip
    return np.asarray(out).astype(np.int64)


@pytest.mark.parametrize("name", [o for o in ca.OPS if o not in ("Rotate", "ShearX", "ShearY", "TranslateXRel",
                                                                    "TranslateYRel")])  # fmt: skip
@pytest.mark.parametrize("sign", [1, -1])
def test_colour_ops_equal_pil_on_every_frame(name, sign):
    frames = _frames()
    frames[2] = frames[2] // 2 + 60  # another histogram: the data-dependent ops read each frame's own
    draw = ca.OpDraw(name, 6.3, sign if name in ca.SIGNED else 1)
    out = ca.apply_op(frames, draw).long().numpy()
    for t in range(len(frames)):
        ref = _pil(frames[t], name, ca.op_argument(draw))
        assert np.abs(out[t] - ref).max() <= 1, (name, t)  # PIL's fixed-point rounding: at most one level
        assert np.mean(out[t] == ref) > 0.97, (name, t)


@pytest.mark.parametrize("name", ["Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"])
def test_geometric_ops_follow_pils_affine_map(name):
    frames = _frames(t=2, h=24, w=32)
    draw = ca.OpDraw(name, 7.0, -1)
    arg = ca.op_argument(draw)
    out = ca.apply_op(frames, draw).long().numpy()
    for t in range(2):
        img = Image.fromarray(frames[t].numpy())
        if name == "Rotate":
            ref = img.rotate(arg, resample=Image.BICUBIC, fillcolor=(128, 128, 128))
        else:
            w, h = img.size
            data = {
                "ShearX": (1, arg, 0, 0, 1, 0),
                "ShearY": (1, 0, 0, arg, 1, 0),
                "TranslateXRel": (1, 0, arg * w, 0, 1, 0),
                "TranslateYRel": (1, 0, 0, 0, 1, arg * h),
            }[name]
            ref = img.transform(img.size, Image.AFFINE, data, resample=Image.BICUBIC, fillcolor=(128, 128, 128))
        diff = np.abs(out[t] - np.asarray(ref).astype(np.int64))
        assert np.median(diff) <= 3 and diff.mean() < 8, (name, diff.mean())  # bicubic kernels differ slightly
    # an integer translation is a shift, the uncovered columns grey
    shift = ca.apply_op(frames, ca.OpDraw("TranslateXRel", 10 * 8 / 32 / 0.45, 1)).long()
    assert torch.equal(shift[:, :, : 32 - 8], frames[:, :, 8:].long()) and (shift[:, :, 32 - 8 :] == 128).all()


def test_every_frame_of_a_clip_gets_the_same_op():
    one = _frames(t=1, seed=3)
    clip = one.expand(5, -1, -1, -1).contiguous()
    g = make_generator("same-op")
    for _ in range(40):
        for draw in ca.draw_ops(ca.RandAugment(), g):
            out = ca.apply_op(clip, draw)
            assert all(torch.equal(out[t], out[0]) for t in range(5)), draw
            assert torch.equal(out[:1], ca.apply_op(one, draw))
    # and the whole transform: a clip of one repeated frame stays one repeated frame, erasing noise aside
    for view in range(30):
        key = ca.ViewKey(0, 1, view)
        x = ca.train_transform(clip, 16, key)
        box = ca.erase_box(16, 16, key.generator("erase"))
        keep = torch.ones(16, 16, dtype=torch.bool)
        if box is not None:
            top, left, h, w = box
            keep[top : top + h, left : left + w] = False
        assert all(torch.equal(x[t][keep], x[0][keep]) for t in range(5))


def test_crop_areas_and_aspects_follow_the_reference():
    g = make_generator("crop-test")
    h, w = 96, 128
    boxes = [ca.crop_box(h, w, g) for _ in range(N)]
    area = np.array([bh * bw / (h * w) for _, _, bh, bw in boxes])
    aspect = np.log([bw / bh for _, _, bh, bw in boxes])
    # accepted tries: area ~ U(0.08, 1) truncated where the box does not fit, aspect log-uniform in [3/4, 4/3]
    assert area.min() >= 0.075 and area.max() <= 1.0 and np.all(np.abs(aspect) <= math.log(4 / 3) + 0.05)
    small = area < 0.5  # boxes that always fit: their area is uniform on [0.08, 0.5]
    hist = np.histogram(area[small], bins=6, range=(0.08, 0.5))[0] / small.sum()
    assert np.abs(hist - 1 / 6).max() < 0.025
    lo = aspect[small]
    assert abs(np.mean(lo < 0)) - 0.5 < 0.03 and abs(lo.std() - math.log(4 / 3) / math.sqrt(3)) < 0.01
    assert all(0 <= t <= h - bh and 0 <= le <= w - bw for t, le, bh, bw in boxes)


def test_erasing_probability_area_and_aspect():
    g = make_generator("erase-test")
    boxes = [ca.erase_box(64, 64, g) for _ in range(N)]
    hit = [b for b in boxes if b is not None]
    assert abs(len(hit) / N - 0.25) < 0.02
    area = np.array([bh * bw / 64**2 for _, _, bh, bw in hit])
    assert area.min() >= 0.015 and area.max() <= 1 / 3 + 0.02
    assert abs(area.mean() - (0.02 + 1 / 3) / 2) < 0.02  # U(0.02, 1/3) where it fits (almost always here)
    aspect = np.log([bh / bw for _, _, bh, bw in hit])
    assert np.all(np.abs(aspect) <= math.log(1 / 0.3) + 0.2) and abs(np.mean(aspect)) < 0.05


def test_the_erased_box_is_one_box_through_time_filled_with_normal_noise():
    clip = torch.full((4, 32, 32, 3), 100, dtype=torch.uint8)
    for view in range(2000):  # a box and no op: 1/4 · 1/16 of the views
        key = ca.ViewKey(5, 0, view)
        box = ca.erase_box(32, 32, key.generator("erase"))
        if box is None or ca.draw_ops(ca.RandAugment(), key.generator("randaugment")):
            continue  # only clips RandAugment leaves alone: the constant frame stays constant outside the box
        x = ca.train_transform(clip, 32, key).float()
        top, left, h, w = box
        inside = x[:, top : top + h, left : left + w]
        outside = x.clone()
        outside[:, top : top + h, left : left + w] = 100
        assert (outside == 100).all()  # nothing else changed: one box, the same in every frame
        z = (inside / 255 - torch.tensor(ca.IMAGENET_MEAN)) / torch.tensor(ca.IMAGENET_STD)
        assert abs(z.mean()) < 0.3 and 0.7 < z.std() < 1.1  # N(0, 1) in the normalised space (clipped tails)
        assert not torch.equal(inside[0], inside[1])  # fresh noise per frame
        return
    raise AssertionError("no clip with a box and no op in 2000 views")


def test_no_view_is_ever_flipped():
    # a horizontal ramp: a flip would make it decrease; RandAugment off, every crop keeps it increasing
    ramp = torch.arange(64, dtype=torch.float32).mul(3).expand(32, 64)
    clip = torch.stack([ramp] * 3, -1).to(torch.uint8)[None].expand(2, -1, -1, -1).contiguous()
    checked = 0
    for view in range(1200):  # views with no op and no box: 1/16 · 3/4 of them
        key = ca.ViewKey(0, 0, view)
        if ca.draw_ops(ca.RandAugment(), key.generator("randaugment")):
            continue
        x = ca.train_transform(clip, 16, key).float()
        if ca.erase_box(16, 16, key.generator("erase")) is None:
            assert (x[0, 8, 1:, 0] >= x[0, 8, :-1, 0]).all()
            checked += 1
    assert checked > 30


def test_vjepa2_temporal_starts():
    g = make_generator("starts")
    # partitions longer than the clip: segment i starts uniformly in [i·P, i·P + P − L − 1]
    starts = np.array([ca.train_starts(300, 16, 4, 2, g) for _ in range(2000)])
    assert starts[:, 0].min() == 0 and starts[:, 0].max() == 150 - 64 - 1
    assert starts[:, 1].min() == 150 and starts[:, 1].max() == 150 + 150 - 64 - 1
    assert abs(starts[:, 0].mean() - (150 - 64 - 1) / 2) < 2
    # shorter partitions: fixed starts i·⌊(N − L)/(S − 1)⌋, no draw
    assert ca.train_starts(100, 16, 4, 2, g) == [0, 36] and ca.train_starts(100, 16, 4, 3, g) == [0, 18, 36]
    assert ca.train_starts(50, 16, 4, 2, g) == [0, 0]  # shorter than one clip: every segment from 0 (padded)
    one = {ca.train_starts(100, 16, 4, 1, g)[0] for _ in range(300)}
    assert min(one) == 0 and max(one) == 100 - 64 - 1
