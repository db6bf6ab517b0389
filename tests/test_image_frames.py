"""Images as images (issue 54): ``ViewSpec.image_frames`` reads an image as that many frames instead of repeating
it to the clip's; ``--image-frames one|repeat`` is one option, one spelling, in ``extract``, ``probe`` and
``classify``. One slot is one frame at tubelet 1 and τ frames at tubelet τ; the probe's store and its kept probe
record it, ``classify`` reads it back (or as told), and an image batch never mixes with clips of another length."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from levjepa.cli import main
from levjepa.commands._images import image_frames
from levjepa.data.clip_augment import ViewKey
from levjepa.data.eval_clip import ViewSpec, load_train_views
from levjepa.eval.protocols import PROTOCOLS
from levjepa.formats.reading.classifier import read_classifier
from test_export import make_run_dir
from test_extract import _video


def _image(path, level, seed):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 60, (20, 30, 3)) + level
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path)


@pytest.fixture
def images(tmp_path, monkeypatch):
    """Index files of noisy images whose brightness is the class (0, 1, 2)."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "img"
    root.mkdir()
    out = []
    for split, n, seed in (("train", 12, 0), ("val", 6, 1), ("test", 9, 2)):
        lines = []
        for i in range(n):
            _image(root / f"{split}{i}.png", 70 * (i % 3), seed * 100 + i)
            lines.append(f"{split}{i}.png {i % 3}")
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
        out.append(root / f"{split}.txt")
    return out


def test_an_image_is_one_frame_or_repeated_in_every_view_path(tmp_path):
    _image(tmp_path / "i.png", 50, 0)
    path = str(tmp_path / "i.png")
    rep, one = ViewSpec(size=16, frames=4, segments=2, crops=3), ViewSpec(size=16, frames=4, segments=2, crops=3,
                                                                         image_frames=1)  # fmt: skip
    a, b = rep.load(path, 8), one.load(path, 8)
    assert a.shape == (6, 3, 4, 16, 16) and b.shape == (6, 3, 1, 16, 16)
    assert torch.equal(a[:, :, :1], b) and torch.equal(a, b.expand(-1, -1, 4, -1, -1))  # the same frame
    g = ViewKey(0, 0, 0)
    t1 = load_train_views(path, ViewSpec(size=16, frames=4, image_frames=2), 8, g)
    t2 = load_train_views(path, ViewSpec(size=16, frames=4), 8, ViewKey(0, 0, 0))
    assert t1.shape == (1, 3, 2, 16, 16) and torch.equal(t2[:, :, :2], t1)
    # a record without the field is the record it always was; one with it says so
    assert "image_frames" not in rep.fields() and one.fields()["image_frames"] == 1
    assert (
        one.describe().endswith("images as 1 frame") and rep.describe() == "4 frames every 2nd frame, 16 px, 2×3 views"
    )
    # the option: one slot is the tubelet's frames; repeat is the paper's protocol
    assert image_frames(rep, "one", 2).image_frames == 2 and image_frames(one, "repeat", 1).image_frames is None
    assert image_frames(one, None, 1) == one
    in1k = PROTOCOLS["in1k"]
    views = in1k.views(2, ViewSpec(image_frames=2))
    assert views.frames == 16 and views.image_frames == 2
    assert "images as 1 slot (2 frame(s))" in in1k.describe(views, 8, 2)
    with pytest.raises(ValueError, match="image_frames=0"):
        ViewSpec(image_frames=0)


def test_probe_and_classify_read_images_as_one_frame_and_say_so(tmp_path, images, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    out = tmp_path / "res" / "probe.json"
    task = "index:" + ",".join(map(str, images))
    args = ["probe", str(run), "--task", task, "--no-baseline", "--workers", "0", "--size", "16", "--frames", "4"]
    assert main([*args, "--probe", "linear", "--image-frames", "one", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "images as 1 frame" in said
    stores = sorted((tmp_path / "res" / "features").rglob("store.json"))  # beside --out
    assert stores and all(json.loads(p.read_text())["config"]["image_frames"] == 1 for p in stores)
    kept = run / "probes" / "img" / "linear"
    assert read_classifier(kept).protocol.image_frames == 1
    reported = json.loads(out.read_text())["results"]["pretrained-ema"]["img"]["linear"]["best"]["test_acc"]
    preds = tmp_path / "p.jsonl"
    assert main(["classify", str(kept), str(images[2]), "--workers", "0", "--out", str(preds)]) == 0
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    acc = 100.0 * sum(r["classes"][0] == r["truth"] for r in rows) / len(rows)
    assert acc == pytest.approx(reported, abs=1e-9)  # the record's one frame: the probe's own numbers
    err = capsys.readouterr().err
    assert "images as 1 frame (the classifier's own)" in err
    # classify as told: the images repeated to the probe's 4 frames, and an image beside a video (own batches)
    video = tmp_path / "v.mp4"
    _video(video, 8, h=16, w=16)
    assert main(["classify", str(kept), str(images[2]), str(video), "--workers", "0", "--image-frames", "one"]) == 0
    assert main(["classify", str(kept), str(images[2]), "--workers", "0", "--image-frames", "repeat"]) == 0
    assert "16 px (--image-frames as given)" in capsys.readouterr().err
    # the built-in benchmark's clips are the run's: the option is refused there, in one line
    assert main(["probe", str(run), "--task", "appearance", "--image-frames", "one"]) == 2
    assert "--image-frames" in capsys.readouterr().err


def test_a_store_of_one_frame_images_beside_videos_is_refused_in_one_line(tmp_path, images, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    _video(tmp_path / "img" / "v.mp4", 8, h=16, w=16)
    mixed = tmp_path / "img" / "mixed.txt"
    mixed.write_text(images[0].read_text() + "v.mp4 0\n")
    task = f"index:{mixed},{images[1]}"
    args = ["probe", str(run), "--task", task, "--no-baseline", "--workers", "0", "--size", "16", "--frames", "4"]
    assert main([*args, "--probe", "linear", "--image-frames", "one"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "images as 1 frame(s) beside videos of 4" in err


def test_the_plan_counts_an_images_tokens_as_it_is_read(tmp_path, images, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    task = "index:" + ",".join(map(str, images))
    args = ["probe", str(run), "--task", task, "--no-baseline", "--workers", "0", "--size", "16", "--frames", "4"]
    disk = {}
    for mode in ("one", "repeat"):
        assert main([*args, "--probe", "attentive", "--image-frames", mode, "--plan"]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("disk in all")]
        disk[mode] = line
    # 27 images; a view: (1 + slots · 2 · 2) float16 tokens of D = 32, plus CLS and mean in float32 (256 bytes)
    assert disk["one"].startswith(f"disk in all: {27 * ((1 + 4) * 64 + 256) / 1e3:.1f} kB")
    assert disk["repeat"].startswith(f"disk in all: {27 * ((1 + 16) * 64 + 256) / 1e3:.1f} kB")
