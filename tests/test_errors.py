"""Every mistake of issue 27's item 5 ends in one line naming what is wrong and what to do, exit status 2,
nothing written: non-finite values where they are read, a query outside the token grid, a launch that cannot
work, a full disk or a read-only file system, an export where a run is expected, a resume shorter than its run;
and a config file takes the command line's forms and its ``preset`` key."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch

from levjepa.cli import main
from levjepa.config import ConfigError, apply_overrides
from levjepa.distributed import DistInfo
from levjepa.formats.writing.export import export_encoder
from levjepa.presets import preset
from levjepa.train import loop
from levjepa.train.config import OptimConfig, PretrainConfig
from test_export import make_run_dir
from train_utils import TINY


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"levjepa {command}: "), err
    return err[0]


@pytest.fixture(scope="module")
def run_at_step_2(tmp_path_factory):
    run = tmp_path_factory.mktemp("errors") / "run"
    args = ["pretrain", "--preset", "demo-cpu", *TINY, "train.steps=2", "--run-dir", str(run), "--no-progress"]
    assert main(args) == 0
    return run


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_a_non_finite_value_is_refused_where_it_is_read(value, tmp_path, capsys):
    assert main(["pretrain", "--preset", "demo-cpu", f"optim.lr={value}", "--print-config"]) == 2
    assert f"optim.lr={float(value)}: must be a finite number" in _one_line(capsys, "pretrain")
    with pytest.raises(ConfigError, match="finite"):
        OptimConfig(lr=float(value))  # the Python API too
    toml = tmp_path / "run.toml"
    toml.write_text(f"[objective]\nlam = {value}\n")
    assert main(["pretrain", "--config", str(toml), "--print-config"]) == 2
    assert "objective.lam" in _one_line(capsys, "pretrain")


def test_a_config_file_takes_the_command_lines_forms_and_its_preset_key(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text('preset = "demo-cpu"\n[data]\nsources = "vids,more"\nnum_local = "3"\n')
    toml.write_text(toml.read_text() + '[train]\neval_at_end = "false"\n')
    assert main(["pretrain", "--config", str(toml), "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    demo = preset("demo-cpu")
    assert cfg["data"]["sources"] == ["vids", "more"] and cfg["data"]["num_local"] == 3
    assert cfg["model"]["dim"] == demo.model.dim and cfg["preset"] == "demo-cpu"  # the preset is the base
    assert cfg["train"]["eval_at_end"] is False and cfg["data"]["global_size"] == demo.data.global_size
    toml.write_text('preset = "demo-gpu"\n')
    assert main(["pretrain", "--config", str(toml), "--print-config"]) == 2
    assert "preset = 'demo-gpu' is not a preset: choose one of" in _one_line(capsys, "pretrain")
    toml.write_text('preset = "demo-cpu"\n')
    assert main(["pretrain", "--preset", "vit-b-paper", "--config", str(toml), "--print-config"]) == 2
    assert "says preset = 'demo-cpu' but --preset vit-b-paper" in _one_line(capsys, "pretrain")


def test_a_query_outside_the_token_grid_is_one_line(tmp_path, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    code = main(["visualize", str(run), "synthetic:0", "--out", str(tmp_path / "v"), "--query", "0,99,0",
                 "--size", "32", "--frames", "4", "--device", "cpu"])  # fmt: skip
    line = _one_line(capsys, "visualize")
    assert code == 2 and "--query 0,99,0: outside the token grid" in line and "omit --query" in line
    assert not (tmp_path / "v" / "visualize.png").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA: train.device=cuda is valid there")
def test_cuda_asked_for_without_cuda_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", "--preset", "demo-cpu", *TINY, "train.device=cuda", "--run-dir", str(run)]) == 2
    assert "train.device=cuda but torch sees no CUDA device" in _one_line(capsys, "pretrain")
    assert not run.exists()


@pytest.mark.parametrize(("code", "advice"), [(errno.ENOSPC, "free space"), (errno.EROFS, "read-only")])
def test_a_full_disk_or_a_read_only_file_system_is_one_line_naming_the_path(
    tmp_path, capsys, monkeypatch, code, advice
):
    import levjepa.train.run_dir as run_dir

    def refuse(path, data):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(run_dir, "write_json", refuse)
    run = tmp_path / "run"
    assert main(["pretrain", "--preset", "demo-cpu", *TINY, "--run-dir", str(run)]) == 2
    line = _one_line(capsys, "pretrain")
    assert f"{run / 'config.json'}: {os.strerror(code).lower()}" in line and advice in line
    assert not run.exists()  # the failed start removed what it made


def test_an_export_where_a_run_is_expected_is_named_as_an_export(run_at_step_2, tmp_path, capsys):
    out = tmp_path / "export"
    export_encoder(run_at_step_2, out)
    assert main(["pretrain", "--resume", str(out)]) == 2
    line = _one_line(capsys, "pretrain")
    assert f"--resume {out}: this is a levjepa export" in line and f"model.init_from={out}" in line
    assert main(["pretrain", "--config", str(out / "config.json"), "--print-config"]) == 2
    assert "this is a levjepa export" in _one_line(capsys, "pretrain")


def test_a_resume_shorter_than_its_run_is_refused_and_rewrites_nothing(run_at_step_2, capsys):
    before = (run_at_step_2 / "config.json").read_bytes()
    assert main(["pretrain", "--resume", str(run_at_step_2), "train.steps=1"]) == 2
    line = _one_line(capsys, "pretrain")
    assert "the run is already at step 2; give train.steps > 2" in line and "clips/s" not in line
    assert (run_at_step_2 / "config.json").read_bytes() == before


def test_loader_workers_are_capped_at_the_cores_this_process_may_use(monkeypatch, capsys):
    data = apply_overrides(PretrainConfig(), ["data.num_workers=8"]).data
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    monkeypatch.setattr(loop, "allowed_cpus", lambda: [0, 1, 2])
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    assert loop._capped_workers(data, info).num_workers == 3
    assert "data.num_workers=8 capped at 3" in capsys.readouterr().err
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two ranks on this node share the cores
    assert loop._capped_workers(data, info).num_workers == 1
    few = apply_overrides(PretrainConfig(), ["data.num_workers=0"]).data
    assert loop._capped_workers(few, info) is few
