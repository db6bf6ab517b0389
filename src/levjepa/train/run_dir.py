"""A run directory's life: every run leaves a trail (STYLE 11). The layout is :mod:`levjepa.weights`'s; this
module makes or reopens the directory, writes the files a run starts with, and removes a start that failed
(the metrics are written as the run goes by ``levjepa.train.report``)::

    RUN_DIR/
      config.json        the resolved PretrainConfig (what `--resume` reads back; written once the models are
                         built and, on resume, the checkpoint has loaded: a refused resume leaves it as it was)
      env.json           levjepa / python / torch / av / numpy / CUDA / devices / host / world size / command line
      git.json           the levjepa source's commit, branch and whether it was dirty
      git_diff.patch     the uncommitted changes, when there are any
      metrics.jsonl      one JSON object per logging step (report.MetricsLogger; read back by weights.read_metrics)
      tb/                TensorBoard event files (`tensorboard --logdir RUN_DIR/tb`; train.loggers)
      .lock              held (fcntl) by the process running the run; says its pid, host and start time

An existing, non-empty run directory is never overwritten silently: pass ``resume=True`` (continue it) or
``overwrite=True`` (delete it first). A resume's config is checked against the run's ``config.json`` before
anything is written (:func:`levjepa.train.config.check_resume`), and a start that fails before its first
metrics line or checkpoint removes the directory it created (:func:`run_directory`), so the same command can
simply be run again. Under ``torchrun`` the main rank makes these checks and every rank raises its refusal
(``distributed.main_rank_decides``). Files are written atomically and follow the umask (``levjepa.weights``).

One process runs a run directory at a time (:class:`RunLock`): the main rank holds an ``fcntl`` lock on
``RUN_DIR/.lock`` for the run's life, so a second ``--resume`` of a live run (a requeued job overlapping its
predecessor) is refused in one line naming the holder's pid, host and start time. The kernel releases the lock
when its process dies, so the lock of a killed job (kill -9, a lost node) is stale and simply taken over.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from levjepa import distributed
from levjepa.config import ConfigError
from levjepa.data import BadFileReport
from levjepa.train.config import PretrainConfig, check_resume
from levjepa.version import __version__, release
from levjepa.weights import (
    BAD_FILES,
    CONFIG,
    METRICS,
    WeightsError,
    atomic_write_text,
    checkpoint_step,
    latest_checkpoint,
    read_json,
    write_json,
)

__all__ = [
    "ResumeCheck",
    "RunDirError",
    "RunLock",
    "check_pretrain_resume",
    "check_steps",
    "default_run_dir",
    "newer_writer",
    "prepare_run_dir",
    "read_bad_files",
    "run_directory",
    "write_run_info",
]

ResumeCheck = Callable[[Path], None]  # refuses (raises) a resume of the run in this directory

ENV = "env.json"  # python, torch, devices, host, world size, command line of the (last) start
LOCK = ".lock"  # the lock of the process running the run (RunLock)


class RunDirError(ValueError):
    """The run directory cannot be used as asked (exists without --resume/--overwrite, or missing)."""


def default_run_dir(preset: str) -> Path:
    return Path("runs") / f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(path: str | Path, *, resume: bool, overwrite: bool, flag: str = "--run-dir") -> Path:
    """Open ``path`` as the module doc says; ``flag``: the option the command names the directory with (pretrain's
    ``--run-dir``, finetune's ``--out``, which has no ``--overwrite``), so the refusal names only its options."""
    path = Path(path)
    if resume and overwrite:
        raise RunDirError("choose one of --resume and --overwrite, not both")
    if resume:
        if not (path / CONFIG).is_file():
            raise RunDirError(f"{path}: nothing to resume (no config.json); start a new run without --resume")
        return path
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            delete = "--overwrite to delete it and start again, " if flag == "--run-dir" else ""
            raise RunDirError(
                f"{path} already exists and is not empty: pass --resume to continue that run, {delete}"
                f"or choose another {flag}"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


class RunLock:
    """An exclusive ``fcntl`` lock on ``RUN_DIR/.lock`` (module docstring): ``acquire`` refuses with a
    :class:`RunDirError` while another live process holds it; the file then says who (pid, host, start time).
    On a file system without locks (``ENOLCK``) the run goes on unlocked, with one note."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.read(fd, 4096).decode(errors="replace").strip()
            os.close(fd)
            if err.errno in (errno.EACCES, errno.EAGAIN):
                raise RunDirError(
                    f"{self.path.parent} is in use by another process ({_holder(holder)}): wait for it to end, or "
                    "stop it, before running this run again"
                ) from None
            print(f"note: {self.path}: the file system offers no lock ({err.strerror}); not locked", file=sys.stderr)
            return self
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock; the file stays (unlinking it races)
            self.fd = None


def _holder(text: str) -> str:
    try:
        who = json.loads(text)
        return f"pid {who['pid']} on {who['host']}, started {who['started']}"
    except (ValueError, KeyError, TypeError):
        return "see its .lock file"


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
        "levjepa": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "av": _version("av"),
        "numpy": _version("numpy"),
        "cuda": torch.version.cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_count": os.cpu_count(),
        # the CPU kernels' instruction set (e.g. AVX2, AVX512): it decides the last bits of every CPU result, so a
        # run reproduces bit for bit only on the same one (ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA select it)
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "argv": sys.argv,
    }
    write_json(path / ENV, env)
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


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def newer_writer(run_dir: Path) -> str | None:
    """The levjepa version that wrote ``run_dir`` when it is newer than this one (its ``env.json``), else None:
    what an error about the run's files should name (a newer levjepa may write keys this one does not know)."""
    env = run_dir / ENV
    try:
        wrote = read_json(env).get("levjepa") if env.is_file() else None
    except (OSError, ValueError):
        return None
    return wrote if isinstance(wrote, str) and release(wrote) > release(__version__) else None


def _started(path: Path) -> bool:
    """Whether the run has written anything worth keeping: a metrics line or a checkpoint."""
    metrics = path / METRICS
    return (metrics.is_file() and metrics.stat().st_size > 0) or latest_checkpoint(path) is not None


def _remove_failed_start(path: Path, created: str) -> None:
    """Undo a start that failed before its first log line or checkpoint: the directory this run created is
    removed, one that existed (empty, or emptied by --overwrite) is left empty."""
    shutil.rmtree(path, ignore_errors=True)
    if created == "emptied":
        path.mkdir(parents=True, exist_ok=True)


def _open(
    path: Path,
    info: distributed.DistInfo,
    *,
    resume: bool,
    overwrite: bool,
    check: ResumeCheck | None,
    flag: str = "--run-dir",
) -> tuple[Path, str, RunLock]:
    """The run directory every rank writes to (the main rank's choice), prepared, what this call did to it:
    "created" (it did not exist), "emptied" (it existed: empty, or --overwrite deleted what it held) or "" (a
    resumed run's, which is never removed), and its lock (held by the main rank)."""
    path = Path(distributed.broadcast_object(str(path)))
    created = ""
    lock = RunLock(path)
    # the main rank checks and every rank raises its refusal (a barrier after a main-only check left the
    # other ranks waiting there forever); the broadcast is also the barrier the ranks wait at
    with distributed.main_rank_decides():
        if info.is_main:
            existed = path.exists()
            if overwrite and (path / LOCK).is_file():
                RunLock(path).acquire().release()  # never delete a directory a live run is writing
            prepare_run_dir(path, resume=resume, overwrite=overwrite, flag=flag)
            if resume and check is not None:  # a refused resume leaves the directory as it was, its lock file too
                check(path)
            if not resume:
                created = "emptied" if existed else "created"
            lock.acquire()
    return path, created, lock


def check_pretrain_resume(path: Path, cfg: PretrainConfig, world_size: int, at: Path | None = None) -> None:
    """What a pretraining ``--resume`` must not change (:func:`levjepa.train.config.check_resume`), the process
    count under local accumulation, and a length that ends before the checkpoint it resumes from (``at``, else
    the run's latest)."""
    check_resume(read_json(path / CONFIG), cfg)
    _check_world_size(path, cfg, world_size)
    check_steps(path, cfg.train.steps, "train.steps", at)


def check_steps(path: Path, steps: int, key: str, at: Path | None = None) -> None:
    """A resume must not end before the step its checkpoint stands at (it would train nothing and rewrite the
    run's config with a shorter length); ``key`` names the setting for the message. The checkpoint is ``at``
    (``--resume RUN/checkpoints/step_N``), else the run's latest. One whose step cannot be read is left to the
    load, which refuses it in one line naming the newest intact checkpoint before it."""
    chosen = at if at is not None else latest_checkpoint(path)
    try:
        done = checkpoint_step(chosen) if chosen is not None else 0
    except (WeightsError, OSError):
        return
    if steps < done:
        raise ConfigError(
            f"--resume {at or path} with {key}={steps}: the run is already at step {done}; give "
            f"{key} > {done} to train on, or leave it (its checkpoints are kept)"
        )


def _check_world_size(path: Path, cfg: PretrainConfig, world_size: int) -> None:
    """Under ``train.accumulation=local`` the loss sees ``data.batch_size × world size`` clips, so a resume on
    another number of processes would continue another objective: refused (``global`` resumes on any)."""
    env = path / ENV
    saved = read_json(env).get("world_size") if env.is_file() else None
    if cfg.train.accumulation == "local" and saved is not None and saved != world_size:
        raise ConfigError(
            f"--resume on {world_size} process(es) of a run trained on {saved} under train.accumulation=local: "
            "there the loss sees data.batch_size x world size clips (SIGReg's N), so the run would continue "
            f"another objective. Resume it on {saved}, or start a new run (train.accumulation=global resumes on any)"
        )


@contextmanager
def run_directory(
    path: str | Path,
    info: distributed.DistInfo,
    *,
    resume: bool,
    overwrite: bool,
    check: ResumeCheck | None = None,
    flag: str = "--run-dir",
) -> Iterator[Path]:
    """The run directory ``path`` for the body of the ``with``, opened as ``resume`` / ``overwrite`` say and
    locked; ``check(path)`` refuses a resume that would change the run (before anything is written). If the
    body raises before the run wrote a metrics line or a checkpoint, a directory this call created (or emptied)
    is removed (or left empty). Both training loops open their directory here."""
    path, created, lock = _open(Path(path), info, resume=resume, overwrite=overwrite, check=check, flag=flag)
    try:
        yield path
    except BaseException:
        if created and not _started(path):
            lock.release()
            _remove_failed_start(path, created)
        raise
    finally:
        lock.release()


def read_bad_files(path: Path, resume: bool) -> BadFileReport:
    """The run's report of unreadable files; on resume, what the run met before it stopped stays reported."""
    report = BadFileReport()
    if resume and (path / BAD_FILES).is_file():
        report.merge(BadFileReport.read(path / BAD_FILES))
    return report
