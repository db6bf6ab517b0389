"""The process's intra-op thread count: the one a command picks for the machine it finds, and changes of it for a
block, restored after.

**Which count a command runs with** (:func:`choose_threads`). torch starts with one intra-op thread per core it
sees; on a machine whose cores other work already keeps busy, those threads wait for each other at every
parallel region (OpenMP's threads spin at its barriers while the core they need runs someone else's process),
and a run goes several times slower than with one thread (``bench/threads.md``). So a command picks, in order:

1. the count it is given (``--threads N``; ``train.threads=N`` for ``levjepa pretrain``);
2. ``OMP_NUM_THREADS`` when it is set (a job script's or ``torchrun``'s choice, which torch itself follows);
3. otherwise the CPUs free now: the CPUs this process may run on (``os.sched_getaffinity``), capped by a cgroup
   CPU quota (``cpu.max``, or cgroup v1's ``cpu.cfs_quota_us``) and by torch's own default, less the CPUs other
   processes keep busy — measured over :data:`SAMPLE_SECONDS` on those CPUs from ``/proc/stat`` (the 1-minute load
   average where there is none) — counting a CPU free when at least :data:`FREE_FRACTION` of it is, and never
   fewer than one thread.

The command says what it chose in one line at its start (``threads: 1 of 2 CPUs (1.6 busy with other work);
--threads N sets it``). The count changes the last digits of float sums, never what is computed; a run records
the count it ran with (``env.json``), and a given ``--threads`` / ``train.threads`` makes a run repeat bit for bit
on one machine whatever else runs there.

**Changes for a block** (:func:`torch_threads`). ``train.threads`` holds for a run and its end-of-run probes;
rendering the built-in benchmark and the chunked SIGReg loops run one intra-op thread each (their reasons are
where they are used). Every such change goes through :func:`torch_threads`, so the count a caller (a notebook, a
test suite) set is the count it finds afterwards, on return or on error.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "FREE_FRACTION",
    "SAMPLE_SECONDS",
    "ThreadChoice",
    "allowed_cpus",
    "choose_threads",
    "threads_for",
    "torch_threads",
]

SAMPLE_SECONDS = 0.25  # how long the CPUs' use is watched before a count is chosen
FREE_FRACTION = 0.5  # a CPU counts as free when at least half of it is idle (background noise is not a job)
MAX_THREADS = 1024  # a count above this is a typo (the config and --threads refuse it)
_TORCH_DEFAULT = torch.get_num_threads()  # what torch chose at import: one per core it sees (or OMP_NUM_THREADS)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads (``None`` or 0: leave the count as it is), then restore it."""
    if n is not None and n < 0:
        raise ValueError(f"torch_threads({n}): a thread count is positive (or 0/None to leave it as it is)")
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class ThreadChoice:
    """A command's thread count and the one line that says why (module doc)."""

    threads: int
    line: str


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: what a SLURM or container limit leaves it)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return list(range(os.cpu_count() or 1))


def _quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The cgroup's CPU quota in CPUs (``cpu.max`` of cgroup v2, else v1's ``cfs_quota_us / cfs_period_us``), or
    None when there is none or it cannot be read."""
    try:
        text = (root / "cpu.max").read_text().split()
        if len(text) == 2 and text[0] != "max":
            return int(text[0]) / int(text[1])
        if text:
            return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def _cpu_times(cpus: list[int], stat: Path) -> tuple[int, int] | None:
    """(busy, total) clock ticks of ``cpus`` so far, from ``/proc/stat``'s ``cpuN`` lines (idle and iowait are
    not busy; steal is: the hypervisor gave the CPU to someone else)."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    busy = total = 0
    for line in lines:
        parts = line.split()
        if parts and parts[0] in wanted:
            ticks = [int(v) for v in parts[1:9]]
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def busy_cpus(cpus: list[int], seconds: float = SAMPLE_SECONDS, stat: Path = Path("/proc/stat")) -> float | None:
    """How many of ``cpus`` other work keeps busy: their busy share over ``seconds`` (this process sleeps meanwhile)
    times their number; the 1-minute load average where ``/proc/stat`` cannot be read; None when neither can."""
    first = _cpu_times(cpus, stat)
    if first is not None:
        time.sleep(seconds)
        second = _cpu_times(cpus, stat)
        if second is not None and second[1] > first[1]:
            return len(cpus) * (second[0] - first[0]) / (second[1] - first[1])
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _whole(cpus: float) -> int:
    """Whole CPUs in ``cpus``, a CPU counted when at least :data:`FREE_FRACTION` of it is there."""
    return math.floor(cpus + 1.0 - FREE_FRACTION)


def threads_for(cpus: int, quota: float | None, busy: float | None, ceiling: int) -> int:
    """The rule (module doc): the ``cpus`` this process may use, capped by ``quota`` and ``ceiling`` (torch's own
    default), less the ``busy`` ones; at least 1."""
    n = min(cpus, ceiling)
    if quota is not None:
        n = min(n, _whole(quota))
    if busy is not None:
        n = min(n, _whole(cpus - busy))
    return max(1, n)


def _env_threads() -> int | None:
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    try:
        value = int(text.split(",")[0])
    except ValueError:
        return None
    return value if value >= 1 else None


def choose_threads(requested: int | None = None, *, setting: str = "--threads N") -> ThreadChoice:
    """The intra-op thread count a command runs with, and the line that says so (module doc). ``requested``: the
    count the user gave (None: choose); ``setting``: how the user sets it, for the line."""
    if requested is not None and requested >= 1:
        given = setting.removesuffix("N") + str(requested)
        return ThreadChoice(requested, f"threads: {requested} (as given: {given})")
    env = _env_threads()
    if env is not None:
        return ThreadChoice(env, f"threads: {env} (OMP_NUM_THREADS; {setting} sets it)")
    cpus = allowed_cpus()
    quota = _quota()
    busy = busy_cpus(cpus)
    n = threads_for(len(cpus), quota, busy, _TORCH_DEFAULT)
    facts = [f"{busy:.1f} busy with other work" if busy is not None else "their load unknown"]
    if quota is not None:
        facts.append(f"a CPU quota of {quota:g}")
    return ThreadChoice(n, f"threads: {n} of {len(cpus)} CPUs ({', '.join(facts)}); {setting} sets it")
