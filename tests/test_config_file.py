"""``levjepa pretrain --config FILE``: a file seeds the config (a finished run's config.json included), the
overrides apply on top, and a bad file is refused by name."""

from __future__ import annotations

import json
import sys

from levjepa.cli import main
from levjepa.config import to_dict
from levjepa.presets import preset
from train_utils import tiny_config


def _printed(capsys, *argv: str) -> dict:
    assert main(["pretrain", *argv, "--print-config"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_runs_config_json_seeds_the_same_config(tmp_path, capsys):
    cfg = to_dict(tiny_config("train.steps=5", "objective.name=lejepa"))
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    assert _printed(capsys, "--config", str(tmp_path / "config.json")) == cfg
    again = _printed(capsys, "--config", str(tmp_path / "config.json"), "train.steps=9", "model.depth=3")
    assert again["train"]["steps"] == 9 and again["model"]["depth"] == 3 and again["objective"]["name"] == "lejepa"


def test_a_partial_toml_file_lays_its_keys_over_the_preset(tmp_path, capsys):
    (tmp_path / "short.toml").write_text("[train]\nsteps = 50\nlog_every = 5\n\n[optim]\nlr = 0.002\n")
    printed = _printed(capsys, "--preset", "demo-cpu", "--config", str(tmp_path / "short.toml"), "train.steps=7")
    demo = to_dict(preset("demo-cpu"))
    assert printed["train"]["steps"] == 7  # the override wins over the file
    assert printed["train"]["log_every"] == 5 and printed["optim"]["lr"] == 0.002
    assert printed["model"] == demo["model"] and printed["data"] == demo["data"]  # the rest is the preset's


def test_a_bad_config_file_is_refused_by_name_in_one_line(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text('{"train": {"stepz": 3}}')
    assert main(["pretrain", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json" in err and "train.stepz" in err
    bad.write_text("{not json")
    assert main(["pretrain", "--config", str(bad)]) == 2
    assert "bad.json: not valid json" in capsys.readouterr().err
    (tmp_path / "c.yaml").write_text("train:\n  steps: 3\n")
    monkeypatch.setitem(sys.modules, "yaml", None)
    assert main(["pretrain", "--config", str(tmp_path / "c.yaml")]) == 2
    assert "pip install pyyaml" in capsys.readouterr().err
