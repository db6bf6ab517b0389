"""Run a function in N real gloo processes and collect what each returns (for equivalence tests).

``run_gloo(fn, world_size, *args)`` spawns ``world_size`` processes, initialises a gloo process group
through ``levjepa.distributed.setup`` (the same path as torchrun), calls ``fn(rank, world_size, *args)``
in each and returns the list of results (anything ``torch.save`` can hold), ordered by rank.
``fn`` must be importable (defined at module level in a test file).
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, out_dir: str, fn: Any, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    from levjepa import distributed

    distributed.setup(device="cpu")
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def run_gloo(fn: Any, world_size: int, *args: Any) -> list[Any]:
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world_size, _free_port(), out_dir, fn, args), nprocs=world_size, join=True)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
