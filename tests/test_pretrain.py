"""The pretraining job end to end: run directory trail, refusal to overwrite, and exact resume after kill -9."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import levjepa
from levjepa.data import PretrainLoader
from levjepa.objective import build_objective
from levjepa.rng import sample_keys
from levjepa.train.config import fit_micro_batch
from levjepa.train.loop import build_models, pretrain
from levjepa.train.optim import lr_at
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


# the CLI, with each file of a checkpoint followed by a pause when LEVJEPA_TEST_SLOW_CHECKPOINT is set (seconds):
# a window in which a kill lands in the middle of a checkpoint write
_SLOW_CLI = """
import os, sys, time
import levjepa.train.checkpoint as ck
pause, save = float(os.environ.get("LEVJEPA_TEST_SLOW_CHECKPOINT", "0")), ck.save_tensors
def slow_save(*args, **kwargs):
    save(*args, **kwargs)
    time.sleep(pause)
ck.save_tensors = slow_save
from levjepa.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(run_dir: Path, *args: str, slow_checkpoint: float = 0.0) -> subprocess.Popen:
    cmd = [sys.executable, "-c", _SLOW_CLI, "pretrain", "--no-progress", *args]
    env = {**os.environ, "PYTHONPATH": SRC, "LEVJEPA_TEST_SLOW_CHECKPOINT": str(slow_checkpoint)}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, condition, what: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"exited before {what}: {proc.stderr.read()}"
        assert time.time() < deadline, f"no {what}"
        time.sleep(0.005)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL


def _latest_is(run: Path, step: int):
    latest = run / "checkpoints" / "latest"
    return lambda: latest.is_file() and latest.read_text() == f"step_{step:06d}"


def _writing_checkpoint(run: Path):
    """True while a checkpoint is half written: its temporary directory holds a file but not meta.json."""
    root = run / "checkpoints"
    return lambda: any((p / "model.safetensors").exists() and not (p / "meta.json").exists()
                       for p in root.glob(".step_*"))  # fmt: skip


def _assert_identical_runs(a: Path, b: Path, final_step: int) -> None:
    final = f"checkpoints/step_{final_step:06d}"
    for name in ("model.safetensors", "ema.safetensors", "trainer.safetensors"):
        ta, _ = load_tensors(a / final / name)
        tb, _ = load_tensors(b / final / name)
        assert ta.keys() == tb.keys() and not any(k.startswith("rng.") for k in ta)  # no RNG state is saved
        for key in ta:
            assert torch.equal(ta[key], tb[key]), (name, key)
    steps_a = [json.loads(x)["step"] for x in (a / "metrics.jsonl").read_text().splitlines()]
    steps_b = [json.loads(x)["step"] for x in (b / "metrics.jsonl").read_text().splitlines()]
    assert steps_a == steps_b
    assert not list((b / "checkpoints").glob(".step_*")), "a half-written checkpoint was left behind"


def test_kill_9_then_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    k = 12
    common = [*TINY, f"train.steps={2 * k}", f"train.checkpoint_every={k}", "train.log_every=4"]
    straight = _cli(tmp_path / "a", "--preset", "demo-cpu", "--run-dir", str(tmp_path / "a"), *common)
    victim = _cli(tmp_path / "b", "--preset", "demo-cpu", "--run-dir", str(tmp_path / "b"), *common)
    _wait_for(victim, _latest_is(tmp_path / "b", k), "first checkpoint")
    _kill(victim)
    assert not (tmp_path / "b" / "checkpoints" / f"step_{2 * k:06d}").exists(), "killed too late to test resume"
    resumed = _cli(tmp_path / "b", "--resume", str(tmp_path / "b"))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert straight.wait(timeout=300) == 0, straight.stderr.read()
    _assert_identical_runs(tmp_path / "a", tmp_path / "b", 2 * k)


def test_a_kill_during_a_checkpoint_write_then_resume_is_bit_identical(tmp_path):
    k = 6
    common = [*TINY, f"train.steps={2 * k}", f"train.checkpoint_every={k}", "train.log_every=3"]
    straight = _cli(tmp_path / "a", "--preset", "demo-cpu", "--run-dir", str(tmp_path / "a"), *common)
    run = tmp_path / "b"
    victim = _cli(run, "--preset", "demo-cpu", "--run-dir", str(run), *common, slow_checkpoint=0.5)
    _wait_for(victim, _writing_checkpoint(run), "checkpoint write")
    _kill(victim)  # between the checkpoint's first file and its meta.json
    assert not (run / "checkpoints" / "latest").exists() and list((run / "checkpoints").glob(".step_*"))
    resumed = _cli(run, "--resume", str(run))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert straight.wait(timeout=300) == 0, straight.stderr.read()
    _assert_identical_runs(tmp_path / "a", run, 2 * k)


@pytest.mark.slow
def test_three_kills_at_random_moments_one_during_a_checkpoint_write_end_bit_identical(tmp_path):
    # kill -9 (1) at a random moment after the first checkpoint, (2) in the middle of a checkpoint write,
    # (3) at a random moment after a resume starts; each followed by a resume; the last one runs to the end
    rng = random.Random(int(time.time()))
    k, run = 8, tmp_path / "b"
    common = [*TINY, f"train.steps={4 * k}", f"train.checkpoint_every={k}", "train.log_every=4"]
    straight = _cli(tmp_path / "a", "--preset", "demo-cpu", "--run-dir", str(tmp_path / "a"), *common)
    victim = _cli(run, "--preset", "demo-cpu", "--run-dir", str(run), *common)
    _wait_for(victim, _latest_is(run, k), "first checkpoint")
    delays = [rng.uniform(0.0, 1.0), rng.uniform(0.5, 4.0)]
    time.sleep(delays[0])
    _kill(victim)
    victim = _cli(run, "--resume", str(run), slow_checkpoint=0.5)
    _wait_for(victim, _writing_checkpoint(run), "checkpoint write")
    _kill(victim)
    victim = _cli(run, "--resume", str(run))
    time.sleep(delays[1])
    if victim.poll() is None:
        _kill(victim)
    resumed = _cli(run, "--resume", str(run))
    assert resumed.wait(timeout=300) == 0, (delays, resumed.stderr.read())
    assert straight.wait(timeout=300) == 0, straight.stderr.read()
    _assert_identical_runs(tmp_path / "a", run, 4 * k)


def test_a_run_never_draws_from_the_global_rng(tmp_path):
    # what a checkpoint used to save as "the RNG state" was the global one, which differed between identical
    # runs (torch seeds each process at random; the DataLoader drew its workers' base seed from it) while no
    # computation read it: now nothing draws from it, and two runs started from different states agree
    cfg = tiny_config("train.steps=4", "train.checkpoint_every=4", "data.num_workers=1")
    for seed, run in ((1, "a"), (2, "b")):
        torch.manual_seed(seed)
        state = torch.get_rng_state()
        with torch.random.fork_rng():
            from levjepa.train import loop

            info = loop.distributed.setup(device="cpu")
            try:
                loop._pretrain(cfg, tmp_path / run, info, resume=False, overwrite=False, progress=False)
            finally:
                loop.distributed.teardown()
            assert torch.equal(torch.get_rng_state(), state), "something in the run drew from the global RNG"
    _assert_identical_runs(tmp_path / "a", tmp_path / "b", 4)


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
    from levjepa.commands.pretrain import demo_verdict
    from levjepa.eval import EvalConfig, evaluate_benchmark
    from levjepa.formats import load_encoder

    run, summary = tmp_path / "run", tmp_path / "summary.json"
    overrides = [*TINY, "train.steps=2", "train.checkpoint_every=2", "train.eval_at_end=true"]
    args = ["pretrain", "--preset", "demo-cpu", *overrides, "--run-dir", str(run), "--no-progress"]
    assert main([*args, "--summary-json", str(summary)]) == 0
    written = json.loads((run / "probe_results.json").read_text())
    assert json.loads(summary.read_text())["probe_results"] == written
    columns = ["pretrained (EMA)", "random init"]
    err = capsys.readouterr().err
    assert list(written["accuracy"]) == columns and "| appearance | attentive |" in err
    # under the table, the demo's promise read off the very numbers it wrote (a 2-step run misses it)
    verdict = demo_verdict(written["accuracy"][columns[0]], written["accuracy"][columns[1]])
    assert verdict in err.splitlines() and "missed" in verdict
    # the promise is read with the probe it was measured with (DEMO_PROBE), and the table says which
    from levjepa.eval import probe_config
    from levjepa.presets import DEMO_PROBE

    recipe = written["info"]["probe_config"]
    assert {k: recipe[k] for k in DEMO_PROBE} == DEMO_PROBE != {k: getattr(probe_config("demo"), k) for k in DEMO_PROBE}
    heads = f"{len(recipe['lrs'])} lr × {len(recipe['weight_decays'])} wd heads"
    assert f"budget demo (attentive: {heads}, {DEMO_PROBE['epochs']} epochs, chosen by val accuracy)" in err
    cfg = tiny_config(*overrides)
    direct = {
        columns[0]: load_encoder(run, weights="ema").encoder,
        columns[1]: build_models(cfg, cfg.train.seed)[0],  # the very weights step 0 trained from
    }
    evaluation = EvalConfig(probes=("knn",), seed=cfg.train.seed)
    knn = evaluate_benchmark(direct, cfg.data.synthetic, evaluation).to_json()["accuracy"]
    for name, tasks in knn.items():
        for task, acc in tasks.items():
            assert written["accuracy"][name][task]["knn"] == acc["knn"], (name, task)


def test_the_demo_promise_is_every_target_and_every_margin():
    from levjepa.presets import DEMO_MARGIN, DEMO_TARGETS, demo_misses

    rnd = {t: {"linear": v - DEMO_MARGIN - 10, "attentive": v - DEMO_MARGIN} for t, v in DEMO_TARGETS.items()}
    edge = {t: {"linear": 0.0, "attentive": v} for t, v in DEMO_TARGETS.items()}  # the best probe counts
    assert demo_misses(edge, rnd) == []
    for task in DEMO_TARGETS:
        short = {**edge, task: {"attentive": DEMO_TARGETS[task] - 0.1}}
        assert [m.split(":")[0] for m in demo_misses(short, rnd)] == [task, task]  # the target and the margin
        closer = {**rnd, task: {"attentive": DEMO_TARGETS[task] - DEMO_MARGIN + 0.1}}
        (miss,) = demo_misses(edge, closer)
        assert miss.startswith(f"{task}: ") and "+14.9 < +15" in miss


def test_bad_files_in_a_real_video_folder_are_reported_not_fatal(tmp_path, capsys):
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
    capsys.readouterr()
    summary = pretrain(cfg, tmp_path / "run", progress=False)
    shown = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bad file ")]
    ffmpeg = "InvalidDataError: [Errno 1094995529] Invalid data found when processing input"  # the path left out
    assert sorted(shown) == [
        f"bad file skipped: {videos / 'empty.mp4'} has 0 bytes",
        f"bad file skipped: {videos / 'notes.mp4'} is not a readable video ({ffmpeg})",
    ]
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
    loader = PretrainLoader(cfg.data, seed=cfg.train.seed, micro_batches=2)
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
    # AdamW divides each gradient by its own magnitude, so an element whose gradient is float32 noise (the
    # compiled graph rounds otherwise) may move by up to its lr on either side: every weight within twice the
    # lr summed over the steps, and all but a few elements within float tolerance (a wrong gradient moves many)
    cfg = tiny_config(*common)
    bound = 2 * sum(lr_at(s, cfg.optim, cfg.train.steps) for s in range(2))
    off = total = 0
    for key in a:
        diff = (b[key] - a[key]).abs()
        assert float(diff.max()) <= bound, key
        off += int((diff > 1e-5 + 1e-4 * a[key].abs()).sum())
        total += diff.numel()
    assert off <= 1e-3 * total, (off, total)


def test_the_literal_ema_is_written_and_a_copy_before_its_first_update_is_not_called_an_average(tmp_path):
    # train.ema_warmup=0 reaches the EMA (its checkpoint metadata); a checkpoint written before the first EMA
    # update (step 1, an update every 2 steps) holds the initial weights and says so, and the copy after one
    # update at the fixed decay says how much of it is still the initialisation
    path = tmp_path / "run"
    cfg = tiny_config("train.steps=2", "train.checkpoint_every=1", "train.ema_every=2", "train.ema_warmup=0")
    pretrain(cfg, path, progress=False)
    first, last = (path / "checkpoints" / f"step_{s:06d}" for s in (1, 2))
    _, meta = load_tensors(first / "ema.safetensors")
    assert float(meta["ema_warmup"]) == 0.0 and int(meta["ema_updates"]) == 0
    # a copy that is mostly its initial weights is read with a warning (its readout is a random encoder's)
    with pytest.warns(UserWarning, match=r"still 100% its initial \(random\) weights \(no update yet\)"):
        text = levjepa.load(first).weights_info
    assert "average" not in text and "before its first update: the initial weights" in text
    with pytest.warns(
        UserWarning, match=r"still 99% its initial .*1 update\(s\) at a fixed decay 0.99.*--weights online"
    ):
        after = levjepa.load(last).weights_info
    assert "1 update(s) at a fixed decay 0.99 from the initial weights, 99% of it still the initialisation" in after
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the online copy, and an EMA with the warm-up, carry no such warning
        levjepa.load(last, weights="online")


def test_a_small_train_batch_size_brings_data_batch_size_down_with_it(capsys):
    cfg = tiny_config("train.batch_size=64", "data.batch_size=64")
    fitted = fit_micro_batch(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=6)), 2)
    assert fitted.data.batch_size == 3 and fitted.micro_batches(2) == 1  # one micro-batch of 3 per process
    assert capsys.readouterr().err.strip() == (
        "note: data.batch_size=64 lowered to 3: train.batch_size=6 is the whole batch of one optimizer step over "
        "2 processes"
    )
    for batch, world in ((128, 1), (64, 1), (5, 2)):  # accumulation, exact, or an uneven split: left as it is
        same = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=batch))
        assert fit_micro_batch(same, world) is same
    assert capsys.readouterr().err == ""


def test_a_dataset_smaller_than_a_batch_names_both_keys_and_the_value_that_fits(tmp_path, capsys):
    from data_media import write_pattern
    from levjepa.cli import main

    videos = tmp_path / "videos"
    videos.mkdir()
    for i in range(5):
        write_pattern(videos / f"v{i}.mp4", 8, height=32, width=32)
    tiny = [o for o in TINY if not o.startswith(("train.batch_size", "data.batch_size"))]  # demo-cpu's 64 and 64
    args = ["pretrain", "--preset", "demo-cpu", *tiny, f"data.sources={videos}", "train.steps=1", "--no-progress"]
    assert main([*args, "--run-dir", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "an epoch of 5 clips" in err and "set train.batch_size=5" in err and "data.batch_size" in err, err
    assert not (tmp_path / "r1").exists()
    # the one override the message names is enough: data.batch_size follows it, said in one line
    assert main([*args, "train.batch_size=5", "--run-dir", str(tmp_path / "r2")]) == 0
    assert "note: data.batch_size=64 lowered to 5" in capsys.readouterr().err
    assert json.loads((tmp_path / "r2" / "config.json").read_text())["data"]["batch_size"] == 5
