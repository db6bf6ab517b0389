"""The process's intra-op thread count, changed for a block and restored after.

``train.threads`` holds for a run and its end-of-run probes; rendering the built-in benchmark and the chunked
SIGReg loops run one intra-op thread each (their reasons are where they are used). Every such change goes
through :func:`torch_threads`, so the count a caller (a notebook, a test suite) set is the count it finds
afterwards, on return or on error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


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
