"""Plain use of long jobs (issue 48): a signal stops ``extract`` and the end-of-run evaluation with one line and
exit 75, and ``extract`` continues its shards to the bytes of an uninterrupted job; Ctrl-C names the last
checkpoint and the resume command; a full disk names its path and says truthfully what is saved; a checkpoint
that cannot be read points at the newest intact one, and ``--resume RUN/checkpoints/step_N`` continues from it."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest
import torch

import levjepa.commands.pretrain as cli_pretrain
import levjepa.features.fill as fill_module
import levjepa.train.loop as train_loop
from levjepa.cli import main
from levjepa.train.preemption import REQUEUE_EXIT
from levjepa.weights import load_tensors
from test_export import make_run_dir
from test_extract import _video
from train_utils import TINY


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def _pretrain_args(run: Path, *extra: str) -> list[str]:
    return ["pretrain", "--preset", "demo-cpu", *TINY, "--run-dir", str(run), "--no-progress", *extra]


def test_sigterm_stops_extract_in_one_line_and_the_same_command_ends_as_an_uninterrupted_job(
    tmp_path, monkeypatch, capsys
):
    media = tmp_path / "videos"
    media.mkdir()
    for i in range(5):
        _video(media / f"v{i}.mp4", 24)
    run = make_run_dir(tmp_path, steps=(5,))
    args = ["extract", str(run), str(media), "--window", "4", "--stride", "4", "--size", "16", "--workers", "0"]
    args += ["--shard-rows", "5", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    real = fill_module.RowUnits.end
    flushes = []

    def stopped_after_two_shards(self):
        real(self)
        flushes.append(1)
        if len(flushes) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's pre-emption, mid-job

    monkeypatch.setattr(fill_module.RowUnits, "end", stopped_after_two_shards)
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "cut")]) == REQUEUE_EXIT
    said = _lines(capsys)
    assert said[-1].startswith("levjepa extract: SIGTERM received: stopped with 10 row(s) written")
    assert "the same command continues" in said[-1]
    monkeypatch.setattr(fill_module.RowUnits, "end", real)
    assert main([*args, "--out", str(tmp_path / "cut")]) == 0
    whole = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == whole
    for name in whole:
        a, b = tmp_path / "cut" / name, tmp_path / "whole" / name
        if name.endswith(".safetensors"):  # the same tensors and metadata (safetensors orders metadata freely)
            (ta, ma), (tb, mb) = load_tensors(a), load_tensors(b)
            assert ma == mb and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), name
        elif name != "extract.json":  # its wall time differs
            assert a.read_bytes() == b.read_bytes(), name


def test_sigterm_during_the_end_of_run_evaluation_is_one_line_and_exit_75(tmp_path, monkeypatch, capsys):
    def evaluation_stopped(cfg, run_dir):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal stops the evaluation before this line")

    monkeypatch.setattr(cli_pretrain, "evaluate_run", evaluation_stopped)
    run = tmp_path / "run"
    assert main(_pretrain_args(run, "train.steps=2", "train.eval_at_end=true")) == REQUEUE_EXIT
    said = _lines(capsys)[-1]
    assert said.startswith("levjepa pretrain: SIGTERM received during the evaluation at the end of the run")
    assert f"evaluate it with `levjepa probe {run}`" in said and (run / "checkpoints" / "step_000002").is_dir()


def test_the_end_of_run_evaluation_keeps_the_runs_thread_count(tmp_path, monkeypatch, capsys):
    """``train.threads=1`` holds for the probes at the end too: the thread count was restored before them, so two
    1-thread runs sharing 2 cores probed with 2 threads each, about 20x as long as at one thread."""
    seen = []

    def evaluation(encoders, synthetic, evaluation):
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt  # stops the run at once: the probes themselves are not what is tested

    monkeypatch.setattr(cli_pretrain, "evaluate_benchmark", evaluation)
    before = torch.get_num_threads()
    want = 1 if before > 1 else 2
    main(_pretrain_args(tmp_path / "run", "train.steps=2", "train.eval_at_end=true", f"train.threads={want}"))
    assert seen == [want] and torch.get_num_threads() == before


def test_ctrl_c_names_the_last_checkpoint_and_the_resume_command(tmp_path, monkeypatch, capsys):
    real = train_loop.train_step

    def interrupted_at_step_three(*args, step, **kwargs):
        if step == 3:
            raise KeyboardInterrupt
        return real(*args, step=step, **kwargs)

    monkeypatch.setattr(train_loop, "train_step", interrupted_at_step_three)
    run = tmp_path / "run"
    assert main(_pretrain_args(run, "train.steps=6", "train.checkpoint_every=2")) == 130
    said = _lines(capsys)[-1]
    assert said == (
        f"levjepa pretrain: interrupted after step 3; the last is checkpoint {run}/checkpoints/step_000002: "
        f"continue with `levjepa pretrain --resume {run}`"
    )


def test_a_full_disk_names_its_path_and_says_nothing_is_saved_when_nothing_is(tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(train_loop.ckpt, "save_checkpoint", full)
    run = tmp_path / "run"
    assert main(_pretrain_args(run, "train.steps=2", "train.checkpoint_every=2")) == 2
    said = _lines(capsys)[-1]
    assert said.startswith(f"levjepa pretrain: {run}/checkpoints: the checkpoint of the last step (2)")
    assert "no space left on device" in said and "the run has no checkpoint yet: none of its steps is saved" in said
    assert "nothing written so far is lost" not in said


def test_a_corrupt_latest_checkpoint_points_at_the_newest_intact_one_and_resume_takes_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_pretrain_args(run, "train.steps=4", "train.checkpoint_every=2", "train.keep_last=4")) == 0
    latest = run / "checkpoints" / "step_000004" / "model.safetensors"
    latest.write_bytes(latest.read_bytes()[:100])  # a disk error: the latest checkpoint's weights cut short
    capsys.readouterr()
    assert main(["pretrain", "--resume", str(run), "train.steps=6", "--no-progress"]) == 2
    said = _lines(capsys)
    good = run / "checkpoints" / "step_000002"
    assert len(said) == 1 and "step_000004/model.safetensors" in said[0]
    assert (
        f"the newest intact checkpoint is {good}: continue from it with `levjepa pretrain --resume {good}`" in said[0]
    )
    assert main(["pretrain", "--resume", str(good), "train.steps=6", "--no-progress"]) == 0
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ".abandoned-step_000004" in names and "step_000006" in names  # set aside, never deleted
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 6  # the metrics after step 2 were logged again, once


@pytest.mark.parametrize("where", ["run", "checkpoint"])
def test_finetune_resume_takes_a_run_or_one_of_its_checkpoints(tmp_path, where):
    from test_finetune import RECIPE, write_index

    media = tmp_path / "media"
    files = [write_index(media, s, n, seed) for s, n, seed in (("train", 6, 0), ("val", 3, 1))]
    source = make_run_dir(tmp_path, steps=(5,))
    out = tmp_path / "ft"
    task = "index:" + ",".join(map(str, files))
    assert main(["finetune", str(source), "--task", task, "--out", str(out), *RECIPE, "steps=2"]) == 0
    target = out if where == "run" else out / "checkpoints" / "step_000002"
    assert main(["finetune", "--resume", str(target), "steps=4"]) == 0
    assert (out / "checkpoints" / "step_000004").is_dir()


def test_a_resume_from_a_checkpoint_is_checked_against_that_checkpoint_not_the_latest(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_pretrain_args(run, "train.steps=4", "train.checkpoint_every=2", "train.keep_last=4")) == 0
    (run / "checkpoints" / "step_000004" / "meta.json").write_text('{"step": ')  # the latest's meta.json cut short
    capsys.readouterr()
    assert main(["pretrain", "--resume", str(run), "train.steps=6", "--no-progress"]) == 2
    said = _lines(capsys)
    good = run / "checkpoints" / "step_000002"
    assert len(said) == 1 and f"continue from it with `levjepa pretrain --resume {good}`" in said[0]
    # shorter than the latest checkpoint (step 4), longer than the one resumed from: trains steps 3
    assert main(["pretrain", "--resume", str(good), "train.steps=3", "--no-progress"]) == 0
    assert "resuming" in capsys.readouterr().err and (run / "checkpoints" / "step_000003").is_dir()
    assert main(["pretrain", "--resume", str(good), "train.steps=1", "--no-progress"]) == 2
    assert "the run is already at step 2; give train.steps > 2" in _lines(capsys)[-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_stops_probe_in_one_line_and_the_same_command_continues_from_its_stores(
    tmp_path, monkeypatch, capsys, sig
):
    """``probe`` stopped after its first feature store: exit 75 and one line saying what is kept; run again, it
    reuses that store, builds the rest and gives the numbers of an uninterrupted evaluation."""
    import levjepa.features.feature_set as store_module
    from test_classify import write_index

    media = tmp_path / "media"
    train, val = (write_index(media, s, n, seed) for s, n, seed in (("train", 9, 0), ("val", 6, 1)))
    run = make_run_dir(tmp_path, steps=(5,))
    args = ["probe", str(run), "--task", f"index:{train},{val}", "--probe", "knn", "--no-baseline", "--no-save"]
    args += ["--workers", "0", "--size", "16", "--frames", "4"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main([*args, "--features", str(whole / "features"), "--out", str(whole / "probe.json")]) == 0
    real, written = store_module.Unit.write, []

    def stopped_after_one_unit(self, *a, **k):
        real(self, *a, **k)
        written.append(self.name)
        os.kill(os.getpid(), sig)  # a scheduler's pre-emption, mid-evaluation

    monkeypatch.setattr(store_module.Unit, "write", stopped_after_one_unit)
    capsys.readouterr()
    cut_args = [*args, "--features", str(cut / "features"), "--out", str(cut / "probe.json")]
    assert main(cut_args) == REQUEUE_EXIT
    said = _lines(capsys)[-1]
    assert said.startswith(f"levjepa probe: {sig.name} received: stopped during the evaluation; the features")
    assert "and the probes finished are kept" in said
    assert f"kept in {cut / 'features'}" in said and "the same command continues from them" in said
    assert written and not (cut / "probe.json").exists()
    monkeypatch.setattr(store_module.Unit, "write", real)
    assert main(cut_args) == 0
    a, b = (json.loads((d / "probe.json").read_text()) for d in (whole, cut))
    knn = [r["results"]["pretrained-ema"]["media"]["knn"] for r in (a, b)]
    for r in knn:
        r.pop("seconds")  # a wall time
    assert a["accuracy"] == b["accuracy"] and knn[0] == knn[1]


def test_probe_stopped_after_a_finished_probe_does_not_train_it_again(tmp_path, monkeypatch, capsys):
    """A probe finished before the signal is read back by the rerun (``levjepa.eval.probe_records``), heads
    included, and the rerun's table, kept probes and JSON are those of an uninterrupted evaluation."""
    import levjepa.eval.harness as harness
    import levjepa.eval.probe_records as records_module
    from test_classify import write_index

    media = tmp_path / "media"
    train, val = (write_index(media, s, n, seed) for s, n, seed in (("train", 9, 0), ("val", 6, 1)))
    run = make_run_dir(tmp_path, steps=(5,))
    args = ["probe", str(run), "--task", f"index:{train},{val}", "--probe", "knn,linear", "--no-baseline"]
    args += ["--workers", "0", "--size", "16", "--frames", "4", "--set", "linear_epochs=2"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    common = ["--features", str(whole / "features"), "--probes-dir", str(whole / "probes")]
    assert main([*args, *common, "--out", str(whole / "probe.json")]) == 0
    real = records_module.ProbeRecords.save

    def stopped_after_the_first_probe(self, key, results):
        real(self, key, results)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(records_module.ProbeRecords, "save", stopped_after_the_first_probe)
    cut_args = [*args, "--features", str(cut / "features"), "--probes-dir", str(cut / "probes")]
    cut_args += ["--out", str(cut / "probe.json")]
    assert main(cut_args) == REQUEUE_EXIT
    assert "and the probes finished are kept" in _lines(capsys)[-1]
    monkeypatch.setattr(records_module.ProbeRecords, "save", real)

    def trained_again(*args, **kwargs):
        raise AssertionError("the kNN probe finished before the signal is evaluated again")

    monkeypatch.setattr(harness, "knn_from_sources", trained_again)
    assert main(cut_args) == 0
    a, b = (json.loads((d / "probe.json").read_text()) for d in (whole, cut))
    assert a["accuracy"] == b["accuracy"]
    for probe in ("knn", "linear"):
        x, y = (r["results"]["pretrained-ema"]["media"][probe] for r in (a, b))
        x.pop("seconds"), y.pop("seconds")  # wall times (the cut run's kNN: as its record says)
        assert x == y, probe
    kept = [p.relative_to(d / "probes") for d in (whole, cut) for p in sorted((d / "probes").rglob("*.safetensors"))]
    assert kept[: len(kept) // 2] == kept[len(kept) // 2 :] and kept
    for p in kept[: len(kept) // 2]:
        ta, tb = load_tensors(whole / "probes" / p)[0], load_tensors(cut / "probes" / p)[0]
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), p


def test_a_signal_stops_probe_on_the_built_in_benchmark_in_one_line(tmp_path, monkeypatch, capsys):
    """The built-in benchmark keeps nothing on disk (features in memory) unless --cache: the line says so."""
    import levjepa.eval.clips_task as clips_task

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal stops the evaluation before this line")

    monkeypatch.setattr(clips_task, "cached_features", stopped)
    run = make_run_dir(tmp_path, steps=(5,))
    syn = ["size=16", "num_frames=4", "num_train=64", "num_val=24", "num_test=32"]
    args = ["probe", str(run), "--task", "arrow", "--probe", "knn", *[a for kv in syn for a in ("--synthetic", kv)]]
    assert main(args) == REQUEUE_EXIT
    said = _lines(capsys)[-1]
    assert said.startswith("levjepa probe: SIGTERM received: stopped during the evaluation, nothing written")
    assert said.endswith("the same command runs it again")
    assert main([*args, "--cache", str(tmp_path / "cache")]) == REQUEUE_EXIT
    said = _lines(capsys)[-1]
    assert f"the features computed so far are kept in {tmp_path / 'cache'}" in said and "probes finished" not in said
