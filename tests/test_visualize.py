"""Visualisation: PCA colours group tokens of the same kind, cosine maps peak at the query, and the tool
writes a PNG/GIF of the right size with non-constant content."""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from PIL import Image

from levjepa.commands import visualize as visualize_cmd
from levjepa.formats.reading.load import random_encoder
from levjepa.formats.writing.export import export_encoder
from levjepa.model import encoder_config
from levjepa.tools import visualize as vis
from test_export import make_run_dir


def test_pca_colours_follow_the_feature_clusters():
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 16, generator=gen) * 5  # 4 centres span 3 directions: all 3 components are signal
    labels = torch.arange(80) % 4
    tokens = centres[labels] + 0.05 * torch.randn(80, 16, generator=gen)
    rgb, ratio = vis.pca_rgb(tokens)
    assert rgb.shape == (80, 3) and rgb.min() >= 0 and rgb.max() <= 1
    assert ratio[0] >= ratio[1] >= ratio[2] >= 0 and ratio.sum() <= 1 + 1e-6
    # within-cluster colour spread is tiny compared with the distance between cluster colours
    means = torch.stack([rgb[labels == k].mean(0) for k in range(4)])
    spread = max(float((rgb[labels == k] - means[k]).norm(dim=1).max()) for k in range(4))
    gap = min(float((means[i] - means[j]).norm()) for i in range(4) for j in range(i + 1, 4))
    assert spread < 0.1 * gap
    sim = vis.cosine_map(tokens, 4)
    assert sim[4] == torch.tensor(1.0) and sim.max() <= 1 + 1e-6
    assert sim[labels == labels[4]].min() > sim[labels != labels[4]].max()


def test_visualize_writes_images_of_the_right_size_with_content(tmp_path):
    enc = random_encoder(encoder_config("vit-test"), seed=0).encoder
    gen = torch.Generator().manual_seed(0)
    clip = torch.randint(0, 256, (3, 4, 32, 24), generator=gen, dtype=torch.uint8)
    clip[:, :, :16] //= 4  # a dark top half: some structure for the features
    summary = vis.visualize(enc, clip, tmp_path, query=(1, 2, 1), scale=2)
    png = Image.open(tmp_path / "visualize.png")
    t, h, w, gap = 4, 64, 48, 2
    assert png.size == (t * (w + gap) - gap, 3 * (h + gap) - gap)
    arr = np.asarray(png.convert("RGB")).astype(float)
    for row in range(3):  # input frames, PCA maps, similarity maps: none is flat
        band = arr[row * (h + gap) : row * (h + gap) + h]
        assert band.std() > 5, row
    gif = Image.open(tmp_path / "visualize.gif")
    assert gif.n_frames == t and gif.size == (3 * (w + gap) - gap, h)
    assert summary["token_grid"] == [4, 4, 3] and summary["query"] == [1, 2, 1]
    assert json.loads((tmp_path / "visualize.json").read_text())["files"]["png"].endswith("visualize.png")


def test_visualize_command_on_a_benchmark_clip(tmp_path, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    export_encoder(run, tmp_path / "export")
    parser = argparse.ArgumentParser()
    visualize_cmd.add_arguments(parser)
    args = parser.parse_args([str(tmp_path / "export"), "synthetic:1", "--out", str(tmp_path / "v"), "--no-gif"])
    assert visualize_cmd.main(args) == 0
    png = Image.open(tmp_path / "v" / "visualize.png")
    # 16 frames of 64 px shown at scale 2 (clips below 128 px are enlarged)
    assert png.size == (16 * (128 + 2) - 2, 3 * (128 + 2) - 2)
    assert not (tmp_path / "v" / "visualize.gif").exists()
    out = capsys.readouterr().out
    assert "pca_explained_variance_ratio" in out and "ema weights step 5" in out  # which copy it drew


def test_a_clip_cut_to_whole_tubelets_is_said_as_adjusted(tmp_path, capsys):
    # the benchmark's clip has 16 frames; an encoder of 3-frame tubelets reads 15 of them, and the note says so
    from levjepa.cli import main

    run = make_run_dir(tmp_path, tubelet=3)
    assert main(["visualize", str(run), "synthetic:0", "--frames", "3", "--out", str(tmp_path / "v"), "--no-gif"]) == 0
    assert "16 frames adjusted to 15, a whole number of tubelets (3 frames)" in capsys.readouterr().err
