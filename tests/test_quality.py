"""Issue 11's instruments: the benchmark's learnability knobs, the linear probe on CLS, the quality scripts.

The accuracies themselves are benchmarks (``bench/quality.md``); these tests check properties.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from levjepa.data import SyntheticConfig
from levjepa.data.synthetic import _trajectory, load_image_pool, load_split, sample_params
from levjepa.eval.benchmark import PROBES, EvalConfig, LabelledSplits, evaluate_features
from levjepa.eval.features import Features

ROOT = Path(__file__).resolve().parents[1]
SMALL = SyntheticConfig(size=32, num_frames=8, num_train=64, num_val=16, num_test=16, image_source="digits")


@pytest.mark.parametrize("object_scale", [0.3, 0.55])
def test_inside_boundary_keeps_the_whole_object_in_every_frame(object_scale):
    cfg = replace(SMALL, boundary="inside", object_scale=object_scale, num_train=512)
    pool = load_image_pool(cfg)
    side = round(object_scale * cfg.size)
    obj, _ = _trajectory(cfg, sample_params(cfg, "train", pool))  # [N, T, 2] top-left, before wrapping
    top_left = torch.round(obj)
    assert (top_left >= 0).all() and (top_left <= cfg.size - side).all()  # never cut by an edge, never wrapped
    free = cfg.size - side  # starts spread over the free range, not pinned to one side
    assert obj[:, 0].min() < 0.2 * free and obj[:, 0].max() > 0.8 * free
    wrap = replace(cfg, boundary="wrap")
    obj, _ = _trajectory(wrap, sample_params(wrap, "train", pool))
    outside = ((obj < 0) | (obj > cfg.size - side)).any(-1).any(-1)
    assert outside.float().mean() > 0.3  # the knob matters: wrapping objects cross an edge in many clips


def test_inside_boundary_refuses_a_trajectory_that_cannot_fit():
    cfg = replace(SMALL, boundary="inside", object_scale=0.8, speed=0.25, friction=1.0)
    with pytest.raises(ValueError, match="boundary='inside'"):
        load_split(cfg, "val")


def test_background_value_sets_the_background_brightness():
    cfg = replace(SMALL, texture_contrast=0.0, background_value=(0.05, 0.1))
    clips = load_split(cfg, "val").clips.float() / 255  # [N, 3, T, S, S]
    corner = clips[:, :, 0, 0, 0].amax(1)  # HSV value = max channel of the flat background (corner pixel)
    object_free = corner < 0.5  # the object may cover a corner; skip those
    assert object_free.sum() > 5 and (corner[object_free] <= 0.1 + 1 / 255).all()
    with pytest.raises(ValueError, match="background_value"):
        replace(SMALL, background_value=(0.5, 0.2))


def test_linear_probe_on_cls_reads_the_cls_and_mean_probe_the_patches():
    gen = torch.Generator().manual_seed(0)
    n, d, c = {"train": 240, "val": 80, "test": 80}, 16, 4
    feats, labels = {}, {}
    for split, size in n.items():
        y = torch.randint(0, c, (size,), generator=gen)
        cls = torch.randn(size, d, generator=gen)
        cls[torch.arange(size), y] += 4.0  # the label is written in the CLS only
        mean = torch.randn(size, d, generator=gen)  # pooled patches: noise
        feats[split] = Features(cls, mean, None)
        labels[split] = {"task": y}
    splits = LabelledSplits({s: torch.zeros(k, 1) for s, k in n.items()}, labels, {"task": c}, "test", "k")
    assert "linear_cls" in PROBES
    res = evaluate_features(feats, splits, EvalConfig(tasks=("task",), probes=("linear_cls", "linear", "knn")))
    assert res["task"]["linear_cls"].reported > 95.0
    assert res["task"]["knn"].reported > 90.0  # kNN reads the CLS too
    assert res["task"]["linear"].reported < 50.0  # chance is 25 %: the mean-pool probe sees only noise


def _run_quality(tmp_path: Path, *args: str, overrides: tuple[str, ...] = ()) -> dict:
    tiny = ["model.dim=32", "model.depth=1", "model.heads=2", "model.proj_hidden=64", "model.proj_dim=8",
            "data.synthetic.num_train=32", "data.synthetic.num_val=16", "data.synthetic.num_test=16",
            "data.synthetic.num_frames=4", "data.num_frames=4", "data.batch_size=8", "train.batch_size=8",
            "data.num_workers=0"]  # fmt: skip
    cmd = [sys.executable, str(ROOT / "bench" / "quality.py"), *args, "--out", str(tmp_path), "--threads", "1"]
    subprocess.run([*cmd, *tiny, *overrides], check=True, capture_output=True, text=True, cwd=tmp_path)
    return json.loads((tmp_path / "quality.json").read_text())


def test_supervised_ceiling_script_trains_and_probes_on_a_smoke_budget(tmp_path):
    out = _run_quality(tmp_path, "supervised", "--steps", "3", "--probes", "linear_cls,knn")
    assert out["kind"] == "supervised" and out["steps"] == 3
    assert len(out["log"]) >= 1 and set(out["log"][0]) == {"step", "appearance", "motion", "arrow"}
    acc = out["accuracy"]
    assert set(acc) == {"supervised", "random init"}
    for per_task in acc.values():
        assert set(per_task) == {"appearance", "motion", "arrow"}
        for probes in per_task.values():
            assert set(probes) == {"linear_cls", "knn"}
            assert all(0.0 <= v <= 100.0 for v in probes.values())
    assert out["info"]["split_sizes"]["test"] == 16  # reported on the test split


def test_ssl_script_probes_each_requested_checkpoint(tmp_path):
    out = _run_quality(tmp_path, "ssl", "--eval-at", "2", "--probes", "linear_cls", overrides=("train.steps=4",))
    assert [int(s) for s in out["curve"]] == [2, 4]
    assert set(out["curve"]["2"]["accuracy"]) == {"EMA @ 2"}
    assert set(out["curve"]["4"]["accuracy"]) == {"EMA @ 4", "online", "random init"}
    assert out["last"]["loss"] is not None
