"""Continued pretraining (``model.init_from``): step 0 holds exactly the source's weights, the architecture is
the source's, the projector loads when there is one, a run continued from the official fixture trains, and
``--resume`` keeps meaning the run's own checkpoints."""

from __future__ import annotations

import json
import math

import pytest
import torch

import levjepa.train.loop as loop
from levjepa.cli import main
from levjepa.formats.reading.load import load_encoder, load_projector
from levjepa.weights import read_metrics
from test_official import fixture, hub_folder, lightning_checkpoint, run_import
from train_utils import TINY


@pytest.fixture
def spy(monkeypatch):
    """The encoder and projector state the loop builds its trainer from (step 0), copied."""
    seen = []
    real = loop.Pretrainer

    def capture(encoder, projector):
        seen.append(({k: v.clone() for k, v in encoder.state_dict().items()},
                     {k: v.clone() for k, v in projector.state_dict().items()}))  # fmt: skip
        return real(encoder, projector)

    monkeypatch.setattr(loop, "Pretrainer", capture)
    return seen


def pretrain(*args: str) -> int:
    return main(["pretrain", "--preset", "demo-cpu", *TINY, "--no-progress", *args])


def continued(*args: str) -> int:
    """A tiny run that takes its architecture from ``model.init_from``: TINY without its ``model.*`` keys."""
    tiny = [o for o in TINY if not o.startswith("model.")]
    return main(["pretrain", "--preset", "demo-cpu", *tiny, "--no-progress", *args])


def test_step_zero_holds_the_source_run_weights_and_its_projector(tmp_path, spy, capsys):
    source = tmp_path / "source"
    assert pretrain("train.steps=2", "train.checkpoint_every=2", "--run-dir", str(source)) == 0
    run = tmp_path / "continued"
    # TINY's model keys agree with the source's architecture: honoured; the preset's other defaults give way
    assert pretrain(f"model.init_from={source}", "train.steps=2", "--run-dir", str(run)) == 0
    encoder, projector = spy[-1]
    want = load_encoder(source)  # the copy levjepa.load reads: the EMA of the latest checkpoint
    assert all(torch.equal(encoder[k], v) for k, v in want.encoder.state_dict().items())
    proj = load_projector(source)
    assert proj is not None and all(torch.equal(projector[k], v) for k, v in proj.items())
    out = capsys.readouterr().out
    assert "init_from: encoder from ema weights step 2" in out and "projector loaded" in out
    saved = json.loads((run / "config.json").read_text())["model"]
    assert saved["init_from"] == str(source) and saved["heads"] == 2  # recorded; the source's architecture
    # --resume keeps its meaning: the run's own checkpoint, not the source again
    spy.clear()
    assert main(["pretrain", "--resume", str(run), "train.steps=4", "--no-progress"]) == 0
    assert "init_from:" not in capsys.readouterr().out
    # the resumed trainer was built from the seed (then restored from step 2), not from the source's weights
    assert not all(torch.equal(spy[-1][0][k], v) for k, v in want.encoder.state_dict().items())
    assert [row["step"] for row in read_metrics(run)][-1] == 4
    assert json.loads((run / "config.json").read_text())["model"]["init_from"] == str(source)


def test_a_run_continued_from_the_official_weights_trains(tmp_path, spy, capsys):
    t = fixture(1)
    imported = tmp_path / "imported"
    assert run_import(lightning_checkpoint(t, tmp_path / "last.ckpt"), imported) == 0
    run = tmp_path / "run"
    args = ["train.steps=12", "train.log_every=1", "train.checkpoint_every=12", "optim.warmup_steps=0", "--run-dir"]
    assert continued(f"model.init_from={imported}", *args, str(run)) == 0
    encoder, projector = spy[-1]
    official = load_encoder(imported).encoder.state_dict()
    assert all(torch.equal(encoder[k], v) for k, v in official.items())  # step 0 = the official weights
    assert all(torch.equal(projector[k], v) for k, v in load_projector(imported).items())  # and its projector
    assert "projector loaded" in capsys.readouterr().out
    cfg = json.loads((run / "config.json").read_text())["model"]
    assert (cfg["rope_layout"], cfg["dim"], cfg["final_norm_bias"]) == ("vjepa2", 96, True)
    losses = [row["loss"] for row in read_metrics(run)]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) < sum(losses[:3])  # it learns from there


def test_init_from_without_a_projector_starts_a_fresh_one_and_says_so(tmp_path, capsys):
    src = hub_folder(tmp_path / "hub", fixture(1), "encoder.", {"num_heads": 3, "attn_mode": "block_causal"})
    run_import(src, tmp_path / "imported")  # an encoder-only release: no projector
    capsys.readouterr()
    assert continued(f"model.init_from={tmp_path / 'imported'}", "train.steps=1", "--run-dir", str(tmp_path / "r")) == 0
    assert "projector fresh (the source has none)" in capsys.readouterr().out


def test_a_missing_source_is_one_line_and_nothing_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    assert pretrain(f"model.init_from={tmp_path / 'nope'}", "--run-dir", str(run)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0] and not run.exists()


def test_an_explicit_override_the_source_overrules_is_one_line_naming_the_sources_value(tmp_path, capsys):
    t = fixture(1)
    imported = tmp_path / "imported"
    assert run_import(lightning_checkpoint(t, tmp_path / "last.ckpt"), imported) == 0  # dim 96, rope vjepa2
    capsys.readouterr()
    run = tmp_path / "run"
    for override, source_value in (("model.dim=64", "dim = 96"), ("model.rope_layout=levjepa", "rope_layout = vjepa2")):
        assert continued(f"model.init_from={imported}", override, "train.steps=1", "--run-dir", str(run)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and override in err[0] and source_value in err[0], err
        assert not run.exists()
    # the same key in a config file counts too; a value equal to the source's is honoured
    (tmp_path / "cfg.json").write_text(json.dumps({"model": {"depth": 7}}))
    args = ["--config", str(tmp_path / "cfg.json"), f"model.init_from={imported}", "--run-dir", str(run)]
    assert continued(*args) == 2 and "model.depth=7" in capsys.readouterr().err
    args = [f"model.init_from={imported}", "model.dim=96", "model.drop_ratio=0.5", "--print-config"]
    assert continued(*args) == 0
    printed = json.loads(capsys.readouterr().out)["model"]
    assert (printed["dim"], printed["drop_ratio"]) == (96, 0.5)  # a training-only field stays the user's
