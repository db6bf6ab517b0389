"""Long evaluation passes are never silent off a terminal (a SLURM .out file): one line at the end, and every
``every`` seconds between; nothing when progress is off."""

from __future__ import annotations

import torch

from levjepa.data.progress import Progress
from levjepa.features.cache import compute_features
from levjepa.model import VideoEncoder, encoder_config


def test_lines_off_a_terminal_and_none_when_off(capsys):
    bar = Progress(4, "store", "file", every=0.0)
    for _ in range(4):
        bar.update(1, "7 rows")
    bar.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 5 and lines[-1].startswith("store: 4/4 files  7 rows") and "eta" in lines[-1]
    quiet = Progress(4, "store", "file", show=False, every=0.0)
    quiet.update(4)
    quiet.close()
    assert capsys.readouterr().err == ""


def test_the_benchmarks_feature_pass_reports_off_a_terminal(capsys):
    enc = VideoEncoder(encoder_config("vit-test")).eval()
    clips = torch.randint(0, 255, (5, 3, 4, 16, 16), dtype=torch.uint8)
    compute_features(enc, clips, batch_size=2, num_frames=4, progress=True, desc="appearance train")
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("appearance train: 5/5 clips")
