"""The life of a training run between its first and its last step, written once for both training loops:
pretraining (``levjepa.train.loop``) and fine-tuning (``levjepa.finetune.loop``).

A loop opens its directory with ``levjepa.train.run_dir.run_directory`` (made or reopened, locked, a failed
start removed), shows its progress with ``levjepa.train.report.Progress`` (a bar, or log lines with the time
left), and inside ``with Lifecycle(...) as life:`` calls, after every optimizer step:

* :meth:`Lifecycle.record` — the step's skip flag (a non-finite loss or gradient: the update was skipped on
  the device), kept on the device; every ``check_every`` steps :meth:`Lifecycle.check` reads the flags (one
  synchronisation), names the skipped steps, and stops the run with :class:`TrainingStopped` after
  ``max_consecutive_skips`` in a row — the longest run since the last check, kept on the device, so a run that
  ends between two checks stops it too;
* :meth:`Lifecycle.end_of_step` — a checkpoint when one is due (every ``checkpoint_every`` steps and at the
  last), written by the loop's own ``write`` (what a checkpoint holds differs between the loops), pruned to
  the newest ``keep_last`` (and those at multiples of ``keep_every``); a write that fails (a full disk) is
  reported with its path and what is and is not saved, and retried at the next checkpoint — except at the last
  step, where it ends the run (:class:`CheckpointError`). Then, if a ``SIGTERM`` or ``SIGUSR1`` arrived on any
  rank (``levjepa.train.preemption``), a checkpoint of the step just done and :class:`Preempted`, whose
  message names the command that continues the run (``levjepa pretrain --resume RUN``, ``levjepa finetune
  --resume OUT``): exit status 75. When that checkpoint cannot be written, the message says so and names the
  last checkpoint saved before it (or that none is).

A ``KeyboardInterrupt`` (Ctrl-C) leaves the ``with`` as :class:`Interrupted`, which names the last checkpoint
and the same command. Only the main rank writes; every rank calls every method (the stop decision and the
hook after a checkpoint may be collectives).
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import torch

from levjepa import distributed
from levjepa.train.checkpoint import checkpoint_step_or_none, latest_checkpoint, prune
from levjepa.train.preemption import Preempted, StopSignals

__all__ = ["CheckpointError", "Interrupted", "Lifecycle", "TrainingStopped", "due"]


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the message says why and what to do."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the message names the last checkpoint and the command that continues the run."""


class CheckpointError(OSError):
    """The last step's checkpoint could not be written: the message says where, why, and what is saved."""


def due(step: int, every: int, total: int) -> bool:
    """Whether something done every ``every`` steps (and at the last) is due after ``step`` steps."""
    return step % every == 0 or step == total


def _saved(previous: Path | None, command: str, run_dir: Path) -> str:
    if previous is None:
        return "the run has no checkpoint yet: none of its steps is saved"
    return f"the previous checkpoint {previous} is intact (`{command} --resume {run_dir}` continues from it)"


class Lifecycle:
    """Checkpoints, pre-emption, Ctrl-C and non-finite steps of one run (module doc)."""

    def __init__(
        self,
        path: Path,
        info: distributed.DistInfo,
        *,
        command: str,
        steps: int,
        checkpoint_every: int,
        keep_last: int,
        keep_every: int | None = None,
        max_consecutive_skips: int,
        consecutive_skips: int = 0,
        after_checkpoint: Callable[[], None] | None = None,
        stop_hint: str = "Lower the learning rate, check the data (bad_files.json) or train in float32.",
    ) -> None:
        self.path, self.info, self.command = path, info, command
        self.steps, self.checkpoint_every = steps, checkpoint_every
        self.keep_last, self.keep_every = keep_last, keep_every
        self.max_consecutive_skips = max_consecutive_skips
        self.after_checkpoint = after_checkpoint  # every rank, after every checkpoint (a collective may go here)
        self.stop_hint = stop_hint  # what to do after too many non-finite steps (the loop's own remedies)
        self.consecutive = torch.tensor(consecutive_skips, device=info.device)  # non-finite steps in a row
        self.worst = self.consecutive.clone()  # the longest such run since the last check (it may have ended)
        self.pending: list[tuple[int, torch.Tensor]] = []  # (step, skip flag) not yet read
        self.skipped: list[int] = []  # steps whose update was skipped
        self.checkpoint: Path | None = latest_checkpoint(path)  # the last checkpoint written (or found)
        self.step = 0  # the last step reported done
        self._signals = StopSignals()

    def __enter__(self) -> Lifecycle:
        self._signals.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._signals.__exit__(kind, value, traceback)
        if kind is KeyboardInterrupt:  # Ctrl-C: say what is saved and how to go on
            where = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint (nothing is saved)"
            raise Interrupted(
                f"interrupted after step {self.step}; the last is {where}"
                + (f": continue with `{self.command} --resume {self.path}`" if self.checkpoint else "")
            ) from None

    def record(self, step: int, skipped: torch.Tensor, stops: torch.Tensor | None = None) -> None:
        """Step ``step`` (0-based) was done; ``skipped``: its update was skipped (a device bool); ``stops``:
        whether it counts towards stopping the run (default: ``skipped``). Nothing is read from the device."""
        stops = skipped if stops is None else stops
        self.consecutive = torch.where(stops, self.consecutive + 1, torch.zeros_like(self.consecutive))
        self.worst = torch.maximum(self.worst, self.consecutive)  # a run that ends before the check still counts
        self.pending.append((step, skipped))
        self.step = step + 1

    def check(self) -> None:
        """Read the skip flags since the last check (one synchronisation), name the skipped steps, and stop the
        run after ``max_consecutive_skips`` non-finite steps in a row."""
        if not self.pending:
            return
        *flags, worst = torch.stack([*(f.to(self.worst.dtype) for _, f in self.pending), self.worst]).tolist()
        newly = [s for (s, _), bad in zip(self.pending, flags, strict=True) if bad]
        self.pending.clear()
        self.worst = self.consecutive.clone()  # a run still going on at the check goes on counting from here
        if newly and self.info.is_main:
            print(f"step(s) {newly}: non-finite loss or gradient, update skipped", file=sys.stderr)
        self.skipped.extend(newly)
        if worst >= self.max_consecutive_skips:
            raise TrainingStopped(
                f"{worst} consecutive optimizer steps (ending by step {self.step - 1}) had a non-finite loss or "
                f"gradient; stopping. The last good checkpoint is {latest_checkpoint(self.path)}. {self.stop_hint}"
            )

    def end_of_step(self, step: int, write: Callable[[], Path]) -> None:
        """After ``step`` steps: a checkpoint when due (``write`` writes it on the main rank and returns its
        path), then the stop on a signal (module doc)."""
        checkpointed = due(step, self.checkpoint_every, self.steps)
        failed = self.save(step, write) if checkpointed else None
        if step >= self.steps or not distributed.any_rank(self._signals.received is not None):
            return
        if not checkpointed:
            failed = self.save(step, write, stopping=True)
        # the main rank wrote (or failed to); the signal's name maybe not rank 0's
        name, failed = distributed.broadcast_object((self._signals.received or "a stop signal", failed))
        saved = self.checkpoint if failed is None else latest_checkpoint(self.path)
        raise Preempted(
            name,
            step,
            saved,
            self.path,
            is_main=self.info.is_main,
            command=self.command,
            failed=failed,
            saved_step=checkpoint_step_or_none(saved) if saved is not None else None,
        )

    def save(self, step: int, write: Callable[[], Path], *, stopping: bool = False) -> str | None:
        """Write the checkpoint of ``step`` (main rank), prune old ones, report a failed write (module doc; not
        when ``stopping``: the stop says it). Returns why the write failed, or None when it was written (and on
        the other ranks)."""
        failed = None
        if self.info.is_main:
            try:
                self.checkpoint = write()
                prune(self.path, self.keep_last, self.keep_every)
            except OSError as err:
                previous = latest_checkpoint(self.path)
                failed = (err.strerror or str(err)).lower()
                where = self.path / "checkpoints"
                if step == self.steps:
                    raise CheckpointError(
                        err.errno or errno.EIO,
                        f"the checkpoint of the last step ({step}) could not be written there ({failed}); "
                        + _saved(previous, self.command, self.path),
                        str(where),
                    ) from err
                if not stopping:
                    print(
                        f"checkpoint at step {step} FAILED: {where}: {failed}; "
                        f"{_saved(previous, self.command, self.path)}. Training continues; free space there and "
                        "it is retried at the next checkpoint.",
                        file=sys.stderr,
                    )
        distributed.barrier()
        if self.after_checkpoint is not None:
            self.after_checkpoint()
        return failed
