"""Worker processes ignore the scheduler's stop signals: the main process stops the run at the end of a step
and still needs its workers until then (SLURM signals every process of a job step)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from levjepa.data.workers import start_context, worker_init

SRC = str(Path(__file__).resolve().parents[1] / "src")


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


_LEFT_OVER = """
import gc, sys
from levjepa.data import DataConfig, SyntheticConfig, PretrainLoader
syn = SyntheticConfig(size=32, num_frames=8, num_train=16, num_val=8, num_test=8, image_source="digits")
cfg = DataConfig(sources=("synthetic",), num_frames=8, global_size=32, local_size=16, num_local=1, batch_size=4,
                 num_workers=1, synthetic=syn)
gc.disable()
loader = PretrainLoader(cfg, seed=0)
next(loader)
cycle = [loader]
cycle.append(cycle)  # what a traceback or a reference cycle does: the loader outlives every use of it
if sys.argv[1] == "close":
    loader.close()
    import multiprocessing as mp
    print(len([p for p in mp.active_children() if p.daemon]))
"""


@pytest.mark.parametrize("how", ["exit", "close"])
def test_persistent_workers_of_a_leftover_loader_do_not_hold_the_exit(how):
    """A leftover loader's workers, which ignore SIGTERM, once held the interpreter's exit forever (CI hung after
    its last test): ``close`` ends them, and at exit the main process ends any still alive."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _LEFT_OVER, how], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 60
    if how == "close":
        assert done.stdout.split() == ["0"]  # no worker left once closed


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z"  # a zombie has ended


@pytest.mark.parametrize("via", ["loader", "pool"])
def test_workers_end_when_the_main_process_is_killed_9(via):
    """A forkserver worker's parent is the server, which lives as long as any of its children: after a
    ``kill -9`` of the main process, the workers would live on (and SIGTERM, which they ignore, could not end
    them); :func:`initializer` makes each end with the main process."""
    script = _LEFT_OVER.replace('if sys.argv[1] == "close":', "if False:") + (
        "import multiprocessing as mp, time\n"
        "print(*[p.pid for p in mp.active_children()], flush=True)\n"
        "time.sleep(600)\n"
    )
    if via == "pool":
        script = (
            "import multiprocessing as mp, time, os\n"
            "from concurrent.futures import ProcessPoolExecutor\n"
            "from levjepa.data.workers import initializer, start_context\n"
            "pool = ProcessPoolExecutor(2, mp_context=start_context(), initializer=initializer())\n"
            "print(*pool.map(os.getpid, [], chunksize=1), *[pool.submit(os.getpid).result() for _ in range(4)],"
            " flush=True)\n"
            "time.sleep(600)\n"
        )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert pids, "no worker started"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while not all(_pid_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"workers {pids} outlived the main process"
        time.sleep(0.1)
