"""Pre-emption: a signal from the scheduler ends a run with a checkpoint, never with lost steps.

A cluster stops a job with a signal before it kills it: SLURM sends ``SIGTERM`` at a time limit, a
pre-emption or ``scancel`` (then ``SIGKILL`` after ``KillWait``, 30 s by default), and
``#SBATCH --signal=USR1@120`` asks for ``SIGUSR1`` 120 s before the time limit. While :class:`StopSignals` is
entered, ``SIGTERM`` and ``SIGUSR1`` only set a flag; the loop finishes the optimizer step it is in, every
rank agrees on the stop (one small all-reduce per step under several processes, so all ranks stop after the
same step), the main rank writes a checkpoint, prints one line and the run raises :class:`Preempted`.

``levjepa pretrain`` (and ``levjepa finetune``, through ``levjepa.train.lifecycle``) then exits with status
:data:`REQUEUE_EXIT` = 75 (``EX_TEMPFAIL`` of ``sysexits.h``:
"a temporary failure, retry later"), distinct from success (0), a failed run (1), a mistake (2) and a
kill (128 + signal), so a job script can requeue on exactly that status (``scontrol requeue
$SLURM_JOB_ID``; the README's sbatch example). This is what Lightning's SLURM plugin and submitit do on
``SIGUSR1`` — checkpoint, then requeue — with the requeue left to the script, which knows its scheduler.
``levjepa pretrain --resume RUN_DIR`` continues from that checkpoint bit-exactly, as after any checkpoint.

Handlers are installed only from the main thread (Python's rule) and the previous ones are restored on exit,
so a notebook or a test suite gets its own behaviour back. A second signal while the checkpoint is being
written is recorded and changes nothing: the job ends as soon as the checkpoint is complete.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

__all__ = ["REQUEUE_EXIT", "STOP_SIGNALS", "JobStopped", "Preempted", "StopSignals", "stop_now_on_signals"]

REQUEUE_EXIT = 75  # sysexits.h EX_TEMPFAIL: stopped by the scheduler after a checkpoint; requeue and --resume

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class JobStopped(Exception):
    """A job stopped on SIGTERM / SIGUSR1 with nothing it wrote lost; the message says what is saved and the
    command that continues it. The command line prints it and exits with :data:`REQUEUE_EXIT`."""

    is_main: bool = True  # the process that says so


class Preempted(JobStopped):
    """The run stopped on a signal after writing a checkpoint; ``--resume`` continues it exactly. When that
    write failed (``failed``: why), ``checkpoint`` is the last one saved before it (``saved_step``), or None."""

    def __init__(
        self,
        signal_name: str,
        step: int,
        checkpoint: object,
        run_dir: object,
        *,
        is_main: bool,
        command: str = "levjepa pretrain",
        failed: str | None = None,
        saved_step: int | None = None,
    ) -> None:
        self.signal_name, self.step, self.checkpoint, self.run_dir = signal_name, step, checkpoint, run_dir
        self.is_main = is_main  # the process that says so (every rank raises)
        self.failed = failed
        resume, requeue = f"`{command} --resume {run_dir}`", f" (exit status {REQUEUE_EXIT}: requeue the job)"
        if failed is None:
            said = f"checkpoint {checkpoint} written; continue with {resume}"
        elif checkpoint is None:
            said = (
                f"but its checkpoint could not be written ({failed}) and the run has no other: none of its steps "
                f"is saved; {resume} starts it again"
            )
        else:
            said = (
                f"but its checkpoint could not be written ({failed}); the last saved is checkpoint {checkpoint} "
                f"(step {saved_step}): {resume} continues from it"
            )
        super().__init__(f"{signal_name} received: stopped after step {step}, {said}{requeue}")


class StopSignals:
    """``with StopSignals() as stop:`` — while inside, SIGTERM / SIGUSR1 set ``stop.received`` (the first
    signal's name) instead of ending the process."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


@contextlib.contextmanager
def stop_now_on_signals(message: Callable[[str], str]) -> Iterator[None]:
    """While inside, SIGTERM / SIGUSR1 raise :class:`JobStopped` (``message(signal name)``) at once: for jobs whose
    every write is atomic and which a rerun continues (``extract``: its complete shards and videos; the end of a
    run's evaluation: the run itself is complete), so stopping mid-step loses nothing. The previous handlers are
    restored on exit; outside the main thread this does nothing."""
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        raise JobStopped(message(signal.Signals(signum).name))

    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
