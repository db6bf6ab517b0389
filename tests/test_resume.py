"""A resume can never damage a run: refused overrides leave the run directory untouched, ``config.json`` is
rewritten only once the checkpoint has loaded, and a start that fails leaves nothing behind."""

from __future__ import annotations

import json

import pytest

from levjepa.cli import main
from levjepa.config import ConfigError, apply_overrides, to_dict
from levjepa.train.config import RESUMABLE, check_resume
from levjepa.train.loop import pretrain
from levjepa.weights import WeightsError
from train_utils import TINY, tiny_config


def _files(run):
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("resume") / "run"
    pretrain(tiny_config("train.steps=2", "train.checkpoint_every=2"), run, progress=False)
    return run


def test_an_architecture_override_on_resume_is_refused_and_the_run_still_resumes(finished_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = _files(run)
    # the failure: this rewrote config.json, then failed loading the checkpoint, for good
    assert main(["pretrain", "--resume", str(run), "model.depth=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.depth (2 -> 6)" in err and "Traceback" not in err
    assert _files(run) == before  # nothing written, nothing removed
    with pytest.raises(ConfigError, match=r"model\.depth"):  # the Python API refuses it as well
        pretrain(tiny_config("train.steps=2", "model.depth=6"), run, resume=True, progress=False)
    assert _files(run) == before
    # ... and a resume that may change what it changes continues the run
    assert main(["pretrain", "--resume", str(run), "train.steps=4", "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 4
    assert (run / "checkpoints" / "latest").read_text() == "step_000004"


def test_config_json_is_written_only_after_the_checkpoint_loaded(finished_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "checkpoints" / "step_000002" / "model.safetensors").write_bytes(b"not safetensors")
    config = (run / "config.json").read_bytes()
    with pytest.raises(WeightsError, match=r"model\.safetensors"):
        pretrain(tiny_config("train.steps=6", "train.checkpoint_every=2"), run, resume=True, progress=False)
    assert (run / "config.json").read_bytes() == config  # train.steps=6 is allowed, but nothing has loaded


def test_only_the_listed_keys_may_change_on_resume():
    saved = tiny_config("train.steps=2")
    raw = json.loads(json.dumps(to_dict(saved)))  # as config.json holds it
    check_resume(raw, apply_overrides(saved, ["train.steps=10", "data.num_workers=2", "train.log_every=5"]))
    for key, value in [("objective.lam", "0.7"), ("data.global_size", "64"), ("train.seed", "3"),
                       ("optim.lr", "0.1"), ("train.batch_size", "16")]:  # fmt: skip
        assert key not in RESUMABLE
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            check_resume(raw, apply_overrides(saved, [f"{key}={value}"]))
    # a key the saved config.json does not hold (levjepa grew it later) may be set: its old value is unknown
    del raw["model"]["final_norm_bias"]
    check_resume(raw, apply_overrides(saved, ["model.final_norm_bias=true"]))


def test_the_micro_batch_may_change_on_resume_only_while_the_loss_sees_the_effective_batch():
    # accumulation=global: the loss sees train.batch_size whatever data.batch_size is, so a resume may re-split
    # it (another GPU's memory); local: the loss sees data.batch_size x world size, so changing it changes N
    saved = tiny_config("train.steps=2", "train.batch_size=16", "data.batch_size=8")
    check_resume(json.loads(json.dumps(to_dict(saved))), apply_overrides(saved, ["data.batch_size=4"]))
    local = apply_overrides(saved, ["train.accumulation=local"])
    raw = json.loads(json.dumps(to_dict(local)))
    check_resume(raw, apply_overrides(local, ["data.num_workers=2"]))
    with pytest.raises(ConfigError, match=r"data\.batch_size \(8 -> 4\).*train\.accumulation=local") as err:
        check_resume(raw, apply_overrides(local, ["data.batch_size=4"]))
    assert "\n" not in str(err.value)


def test_a_local_accumulation_run_resumes_only_on_its_number_of_processes(finished_run, tmp_path):
    # under local the loss sees data.batch_size x world size clips: another world size is another objective.
    # The run's env.json says how many processes trained it (here rewritten to 2, as a 2-rank run writes it)
    import shutil

    def two_ranks(run):
        env = json.loads((run / "env.json").read_text())
        (run / "env.json").write_text(json.dumps({**env, "world_size": 2}))

    local = tmp_path / "local"
    pretrain(tiny_config("train.steps=2", "train.accumulation=local"), local, progress=False)
    two_ranks(local)
    before = _files(local)
    with pytest.raises(ConfigError, match=r"on 1 process\(es\) of a run trained on 2 under train\.accumulation=local"):
        pretrain(tiny_config("train.steps=3", "train.accumulation=local"), local, resume=True, progress=False)
    assert _files(local) == before
    run = tmp_path / "global"  # the default, global: the loss sees the effective batch on any number of GPUs
    shutil.copytree(finished_run, run)
    two_ranks(run)
    assert pretrain(tiny_config("train.steps=3"), run, resume=True, progress=False).steps == 3


def test_resume_help_lists_what_may_change(capsys):
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "train.steps" in out and "data.sources" in out


def test_a_failed_start_removes_the_run_directory_it_created(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["pretrain", "--preset", "demo-cpu", *TINY, f"data.sources={tmp_path / 'nowhere'}", "--run-dir", str(run)]
    for _ in range(2):  # the same command again meets the same error, not "run directory exists"
        assert main([*args, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "nowhere" in err and "already exists" not in err
        assert not run.exists()
    run.mkdir()  # a directory that existed (empty) stays, empty
    assert main([*args, "--no-progress"]) == 2
    assert run.is_dir() and not any(run.iterdir())
