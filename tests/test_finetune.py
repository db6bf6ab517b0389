"""``levjepa finetune``: a tiny encoder fine-tuned for a few steps resumes after an interruption bit-exactly,
its best classifier runs in ``levjepa classify`` and exports with ``id2label``; the recipe's pieces do what
their docstrings say; bad input ends in one line and leaves the source untouched."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil

import pytest
import torch

import levjepa.finetune.loop as ft_loop
from levjepa.cli import main
from levjepa.finetune.config import FinetuneConfig
from levjepa.formats.reading.classifier import load_classifier
from levjepa.formats.reading.load import load_encoder
from levjepa.model import encoder_config
from levjepa.model.classifier import HeadConfig, VideoClassifier
from levjepa.model.vit import VideoEncoder
from levjepa.rng import make_generator
from levjepa.train.finetune_recipe import DropPath, layer_id, lr_at, param_groups, soft_targets
from levjepa.weights import load_tensors, save_tensors
from test_classify import write_index
from test_export import make_run_dir

# 4 frames of 16 px, every augmentation and source of randomness on: mixup, drop-path, half the tokens
RECIPE = [
    "frames=4",
    "frame_stride=1",
    "size=16",
    "steps=4",
    "batch_size=4",
    "micro_batch=2",
    "warmup_steps=1",
    "eval_every=2",
    "checkpoint_every=2",
    "log_every=1",
    "workers=0",
    "loggers=",
    "mixup=0.8",
    "drop_path=0.2",
    "keep_ratio=0.5",
    "lr=1e-3",
]


@pytest.fixture
def task(tmp_path):
    media = tmp_path / "media"
    files = [write_index(media, s, n, seed) for s, n, seed in (("train", 6, 0), ("val", 3, 1), ("test", 3, 2))]
    return "index:" + ",".join(map(str, files))


def test_finetune_resumes_bit_exactly_and_classifies(tmp_path, task, monkeypatch, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = ["finetune", str(run), "--task", task, "--device", "cpu", *RECIPE]
    assert main([*args, "--out", str(whole)]) == 0
    original = ft_loop.train_step

    def killed_after_two(module, opt, batches, recipe, step, ctx):
        if step == 2:
            raise KeyboardInterrupt  # the job is killed after the step-2 checkpoint
        return original(module, opt, batches, recipe, step, ctx)

    monkeypatch.setattr(ft_loop, "train_step", killed_after_two)
    assert main([*args, "--out", str(cut)]) == 130
    assert sorted(p.name for p in (cut / "checkpoints").iterdir() if p.is_dir()) == ["step_000002"]
    monkeypatch.setattr(ft_loop, "train_step", original)
    assert main([*args, "--out", str(cut), "--resume"]) == 0
    a, _ = load_tensors(whole / "checkpoints/step_000004/model.safetensors")
    b, _ = load_tensors(cut / "checkpoints/step_000004/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start, _ = load_tensors(run / "checkpoints/step_000005/ema.safetensors")
    enc = {k[len("encoder.") :]: v for k, v in a.items() if k.startswith("encoder.")}
    assert any(not torch.equal(enc[k], start[f"encoder.{k}"]) for k in enc)  # the encoder itself trained
    lines = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines()]
    whole_lines = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in lines if "loss" in r]
    assert losses == [(r["step"], r["loss"]) for r in whole_lines if "loss" in r] and len(losses) == 4
    results = json.loads((whole / "results.json").read_text())
    assert results == json.loads((cut / "results.json").read_text())
    # the best classifier runs in classify, and classify's accuracy on the test index is results.json's
    capsys.readouterr()
    test_index = task.split(",")[2]
    assert main(["classify", str(whole / "best"), test_index, "--workers", "0", "--top-k", "2"]) == 0
    assert f"accuracy {results['test_acc']:.1f} %" in capsys.readouterr().out
    # export: the hub layout with id2label and the head beside the encoder; load() reads a plain encoder
    hub = tmp_path / "hub"
    assert main(["export", str(whole / "best"), "--out", str(hub)]) == 0
    config = json.loads((hub / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1", "2": "2"} and config["label2id"]["2"] == 2
    assert load_encoder(hub).config == load_encoder(whole / "best").config
    clf = load_classifier(hub)
    assert clf.record.labels == ("0", "1", "2")
    # the head is written once: the head.* of model.safetensors, which classify and transformers' names read
    tensors, _ = load_tensors(hub / "model.safetensors")
    head = {k[len("head.") :]: v for k, v in tensors.items() if k.startswith("head.")}
    assert not (hub / "head.safetensors").exists() and not (whole / "best" / "head.safetensors").exists()
    assert head.keys() == clf.model.head.state_dict().keys()
    assert all(torch.equal(v, clf.model.head.state_dict()[k]) for k, v in head.items())
    best = load_classifier(whole / "best").model.head.state_dict()
    assert all(torch.equal(v, best[k]) for k, v in head.items())
    # an export written before (the head in head.safetensors too) reads the same head
    old = tmp_path / "old"
    shutil.copytree(hub, old)
    save_tensors(old / "head.safetensors", head)
    assert all(torch.equal(v, head[k]) for k, v in load_classifier(old).model.head.state_dict().items())


def test_bad_input_is_one_line_and_leaves_the_source_alone(tmp_path, task, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}  # nothing below writes into the source run
    args = ["finetune", str(run), "--task", task, "--device", "cpu", *RECIPE]
    assert main([*args, "--out", str(run / "ft")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "inside (or holds) the source" in err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before
    one = tmp_path / "media" / "one.txt"
    one.write_text("train0.mp4 0\ntrain3.mp4 0\n")
    single = f"index:{one},{task.split(',')[1]}"
    assert main(["finetune", str(run), "--task", single, "--out", str(tmp_path / "o"), *RECIPE]) == 2
    assert "need >= 2 classes" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main([*args, "--out", str(tmp_path / "o2"), "steps=1", "eval_every=1", "checkpoint_every=1"]) == 0
    assert main([*args, "--out", str(tmp_path / "o2"), "--resume", "steps=2", "lr=0.1"]) == 2
    assert "--resume may change only" in capsys.readouterr().err
    # LP-FT from a kept probe: its head must be the one asked for
    probe = ["probe", str(run), "--task", task, "--no-baseline", "--workers", "0", "--size", "16", "--frames", "4"]
    assert main([*probe, "--probe", "linear", "--set", "linear_epochs=1", "--features", str(tmp_path / "f")]) == 0
    kept = run / "probes" / "media" / "linear"
    assert main([*args, "--out", str(tmp_path / "o3"), f"head_from={kept}"]) == 2  # attentive asked
    assert "head_from=" in capsys.readouterr().err and not (tmp_path / "o3").exists()
    lp_ft = [*args, "--out", str(tmp_path / "o4"), "--head", "linear", f"head_from={kept}", "steps=1"]
    assert main([*lp_ft, "eval_every=1", "checkpoint_every=1"]) == 0
    # a probe of the same width kept on another encoder (the run's online copy; fine-tuning starts from its EMA
    # copy) is refused by the weights fingerprint, before anything is written
    online = tmp_path / "probes_online"
    feats = str(tmp_path / "f2")
    probe_online = [*probe, "--weights", "online", "--probes-dir", str(online), "--features", feats]
    assert main([*probe_online, "--probe", "linear", "--set", "linear_epochs=1"]) == 0
    other = [*args, "--out", str(tmp_path / "o5"), "--head", "linear", f"head_from={online / 'media' / 'linear'}"]
    assert main(other) == 2
    err = capsys.readouterr().err
    assert "a head reads only the encoder it was trained on" in err and not (tmp_path / "o5").exists()


def test_recipe_pieces():
    cfg = FinetuneConfig(task=("a", "b"), steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-5, layer_decay=0.5)
    # levjepa's one schedule: from 0 at step 0 (VideoMAE's warm-up start) to lr at step warmup_steps
    sched = cfg.schedule
    assert lr_at(0, sched) == 0.0 and lr_at(5, sched) == pytest.approx(5e-4) and lr_at(10, sched) == pytest.approx(1e-3)
    assert (
        lr_at(100, sched) == pytest.approx(1e-5)
        and lr_at(99, sched) > 1e-5
        and lr_at(55, sched) == pytest.approx(0.5 * (1e-3 + 1e-5))
    )
    enc = VideoEncoder(encoder_config("vit-test"))
    model = VideoClassifier(enc, HeadConfig(dim=enc.cfg.dim, num_classes=3))
    assert layer_id("encoder.patch_embed.proj.weight", 2) == 0 and layer_id("encoder.blocks.1.attn.qkv.weight", 2) == 2
    assert layer_id("head.pool.query", 2) == 3 and layer_id("encoder.norm.weight", 2) == 3
    scales = {round(g["lr_scale"], 6) for g in param_groups(model, cfg.layer_decay, cfg.weight_decay)}
    assert scales == {0.125, 0.25, 0.5, 1.0}  # embedding, block 0, block 1, head and final norm
    y = soft_targets(torch.tensor([2, 0]), 3, 0.3)
    assert torch.allclose(y.sum(1), torch.ones(2)) and y[0, 2] == pytest.approx(0.8) and y[0, 0] == pytest.approx(0.1)


def test_drop_path_drops_whole_block_updates_only_in_training():
    enc = VideoEncoder(encoder_config("vit-test"))
    model = VideoClassifier(enc, HeadConfig(dim=enc.cfg.dim, num_classes=3)).train()
    x = torch.randn(4, 3, 2, 16, 16, generator=make_generator("test", "x"))
    plain = model(x)
    dp = DropPath(model, 0.9)
    assert dp.rates == [0.0, 0.9]  # rising with depth to the rate at the last block
    dp.generator = make_generator("test", "dp")
    dropped = model(x)
    assert not torch.allclose(dropped, plain)
    dp.generator = make_generator("test", "dp")
    assert torch.equal(model(x), dropped)  # the draws come from the generator only
    model.eval()
    assert torch.allclose(model(x), plain)  # never at evaluation
    dp.remove()
    model.train()
    assert torch.equal(model(x), plain)


def test_sigterm_during_finetune_checkpoints_exits_75_and_resumes_bit_exactly(tmp_path, task, monkeypatch, capsys):
    """A scheduler's SIGTERM at step 1 (checkpoints every 2): the step finishes, a checkpoint of step 1 is
    written, the command exits 75 (requeue), and --resume ends on the weights of an uninterrupted run."""
    import os
    import signal

    run = make_run_dir(tmp_path, steps=(5,))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = ["finetune", str(run), "--task", task, "--device", "cpu", *RECIPE]
    assert main([*args, "--out", str(whole)]) == 0
    original = ft_loop.train_step

    def signalled_in_step_one(module, opt, batches, recipe, step, ctx):
        out = original(module, opt, batches, recipe, step, ctx)
        if step == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the step runs: handled after it
        return out

    monkeypatch.setattr(ft_loop, "train_step", signalled_in_step_one)
    capsys.readouterr()
    assert main([*args, "--out", str(cut)]) == 75
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith("levjepa finetune: SIGTERM received") and f"`levjepa finetune --resume {cut}`" in said
    assert sorted(p.name for p in (cut / "checkpoints").iterdir() if p.is_dir()) == ["step_000001"]
    monkeypatch.setattr(ft_loop, "train_step", original)
    assert main(["finetune", "--resume", str(cut)]) == 0  # the line's command: the rest from cut/config.json
    a, _ = load_tensors(whole / "checkpoints/step_000004/model.safetensors")
    b, _ = load_tensors(cut / "checkpoints/step_000004/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (cut / "checkpoints" / "step_000004" / "ema.safetensors").exists()  # fine-tuning keeps no EMA


def test_finetune_keeps_the_newest_checkpoints_and_refuses_a_second_live_resume(tmp_path, task):
    """keep_last prunes the older checkpoints; while a process holds the run (its lock), a second
    `finetune --resume OUT` is refused in one line and rewrites nothing."""
    import subprocess
    import sys

    from levjepa.train.run_dir import RunLock
    from test_pretrain import SRC

    run = make_run_dir(tmp_path, steps=(5,))
    out = tmp_path / "ft"
    args = ["finetune", str(run), "--task", task, "--device", "cpu", *RECIPE, "checkpoint_every=1", "keep_last=2"]
    assert main([*args, "--out", str(out)]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir()) == ["step_000003", "step_000004"]
    config = (out / "config.json").read_text()
    holder = RunLock(out).acquire()  # a live process (this one) runs the directory
    try:
        env = {**os.environ, "PYTHONPATH": SRC}
        second = subprocess.run(
            [sys.executable, "-m", "levjepa", "finetune", "--resume", str(out), "steps=6"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
    finally:
        holder.release()
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1 and "is in use by another process" in lines[0]
    assert (out / "config.json").read_text() == config


def test_the_training_streams_workers_end_before_the_test_evaluation(tmp_path, task, monkeypatch):
    alive = []
    real = ft_loop._finish

    before = set(multiprocessing.active_children())  # earlier tests' processes (the suite's) are not this run's

    def finish(*args, **kwargs):  # the worker processes of this run still running at the test split
        alive.append([p for p in multiprocessing.active_children() if p not in before])
        return real(*args, **kwargs)

    monkeypatch.setattr(ft_loop, "_finish", finish)
    run = make_run_dir(tmp_path, steps=(5,))
    args = ["finetune", str(run), "--task", task, "--device", "cpu", "--out", str(tmp_path / "ft"), *RECIPE]
    assert main([*args, "workers=1", "steps=2", "eval_every=4"]) == 0
    assert alive == [[]]


def test_non_finite_steps_stop_a_finetune_with_its_own_remedies(tmp_path, task, monkeypatch, capsys):
    monkeypatch.setattr(ft_loop, "train_step", lambda *args: (torch.tensor(float("nan")), torch.tensor(True)))
    run = make_run_dir(tmp_path, steps=(5,))
    args = ["finetune", str(run), "--task", task, "--device", "cpu", "--out", str(tmp_path / "ft"), *RECIPE]
    assert main([*args, "max_consecutive_skips=2"]) == 1
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith("levjepa finetune: 2 consecutive optimizer steps") and said.endswith(
        "Lower lr, or check the training split's files."
    )
    assert "float32" not in said and "bad_files.json" not in said
