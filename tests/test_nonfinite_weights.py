"""Weights that cannot be right are refused where they are read, by name: a NaN or an infinity in any tensor of a
run's checkpoint, an export, official weights (a ``.ckpt`` read without safetensors included) or a folder that
transformers' ``AutoModel`` loads ends the load with the file and the tensor — never an encoder whose every
feature is NaN and whose every probe sits at chance."""

from __future__ import annotations

import pytest
import torch
import transformers

import levjepa
from levjepa.cli import main
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.reading.official import read_official
from levjepa.formats.writing.export import export_encoder
from levjepa.weights import WeightsError, load_tensors, refuse_nonfinite, save_tensors
from test_export import make_run_dir
from test_official import fixture, lightning_checkpoint

BAD = "blocks.0.attn.qkv.weight"


def _poison(path, name, value=float("nan")):
    """Rewrite a safetensors file with one value of ``name`` replaced (its metadata kept)."""
    tensors, meta = load_tensors(path)
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[3] = value
    save_tensors(path, tensors, meta)


def test_the_check_names_the_tensor_and_counts_and_passes_finite_integer_and_meta_tensors():
    refuse_nonfinite({"w": torch.randn(4), "step": torch.tensor([2**62]), "m": torch.empty(3, device="meta")}, "f")
    t = torch.zeros(10)
    t[1], t[2], t[5] = float("nan"), float("inf"), float("-inf")
    with pytest.raises(WeightsError, match=r"^f: tensor 'b' holds 1 NaN and 2 infinite value\(s\) of 10 \(and 1"):
        refuse_nonfinite({"a": torch.ones(2), "b": t, "c": torch.full((2,), float("nan"))}, "f")


def test_a_run_whose_ema_holds_nan_is_refused_by_every_reader_and_the_online_copy_still_loads(tmp_path, capsys):
    run = make_run_dir(tmp_path)
    ema = run / "checkpoints" / "step_000020" / "ema.safetensors"
    _poison(ema, f"encoder.{BAD}")
    with pytest.raises(WeightsError, match=rf"ema\.safetensors: tensor 'encoder\.{BAD}' holds 1 NaN"):
        load_encoder(run)
    with pytest.raises(WeightsError, match="holds 1 NaN"):
        levjepa.from_pretrained(run)
    assert load_encoder(run, weights="online").weights == "online"  # the other copy is unharmed
    for argv in (["probe", str(run)], ["export", str(run), "--out", str(tmp_path / "export")]):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"'encoder.{BAD}' holds 1 NaN" in err and "step_N" in err, err
    assert not (tmp_path / "export").exists()


def test_an_export_holding_an_infinity_is_refused_by_levjepa_and_by_transformers(tmp_path):
    run = make_run_dir(tmp_path)
    export_encoder(run, tmp_path / "export")
    _poison(tmp_path / "export" / "model.safetensors", BAD, float("inf"))
    with pytest.raises(WeightsError, match=rf"model\.safetensors: tensor '{BAD}' holds 0 NaN and 1 infinite"):
        load_encoder(tmp_path / "export")
    with pytest.raises(WeightsError, match=rf"'encoder\.{BAD}' holds 0 NaN and 1 infinite"):
        transformers.AutoModel.from_pretrained(str(tmp_path / "export"))


def test_an_official_checkpoint_read_by_torch_load_is_checked_copy_by_copy(tmp_path):
    ckpt = lightning_checkpoint(fixture(1), tmp_path / "last.ckpt")
    saved = torch.load(ckpt, weights_only=True)
    saved["state_dict"]["encoder.blocks.0.mlp.fc1.weight"][0, 0] = float("nan")  # the online copy; the EMA is finite
    torch.save(saved, ckpt)
    assert read_official(ckpt).copy == "ema"
    with pytest.raises(WeightsError, match=r"last\.ckpt \(online copy of the encoder\): tensor 'blocks\.0\.mlp\.fc1"):
        read_official(ckpt, weights="online")
