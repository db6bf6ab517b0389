"""What a user reads: the start banner, the evaluation at the end announced (and off when the run's data is
not the benchmark it evaluates on), ``--help`` with examples and defaults, and a config reference generated
from the dataclasses that lists every key."""

from __future__ import annotations

import dataclasses
import json

import pytest

from levjepa.cli import main
from levjepa.commands import plain_text
from levjepa.commands.pretrain import resolve_config
from levjepa.config import apply_overrides, flatten, to_dict
from levjepa.train.config import PretrainConfig
from levjepa.train.loop import pretrain
from train_utils import tiny_config


def test_the_start_banner_says_where_on_what_and_with_what(tmp_path, capsys):
    cfg = tiny_config("train.steps=2", "train.batch_size=16", "data.batch_size=8")
    pretrain(cfg, tmp_path / "run", progress=False)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"pretrain {tmp_path / 'run'}: new run, steps 0 -> 2"
    assert err[1].startswith("  device cpu x 1 process, precision fp32; encoder ") and "parameters" in err[1]
    assert err[2] == "  data 64 items from synthetic"
    assert err[3] == "  batch 16 = 8 clips x 2 micro-batches x 1 process (the loss sees all 16)"
    pretrain(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=3)), tmp_path / "run", resume=True,
             progress=False)  # fmt: skip
    assert f"pretrain {tmp_path / 'run'}: resuming at step 2, steps 2 -> 3" in capsys.readouterr().err


def test_the_benchmark_evaluation_is_off_for_a_run_on_other_data_unless_asked(tmp_path, capsys):
    videos = tmp_path / "videos"
    videos.mkdir()
    cfg = resolve_config("demo-cpu", [f"data.sources={videos}"], None)
    assert cfg.train.eval_at_end is False
    assert "note: train.eval_at_end off: this run trains on" in capsys.readouterr().err
    assert resolve_config("demo-cpu", [f"data.sources={videos}", "train.eval_at_end=true"], None).train.eval_at_end
    assert resolve_config("demo-cpu", [], None).train.eval_at_end  # the demo on its benchmark keeps it
    assert "eval_at_end" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "said"), [({"RANK": "1"}, False), ({"SLURM_PROCID": "3"}, False), ({"RANK": "0"}, True)]
)
def test_a_note_is_said_once_per_job_by_the_first_process(env, said, tmp_path, capsys, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # what torchrun / srun set in each process they start
    resolve_config("demo-cpu", [f"data.sources={tmp_path}"], None)
    assert ("note: train.eval_at_end off" in capsys.readouterr().err) is said


@pytest.mark.parametrize("command", ["pretrain", "probe", "extract"])
def test_help_shows_the_module_docstring_and_the_defaults(command, capsys):
    import importlib

    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    doc = plain_text(importlib.import_module(f"levjepa.commands.{command}").__doc__).strip().splitlines()
    body = [line for line in doc[1:] if line.strip()]
    assert body[0] in out and body[-1] in out  # the docstring (as plain text) below the options, examples included
    assert "(default: " in out or "(default " in out


def test_pretrain_help_shows_its_examples(capsys):
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    assert "levjepa pretrain --resume runs/vitb" in capsys.readouterr().out


def test_extract_help_shows_the_default_format():
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main(["extract", "--help"])
    out = " ".join(buf.getvalue().split())
    assert "(default: safetensors)" in out and "(default: ema)" in out


def test_the_config_reference_lists_every_key_with_its_default(capsys):
    assert main(["pretrain", "--help-config"]) == 0
    out = capsys.readouterr().out
    reference = out.split("\n\n", 1)[1]  # below the header
    rows = {line.split(" = ")[0]: line for line in reference.splitlines()}
    keys = _keys(PretrainConfig())
    assert keys == set(rows), keys ^ set(rows)
    assert set(flatten(to_dict(PretrainConfig()))) == keys - {"model.readout_layers"}  # written only when set
    assert "data.batch_size = 64    [int]  per rank" in rows["data.batch_size"]
    assert rows["train.eval_at_end"].endswith("(demo-cpu)")  # the field's comment
    # every default as shown, written as the command line writes it, gives the defaults back
    assert PretrainConfig() == apply_overrides(PretrainConfig(), [_as_override(k, row) for k, row in rows.items()])


def _keys(cfg: object, prefix: str = "") -> set[str]:
    """Every key of a (nested) config, from its dataclass fields (``to_dict`` leaves out a field marked
    ``OMIT_DEFAULT`` while it holds its default)."""
    keys: set[str] = set()
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        keys |= _keys(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else {prefix + f.name}
    return keys


def _as_override(key: str, row: str) -> str:
    shown = row.split(" = ", 1)[1].split("    [")[0]
    try:
        value = json.loads(shown)
    except json.JSONDecodeError:
        return f"{key}={shown}"  # a string
    if isinstance(value, list):
        return f"{key}={','.join(map(str, value))}"
    return f"{key}={'none' if value is None else str(value).lower() if isinstance(value, bool) else value}"
