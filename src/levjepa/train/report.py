"""What a run tells its user as it goes and when it ends: metrics, progress, and the summary.

* :class:`MetricsLogger` appends every logged step to ``metrics.jsonl`` (read back by
  ``levjepa.weights.read_metrics``) and to the loggers of ``train.loggers`` (TensorBoard, W&B, MLflow).
* :class:`Progress` is the main rank's view of a run in progress (pretraining's and fine-tuning's): a tqdm
  bar on a terminal, otherwise one :func:`log_line` per log step on stderr (a SLURM ``.out`` file gets lines,
  not carriage returns), the rate in clips/s since the last log, peak memory, and the time left at the mean
  rate since this process started (or resumed). It holds the timing, so the loop's state holds training state only.
* :func:`start_banner` is what a run says before its first step: where it writes, on what, with what.
* :class:`RunSummary` is what ``pretrain`` returns; :func:`format_summary` prints it and :func:`summary_json`
  writes it (``levjepa pretrain --summary-json``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from levjepa.config import ConfigError, flatten
from levjepa.weights import METRICS

__all__ = [
    "MetricsLogger",
    "Progress",
    "RunSummary",
    "check_loggers",
    "format_summary",
    "log_line",
    "peak_memory_gb",
    "start_banner",
    "summary_json",
]

TERMS = ("loss", "invariance", "pred", "sigreg", "localreg")  # the loss and its terms, in the order shown

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
    config as parameters. Only what is asked for is imported. ``purge_step`` (a resume: its checkpoint's step
    + 1) makes TensorBoard drop the events logged after the checkpoint, so resumed curves have no duplicate
    steps.
    """

    def __init__(
        self,
        path: Path,
        loggers: Sequence[str] = ("tensorboard",),
        config: dict[str, Any] | None = None,
        purge_step: int | None = None,
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
                # purge_step: TensorBoard hides the events of steps >= it written before (a resumed run's)
                self.tb = SummaryWriter(log_dir=str(path / "tb"), purge_step=purge_step)
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


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process so far: allocated on a GPU, resident (RSS) on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss_kb / 2**20  # Linux reports KiB


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def log_line(step: int, total: int, metrics: dict[str, float], eta_s: float) -> str:
    """One log record a cluster log can hold: step, the loss and its terms, clips/s and the time left, e.g.
    ``step 40/800  loss 1.0231  invariance 0.4512  sigreg 5.1230  128.4 clips/s  eta 5m56s``."""
    parts = [f"step {step}/{total}", *(f"{k} {metrics[k]:.4f}" for k in TERMS if k in metrics)]
    parts.append(f"{metrics.get('clips_per_s', math.nan):.1f} clips/s")
    parts.append(f"eta {_duration(eta_s)}")
    return "  ".join(parts)


class Progress:
    """A run in progress as its user sees it (module docstring). Every rank makes one; only the main rank's
    writes (``logger``: the main rank's :class:`MetricsLogger`, or ``None``)."""

    def __init__(
        self,
        *,
        total: int,
        start_step: int,
        batch_size: int,
        device: torch.device,
        logger: MetricsLogger | None,
        is_main: bool,
        show: bool,
        desc: str = "pretrain",
    ) -> None:
        self.total, self.batch_size, self.device, self.logger = total, batch_size, device, logger
        bar_on = show and is_main and sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=start_step, desc=desc, unit="step", dynamic_ncols=True,
                        disable=not bar_on)  # fmt: skip
        self.lines = is_main and not bar_on  # one line per log step instead of the bar
        self.start_step = self.logged_step = start_step
        self.t_start = self.t_log = time.perf_counter()

    def advance(self) -> None:
        """One optimizer step done."""
        self.bar.update(1)

    def elapsed(self) -> float:
        """Seconds since this process started (or resumed) the run."""
        return time.perf_counter() - self.t_start

    def eta(self, step: int, now: float) -> float:
        """Seconds left at the mean rate since this process started (or resumed)."""
        done = step - self.start_step
        return (now - self.t_start) / done * (self.total - step) if done > 0 else math.nan

    def log(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Record ``metrics`` at ``step`` with the rate since the last log and the peak memory added; returns
        the record."""
        now = time.perf_counter()
        record = dict(metrics)
        record["clips_per_s"] = (step - self.logged_step) * self.batch_size / max(now - self.t_log, 1e-9)
        record["peak_mem_gb"] = peak_memory_gb(self.device)
        self.t_log, self.logged_step = now, step
        if self.logger is not None:
            self.logger.log(step, record)
        self.bar.set_postfix(
            loss=f"{record['loss']:.4f}",
            inv=f"{record.get('invariance', record.get('pred', math.nan)):.4f}",
            sigreg=f"{record.get('sigreg', record.get('localreg', math.nan)):.3f}",
            clips_s=f"{record['clips_per_s']:.1f}",
            refresh=False,
        )
        if self.lines:
            print(log_line(step, self.total, record, eta_s=self.eta(step, now)), file=sys.stderr)
        return record

    def close(self) -> None:
        self.bar.close()
        if self.logger is not None:
            self.logger.close()


def _millions(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 100_000 else f"{count / 1e3:.1f}k"


def start_banner(
    *,
    run_dir: Path,
    start_step: int,
    steps: int,
    device: torch.device,
    world_size: int,
    encoder_params: int,
    projector_params: int,
    items: int,
    sources: Sequence[str],
    batch_size: int,
    micro_batch: int,
    micro_batches: int,
    precision: str,
) -> str:
    """The lines a run prints before its first step, e.g.::

    pretrain runs/vitb: new run, steps 0 -> 320
      device cpu x 1 process, precision fp32; encoder 5.6M parameters (+ projector 0.6M)
      data 1600 items from synthetic
      batch 64 = 16 clips x 4 micro-batches x 1 process (the loss sees all 64)
    """
    what = f"resuming at step {start_step}" if start_step else "new run"
    processes = f"{world_size} process{'es' if world_size > 1 else ''}"
    return "\n".join(
        [
            f"pretrain {run_dir}: {what}, steps {start_step} -> {steps}",
            f"  device {device.type} x {processes}, precision {precision}; encoder {_millions(encoder_params)} "
            f"parameters (+ projector {_millions(projector_params)})",
            f"  data {items} items from {', '.join(sources)}",
            f"  batch {batch_size} = {micro_batch} clips x {micro_batches} "
            f"micro-batch{'es' if micro_batches > 1 else ''} x {processes} (the loss sees all {batch_size})",
        ]
    )


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    wall_s: float
    clips_per_s: float
    final: dict[str, float] = field(default_factory=dict)
    skipped_steps: list[int] = field(default_factory=list)
    bad_files: int = 0
    checkpoint: Path | None = None
    rank: int = 0  # the process that returned this summary (only rank 0 writes the run directory)
    probe_results: dict[str, Any] | None = None  # filled by `levjepa pretrain` when train.eval_at_end


def format_summary(s: RunSummary) -> str:
    lines = [
        f"run directory : {s.run_dir}",
        f"steps         : {s.steps}   wall {s.wall_s:.1f} s   {s.clips_per_s:.1f} clips/s",
    ]
    if s.final:
        keys = [k for k in TERMS if k in s.final]
        lines.append("final losses  : " + "  ".join(f"{k} {s.final[k]:.4f}" for k in keys))
        if "effective_rank" in s.final:
            lines.append(f"effective rank: {s.final['effective_rank']:.1f}")
    lines.append(f"skipped steps : {len(s.skipped_steps)}{' ' + str(s.skipped_steps[:10]) if s.skipped_steps else ''}")
    lines.append(f"bad files     : {s.bad_files}" + (" (see bad_files.json)" if s.bad_files else ""))
    if s.checkpoint:
        lines.append(f"checkpoint    : {s.checkpoint}")
    return "\n".join(lines)


def summary_json(s: RunSummary) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    d["run_dir"] = str(s.run_dir)
    d["checkpoint"] = str(s.checkpoint) if s.checkpoint else None
    return d
