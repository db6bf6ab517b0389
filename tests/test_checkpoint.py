"""Checkpoints: exact round trip, atomic against failures, pruning, and no pickle anywhere."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from levjepa.train import checkpoint as ckpt
from levjepa.train.config import OptimConfig
from levjepa.train.ema import EMA
from levjepa.train.optim import build_optimizer
from levjepa.weights import load_tensors


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
        self.projector = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))

    def forward(self, x):
        return self.projector(self.encoder(x))


def _trained(seed: int = 0, steps: int = 3):
    torch.manual_seed(seed)
    model = _Model()
    ema = EMA(model.encoder, decay=0.5, every=1)
    opt = build_optimizer(model, OptimConfig(warmup_steps=0))
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 4)).square().mean().backward()
        opt.step()
        ema.update(model.encoder)
    return model, ema, opt


def _save(tmp_path, model, ema, opt, step):
    return ckpt.save_checkpoint(
        tmp_path,
        model=model,
        ema=ema,
        optimizer=opt,
        state=ckpt.TrainerState(step=step, consecutive_skips=1, extra={"metrics": {"loss": 1.5}}),
        encoder_config={"dim": 8},
    )


def test_round_trip_restores_everything_exactly(tmp_path):
    model, ema, opt = _trained()
    path = _save(tmp_path, model, ema, opt, step=3)
    assert not [k for k in load_tensors(path / "trainer.safetensors")[0] if not k.startswith("optim.")]  # no RNG
    assert ckpt.latest_checkpoint(tmp_path) == path and path.name == "step_000003"

    model2, ema2, opt2 = _trained(seed=1, steps=1)  # different weights and optimizer state
    before = torch.get_rng_state()
    state = ckpt.load_checkpoint(path, model=model2, ema=ema2, optimizer=opt2)
    assert (state.step, state.consecutive_skips) == (3, 1)
    assert state.extra["metrics"] == {"loss": 1.5}
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b), k  # BatchNorm running stats included
    for k, v in ema.state_dict().items():
        assert torch.equal(v, ema2.state_dict()[k])
    assert ema2.updates == ema.updates == 3  # the EMA's schedule resumes where it stood
    assert torch.equal(torch.get_rng_state(), before)  # loading leaves the global RNG alone (nothing uses it)
    # the optimizers now step identically
    for m, o in ((model, opt), (model2, opt2)):
        torch.manual_seed(7)
        o.zero_grad()
        m(torch.randn(16, 4)).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_checkpoint_files_hold_no_pickle(tmp_path):
    model, ema, opt = _trained()
    path = _save(tmp_path, model, ema, opt, step=3)
    names = sorted(p.name for p in path.iterdir())
    assert names == ["ema.safetensors", "meta.json", "model.safetensors", "trainer.json", "trainer.safetensors"]
    assert json.loads((path / "meta.json").read_text())["encoder_config"] == {"dim": 8}


def test_failed_write_leaves_previous_checkpoint_and_latest_intact(tmp_path, monkeypatch):
    model, ema, opt = _trained()
    first = _save(tmp_path, model, ema, opt, step=3)
    calls = {"n": 0}
    real = ckpt.save_tensors

    def disk_full_on_second_file(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt, "save_tensors", disk_full_on_second_file)
    with pytest.raises(OSError, match="No space"):
        _save(tmp_path, model, ema, opt, step=6)
    assert ckpt.latest_checkpoint(tmp_path) == first
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()] == ["step_000003"]
    model2, ema2, opt2 = _trained(seed=1, steps=1)
    assert ckpt.load_checkpoint(first, model=model2, ema=ema2, optimizer=opt2).step == 3


def test_prune_keeps_last_and_multiples(tmp_path):
    model, ema, opt = _trained()
    for step in (10, 20, 30, 40, 50):
        _save(tmp_path, model, ema, opt, step=step)
    ckpt.prune(tmp_path, keep_last=2, keep_every=20)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000020", "step_000040", "step_000050"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000050"


def test_weights_without_a_final_norm_from_before_its_last_bias_went_load_and_name_the_resume_override(tmp_path):
    # final_norm=false encoders used to train the last block's mlp.fc2 bias (a constant shift of CLS that the
    # projector's BatchNorm removes); such weights still load as they were, and a resume names the override
    import levjepa
    from levjepa.config import ConfigError, apply_overrides, to_dict
    from levjepa.train.loop import build_models
    from levjepa.train.step import Pretrainer
    from train_utils import tiny_config

    legacy = tiny_config("model.final_norm=false", "model.final_norm_bias=true")
    model = Pretrainer(*build_models(legacy, seed=0))
    last = f"encoder.blocks.{legacy.model.depth - 1}.mlp.fc2.bias"
    assert last in model.state_dict()
    ema, opt = EMA(model.encoder), build_optimizer(model, legacy.optim)
    model_cfg = {k: v for k, v in to_dict(legacy.model).items() if k != "final_norm_bias"}  # as written then
    path = ckpt.save_checkpoint(
        tmp_path, model=model, ema=ema, optimizer=opt, state=ckpt.TrainerState(step=1), encoder_config=model_cfg
    )
    today = apply_overrides(legacy, ["model.final_norm_bias=false"])
    fresh = Pretrainer(*build_models(today, seed=0))
    assert last not in fresh.state_dict()
    with pytest.raises(ConfigError, match=r"model\.final_norm_bias=true"):
        ckpt.load_checkpoint(path, model=fresh, ema=EMA(fresh.encoder), optimizer=build_optimizer(fresh, today.optim))
    loaded = levjepa.load(path, weights="online")
    assert loaded.blocks[-1].mlp.fc2.bias is not None
    assert torch.equal(loaded.blocks[-1].mlp.fc2.bias, model.encoder.blocks[-1].mlp.fc2.bias)


def test_rewinding_past_the_same_step_again_sets_each_later_checkpoint_aside_under_a_free_name(tmp_path, capsys):
    root = tmp_path / "checkpoints"

    def written(step: int, mark: str) -> None:
        (root / f"step_{step:06d}").mkdir(parents=True)
        (root / f"step_{step:06d}" / "meta.json").write_text(json.dumps({"step": step, "mark": mark}))

    written(2, "kept")
    for rewind in ("first", "second", "third"):  # the run went on to step 4 again, then back to step 2
        written(4, rewind)
        ckpt._abandon_after(tmp_path, root / "step_000002")
        assert ckpt.latest_checkpoint(tmp_path) == root / "step_000002"
    aside = {p.name: json.loads((p / "meta.json").read_text())["mark"] for p in root.glob(".abandoned-*")}
    assert aside == {".abandoned-step_000004": "first", ".abandoned-step_000004.1": "second",
                     ".abandoned-step_000004.2": "third"}  # fmt: skip
    said = capsys.readouterr()
    assert said.out == "" and "step_000004 set aside as .abandoned-step_000004.2" in said.err
