"""Every change of torch's intra-op thread count goes through ``torch_threads``: set for the block, the caller's
count back after it, on return and on error; a pretraining run with ``train.threads`` leaves the count as found."""

from __future__ import annotations

import os

import pytest
import torch

from levjepa.threads import torch_threads


@pytest.fixture
def three():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def test_the_count_holds_in_the_block_and_is_restored_after_an_error(three):
    with pytest.raises(RuntimeError), torch_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("n", [None, 0])
def test_none_or_zero_leaves_the_count(three, n):
    with torch_threads(n):
        assert torch.get_num_threads() == 3
        torch.set_num_threads(2)  # a change inside the block is undone too
    assert torch.get_num_threads() == 3


def test_a_negative_count_is_refused(three):
    with pytest.raises(ValueError, match="torch_threads"), torch_threads(-1):
        pass
    assert torch.get_num_threads() == 3


def test_pretraining_runs_at_train_threads_and_restores_the_count(three, tmp_path, monkeypatch):
    import dataclasses

    import levjepa.train.loop as loop
    from levjepa.presets import preset

    seen = []

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise RuntimeError("stop after the start")

    monkeypatch.setattr(loop, "_pretrain", spy)
    cfg = preset("demo-cpu")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, threads=1))
    with pytest.raises(RuntimeError, match="stop after the start"):
        loop.pretrain(cfg, tmp_path / "run")
    assert seen == [1] and torch.get_num_threads() == 3


# ----------------------------------------------------------------------------- the count a command picks


def test_the_rule_leaves_busy_cpus_to_the_work_that_keeps_them_busy():
    from levjepa.threads import threads_for

    assert threads_for(2, None, 0.1, 2) == 2  # an idle 2-core machine: both
    assert threads_for(2, None, 1.0, 2) == 1  # one core busy elsewhere: one thread, not two contending
    assert threads_for(2, None, 2.4, 2) == 1  # oversubscribed already: still one, never none
    assert threads_for(2, None, 0.3, 2) == 2  # background noise on the second core: still counted
    assert threads_for(2, None, 0.6, 2) == 1  # less than half of the second core free: not counted
    assert threads_for(16, None, 3.0, 16) == 13
    assert threads_for(64, 4.0, 0.0, 64) == 4  # a cgroup quota of 4 CPUs caps it
    assert threads_for(64, 0.5, 0.0, 64) == 1
    assert threads_for(8, None, None, 4) == 4  # load unknown: torch's own default caps it


def _stat(path, ticks):
    """A /proc/stat with per-CPU (user, nice, system, idle, iowait, irq, softirq, steal) ticks."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"] + [f"cpu{i} " + " ".join(map(str, t)) + " 0 0" for i, t in enumerate(ticks)]
    path.write_text("\n".join(lines) + "\nintr 0\n")


def test_busy_cpus_are_read_from_the_ticks_of_this_process_cpus(tmp_path, monkeypatch):
    import levjepa.threads as threads

    stat = tmp_path / "stat"
    start = [(100, 0, 0, 100, 0, 0, 0, 0)] * 3
    _stat(stat, start)
    after = [(180, 0, 10, 110, 0, 0, 0, 0), (100, 0, 0, 190, 10, 0, 0, 0), (150, 0, 0, 100, 0, 0, 0, 50)]
    monkeypatch.setattr(threads.time, "sleep", lambda s: _stat(stat, after))
    assert threads.busy_cpus([0, 1], stat=stat) == pytest.approx(2 * 90 / 200)  # iowait is idle
    _stat(stat, start)
    assert threads.busy_cpus([0, 2], stat=stat) == pytest.approx(2 * 190 / 200)  # steal is someone else's
    assert threads.busy_cpus([0, 1], stat=tmp_path / "none") == pytest.approx(os.getloadavg()[0], abs=1.0)


def test_a_cgroup_quota_is_read_from_v2_then_v1(tmp_path):
    from levjepa.threads import _quota

    assert _quota(tmp_path) is None
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _quota(tmp_path) is None  # v2 says no limit
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert _quota(tmp_path) == 2.0


def test_a_given_count_then_omp_num_threads_then_the_rule_each_said_in_one_line(monkeypatch):
    import levjepa.threads as threads

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.choose_threads(2).threads == 2 and "as given: --threads 2" in threads.choose_threads(2).line
    assert threads.choose_threads(None).threads == 3 and "OMP_NUM_THREADS" in threads.choose_threads(None).line
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "allowed_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads, "_quota", lambda: None)
    monkeypatch.setattr(threads, "busy_cpus", lambda cpus: 1.7)
    choice = threads.choose_threads(None, setting="train.threads=N")
    assert choice.threads == 1 and "\n" not in choice.line
    assert choice.line == "threads: 1 of 2 CPUs (1.7 busy with other work); train.threads=N sets it"


@pytest.mark.parametrize(
    "command", ["probe", "extract", "visualize", "export", "import", "stream", "classify", "finetune"]
)
def test_every_long_command_takes_threads_and_runs_at_that_count(command, monkeypatch, capsys):
    import importlib

    from levjepa.commands import MODULES, THREADED, main

    assert command in THREADED
    seen = []
    module = importlib.import_module(f"levjepa.commands.{MODULES.get(command, command)}")
    monkeypatch.setattr(module, "main", lambda args: seen.append(torch.get_num_threads()) or print("working"))
    before = torch.get_num_threads()
    argv = {"finetune": ["x"], "stream": ["x", "y"], "probe": ["x"], "export": ["x", "--out", "y"]}
    argv |= {"import": ["x", "--out", "y"], "extract": ["x", "y", "--out", "z"], "visualize": ["x", "y", "--out", "z"]}
    argv |= {"classify": ["x", "y"], "select": ["x"]}
    assert main([command, *argv[command], "--threads", "3"]) == 0
    assert seen == [3] and torch.get_num_threads() == before
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["threads: 3 (as given: --threads 3)", "working"]  # said before the command's first line
