"""load, probe and export on a run the trainer really wrote (not a hand-made run directory), and the
checkpoints written before this version: a final LayerNorm bias, an EMA without its update count.

Every reader says which copy of the weights it used; the EMA copy is the default and averages trained
weights (``levjepa.train.ema``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import warnings

import pytest
import torch

import levjepa
from levjepa.commands import export as export_mod
from levjepa.commands import probe as cli_probe
from levjepa.commands.pretrain import resolve_config
from levjepa.config import ConfigError, apply_overrides, from_dict
from levjepa.formats.reading.load import load_encoder
from levjepa.train.config import PretrainConfig
from levjepa.train.loop import pretrain
from levjepa.weights import load_tensors, prefixed, save_tensors
from train_utils import tiny_config

STEPS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("trained") / "run"
    pretrain(tiny_config(f"train.steps={STEPS}", "train.checkpoint_every=2"), path, progress=False)
    return path


def _clip(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, 4, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_load_reads_the_weights_the_trainer_wrote_and_says_which_copy(run):
    ckpt = run / "checkpoints" / f"step_{STEPS:06d}"
    ema = levjepa.load(run)
    assert ema.weights_info.startswith(
        f"ema weights step {STEPS} (EMA: weighted average of the online weights over {STEPS} update(s)"
    )
    online = levjepa.load(run, weights="online")
    assert "the weights the optimizer trained" in online.weights_info
    for enc, file in ((ema, "ema.safetensors"), (online, "model.safetensors")):
        written = prefixed(load_tensors(ckpt / file)[0], "encoder.")
        assert enc.state_dict().keys() == written.keys()
        assert all(torch.equal(v, written[k]) for k, v in enc.state_dict().items())
        assert not enc.training and not any(p.requires_grad for p in enc.parameters())
    with torch.no_grad():
        a, b = ema(_clip()), online(_clip())
    assert torch.isfinite(a).all() and not torch.allclose(a, b)  # two different copies


def test_probe_command_on_the_trained_run_names_each_copy(run, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli_probe.add_arguments(parser)
    out = tmp_path / "probe.json"
    argv = [str(run), "--task", "appearance", "--weights", "both", "--probe", "linear", "--set", "linear_epochs=2"]
    args = parser.parse_args([*argv, "--out", str(out)])
    assert cli_probe.main(args) == 0
    text = capsys.readouterr().out
    assert f"pretrained-ema: ema weights step {STEPS} (EMA: weighted average of the online weights" in text
    assert f"pretrained-online: online weights step {STEPS} (the weights the optimizer trained)" in text
    result = json.loads(out.read_text())
    assert set(result["accuracy"]) == {"pretrained-ema", "pretrained-online", "random-init"}


def test_export_of_the_trained_run_loads_back_bit_identical(run, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    export_mod.add_arguments(parser)
    assert export_mod.main(parser.parse_args([str(run), "--out", str(tmp_path / "export")])) == 0
    assert f"exported ema weights step {STEPS} (EMA: weighted average" in capsys.readouterr().out
    exported, direct = levjepa.load(tmp_path / "export"), levjepa.load(run)
    assert "EMA: weighted average" in exported.weights_info
    with torch.no_grad():
        assert torch.equal(exported(_clip(1)), direct(_clip(1)))
    assert "weighted average of the online weights" in (tmp_path / "export" / "README.md").read_text()


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    """A run as levjepa wrote it before this version: the final LayerNorm with a bias (trained on the
    rounding noise of its exactly zero gradient), an EMA without its update count, configs without the new
    key."""
    path = tmp_path_factory.mktemp("legacy") / "run"
    cfg = tiny_config(f"train.steps={STEPS}", "train.checkpoint_every=2", "model.final_norm_bias=true")
    pretrain(cfg, path, progress=False)
    for ckpt in (path / "checkpoints").iterdir():
        if not ckpt.is_dir():
            continue
        tensors, meta = load_tensors(ckpt / "ema.safetensors")
        save_tensors(ckpt / "ema.safetensors", tensors, {"step": meta["step"]})
        meta = json.loads((ckpt / "meta.json").read_text())
        del meta["encoder_config"]["final_norm_bias"]
        (ckpt / "meta.json").write_text(json.dumps(meta))
    config = json.loads((path / "config.json").read_text())
    del config["model"]["final_norm_bias"]
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_older_checkpoints_load_as_written_and_warn_about_their_ema(legacy):
    # the EMA then started at the random initialisation with decay 0.99: 0.99^4 = 96 % of it still is
    with pytest.warns(UserWarning, match=r"still 96% its initial \(random\) weights.*weights='online'"):
        ema = load_encoder(legacy)
    written = load_tensors(legacy / "checkpoints" / f"step_{STEPS:06d}" / "ema.safetensors")[0]
    assert ema.config.final_norm_bias and torch.equal(ema.encoder.norm.bias, written["encoder.norm.bias"])
    assert "written before the decay warm-up: 96% of it is still the random initialisation" in ema.describe()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the online weights are what they always were: no warning
        online = load_encoder(legacy, weights="online")
    assert online.config.final_norm_bias and "the weights the optimizer trained" in online.describe()


def test_resuming_an_older_run_names_the_override_then_continues(legacy, tmp_path):
    run = tmp_path / "resumed"
    shutil.copytree(legacy, run)
    cfg = resolve_config(None, [f"train.steps={STEPS + 2}"], run)
    with pytest.raises(ConfigError, match=r"model\.final_norm_bias=true"):
        pretrain(cfg, run, resume=True, progress=False)
    summary = pretrain(apply_overrides(cfg, ["model.final_norm_bias=true"]), run, resume=True, progress=False)
    assert summary.checkpoint.name == f"step_{STEPS + 2:06d}"
    assert from_dict(PretrainConfig, json.loads((run / "config.json").read_text())).model.final_norm_bias
    _, meta = load_tensors(summary.checkpoint / "ema.safetensors")
    assert meta["ema_updates"] == str(STEPS + 2)  # the legacy copy's count was taken from the step
