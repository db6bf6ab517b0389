"""The only module of levjepa that touches ``torch.distributed``.

Everything else asks this module for the rank, the world size, or a reduction; the model and the
objectives never import ``torch.distributed`` themselves, and every helper below is a no-op in a single
process, so the same code runs on a laptop and under ``torchrun``.

Launch: ``torchrun --nproc_per_node=N [--nnodes ...] -m levjepa pretrain ...`` sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. Under SLURM, ``srun`` starting one task
per GPU is enough: when the torchrun variables are absent, ``SLURM_PROCID`` / ``SLURM_STEP_NUM_TASKS`` (or
``SLURM_NTASKS``) / ``SLURM_LOCALID`` give the rank, world size and local rank, and :func:`slurm_rendezvous`
derives ``MASTER_ADDR`` (the first host of ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST``, parsed here,
no ``scontrol``) and ``MASTER_PORT`` (15000 + the last four digits of ``SLURM_JOB_ID``, Lightning's rule)
unless the job script exported them. ``SLURM_NTASKS > 1`` in a process that ``srun`` did not start (the
batch script itself runs ``python``: no ``SLURM_STEP_NUM_TASKS``) is the one-process-in-a-multi-task-
allocation mistake, refused in one line (:class:`LaunchError`). SLURM is never required. The backend is
NCCL when the process has a GPU and gloo otherwise.

Gradient semantics of :func:`all_reduce_mean` (the SIGReg statistics go through it). The forward returns
``s = mean_r s_r`` on every rank; the backward is the true adjoint of that mean summed over the ranks'
losses, ``grad s_r = mean_r' grad s``. When every rank computes the same loss ``L(s)`` this gives rank
``r`` the gradient ``dL/ds``, i.e. ``world_size`` times the single-process gradient for its own rows, so
that after DDP averages parameter gradients over ranks they equal the single-process gradients on the
concatenated batch. ``tests/test_distributed.py`` checks this with real gloo processes.

Parameter gradients are averaged over ranks either by DDP (:func:`wrap_ddp`: overlapped with the backward,
used when each rank runs one micro-batch per step) or by one explicit :func:`all_reduce_gradients` after
the last micro-batch (the trainer's GradCache accumulation, whose projector backward happens outside any
DDP forward; see ``levjepa.train.step``). Both take the same mean.
"""

from __future__ import annotations

import datetime
import os
import pickle
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "DistInfo",
    "LaunchError",
    "SyncBatchNorm1d",
    "all_gather_objects",
    "all_gather_rows",
    "all_reduce_gradients",
    "all_reduce_mean",
    "all_reduce_sum",
    "any_rank",
    "barrier",
    "broadcast_object",
    "convert_sync_batchnorm",
    "is_ddp",
    "is_initialized",
    "is_main",
    "main_rank_decides",
    "rank",
    "reduce_scalars",
    "resolve_device",
    "setup",
    "slurm_first_host",
    "slurm_rendezvous",
    "teardown",
    "world_size",
    "wrap_ddp",
]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return None


class LaunchError(ValueError):
    """The processes were started in a way that cannot work (the message says how to start them)."""


def slurm_first_host(nodelist: str) -> str:
    """The first host of a SLURM host list, as ``scontrol show hostnames`` would list it first:
    ``node07`` -> ``node07``, ``gpu[003-010,012]`` -> ``gpu003``, ``a[1-2]-ib[0-1],b4`` -> ``a1-ib0``."""
    depth, end = 0, len(nodelist)
    for i, char in enumerate(nodelist):  # the first entry: up to the first comma outside brackets
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            end = i
            break
    entry, host = nodelist[:end].strip(), ""
    while "[" in entry:
        head, _, rest = entry.partition("[")
        ranges, _, entry = rest.partition("]")
        host += head + ranges.split(",")[0].split("-")[0]
    host += entry
    if not host or any(c in host for c in "[],"):
        raise LaunchError(f"SLURM host list {nodelist!r}: cannot read its first host; export MASTER_ADDR")
    return host


def slurm_rendezvous(environ: Mapping[str, str]) -> dict[str, str]:
    """``MASTER_ADDR`` / ``MASTER_PORT`` for ranks that ``srun`` started (module docstring), for those of the
    two that ``environ`` lacks; ``{}`` outside SLURM or when both are set."""
    out: dict[str, str] = {}
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if "MASTER_ADDR" not in environ and nodelist:
        out["MASTER_ADDR"] = slurm_first_host(nodelist)
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if "MASTER_PORT" not in environ and job and job.isdigit():
        out["MASTER_PORT"] = str(15000 + int(job[-4:]))
    return out


def _world() -> int:
    """The number of processes the launcher started (module docstring); refuses one process of an allocation
    that asked for several tasks."""
    if _env_int("WORLD_SIZE") is not None:
        return _env_int("WORLD_SIZE") or 1
    tasks = _env_int("SLURM_NTASKS", "SLURM_NPROCS") or 1
    step_tasks = _env_int("SLURM_STEP_NUM_TASKS")
    if tasks > 1 and step_tasks is None:
        raise LaunchError(
            f"SLURM allocated {tasks} tasks (SLURM_NTASKS={tasks}) but this one process was not started by srun: "
            "start every rank with `srun python -m levjepa ...` (or one `torchrun --nproc_per_node=N` per node), "
            "or ask for --ntasks=1"
        )
    return step_tasks or tasks


def setup(device: str | None = None, timeout_s: float = 1800.0) -> DistInfo:
    """Initialise the process group if the environment asks for more than one process.

    ``device``: ``"cpu"``, ``"cuda"`` or ``None`` (a GPU when one is visible). Returns this process's
    rank, world size, local rank and the device it should use. A launch that cannot work (CUDA asked for
    and absent, a SLURM allocation of several tasks running one process, no rendezvous address) raises a
    :class:`LaunchError` that says what to do.
    """
    world = _world()
    rank_ = launch_rank()
    local = _env_int("LOCAL_RANK", "SLURM_LOCALID") or 0
    want_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if want_cuda and not torch.cuda.is_available():
        raise LaunchError(
            f"train.device={device} but torch sees no CUDA device (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda}): use train.device=cpu or auto, or install a CUDA build of torch on a GPU machine"
        )
    dev = torch.device("cuda", local % max(torch.cuda.device_count(), 1)) if want_cuda else torch.device("cpu")
    if want_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        if _env_int("WORLD_SIZE") is None:  # srun started the ranks: the rendezvous from SLURM's variables
            os.environ.update(slurm_rendezvous(os.environ))
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise LaunchError(
                    f"{world} processes but {var} is not set: launch with torchrun or srun, or export "
                    "MASTER_ADDR and MASTER_PORT"
                )
        os.environ.setdefault("RANK", str(rank_))
        os.environ.setdefault("WORLD_SIZE", str(world))
        # torch.distributed.nn.functional binds ``group.WORLD`` as default arguments when it is first
        # imported, and DistributedDataParallel imports it lazily: imported after init_process_group it
        # keeps the group alive past destroy_process_group, so gloo's worker threads are still running at
        # interpreter shutdown, where releasing their last work aborts the process ("terminate called
        # without an active exception", SIGABRT, about one clean exit in seven). Imported first, it binds None.
        import torch.distributed.nn as _  # noqa: F401

        dist.init_process_group(
            backend="nccl" if want_cuda else "gloo",
            rank=rank_,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if want_cuda else None,
        )
    return DistInfo(rank=rank(), world_size=world_size(), local_rank=local, device=dev)


def teardown() -> None:
    """Destroy the process group (see ``setup`` for why the group is really freed)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def launch_rank() -> int:
    """This process's rank as its launcher numbered it (torchrun's ``RANK``, srun's ``SLURM_PROCID``; 0 when
    alone), known before the process group starts and after it ends: a command prints its notes and results
    where this is 0, once per job instead of once per process."""
    return _env_int("RANK", "SLURM_PROCID") or 0


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def resolve_device(device: str) -> str:
    """``auto``: this process's CUDA device when there is one (``LOCAL_RANK`` under torchrun), else the CPU;
    any other name is returned as given."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        local = _env_int("LOCAL_RANK", "SLURM_LOCALID") or 0
        return f"cuda:{local % torch.cuda.device_count()}"
    return "cpu"


class _AllReduce(torch.autograd.Function):
    """Sum (or mean) over ranks whose backward is the adjoint: the same reduction of the gradients."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, mean: bool) -> torch.Tensor:
        ctx.mean = mean
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / world_size() if mean else out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return (out / world_size() if ctx.mean else out), None


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Differentiable mean over ranks (see the module docstring for the gradient). Identity alone."""
    return tensor if world_size() == 1 else _AllReduce.apply(tensor, True)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Differentiable sum over ranks; its backward sums the gradients over ranks. Identity alone."""
    return tensor if world_size() == 1 else _AllReduce.apply(tensor, False)


@torch.no_grad()
def reduce_scalars(values: Mapping[str, float | torch.Tensor], op: str = "mean") -> dict[str, float]:
    """Reduce a dict of scalars over ranks for logging, in one collective; returns Python floats.

    This synchronises with the device: call it only on logging steps.
    """
    keys = sorted(values)
    if not keys:
        return {}
    device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    if is_initialized() and dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flat = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=device).reshape(()) for k in keys])
    if world_size() > 1:
        dist.all_reduce(flat, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        if op == "mean":
            flat /= world_size()
    return dict(zip(keys, flat.tolist(), strict=True))


def all_gather_objects(obj: Any) -> list[Any]:
    """Gather one picklable object from every rank (small objects only: bad-file lists, summaries)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


@torch.no_grad()
def all_gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` ``[n, ...]`` stacked along rows in rank order, ``[world_size · n, ...]``; not
    differentiable (for detached values, e.g. the rows LocaLeJEPA clusters). Every rank must pass the same
    shape (the trainer's ranks hold equal batches). Alone: ``tensor`` itself."""
    if world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


@contextmanager
def main_rank_decides() -> Iterator[None]:
    """``with main_rank_decides(): if is_main(): check()`` — the main rank's verdict, raised on every rank.

    For checks only the main rank makes (a run directory's state, its lock): an exception the body raises
    there is broadcast when the body ends, and every rank raises it, instead of the other ranks waiting
    forever in their next collective. The main rank raises its own exception (its traceback kept); the others
    an unpickled copy, the same type and message (a :class:`RuntimeError` naming them when the exception does
    not survive pickling). Every rank must enter the block (it is one broadcast); alone it is a plain block.

    Why not a quiet variant on the other ranks: the same exception on every rank is what a caller of the
    Python API can catch on each, and it gives every rank the CLI's one-line message and exit status, so
    torchrun's summary of the first failed rank names the real cause whichever rank it is. The price is that
    line once per rank in a torchrun log.
    """
    mine: Exception | None = None
    try:
        yield
    except Exception as err:  # every rank must reach the broadcast below
        mine = err
    verdict = broadcast_object(_portable(mine) if is_main() else None)
    if mine is not None:
        raise mine
    if verdict is not None:
        raise verdict


def _portable(err: Exception | None) -> Exception | None:
    """``err`` if a copy of it survives pickling (what a broadcast does to it), else a RuntimeError saying it."""
    if err is None:
        return None
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # any failure to pickle or rebuild it: send its words instead
        return RuntimeError(f"{type(err).__name__}: {err}")


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (one tiny all-reduce; every rank must call it). Alone: ``flag``."""
    if world_size() == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    box = torch.tensor([int(flag)], device=device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return bool(box.item())


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


class SyncBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d whose batch statistics are taken over the global batch (all ranks), on CPU too.

    ``torch.nn.SyncBatchNorm`` refuses CPU tensors, and the projector's BatchNorm must see the global
    batch for a 2-rank run to equal a 1-rank run on the same clips. The sums ``(Σx, Σx², n)`` go through
    one differentiable all-reduce; alone it is an ordinary ``BatchNorm1d``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or world_size() == 1:
            return super().forward(x)
        if x.dim() != 2:
            raise ValueError(f"SyncBatchNorm1d expects [N, C] input, got shape {tuple(x.shape)}")
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        n_local = torch.full((1,), float(x.shape[0]), device=x.device, dtype=xf.dtype)
        stats = all_reduce_sum(torch.cat([xf.sum(0), (xf * xf).sum(0), n_local]))
        c = x.shape[1]
        n = stats[-1]
        mean = stats[:c] / n
        var = (stats[c : 2 * c] / n - mean * mean).clamp_min(0.0)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            assert self.num_batches_tracked is not None  # tracked with the running statistics
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                unbiased = var * n / (n - 1).clamp_min(1.0)
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.detach().to(self.running_var.dtype), momentum)
        y = (xf - mean) * torch.rsqrt(var + self.eps)
        if self.affine:
            y = y * self.weight + self.bias
        return y.to(x.dtype)


def convert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every ``nn.BatchNorm1d`` in ``module`` by :class:`SyncBatchNorm1d` (weights kept)."""
    if isinstance(module, nn.BatchNorm1d) and not isinstance(module, SyncBatchNorm1d):
        new = SyncBatchNorm1d(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        ref = next(iter(module.state_dict().values()))
        new.to(device=ref.device, dtype=module.running_mean.dtype if module.running_mean is not None else ref.dtype)
        new.load_state_dict(module.state_dict())
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_sync_batchnorm(child))
    return module


@torch.no_grad()
def all_reduce_gradients(params: list[torch.Tensor], bucket_elements: int = 1 << 24) -> None:
    """Average ``p.grad`` over ranks, in place (what DDP does), for gradients accumulated outside DDP.

    The gradients are flattened into buckets of at most ``bucket_elements`` (one all-reduce each, summed,
    then divided by the world size), so the call costs a few collectives, not one per parameter. Every rank
    must pass the same parameters in the same order (the same model). A no-op in a single process.
    """
    if world_size() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    scale = 1.0 / world_size()
    bucket: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        if not bucket:
            return
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.mul_(scale)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        bucket.clear()

    for g in grads:
        if bucket and (size + g.numel() > bucket_elements or g.dtype != bucket[0].dtype):
            flush()
            size = 0
        bucket.append(g)
        size += g.numel()
    flush()


def is_ddp(module: nn.Module) -> TypeGuard[DistributedDataParallel]:
    """Whether ``module`` is wrapped in DistributedDataParallel (its gradients are averaged by DDP)."""
    return isinstance(module, DistributedDataParallel)


def wrap_ddp(module: nn.Module, info: DistInfo, **kwargs: Any) -> nn.Module:
    """DistributedDataParallel when running on several ranks; the module itself otherwise."""
    if info.world_size == 1:
        return module
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, **kwargs)
