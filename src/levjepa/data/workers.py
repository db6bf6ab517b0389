"""Worker processes: how they start and what each does first, for data loading, extraction and evaluation.

Every process pool of levjepa starts here. **Start method**: ``forkserver`` by default (``data.worker_start``
for the pretraining loader): workers come from a clean single-threaded server, never forked from this
process, whose other threads (tqdm's monitor, queue feeders, a trainer's CUDA context) may hold locks at
fork time and deadlock a forked child; ``spawn`` where the platform has no forkserver. The server imports
torch, PyAV and ``levjepa.data`` once, when it starts (:data:`PRELOAD`), so every worker forked from it
starts with them imported: a pool of workers is ready in a few hundredths of a second instead of each worker
importing torch anew (about 4 s per pool on a loaded 2-core machine, ``bench/eval.md``; a feature store
starts one pool per split and encoder). **Start-up**
(:func:`worker_init`): FFmpeg's own log is silenced, since a worker reports a broken file as a reason string
(``levjepa.data.badfiles``) and FFmpeg's messages about it would flood the log; SIGTERM and SIGUSR1 are
ignored, since SLURM signals every process of a job step and the main process, which stops the run cleanly
at the end of the step (``levjepa.train.preemption``), still needs its workers until then. The main process
ends them itself: ``PretrainLoader.close``, and at exit SIGKILL for any that a leftover loader still holds;
a worker of :func:`initializer` also ends when the main process does, a ``kill -9`` included.

* :func:`decode_in_workers` — ``dataset[0], dataset[1], …`` in order from a ``DataLoader``'s workers, two
  items ahead per worker;
* :func:`safe_map` — ``fn(key)`` for every key, in order, in those workers, as ``(key, value or None, the
  reason)``: a file that cannot be read (the one bad-file rule, ``levjepa.data.badfiles.is_bad_file``, that
  pretraining's loader and ``data check`` apply too) becomes a reason to report, never an exception that ends
  the job (feature stores, extraction, ``classify``, fine-tuning's training clips); a bug still ends it;
* :func:`parallel_map` — ``[fn(x) for x in items]`` over a process pool, with its progress (checking,
  preparing and packing data);
* :func:`start_context` — the multiprocessing context of a start method (the pretraining loader).
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing as mp
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Generic, TypeVar

from torch.utils.data import DataLoader, Dataset

from levjepa.data.badfiles import READ_ERRORS, bad_file_reason, is_bad_file
from levjepa.data.progress import Progress

__all__ = [
    "PRELOAD",
    "READ_ERRORS",
    "decode_in_workers",
    "initializer",
    "parallel_map",
    "safe_map",
    "start_context",
    "worker_init",
]

K = TypeVar("K")
V = TypeVar("V")

# what the forkserver imports once, before it forks any worker (the main script first, as multiprocessing's
# default preload does): what every worker of levjepa imports anyway
PRELOAD = ["__main__", "torch", "av", "levjepa.data"]


def start_context(method: str = "forkserver") -> Any:
    """The multiprocessing context of ``method`` (``spawn`` where the platform does not offer it); a forkserver
    preloads :data:`PRELOAD` (module doc)."""
    _end_leftover_workers_at_exit()
    ctx = mp.get_context(method if method in mp.get_all_start_methods() else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)  # takes effect when the server starts (once per process)
    return ctx


@functools.cache
def _end_leftover_workers_at_exit() -> None:
    """At exit multiprocessing ends each daemon child still alive with SIGTERM and then joins it: a worker,
    which ignores SIGTERM, would hold the exit forever (a ``DataLoader`` kept alive by a traceback or a
    reference cycle leaves one). Registered after multiprocessing's own handler, this one runs first."""
    atexit.register(_end_leftover_workers)


def _end_leftover_workers(grace: float = 1.0) -> None:
    """SIGTERM to every daemon child still alive, ``grace`` seconds to end, then SIGKILL."""
    children = [p for p in mp.active_children() if p.daemon]
    for p in children:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in children:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(grace)


def worker_init(_: int = 0, main_pid: int | None = None) -> None:
    """What every worker does first (see the module doc); with ``main_pid``, the worker also ends when that
    process does (:func:`initializer`)."""
    import av

    av.logging.set_level(None)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)  # the main process decides when the run stops; it ends its workers
    if main_pid is not None:
        threading.Thread(target=_exit_with, args=(main_pid,), name="levjepa-main-watch", daemon=True).start()


def initializer() -> Callable[..., None]:
    """:func:`worker_init` bound to this process's pid, for the workers this process starts. A worker of the
    forkserver is the server's child, not ours: PyTorch's own watch of the parent sees the server, which
    lives as long as any of its children, so after a ``kill -9`` of this process its workers would live on."""
    return functools.partial(worker_init, main_pid=os.getpid())


def _exit_with(pid: int) -> None:
    """End this process as soon as process ``pid`` has ended, however it ended."""
    try:
        handle = os.pidfd_open(pid)  # Linux ≥ 5.3: readable once the process has ended
    except (AttributeError, OSError):
        handle = None
    if handle is not None:
        select.select([handle], [], [])
    else:
        while _alive(pid):
            time.sleep(1.0)
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def decode_in_workers(dataset: Dataset[Any], workers: int) -> Generator[Any, None, None]:
    """``dataset[0], dataset[1], …`` in order, computed by ``workers`` processes, two items ahead per worker;
    ``workers = 0``: in this process. Closing the generator (``.close()``) stops the workers at once, before
    the end: otherwise they live as long as the generator, which a traceback can keep."""
    if workers == 0:
        yield from (dataset[j] for j in range(len(dataset)))  # type: ignore[arg-type]
        return
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=start_context(),
        worker_init_fn=initializer(),
        prefetch_factor=2,
    )
    it = iter(loader)
    try:
        yield from it
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)  # what the iterator's __del__ does: stop, then join
        if shutdown is not None:
            shutdown()


class _Safe(Dataset[tuple[Any, Any, str]], Generic[K, V]):
    """Item ``j`` -> ``(keys[j], fn(keys[j]) or None, why it could not be computed)``: what runs in a worker."""

    def __init__(self, fn: Callable[[K], V], keys: Sequence[K]) -> None:
        self.fn, self.keys = fn, keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, j: int) -> tuple[K, V | None, str]:
        key = self.keys[j]
        try:
            return key, self.fn(key), ""
        except Exception as err:  # the one bad-file rule decides; anything else is a bug and ends the job
            if not is_bad_file(err):
                raise
            return key, None, bad_file_reason(err)


def safe_map(fn: Callable[[K], V], keys: Sequence[K], workers: int) -> Generator[tuple[K, V | None, str], None, None]:
    """``(key, fn(key), "")`` for every key of ``keys``, in order, computed by ``workers`` processes two keys
    ahead (``workers = 0``: in this one); a key whose ``fn`` raises what ``levjepa.data.badfiles.is_bad_file``
    calls a bad file comes as ``(key, None, bad_file_reason(error))``; any other error ends the map. ``fn``
    and ``keys`` go to the workers by pickling: a module-level function or a ``functools.partial`` of one. (A
    value that is a tuple comes back from a worker as a list.) A stream left before its end should be closed
    (``.close()``): that stops its workers."""
    items = decode_in_workers(_Safe(fn, keys), workers)
    try:
        for item in items:
            yield tuple(item)  # a worker's tuple comes back as a list
    finally:
        items.close()


def parallel_map(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    workers: int,
    *,
    desc: str = "",
    unit: str = "file",
    failed: Callable[[Any], bool] | None = None,
    progress: bool = True,
) -> list[Any]:
    """``[fn(x) for x in items]`` over ``workers`` processes (inline when ``workers <= 1``), with its progress
    (:class:`levjepa.data.progress.Progress`: a bar on a terminal, lines off one; ``failed(result)`` counts
    the failures it shows). Results keep the order of items."""
    items = list(items)
    bar = Progress(len(items), desc or "work", unit, show=progress)
    if workers <= 1 or len(items) <= 1:
        return _collect(map(fn, items), bar, failed)
    with ProcessPoolExecutor(max_workers=workers, mp_context=start_context(), initializer=initializer()) as pool:
        try:
            return _collect(pool.map(fn, items, chunksize=1), bar, failed)
        except BaseException:  # a signal, Ctrl-C, an error: the items not started are dropped, not run to the end
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _collect(results: Iterable[Any], bar: Progress, failed: Callable[[Any], bool] | None) -> list[Any]:
    """The results as they come, each one advancing ``bar`` (its lines count the failures), then the last line."""
    out, bad = [], 0
    for result in results:
        out.append(result)
        bad += bool(failed is not None and failed(result))
        bar.update(1, f"{bad} failed" if bad else "")
    bar.close()
    return out
