"""Shared test fixtures."""

from __future__ import annotations

import pytest

from levjepa.threads import torch_threads


@pytest.fixture
def one_thread():
    """Many small ops: on a shared 2-core machine one intra-op thread is faster than two contending ones."""
    with torch_threads(1):
        yield
