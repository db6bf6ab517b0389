"""Pre-emption on a shared cluster: SIGTERM / SIGUSR1 end a run with a checkpoint and exit 75, the resume is
bit-identical to an uninterrupted run with no duplicate TensorBoard step, one live process per run directory,
and the SLURM rendezvous read from SLURM's own variables."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from levjepa import distributed
from levjepa.train.preemption import REQUEUE_EXIT
from levjepa.train.run_dir import RunLock
from test_pretrain import SRC, _assert_identical_runs, _cli, _kill, _latest_is, _wait_for
from train_utils import TINY


def _logged_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def _tensorboard_steps(run: Path, tag: str = "loss") -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_at_a_random_step_checkpoints_exits_75_and_the_resume_is_bit_identical(tmp_path, sig):
    steps = 16
    at = random.Random(time.time_ns()).randint(2, steps - 4)  # the step after which the signal is sent
    common = [*TINY, f"train.steps={steps}", "train.checkpoint_every=10", "train.log_every=1"]
    straight = _cli(tmp_path / "a", "--preset", "demo-cpu", "--run-dir", str(tmp_path / "a"), *common)
    run = tmp_path / "b"
    victim = _cli(run, "--preset", "demo-cpu", "--run-dir", str(run), *common)
    _wait_for(victim, lambda: bool(_logged_steps(run)) and _logged_steps(run)[-1] >= at, f"step {at}")
    victim.send_signal(sig)
    assert victim.wait(timeout=120) == REQUEUE_EXIT
    said = [line for line in victim.stderr.read().splitlines() if "received" in line]
    assert len(said) == 1 and said[0].startswith(f"levjepa pretrain: {sig.name} received: stopped after step")
    stopped = int(said[0].split("after step ")[1].split(",")[0])
    assert at <= stopped < steps, (at, stopped)
    assert (run / "checkpoints" / "latest").read_text() == f"step_{stopped:06d}"  # the step it stopped at
    resumed = _cli(run, "--resume", str(run))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert straight.wait(timeout=300) == 0, straight.stderr.read()
    _assert_identical_runs(tmp_path / "a", run, steps)
    assert _logged_steps(run) == list(range(1, steps + 1))
    assert _tensorboard_steps(run) == list(range(1, steps + 1)) == _tensorboard_steps(tmp_path / "a")


def test_tensorboard_curves_have_no_duplicate_step_after_a_kill_and_resume(tmp_path):
    # kill -9 after step 6 was logged: steps 5 and 6 are in the event file but not in the checkpoint (step 4)
    run = tmp_path / "run"
    common = [*TINY, "train.steps=8", "train.checkpoint_every=4", "train.log_every=1"]
    victim = _cli(run, "--preset", "demo-cpu", "--run-dir", str(run), *common)
    _wait_for(victim, lambda: len(_logged_steps(run)) >= 6 and _logged_steps(run)[-1] < 8, "step 6")
    _kill(victim)
    logged = _logged_steps(run)
    assert 4 < logged[-1] < 8  # steps after the checkpoint were logged, then lost
    resumed = _cli(run, "--resume", str(run))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert _tensorboard_steps(run) == list(range(1, 9))


def test_a_second_live_resume_is_refused_in_one_line_and_a_killed_holder_is_stale(tmp_path):
    run = tmp_path / "run"
    common = [*TINY, "train.steps=4", "train.checkpoint_every=2"]
    first = _cli(run, "--preset", "demo-cpu", "--run-dir", str(run), *common)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    holder = RunLock(run).acquire()  # a live process (this one) runs the directory
    try:
        second = _cli(run, "--resume", str(run), "train.steps=6")
        assert second.wait(timeout=120) == 2
        lines = second.stderr.read().strip().splitlines()
        assert len(lines) == 1 and "is in use by another process" in lines[0]
        assert f"pid {os.getpid()} on {socket.gethostname()}" in lines[0]
        assert json.loads((run / "config.json").read_text())["train"]["steps"] == 4  # nothing rewritten
    finally:
        holder.release()
    # a holder killed with -9 leaves its .lock file behind: stale, taken over by the next resume
    script = f"import sys, time; sys.path.insert(0, {SRC!r})\nfrom levjepa.train.run_dir import RunLock\n"
    script += f"from pathlib import Path\nRunLock(Path({str(run)!r})).acquire()\n"
    script += "print('held', flush=True); time.sleep(60)"
    killed = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "held"
    _kill(killed)
    assert json.loads((run / ".lock").read_text())["pid"] == killed.pid
    third = _cli(run, "--resume", str(run), "train.steps=6")
    assert third.wait(timeout=300) == 0, third.stderr.read()
    assert _latest_is(run, 6)()


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node07", "node07"),
        ("gpu[003-010,012]", "gpu003"),
        ("gpu[12,3-5],cpu1", "gpu12"),
        ("a[1-2]-ib[0-1],b4", "a1-ib0"),
        ("n001,n002", "n001"),
        ("rack2-[08-09]", "rack2-08"),
    ],
)
def test_the_first_host_of_a_slurm_nodelist(nodelist, first):
    assert distributed.slurm_first_host(nodelist) == first


def test_the_rendezvous_comes_from_slurm_variables_unless_exported():
    env = {"SLURM_JOB_NODELIST": "gpu[017-020]", "SLURM_JOB_ID": "4812345"}
    assert distributed.slurm_rendezvous(env) == {"MASTER_ADDR": "gpu017", "MASTER_PORT": str(15000 + 2345)}
    assert distributed.slurm_rendezvous({**env, "SLURM_STEP_NODELIST": "gpu019"})["MASTER_ADDR"] == "gpu019"
    assert distributed.slurm_rendezvous({**env, "MASTER_ADDR": "h", "MASTER_PORT": "1"}) == {}
    assert distributed.slurm_rendezvous({}) == {}


def test_one_process_in_a_multi_task_allocation_is_named_in_one_line(monkeypatch, capsys):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "0")
    with pytest.raises(distributed.LaunchError, match=r"SLURM_NTASKS=4.*not started by srun"):
        distributed.setup(device="cpu")
    from levjepa.cli import main

    code = main(["pretrain", "--preset", "demo-cpu", *TINY, "--run-dir", "/nonexistent/never-made"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("levjepa pretrain: SLURM allocated 4 tasks"), err


_RANK = """
import os, sys, torch
sys.path.insert(0, {src!r})
from levjepa import distributed
info = distributed.setup(device="cpu", timeout_s=60)
total = distributed.all_reduce_sum(torch.tensor([float(info.rank + 1)]))
print(info.rank, info.world_size, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], float(total), flush=True)
distributed.teardown()
"""


def _free_port_above_15000() -> int:
    for port in random.Random(time.time_ns()).sample(range(15000, 25000), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 15000-24999")


def test_ranks_started_as_srun_starts_them_meet_at_the_address_slurm_names(tmp_path):
    # what srun sets for 2 tasks on one node, by hand: no MASTER_ADDR / MASTER_PORT, no torchrun variables
    port = _free_port_above_15000()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "WORLD_SIZE", "RANK"))}
    base.update(SLURM_JOB_ID=f"77{port - 15000:04d}", SLURM_JOB_NODELIST="localhost", SLURM_NTASKS="2",
                SLURM_STEP_NUM_TASKS="2")  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK.format(src=SRC)],
            env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    rows = sorted(o[0].split() for o in outs)
    assert rows == [[str(r), "2", "localhost", str(port), "3.0"] for r in range(2)]
