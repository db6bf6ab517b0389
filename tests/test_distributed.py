"""levjepa.distributed: the differentiable all-reduce and the global-batch BatchNorm, with real gloo ranks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from dist_utils import run_gloo
from levjepa import distributed
from levjepa.distributed import SyncBatchNorm1d, all_reduce_mean, convert_sync_batchnorm


def _loss_of_mean(x: torch.Tensor) -> torch.Tensor:
    # a nonlinear function of a batch statistic, the shape of SIGReg's use
    s = all_reduce_mean(torch.stack([x.sin().mean(0), x.cos().mean(0)]))
    return (s - 0.3).square().sum() * x.shape[0] * distributed.world_size()


def _grad_worker(rank: int, world: int, x_full: torch.Tensor):
    x = x_full.chunk(world)[rank].clone().requires_grad_(True)
    loss = _loss_of_mean(x)
    loss.backward()
    return loss.detach(), x.grad


def _bn_worker(rank: int, world: int, x_full: torch.Tensor, w_full: torch.Tensor, state: dict):
    bn = convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(x_full.shape[1]).double()))
    bn.load_state_dict(state)
    x = x_full.chunk(world)[rank].clone().requires_grad_(True)
    y = bn(x)
    (y * w_full.chunk(world)[rank]).sum().backward()
    return y.detach(), x.grad, bn[0].running_mean.clone(), bn[0].running_var.clone()


@pytest.mark.distributed
def test_all_reduce_mean_gives_single_process_loss_and_world_times_gradient():
    torch.manual_seed(0)
    x_full = torch.randn(8, 5, dtype=torch.float64)
    xs = x_full.clone().requires_grad_(True)
    ref = _loss_of_mean(xs)
    ref.backward()
    results = run_gloo(_grad_worker, 2, x_full)
    for rank, (loss, grad) in enumerate(results):
        torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=1e-12)
        # each rank's input gradient is world_size x the single-process gradient of its rows
        torch.testing.assert_close(grad, 2 * xs.grad.chunk(2)[rank], rtol=1e-10, atol=1e-12)


@pytest.mark.distributed
def test_sync_batchnorm_over_two_ranks_equals_batchnorm_on_the_global_batch():
    torch.manual_seed(1)
    x_full = torch.randn(12, 4, dtype=torch.float64) * 3 + 1
    bn = torch.nn.Sequential(torch.nn.BatchNorm1d(4).double())
    state = {k: v.clone() for k, v in bn.state_dict().items()}
    w_full = torch.randn(12, 4, dtype=torch.float64)
    xs = x_full.clone().requires_grad_(True)
    y = bn(xs)
    (y * w_full).sum().backward()
    results = run_gloo(_bn_worker, 2, x_full, w_full, state)
    for rank, (y_r, g_r, rm, rv) in enumerate(results):
        torch.testing.assert_close(y_r, y.detach().chunk(2)[rank])
        # BatchNorm's input gradient couples rows through the batch statistics; with the sum-loss
        # of every rank the adjoint is the single-process gradient of the summed loss
        torch.testing.assert_close(g_r, xs.grad.chunk(2)[rank])
        torch.testing.assert_close(rm, bn[0].running_mean)
        torch.testing.assert_close(rv, bn[0].running_var)


def test_single_process_helpers_are_identities():
    x = torch.randn(3, requires_grad=True)
    assert all_reduce_mean(x) is x
    assert distributed.world_size() == 1 and distributed.rank() == 0 and distributed.is_main()
    assert distributed.reduce_scalars({"a": torch.tensor(2.0), "b": 3.0}) == {"a": 2.0, "b": 3.0}
    bn = SyncBatchNorm1d(3)
    ref = torch.nn.BatchNorm1d(3)
    z = torch.randn(7, 3)
    torch.testing.assert_close(bn(z), ref(z))


def _thread_names() -> list[str]:
    tasks = Path("/proc/self/task")
    return sorted((t / "comm").read_text().strip() for t in tasks.iterdir())


def _teardown_worker(rank: int, world: int) -> tuple[list[str], list[str]]:
    from torch.nn.parallel import DistributedDataParallel

    from levjepa import distributed

    DistributedDataParallel(torch.nn.Linear(3, 2))(torch.randn(4, 3)).sum().backward()
    running = _thread_names()
    distributed.teardown()
    for _ in range(40):  # gloo's threads end asynchronously: give them 2 s (a group that outlives teardown never ends)
        if not any("gloo" in name for name in _thread_names()):
            break
        time.sleep(0.05)
    return running, _thread_names()


@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to list native threads")
def test_teardown_stops_the_gloo_threads_even_after_ddp():
    # DDP imports torch.distributed.nn, whose default arguments hold the WORLD group: if that import
    # comes after init_process_group the group outlives teardown, and its worker threads still running at
    # interpreter shutdown abort the process (SIGABRT) about one exit in seven
    for running, after in run_gloo(_teardown_worker, 2):
        assert any("gloo" in name for name in running)  # the probe sees gloo's threads at all
        assert not any("gloo" in name for name in after), after
