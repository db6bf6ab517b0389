"""Empirical characteristic function of projections without ``N × M × nodes`` tensors (any device).

For projections ``u`` of shape ``[V, N, M]`` (view slot, sample, direction) and nodes ``t_j = j·Δ``,
``j = 0..J-1``, the forward returns the local statistics

    stats[v, 0, j, m] = mean_i cos(t_j u[v, i, m])        stats[v, 1, j, m] = mean_i sin(t_j u[v, i, m])

shape ``[V, 2, J, M]`` (``j = 0`` is exactly ``(1, 0)``). The backward, given ``g = dL/dstats``, returns

    dL/du[v, i, m] = (1/N) Σ_j t_j (g[v, 1, j, m] cos(t_j u) − g[v, 0, j, m] sin(t_j u))
                   = Re Σ_j β_j e^{i t_j u},     β_j = t_j (g_sin + i·g_cos) / N.

Design: the nodes are evenly spaced, so ``e^{i t_j u} = (e^{iΔu})^j``: one ``cos``/``sin`` pair per
(sample, direction) and complex multiplications for the rest, in the forward (running powers, summed over
the chunk) and in the backward (Horner's scheme over ``j``). Samples are processed in chunks of ``chunk``
rows, all view slots at once (fewer, larger ops: each op is a parallel region, and on a shared CPU many
small ones cost more than their arithmetic), so the working set is ``V × chunk × M`` complex numbers and
the only ``V × N × M`` tensors are the saved input ``u`` and its gradient: memory O(N·M), never O(N·M·J).
Values and gradients agree with the straightforward autograd version (``sigreg(..., impl="reference")``)
to ~1e-15 in float64 and ~1e-6 in float32 (the recurrence accumulates one rounding error per node).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from levjepa.threads import torch_threads

__all__ = ["backward_grad", "default_chunk", "forward_stats"]


def default_chunk(num_views: int, num_directions: int, device: torch.device) -> int:
    """Rows per chunk (all view slots are processed together): ~128K complex entries per working tensor on
    CPU (the size tuned on the 2-core machine, ``bench/sigreg.md`` § CPU), ~4M on accelerators (fewer
    launches)."""
    target = 1 << 17 if device.type == "cpu" else 1 << 22
    return max(1, target // max(num_views * num_directions, 1))


def _unit_phasor(u: torch.Tensor, step: float, scratch: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``e^{iΔu}`` written into ``out`` (complex, ``u``'s shape) through the real ``scratch``; returns ``out``."""
    torch.mul(u, step, out=scratch)
    parts = torch.view_as_real(out)
    torch.cos(scratch, out=parts[..., 0])
    torch.sin(scratch, out=parts[..., 1])
    return out


def _buffers(u: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One worker's scratch: real ``[V, c, M]`` and two complex ``[V, c, M]``, reused for every chunk (few,
    large allocations: no allocator churn in the loop)."""
    nviews, n, m = u.shape
    rows = min(chunk, n)
    ctype = torch.complex128 if u.dtype == torch.float64 else torch.complex64
    scratch = torch.empty(nviews, rows, m, dtype=u.dtype, device=u.device)
    return scratch, torch.empty(nviews, rows, m, dtype=ctype, device=u.device), torch.empty_like(scratch, dtype=ctype)


def _chunk_sums(u: torch.Tensor, starts: list[int], step: float, num_nodes: int, chunk: int) -> torch.Tensor:
    """``Σ_i e^{i t_j u_i}`` for ``j = 1..J-1`` over the chunks starting at ``starts``: ``[V, J-1, M]``."""
    nviews, n, m = u.shape
    scratch, e1_buf, power_buf = _buffers(u, chunk)
    sums = torch.zeros(nviews, num_nodes - 1, m, dtype=e1_buf.dtype, device=u.device)
    for start in starts:
        rows = min(chunk, n - start)
        e1 = _unit_phasor(u[:, start : start + rows], step, scratch[:, :rows], e1_buf[:, :rows])  # [V, c, M]
        power = power_buf[:, :rows]
        power.copy_(e1)
        sums[:, 0] += power.sum(1)
        for j in range(1, num_nodes - 1):
            power.mul_(e1)
            sums[:, j] += power.sum(1)
    return sums


def _chunk_grads(
    u: torch.Tensor, beta: torch.Tensor, out: torch.Tensor, starts: list[int], step: float, chunk: int
) -> None:
    """Write ``Re Σ_j β_j e^{i t_j u}`` into ``out`` for the chunks starting at ``starts`` (Horner in j)."""
    n = u.shape[1]
    num_nodes = beta.shape[1]
    scratch, e1_buf, acc_buf = _buffers(u, chunk)
    for start in starts:
        rows = min(chunk, n - start)
        e1 = _unit_phasor(u[:, start : start + rows], step, scratch[:, :rows], e1_buf[:, :rows])  # [V, c, M]
        acc = acc_buf[:, :rows]
        acc.copy_(beta[:, num_nodes - 1, None, :].expand_as(e1))
        for j in range(num_nodes - 2, 0, -1):  # ((β_{J-1} e + β_{J-2}) e + ...) e
            acc.mul_(e1).add_(beta[:, j, None, :])
        acc.mul_(e1)
        out[:, start : start + rows] = acc.real


def _split(n: int, chunk: int, device: torch.device) -> list[list[int]]:
    """Chunk starts dealt round-robin to one worker per intra-op thread (CPU), or one list elsewhere."""
    starts = list(range(0, n, chunk))
    workers = min(torch.get_num_threads(), len(starts)) if device.type == "cpu" else 1
    return [starts[w::workers] for w in range(max(workers, 1))]


def _run(work: Any, parts: list[list[int]]) -> list[Any]:
    """Run ``work(starts)`` for each part: on CPU, one Python thread per part with one intra-op thread each.

    The loops issue many mid-sized ops; each would otherwise be an OpenMP parallel region whose barrier,
    on a shared CPU, waits for a descheduled sibling thread (many times slower under load: ``bench/sigreg.md``
    § CPU, notes). Workers that only meet at the end avoid that, and torch ops release the GIL.
    """

    def no_grad_work(starts: list[int]) -> Any:
        with torch.no_grad():  # grad mode is thread-local: worker threads start with it enabled
            return work(starts)

    if len(parts) == 1:
        return [no_grad_work(parts[0])]
    with torch_threads(1), ThreadPoolExecutor(max_workers=len(parts)) as pool:
        return list(pool.map(no_grad_work, parts))


def forward_stats(u: torch.Tensor, step: float, num_nodes: int, chunk: int | None = None) -> torch.Tensor:
    """The statistics ``[V, 2, J, M]`` of contiguous ``u`` ``[V, N, M]`` (module doc), without autograd."""
    nviews, n, m = u.shape
    chunk = default_chunk(nviews, m, u.device) if chunk is None else chunk
    parts = _split(n, chunk, u.device)
    partial = _run(lambda starts: _chunk_sums(u, starts, step, num_nodes, chunk), parts)
    sums = partial[0]
    for extra in partial[1:]:  # a fixed order: deterministic for a given thread count
        sums = sums + extra
    stats = u.new_empty(nviews, 2, num_nodes, m)
    stats[:, 0, 0] = 1.0
    stats[:, 1, 0] = 0.0
    stats[:, 0, 1:] = sums.real / n
    stats[:, 1, 1:] = sums.imag / n
    return stats


def backward_grad(
    u: torch.Tensor, grad: torch.Tensor, step: float, num_nodes: int, chunk: int | None = None
) -> torch.Tensor:
    """``dL/du`` ``[V, N, M]`` from ``grad = dL/dstats`` ``[V, 2, J, M]`` (module doc), without autograd."""
    nviews, n, m = u.shape
    chunk = default_chunk(nviews, m, u.device) if chunk is None else chunk
    t = torch.arange(num_nodes, device=u.device, dtype=u.dtype) * step
    grad = grad.to(u.dtype)
    beta = torch.complex(grad[:, 1], grad[:, 0]) * (t[:, None] / n)  # [V, J, M]
    out = torch.empty_like(u)
    _run(lambda starts: _chunk_grads(u, beta, out, starts, step, chunk), _split(n, chunk, u.device))
    return out
