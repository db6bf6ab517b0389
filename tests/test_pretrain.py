"""The pretraining job end to end: run directory trail, refusal to overwrite, and exact resume after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from levjepa.data import build_pretrain_loader
from levjepa.objective import build_objective
from levjepa.rng import sample_keys
from levjepa.train.loop import build_models, pretrain
from levjepa.train.run_dir import RunDirError
from levjepa.train.step import Pretrainer
from levjepa.weights import load_tensors
from train_utils import TINY, tiny_config

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_run_directory_holds_the_trail(tmp_path):
    cfg = tiny_config("train.steps=4", "train.checkpoint_every=2")  # train.threads=1 for the run
    threads, rng_state = torch.get_num_threads(), torch.get_rng_state()
    torch.set_num_threads(3)
    try:
        summary = pretrain(cfg, tmp_path / "run", progress=False)
        assert torch.get_num_threads() == 3  # the run leaves no state behind (CI ran later tests on 1 thread)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.get_rng_state(), rng_state)
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["model"]["dim"] == 32
    env = json.loads((run / "env.json").read_text())
    assert env["torch"] == torch.__version__ and env["world_size"] == 1
    assert "commit" in json.loads((run / "git.json").read_text())
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4]
    for key in ("loss", "invariance", "sigreg", "sigreg/view0", "effective_rank", "std/mean", "lr", "clips_per_s"):
        assert key in lines[-1], key
    assert list((run / "tb").iterdir()), "TensorBoard events missing"
    assert json.loads((run / "bad_files.json").read_text())["total"] == 0
    assert (run / "checkpoints" / "latest").read_text() == "step_000004" == summary.checkpoint.name
    with pytest.raises(RunDirError, match="--resume"):
        pretrain(cfg, run, progress=False)


def test_the_loop_updates_the_ema_to_the_average_it_claims(tmp_path):
    # an EMA update every 2 steps: at step 2 the copy is the online weights (the first update copies them),
    # at step 4 it is (1 * 2 * ... * 9 theta_2 + 2 * 3 * ... * 10 theta_4) / (...) = (theta_2 + 10 theta_4) / 11
    cfg = tiny_config("train.steps=4", "train.checkpoint_every=2", "train.ema_every=2", "train.ema_decay=0.9999")
    pretrain(cfg, tmp_path, progress=False)
    ckpts = tmp_path / "checkpoints"
    online = {s: load_tensors(ckpts / f"step_{s:06d}" / "model.safetensors")[0] for s in (2, 4)}
    ema2, meta2 = load_tensors(ckpts / "step_000002" / "ema.safetensors")
    ema4, meta4 = load_tensors(ckpts / "step_000004" / "ema.safetensors")
    assert (meta2["ema_updates"], meta4["ema_updates"]) == ("1", "2")
    assert ema4.keys() == {k for k in online[4] if k.startswith("encoder.")}
    moved = 0.0
    for key in ema4:
        torch.testing.assert_close(ema2[key], online[2][key], rtol=0, atol=0)
        torch.testing.assert_close(ema4[key], (online[2][key] + 10 * online[4][key]) / 11, rtol=1e-5, atol=1e-7)
        moved = max(moved, float((ema4[key] - online[2][key]).abs().max()))
    assert moved > 1e-4  # steps 3 and 4 changed the weights: the two copies are distinguishable


def _cli(run_dir: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "levjepa", "pretrain", "--no-progress", *args]
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_kill_9_then_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    k = 12
    common = [*TINY, f"train.steps={2 * k}", f"train.checkpoint_every={k}", "train.log_every=4"]
    straight = _cli(tmp_path / "a", "--preset", "demo-cpu", "--run-dir", str(tmp_path / "a"), *common)
    victim = _cli(tmp_path / "b", "--preset", "demo-cpu", "--run-dir", str(tmp_path / "b"), *common)
    latest = tmp_path / "b" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not (latest.is_file() and latest.read_text() == f"step_{k:06d}"):
        assert victim.poll() is None, victim.stderr.read()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    assert not (tmp_path / "b" / "checkpoints" / f"step_{2 * k:06d}").exists(), "killed too late to test resume"
    resumed = _cli(tmp_path / "b", "--resume", str(tmp_path / "b"))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert straight.wait(timeout=300) == 0, straight.stderr.read()
    final = f"checkpoints/step_{2 * k:06d}"
    for name in ("model.safetensors", "ema.safetensors", "trainer.safetensors"):
        a, _ = load_tensors(tmp_path / "a" / final / name)
        b, _ = load_tensors(tmp_path / "b" / final / name)
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith("rng."):  # where the global RNG stands differs (the DataLoader draws its base
                continue  # seed from it once per process); no training computation uses it
            assert torch.equal(a[key], b[key]), (name, key)
    steps_a = [json.loads(x)["step"] for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    steps_b = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps_a == steps_b


def test_cli_rejects_unknown_keys_and_bad_values_with_choices(capsys):
    from levjepa.cli import main

    assert main(["pretrain", "--preset", "demo-cpu", "model.depht=3", "--print-config"]) == 2
    assert "valid keys here are" in capsys.readouterr().err
    assert main(["pretrain", "--preset", "demo-cpu", "objective.name=lejepa2", "--print-config"]) == 2
    assert "levjepa, lejepa, localejepa" in capsys.readouterr().err
    assert main(["pretrain", "--preset", "vit-b-paper", "--print-config"]) == 2
    assert "data.sources=PATH" in capsys.readouterr().err
    assert main(["pretrain", "--preset", "vit-b-paper", "data.sources=/videos", "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["optim"]["lr"] == 4e-4 and printed["train"]["batch_size"] == 3072
    assert printed["model"]["dim"] == 768 and printed["data"]["num_local"] == 4


def test_the_command_ends_the_demo_with_probes_of_the_run_it_wrote(tmp_path, capsys):
    # train.eval_at_end: the loop knows nothing of evaluation; `levjepa pretrain` reads the final checkpoint
    # back and probes it beside the random initialisation the run started from
    from levjepa.cli import main
    from levjepa.eval import EvalConfig, evaluate_benchmark, load_encoder

    run, summary = tmp_path / "run", tmp_path / "summary.json"
    overrides = [*TINY, "train.steps=2", "train.checkpoint_every=2", "train.eval_at_end=true"]
    args = ["pretrain", "--preset", "demo-cpu", *overrides, "--run-dir", str(run), "--no-progress"]
    assert main([*args, "--summary-json", str(summary)]) == 0
    written = json.loads((run / "probe_results.json").read_text())
    assert json.loads(summary.read_text())["probe_results"] == written
    columns = ["pretrained (EMA)", "pretrained (online)", "random init"]
    assert list(written["accuracy"]) == columns and "| appearance | attentive |" in capsys.readouterr().err
    cfg = tiny_config(*overrides)
    direct = {
        columns[1]: load_encoder(run, weights="online").encoder,
        columns[2]: build_models(cfg, cfg.train.seed)[0],  # the very weights step 0 trained from
    }
    evaluation = EvalConfig(probes=("knn",), seed=cfg.train.seed)
    knn = evaluate_benchmark(direct, cfg.data.synthetic, evaluation).to_json()["accuracy"]
    for name, tasks in knn.items():
        for task, acc in tasks.items():
            assert written["accuracy"][name][task]["knn"] == acc["knn"], (name, task)


def test_bad_files_in_a_real_video_folder_are_reported_not_fatal(tmp_path):
    from data_media import write_pattern

    videos = tmp_path / "videos"
    videos.mkdir()
    for i in range(3):
        write_pattern(videos / f"good{i}.mp4", 12)
    (videos / "empty.mp4").write_bytes(b"")
    (videos / "notes.mp4").write_text("not a video at all")
    cfg = tiny_config(
        f"data.sources={videos}", "data.samples_per_epoch=16", "train.steps=2", "train.checkpoint_every=2"
    )
    from levjepa.data import BadFileWarning

    with pytest.warns(BadFileWarning) as caught:  # one warning per bad file
        summary = pretrain(cfg, tmp_path / "run", progress=False)
    assert len(caught) == 2
    report = json.loads((tmp_path / "run" / "bad_files.json").read_text())
    assert report["total"] == 2 == summary.bad_files
    assert sorted(Path(f["path"]).name for f in report["files"]) == ["empty.mp4", "notes.mp4"]
    for name in ("empty.mp4", "notes.mp4"):
        (videos / name).unlink()
    for i in range(3):
        (videos / f"good{i}.mp4").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=str(videos)):
        pretrain(cfg, tmp_path / "run2", progress=False)
    from levjepa.cli import main

    args = ["pretrain", "--preset", "demo-cpu", *TINY, f"data.sources={videos}", "--run-dir", str(tmp_path / "run3")]
    assert main([*args, "--no-progress"]) == 2  # a clear message, not a traceback


@pytest.mark.parametrize(
    ("overrides", "terms"),
    [
        ([], {"invariance", "sigreg", "sigreg/view0"}),
        (["objective.name=lejepa", "data.num_global=2", "objective.num_global_views=2"], {"pred", "sigreg"}),
        (["objective.name=localejepa"], {"pred", "localreg", "kmeans_fallback", "clusters_used"}),
    ],
)
def test_objective_switch_logs_what_the_objective_computes(tmp_path, overrides, terms):
    # two steps of 2 micro-batches each (GradCache); the loss and terms logged at step s must be those of
    # the objective called directly on the weights after step s - 1, on that step's whole batch
    cfg = tiny_config(
        "train.steps=2", "train.checkpoint_every=1", "train.log_every=1", "train.batch_size=16", *overrides
    )
    pretrain(cfg, tmp_path, progress=False)
    assert json.loads((tmp_path / "config.json").read_text())["objective"]["name"] == cfg.objective.name
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    model = Pretrainer(*build_models(cfg, cfg.train.seed))
    objective = build_objective(cfg.objective)
    loader = build_pretrain_loader(cfg.data, seed=cfg.train.seed, micro_batches=2)
    for step, row in enumerate(logged):
        if step > 0:
            model.load_state_dict(load_tensors(tmp_path / "checkpoints" / f"step_{step:06d}" / "model.safetensors")[0])
        batches = [next(loader), next(loader)]
        views = [torch.cat([b.augment_to_device("cpu")[g] for b in batches], dim=1) for g in range(2)]
        keys = torch.cat([sample_keys(cfg.train.seed, "drop", b.epoch, positions=b.index) for b in batches])
        with torch.no_grad():
            out = objective(model(views, keys), step)
        assert terms <= set(row)
        assert row["loss"] == pytest.approx(float(out.loss), rel=1e-5, abs=1e-6)
        for t in terms:
            assert row[t] == pytest.approx(float(out.terms[t]), rel=1e-5, abs=1e-6), t


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path):
    # train.compile=true (Inductor, on the CPU here): 2 steps of 2 micro-batches (the GradCache no-grad and
    # grad passes both run compiled blocks) log the losses and reach the weights of eager training
    common = ("train.steps=2", "train.checkpoint_every=2", "train.log_every=1", "train.batch_size=16")
    for name, flag in (("eager", "false"), ("compiled", "true")):
        pretrain(tiny_config(*common, f"train.compile={flag}"), tmp_path / name, progress=False)
    rows = {
        n: [json.loads(x) for x in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("eager", "compiled")
    }
    for a, b in zip(rows["eager"], rows["compiled"], strict=True):
        for key in ("loss", "invariance", "sigreg", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-4), (a["step"], key)
    a, _ = load_tensors(tmp_path / "eager" / "checkpoints" / "step_000002" / "model.safetensors")
    b, _ = load_tensors(tmp_path / "compiled" / "checkpoints" / "step_000002" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5, msg=key)
