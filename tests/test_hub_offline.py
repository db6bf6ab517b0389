"""Hub operations without a network: one line, never a traceback, and no network tried when ``HF_HUB_OFFLINE``
says so. ``export --push-to-hub`` keeps the export it wrote and names huggingface_hub's command that pushes it
later; a hub repo id that cannot be fetched says so in one line. No test here reaches a real network: the hub
is either switched off (``HF_HUB_OFFLINE=1``) or an endpoint nothing listens on (``HF_ENDPOINT``, port 9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest

import levjepa
from levjepa.cli import main
from levjepa.weights import WeightsError
from test_export import make_run_dir

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _never(*args, **kwargs):
    raise AssertionError(f"the network was tried: {args} {kwargs}")


def test_an_offline_push_is_not_tried_and_is_one_line_after_the_export(tmp_path, monkeypatch, capsys):
    run = make_run_dir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # set after huggingface_hub was imported: levjepa reads it itself
    monkeypatch.setattr(huggingface_hub, "create_repo", _never)
    monkeypatch.setattr(huggingface_hub, "upload_folder", _never)
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out), "--push-to-hub", "my-org/demo", "--private"]) == 2
    said = capsys.readouterr()
    assert "exported ema weights step 20" in said.out and (out / "model.safetensors").is_file()
    assert said.err.count("\n") == 1, said.err
    assert said.err.startswith(f"levjepa export: {out} is written; not pushed to my-org/demo: HF_HUB_OFFLINE is set")
    assert f"push it with `hf upload my-org/demo {out} . --private`" in said.err


def test_a_push_to_an_unreachable_hub_is_one_line_with_the_command_that_retries(tmp_path):
    run = make_run_dir(tmp_path)
    out = tmp_path / "export"
    env = {
        "PYTHONPATH": SRC,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "HF_ENDPOINT": "http://127.0.0.1:9",  # nothing listens there: a refused connection, no real network
        "HF_TOKEN": "hf_not_a_real_token",
    }
    argv = [sys.executable, "-m", "levjepa", "export", str(run), "--out", str(out), "--push-to-hub", "my-org/demo"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and (out / "model.safetensors").is_file(), done.stderr[-3000:]
    assert done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert done.stderr.startswith(f"levjepa export: {out} is written; not pushed to my-org/demo: the hub cannot be")
    assert done.stderr.rstrip().endswith(f"push it with `hf upload my-org/demo {out} .`")


def test_a_repo_id_offline_reads_the_cache_only_and_says_so_in_one_line(tmp_path, monkeypatch):
    asked = []

    def snapshot_download(repo_id, revision=None, local_files_only=False, **_):
        asked.append(local_files_only)
        raise huggingface_hub.errors.LocalEntryNotFoundError("not in the cache\nand more lines")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsError, match=r"^my-org/demo: no such local folder, .* not in the hub cache") as err:
        levjepa.from_pretrained("my-org/demo")
    assert asked == [True] and "\n" not in str(err.value) and "`hf download my-org/demo`" in str(err.value)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(WeightsError):
        levjepa.from_pretrained("my-org/demo")
    assert asked == [True, False]  # online, the hub is asked
