"""The torch floor is what the code needs, stated once in pyproject.toml and checked at import in one line;
the run directory records which levjepa, torch, av and numpy wrote it, and a run from a newer levjepa is
named as such when this one cannot read it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

import levjepa
from levjepa.cli import main
from levjepa.train.loop import pretrain
from train_utils import tiny_config

ROOT = Path(__file__).resolve().parents[1]


VERSIONS = [("2.4.1", False), ("2.3.0+cu121", False), ("2.5.0", True), ("2.13.0+cpu", True), ("2.5.0a0+git", True)]


@pytest.mark.parametrize(("found", "ok"), [*VERSIONS, ("1.13.1", False)])
def test_an_older_torch_is_refused_in_one_line(found, ok):
    if ok:
        levjepa.check_torch(found)
        return
    with pytest.raises(ImportError) as info:
        levjepa.check_torch(found)
    assert "\n" not in str(info.value) and f"levjepa needs torch>=2.5, found torch {found}" in str(info.value)


def test_the_floor_in_pyproject_is_the_one_checked_and_the_installed_torch_passes():
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=([\d.]+)"', text).group(1)
    assert tuple(int(x) for x in floor.split(".")) == levjepa.TORCH_FLOOR
    assert f"torch>={floor}" in (ROOT / "README.md").read_text()
    assert levjepa.release(torch.__version__) >= levjepa.TORCH_FLOOR


def test_import_levjepa_refuses_an_old_torch_without_importing_it(tmp_path):
    # a fake distribution's metadata says torch 2.4.0, ahead of the real one on the path
    dist = tmp_path / "torch-2.4.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.4.0\n")
    code = "import sys; sys.path.insert(0, sys.argv[1]); import levjepa"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1 and "ImportError: levjepa needs torch>=2.5, found torch 2.4.0" in out.stderr
    loaded = subprocess.run([sys.executable, "-c", "import sys, levjepa; print('torch' in sys.modules)"],
                            capture_output=True, text=True)  # fmt: skip
    assert loaded.stdout.strip() == "False"  # the check reads metadata: import levjepa stays cheap


def test_env_json_records_the_versions_that_wrote_the_run(tmp_path):
    pretrain(tiny_config("train.steps=1"), tmp_path / "run", progress=False)
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["levjepa"] == levjepa.__version__ and env["torch"] == torch.__version__
    assert env["av"] == metadata.version("av") and env["numpy"] == metadata.version("numpy")
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # e.g. "AVX512": the float path


def test_a_run_written_by_a_newer_levjepa_is_named_as_such(tmp_path, capsys):
    run = tmp_path / "run"
    pretrain(tiny_config("train.steps=1"), run, progress=False)
    config = json.loads((run / "config.json").read_text())
    config["train"]["new_knob"] = 3  # a key this levjepa does not know
    (run / "config.json").write_text(json.dumps(config))
    env = json.loads((run / "env.json").read_text())
    (run / "env.json").write_text(json.dumps({**env, "levjepa": "9.1.0"}))
    capsys.readouterr()
    assert main(["pretrain", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "was written by levjepa 9.1.0, newer than this one" in err and "train.new_knob" in err
    assert main(["pretrain", "--config", str(run / "config.json"), "--print-config"]) == 2
    assert "written by levjepa 9.1.0" in capsys.readouterr().err


def test_release_keeps_the_numeric_release_and_drops_a_pre_release_tag():
    assert levjepa.release("2.13.0+cpu") == (2, 13, 0)
    assert levjepa.release("2.4.1rc3") == (2, 4, 1)
    assert levjepa.release("2.6.0a0+git1234") == (2, 6, 0)
    assert levjepa.release("2.5.dev20240101") == (2, 5)
