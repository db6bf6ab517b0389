"""Every change of torch's intra-op thread count goes through ``torch_threads``: set for the block, the caller's
count back after it, on return and on error; a pretraining run with ``train.threads`` leaves the count as found."""

from __future__ import annotations

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
