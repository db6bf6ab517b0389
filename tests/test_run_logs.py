"""What a run tells a cluster user: one log line per log step when no progress bar is on a terminal, and the
metrics in the loggers asked for (TensorBoard optional, W&B / MLflow only on request)."""

from __future__ import annotations

import importlib.machinery
import json
import re
import sys
import types

import pytest

from levjepa.config import ConfigError
from levjepa.train.loop import pretrain
from levjepa.train.report import log_line
from train_utils import tiny_config

LINE = re.compile(r"^step (\d+)/6  loss [\d.]+  invariance [\d.]+  sigreg [\d.]+  [\d.]+ clips/s  eta \S+$")


def test_log_lines_reach_stderr_when_the_bar_is_off_or_not_on_a_terminal(tmp_path, capsys):
    cfg = tiny_config("train.steps=6", "train.log_every=2", "train.checkpoint_every=6")
    for progress, run in ((False, "a"), (True, "b")):  # pytest's stderr is not a terminal: no bar either way
        pretrain(cfg, tmp_path / run, progress=progress)
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.startswith("step ")]
        assert [int(LINE.match(x).group(1)) for x in lines] == [2, 4, 6], err
        assert "\r" not in err  # no carriage-return bar updates in a log file
        metrics = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        assert f"loss {metrics[-1]['loss']:.4f}" in lines[-1]


def test_a_log_line_holds_step_loss_terms_rate_and_eta():
    line = log_line(40, 800, {"loss": 1.02314, "invariance": 0.4512, "sigreg": 5.123, "clips_per_s": 128.4}, 356.0)
    assert line == "step 40/800  loss 1.0231  invariance 0.4512  sigreg 5.1230  128.4 clips/s  eta 5m56s"
    assert log_line(1, 9, {"loss": 1.0, "pred": 0.5, "localreg": 0.1, "clips_per_s": 1.0}, 7200.0).endswith("eta 2h00m")


def test_without_tensorboard_a_run_says_so_once_and_writes_its_metrics(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # importing it now fails
    pretrain(tiny_config("train.steps=2", "train.checkpoint_every=2"), tmp_path / "run", progress=False)
    err = capsys.readouterr().err
    assert err.count("levjepa[tensorboard]") == 1
    assert not (tmp_path / "run" / "tb").exists() and (tmp_path / "run" / "metrics.jsonl").read_text()
    pretrain(tiny_config("train.steps=2", "train.loggers="), tmp_path / "quiet", progress=False)
    assert "levjepa[tensorboard]" not in capsys.readouterr().err  # train.loggers= asks for none


def _fake_module(name: str, calls: list, **functions) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for fname, result in functions.items():
        setattr(module, fname, lambda *a, _f=fname, _r=result, **k: (calls.append((_f, a, k)), _r)[1])
    return module


def test_wandb_and_mlflow_get_the_config_and_every_logged_step_only_when_asked(tmp_path, monkeypatch):
    calls: list = []
    wandb_run = _fake_module("wandb_run", calls, log=None, finish=None)
    monkeypatch.setitem(sys.modules, "wandb", _fake_module("wandb", calls, init=wandb_run))
    monkeypatch.setitem(sys.modules, "mlflow", _fake_module("mlflow", calls, start_run=None, log_params=None,
                                                            log_metrics=None, end_run=None))  # fmt: skip
    cfg = tiny_config("train.steps=4", "train.log_every=2", "train.loggers=wandb,mlflow")
    pretrain(cfg, tmp_path / "run", progress=False)
    names = [c[0] for c in calls]
    assert names == ["init", "start_run", "log_params", "log", "log_metrics", "log", "log_metrics", "finish", "end_run"]
    init = calls[0][2]
    assert init["name"] == "run" and init["config"]["model"]["dim"] == 32
    assert calls[2][1][0]["model.dim"] == "32"
    assert [c[2]["step"] for c in calls if c[0] in ("log", "log_metrics")] == [2, 2, 4, 4]
    assert "loss" in calls[3][1][0]
    calls.clear()
    pretrain(tiny_config("train.steps=2"), tmp_path / "plain", progress=False)
    assert calls == []  # installed but not asked for: never touched


def test_a_logger_asked_for_but_not_installed_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else object())
    with pytest.raises(ConfigError, match=r"pip install wandb"):
        pretrain(tiny_config("train.steps=2", "train.loggers=wandb"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
