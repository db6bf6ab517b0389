"""Shared test fixtures."""

from __future__ import annotations

import pytest

from levjepa.threads import torch_threads


@pytest.fixture
def one_thread():
    """Many small ops: on a shared 2-core machine one intra-op thread is faster than two contending ones."""
    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def one_thread_count(monkeypatch):
    """Every command a test runs picks one intra-op thread (OMP_NUM_THREADS, rule 2 of levjepa.threads): a command
    left to pick for itself follows the machine's load, which moves between a run and its resume, and a resume
    repeats a run bit for bit only at the count it ran with. tests/test_threads.py sets and clears it itself."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
