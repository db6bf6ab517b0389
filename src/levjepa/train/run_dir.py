"""Starting a run directory: every run leaves a trail (STYLE 11). The layout is :mod:`levjepa.weights`'s;
this module writes the files a run starts with and its metrics as it goes::

    RUN_DIR/
      config.json        the resolved PretrainConfig (what `--resume` reads back; written once the models are
                         built and, on resume, the checkpoint has loaded: a refused resume leaves it as it was)
      env.json           python / torch / CUDA / devices / host / world size / command line
      git.json           the levjepa source's commit, branch and whether it was dirty
      git_diff.patch     the uncommitted changes, when there are any
      metrics.jsonl      one JSON object per logging step (MetricsLogger; read back by weights.read_metrics)
      tb/                TensorBoard event files (`tensorboard --logdir RUN_DIR/tb`; train.loggers)

An existing, non-empty run directory is never overwritten silently: pass ``resume=True`` (continue it) or
``overwrite=True`` (delete it first). Files are written atomically and follow the umask (``levjepa.weights``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from levjepa.config import ConfigError, flatten
from levjepa.weights import CONFIG, METRICS, atomic_write_text, write_json

__all__ = ["RunDirError", "MetricsLogger", "check_loggers", "default_run_dir", "prepare_run_dir", "write_run_info"]


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


# train.loggers -> the package each one needs (and the extra that installs it)
LOGGER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def check_loggers(loggers: Sequence[str]) -> None:
    """Refuse, before a run starts, a logger whose package is not installed — except TensorBoard, the default,
    which is then skipped with a note (:class:`MetricsLogger`)."""
    for name in loggers:
        if name != "tensorboard" and importlib.util.find_spec(LOGGER_PACKAGES[name]) is None:
            raise ConfigError(
                f"train.loggers asks for {name}, which is not installed: pip install {LOGGER_PACKAGES[name]} "
                f"(or 'levjepa[{name}]'), or drop it from train.loggers"
            )


class MetricsLogger:
    """Appends metrics to ``metrics.jsonl`` and to the loggers of ``train.loggers``; only the main rank makes one.

    ``tensorboard``: event files in ``RUN_DIR/tb`` (skipped with one note when the package is missing);
    ``wandb``: a W&B run named after the run directory (project ``$WANDB_PROJECT``, default ``levjepa``) with the
    config; ``mlflow``: an MLflow run (tracking URI from ``$MLFLOW_TRACKING_URI`` as MLflow reads it) with the
    config as parameters. Only what is asked for is imported.
    """

    def __init__(
        self, path: Path, loggers: Sequence[str] = ("tensorboard",), config: dict[str, Any] | None = None
    ) -> None:
        self.file = open(path / METRICS, "a", buffering=1)  # noqa: SIM115 (closed in close())
        self.tb: Any = None
        self.wandb: Any = None
        self.mlflow: Any = None
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print(
                    "note: no TensorBoard events (the tensorboard package is not installed: pip install "
                    "'levjepa[tensorboard]'); metrics.jsonl has every metric. train.loggers= silences this.",
                    file=sys.stderr,
                )
            else:
                self.tb = SummaryWriter(log_dir=str(path / "tb"))
        if "wandb" in loggers:
            import wandb

            project = os.environ.get("WANDB_PROJECT", "levjepa")
            self.wandb = wandb.init(project=project, name=path.name, dir=str(path), config=config or {})
        if "mlflow" in loggers:
            import mlflow

            self.mlflow = mlflow
            mlflow.start_run(run_name=path.name)
            mlflow.log_params({k: str(v)[:250] for k, v in flatten(config or {}).items()})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.tb is not None:
            for key, value in metrics.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.mlflow is not None:
            self.mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.mlflow is not None:
            self.mlflow.end_run()
