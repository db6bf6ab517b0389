"""Worker processes: how they start and what each does first, for data loading, extraction and evaluation.

Every process pool of levjepa starts here. **Start method**: ``forkserver`` by default (``data.worker_start``
for the pretraining loader): workers come from a clean single-threaded server, never forked from this
process, whose other threads (tqdm's monitor, queue feeders, a trainer's CUDA context) may hold locks at
fork time and deadlock a forked child; ``spawn`` where the platform has no forkserver. **Start-up**
(:func:`worker_init`): FFmpeg's own log is silenced, since a worker reports a broken file as a reason string
(``levjepa.data.badfiles``) and FFmpeg's messages about it would flood the log; SIGTERM and SIGUSR1 are
ignored, since SLURM signals every process of a job step and the main process, which stops the run cleanly
at the end of the step (``levjepa.train.preemption``), still needs its workers until then.

* :func:`decode_in_workers` — ``dataset[0], dataset[1], …`` in order from a ``DataLoader``'s workers, two
  items ahead per worker (feature stores, extraction);
* :func:`parallel_map` — ``[fn(x) for x in items]`` over a process pool (checking and preparing data);
* :func:`start_context` — the multiprocessing context of a start method (the pretraining loader).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset

__all__ = ["decode_in_workers", "parallel_map", "start_context", "worker_init"]


def start_context(method: str = "forkserver") -> Any:
    """The multiprocessing context of ``method`` (``spawn`` where the platform does not offer it)."""
    return mp.get_context(method if method in mp.get_all_start_methods() else "spawn")


def worker_init(_: int = 0) -> None:
    """What every worker does first (see the module doc)."""
    import av

    av.logging.set_level(None)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)  # the main process decides when the run stops; it ends its workers


def decode_in_workers(dataset: Dataset[Any], workers: int) -> Iterator[Any]:
    """``dataset[0], dataset[1], …`` in order, computed by ``workers`` processes, two items ahead per worker;
    ``workers = 0``: in this process."""
    if workers == 0:
        yield from (dataset[j] for j in range(len(dataset)))  # type: ignore[arg-type]
        return
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=start_context(),
        worker_init_fn=worker_init,
        prefetch_factor=2,
    )
    yield from loader


def parallel_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: int, *, desc: str = "") -> list[Any]:
    """``[fn(x) for x in items]`` over ``workers`` processes (inline when ``workers <= 1``), with a progress bar
    on a terminal. Results keep the order of ``items``."""
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in tqdm(items, desc=desc, disable=None, leave=False)]
    with ProcessPoolExecutor(max_workers=workers, mp_context=start_context(), initializer=worker_init) as pool:
        return list(tqdm(pool.map(fn, items, chunksize=1), total=len(items), desc=desc, disable=None, leave=False))
