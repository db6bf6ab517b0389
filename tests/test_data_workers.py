"""Worker processes ignore the scheduler's stop signals: the main process stops the run at the end of a step
and still needs its workers until then (SLURM signals every process of a job step)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from levjepa.data.workers import start_context, worker_init


def _signalled_worker(queue) -> None:
    worker_init()
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        os.kill(os.getpid(), sig)
    time.sleep(0.1)
    queue.put("alive")


@pytest.mark.parametrize("method", ["spawn"])
def test_a_worker_survives_sigterm_and_sigusr1(method):
    ctx = start_context(method)
    queue = ctx.Queue()
    proc = ctx.Process(target=_signalled_worker, args=(queue,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0 and queue.get(timeout=5) == "alive"
