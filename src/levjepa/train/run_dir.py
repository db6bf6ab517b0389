"""Starting a run directory: every run leaves a trail (STYLE 11). The layout is :mod:`levjepa.weights`'s;
this module writes the files a run starts with and its metrics as it goes::

    RUN_DIR/
      config.json        the resolved PretrainConfig (what `--resume` reads back)
      env.json           python / torch / CUDA / devices / host / world size / command line
      git.json           the levjepa source's commit, branch and whether it was dirty
      git_diff.patch     the uncommitted changes, when there are any
      metrics.jsonl      one JSON object per logging step (MetricsLogger; read back by weights.read_metrics)
      tb/                TensorBoard event files (`tensorboard --logdir RUN_DIR/tb`)

An existing, non-empty run directory is never overwritten silently: pass ``resume=True`` (continue it) or
``overwrite=True`` (delete it first).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from levjepa.weights import CONFIG, METRICS, atomic_write_text, write_json

__all__ = ["RunDirError", "prepare_run_dir", "write_run_info", "MetricsLogger", "default_run_dir"]


class RunDirError(ValueError):
    """The run directory cannot be used as asked (exists without --resume/--overwrite, or missing)."""


def default_run_dir(preset: str) -> Path:
    import time

    return Path("runs") / f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(path: str | Path, *, resume: bool, overwrite: bool) -> Path:
    path = Path(path)
    if resume and overwrite:
        raise RunDirError("choose one of --resume and --overwrite, not both")
    if resume:
        if not (path / CONFIG).is_file():
            raise RunDirError(f"{path}: nothing to resume (no config.json); start a new run without --resume")
        return path
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise RunDirError(
                f"{path} already exists and is not empty: pass --resume to continue that run, "
                "--overwrite to delete it and start again, or choose another --run-dir"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def write_run_info(path: Path, config: dict[str, Any], world_size: int) -> None:
    """config.json, env.json, git.json (+ git_diff.patch when the source tree is dirty)."""
    write_json(path / CONFIG, config)
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "argv": sys.argv,
    }
    write_json(path / "env.json", env)
    src = Path(__file__).resolve().parent
    sha = _git(["rev-parse", "HEAD"], src)
    diff = _git(["diff", "HEAD"], src) if sha else None
    git = {
        "commit": sha.strip() if sha else None,
        "branch": (_git(["rev-parse", "--abbrev-ref", "HEAD"], src) or "").strip() or None,
        "dirty": bool(diff),
    }
    write_json(path / "git.json", git)
    if diff:
        atomic_write_text(path / "git_diff.patch", diff)


class MetricsLogger:
    """Appends metrics to ``metrics.jsonl`` and TensorBoard; only the main rank constructs one."""

    def __init__(self, path: Path, tensorboard: bool = True) -> None:
        self.file = open(path / METRICS, "a", buffering=1)  # noqa: SIM115 (closed in close())
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(path / "tb"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.tb is not None:
            for key, value in metrics.items():
                self.tb.add_scalar(key, value, step)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
