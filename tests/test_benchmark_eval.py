"""Frozen evaluation end to end: features keep every token, images are repeated along time, the encoder runs
in eval mode without gradients and is bit-identical afterwards; the benchmark table and JSON are complete."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from levjepa.commands import probe as cli_probe
from levjepa.config import apply_overrides
from levjepa.data import SyntheticConfig
from levjepa.data.eval_clip import as_clip
from levjepa.eval import EvalConfig, evaluate_benchmark
from levjepa.eval.probes import probe_config
from levjepa.features.cache import cached_features, compute_features
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config
from levjepa.weights import weights_fingerprint
from test_export import make_run_dir

TINY = ["size=16", "num_frames=4", "num_train=64", "num_val=24", "num_test=32"]


def _tiny_cfg() -> SyntheticConfig:
    return apply_overrides(SyntheticConfig(), TINY)


def test_features_see_every_token_and_images_repeat_along_time():
    enc = random_encoder(encoder_config("vit-test"), seed=0).encoder
    gen = torch.Generator().manual_seed(0)
    clips = torch.randint(0, 256, (3, 3, 4, 16, 24), generator=gen, dtype=torch.uint8)
    f = compute_features(enc, clips, batch_size=2)
    assert f.tokens.shape == (3, 1 + 4 * 2 * 3, 32) and f.tokens.dtype == torch.float16  # CLS + every patch
    torch.testing.assert_close(f.tokens[:, 0].float(), f.cls, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(f.tokens[:, 1:].float().mean(1), f.mean, rtol=1e-3, atol=1e-3)
    images = clips[:, :, 0]  # [N, C, H, W]
    fi = compute_features(enc, images, num_frames=4)
    fr = compute_features(enc, images[:, :, None].repeat(1, 1, 4, 1, 1))
    torch.testing.assert_close(fi.cls, fr.cls) and torch.testing.assert_close(fi.mean, fr.mean)
    assert as_clip(images, 4).shape == (3, 3, 4, 16, 24)
    with pytest.raises(ValueError, match="uint8"):
        compute_features(enc, clips.int())


def test_features_are_cached_by_weights_and_data(tmp_path):
    enc = random_encoder(encoder_config("vit-test"), seed=0).encoder
    other = random_encoder(encoder_config("vit-test"), seed=1).encoder
    clips = torch.randint(0, 256, (2, 3, 2, 16, 16), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    a = cached_features(enc, clips, key="k", cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 1
    b = cached_features(enc, clips, key="k", cache_dir=tmp_path)  # read back, not recomputed
    assert torch.equal(a.cls, b.cls) and torch.equal(a.tokens, b.tokens)
    cached_features(other, clips, key="k", cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2 and weights_fingerprint(enc) != weights_fingerprint(other)


def test_probing_leaves_the_encoder_bit_identical_and_runs_it_frozen():
    enc = random_encoder(encoder_config("vit-test"), seed=0).encoder
    enc.train()  # e.g. the trainer's live online encoder
    enc.requires_grad_(True)
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    seen = []
    enc.blocks[0].register_forward_hook(lambda m, i, o: seen.append((m.training, torch.is_grad_enabled())))
    cfg = probe_config("demo", epochs=2, linear_epochs=2)
    res = evaluate_benchmark({"enc": enc}, _tiny_cfg(), EvalConfig(budget="demo", probe=cfg))
    assert seen and all(mode == (False, False) for mode in seen)  # eval() and no grad at every forward
    after = enc.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert (
        enc.training
        and all(p.requires_grad for p in enc.parameters())
        and all(p.grad is None for p in enc.parameters())
    )
    assert set(res.results["enc"]) == {"appearance", "motion", "arrow"}


def test_benchmark_table_and_json_name_source_clip_and_keep_the_grid():
    encs = {n: random_encoder(encoder_config("vit-test"), seed=s).encoder for n, s in (("a", 0), ("b", 1))}
    cfg = probe_config("demo", epochs=2, linear_epochs=2)
    evaluation = EvalConfig(tasks=("motion", "arrow"), probes=("linear", "knn"), probe=cfg)
    res = evaluate_benchmark(encs, _tiny_cfg(), evaluation)
    table = res.table()
    assert res.info["image_source"] in table and "4×16×16 (T×H×W)" in table and "64/24/32" in table
    assert "| motion | linear (mean) |" in table and "| arrow | kNN (CLS) |" in table and "chance" in table
    js = res.to_json()
    assert set(js["accuracy"]) == {"a", "b"}
    grid = js["results"]["a"]["motion"]["linear"]["grid"]
    assert len(grid) == len(cfg.grid("linear")) and all("test_acc" in g for g in grid)
    assert 0 <= js["accuracy"]["b"]["arrow"]["knn"] <= 100
    with pytest.raises(ValueError, match="valid tasks"):
        evaluate_benchmark(encs, _tiny_cfg(), EvalConfig(tasks=("colour",)))
    with pytest.raises(ValueError, match="valid choices are attentive, linear, linear_cls, knn"):
        EvalConfig(probes=("svm",))


def test_probe_command_with_baseline_and_both_weights(tmp_path, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    out = tmp_path / "probe.json"
    parser = argparse.ArgumentParser()
    cli_probe.add_arguments(parser)
    syn = [a for kv in TINY for a in ("--synthetic", kv)]
    args = parser.parse_args(
        [
            str(run),
            "--task",
            "arrow",
            "--weights",
            "both",
            "--probe",
            "linear,knn",
            "--set",
            "linear_epochs=2",
            "--out",
            str(out),
            *syn,
        ]
    )
    assert cli_probe.main(args) == 0
    text = capsys.readouterr().out
    assert "pretrained-ema" in text and "pretrained-online" in text and "random-init" in text
    js = json.loads(out.read_text())
    assert set(js["accuracy"]) == {"pretrained-ema", "pretrained-online", "random-init"}
    assert js["info"]["encoders"]["random-init"].startswith("random")


def test_probe_command_on_a_labelled_index_reports_bad_files(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from levjepa.data import write_video

    media = tmp_path / "media"
    media.mkdir()
    rows = {"train": [], "val": [], "test": []}
    gen = np.random.default_rng(0)
    for split, n in (("train", 8), ("val", 4), ("test", 4)):
        for i in range(n):
            label = i % 2
            base = np.array([200, 40, 40] if label == 0 else [40, 40, 200], np.uint8)
            frames = np.clip(base + gen.integers(-30, 30, (12, 16, 16, 3)), 0, 255).astype(np.uint8)
            path = media / f"{split}{i}.mp4"
            write_video(path, frames, fps=10)
            rows[split].append(f"{path.name} {label}")
    Image.fromarray(np.full((16, 16, 3), [200, 40, 40], np.uint8)).save(media / "red.png")
    rows["train"] += ["red.png 0", "missing.mp4 1"]
    for split, lines in rows.items():
        (media / f"{split}.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "res" / "probe.json"
    run = make_run_dir(tmp_path, steps=(5,))
    parser = argparse.ArgumentParser()
    cli_probe.add_arguments(parser)
    task = "index:" + ",".join(str(media / f"{s}.csv") for s in ("train", "val", "test"))
    args = parser.parse_args(
        [str(run), "--task", task, "--probe", "knn,linear", "--frames", "4", "--size", "16", "--out", str(out)]
    )
    assert cli_probe.main(args) == 0
    said = capsys.readouterr()
    text = said.out
    assert [line for line in said.err.splitlines() if "missing.mp4" in line] == [
        f"bad file skipped: {media / 'missing.mp4'} does not exist"
    ]  # one line per bad file, then skipped
    name = media.name  # the task is named by the folder of its generic train.csv
    assert f"| {name} | kNN (CLS) |" in text and "1 unreadable file(s) skipped" in text
    js = json.loads(out.read_text())
    assert js["info"]["split_sizes"] == {"train": 9, "val": 4, "test": 4}
    assert js["accuracy"]["pretrained-ema"][name]["knn"] == 100.0  # colour separates the classes
    bad = json.loads((out.parent / "bad_files.json").read_text())
    assert bad["total"] == 1 and bad["files"][0]["path"].endswith("missing.mp4")
