"""Fused Triton kernels for the SIGReg characteristic-function statistics (GPU; optional import).

Same contract as :mod:`levjepa.objective._chunked` (its CPU twin, and the equivalence reference in the
tests): input projections ``u`` ``[V, N, M]`` float32, output the local statistics ``[V, 2, J, M]``

    stats[v, 0, j, m] = mean_i cos(t_j u[v, i, m]),   stats[v, 1, j, m] = mean_i sin(t_j u[v, i, m]),

with ``t_j = j·Δ``; the backward is ``dL/du = Re Σ_j β_j e^{i t_j u}``, ``β_j = t_j (g_sin + i·g_cos)/N``.

Kernels:

* forward, grid ``(M / BLOCK_M, P, V)``: each program owns ``BLOCK_M`` directions and one of ``P`` row
  groups (``P ≤ 64``, groups of ≥ 128 rows), walks its rows in ``BLOCK_N × BLOCK_M`` tiles: one
  ``cos``/``sin`` per element, then the powers ``(c_j, s_j) = (c_{j-1}, s_{j-1})·(c_1, s_1)`` (a complex
  multiplication per node, ``e^{i t_j u} = (e^{iΔu})^j``), each column-summed into a register accumulator
  ``[J_pad, BLOCK_M]``. The ``P`` group partials ``[V, P, 2, J, M]`` (a few MB) are summed by torch in a
  fixed order: deterministic, unlike atomics.
* backward, grid ``(M / BLOCK_M, N / BLOCK_N, V)``: Horner's scheme over ``j`` with the ``β_j`` of the
  tile's columns (formed in the kernel from ``dL/dstats``); writes ``dL/du``.

Nothing of size ``N × M × J`` exists: memory is ``u``, its gradient and the small partial buffer. Padded
rows/columns are masked by zeroing ``e^{iΔu}``, so their powers contribute nothing.

Under ``TRITON_INTERPRET=1`` (set before triton is first imported) the kernels run on CPU tensors through
Triton's interpreter; the test suite uses that to check them against the chunked path. Only float32 is
handled here (float64 inputs take the chunked path on every device).
"""

from __future__ import annotations

import os

import torch

try:  # optional dependency: the GPU machine has it, a CPU install need not
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None

__all__ = ["AVAILABLE", "INTERPRET", "backward_grad", "check_input", "forward_stats", "row_groups"]

AVAILABLE = triton is not None
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
MAX_ROW_GROUPS = 64
ROW_QUANTUM = 128  # row groups are multiples of this (every BLOCK_N below divides it)

if AVAILABLE:
    # A few tile shapes, autotuned per (N, M) on the GPU; the interpreter has no timer, so it gets one.
    _FWD_CONFIGS = [
        triton.Config({"BLOCK_N": 16, "BLOCK_M": 128}, num_warps=4),
        triton.Config({"BLOCK_N": 32, "BLOCK_M": 64}, num_warps=4),
        triton.Config({"BLOCK_N": 64, "BLOCK_M": 64}, num_warps=4),
        triton.Config({"BLOCK_N": 64, "BLOCK_M": 32}, num_warps=4),
        triton.Config({"BLOCK_N": 128, "BLOCK_M": 64}, num_warps=8),
    ]
    _BWD_CONFIGS = [
        triton.Config({"BLOCK_N": 32, "BLOCK_M": 64}, num_warps=4),
        triton.Config({"BLOCK_N": 64, "BLOCK_M": 64}, num_warps=4),
        triton.Config({"BLOCK_N": 128, "BLOCK_M": 32}, num_warps=4),
        triton.Config({"BLOCK_N": 64, "BLOCK_M": 128}, num_warps=8),
    ]
    _INTERPRET_CONFIGS = [triton.Config({"BLOCK_N": 16, "BLOCK_M": 16}, num_warps=1)]

    @triton.jit
    def _ecf_fwd_kernel(
        u_ptr,
        part_ptr,
        N,
        M,
        step,
        ROWS_PER_GROUP: tl.constexpr,
        NUM_NODES: tl.constexpr,
        NODES_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_M: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        group = tl.program_id(1)
        v = tl.program_id(2).to(tl.int64)
        num_groups = tl.num_programs(1)
        cols = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        col_ok = cols < M
        node = tl.arange(0, NODES_PAD)[:, None]  # accumulator row j holds Σ_i of e^{i t_j u}
        acc_c = tl.zeros([NODES_PAD, BLOCK_M], dtype=tl.float32)
        acc_s = tl.zeros([NODES_PAD, BLOCK_M], dtype=tl.float32)
        row0 = group * ROWS_PER_GROUP
        for start in range(0, ROWS_PER_GROUP, BLOCK_N):
            rows = row0 + start + tl.arange(0, BLOCK_N)
            ok = (rows[:, None] < N) & col_ok[None, :]
            offs = v * N * M + rows[:, None].to(tl.int64) * M + cols[None, :]
            x = tl.load(u_ptr + offs, mask=ok, other=0.0) * step
            c1 = tl.where(ok, tl.cos(x), 0.0)
            s1 = tl.where(ok, tl.sin(x), 0.0)
            acc_c += tl.where(node == 0, tl.sum(ok.to(tl.float32), axis=0)[None, :], 0.0)  # cos(0) = 1
            c = c1
            s = s1
            for j in tl.static_range(1, NUM_NODES):
                if j > 1:
                    c_next = c * c1 - s * s1
                    s = s * c1 + c * s1
                    c = c_next
                acc_c += tl.where(node == j, tl.sum(c, axis=0)[None, :], 0.0)
                acc_s += tl.where(node == j, tl.sum(s, axis=0)[None, :], 0.0)
        # partial layout [V, groups, 2, NUM_NODES, M]
        ptrs = part_ptr + ((v * num_groups + group) * 2 * NUM_NODES) * M + node * M + cols[None, :]
        keep = (node < NUM_NODES) & col_ok[None, :]
        tl.store(ptrs, acc_c, mask=keep)
        tl.store(ptrs + NUM_NODES * M, acc_s, mask=keep)

    @triton.jit
    def _ecf_bwd_kernel(
        u_ptr,
        g_ptr,
        grad_ptr,
        N,
        M,
        step,
        NUM_NODES: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_M: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        v = tl.program_id(2).to(tl.int64)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        col_ok = cols < M
        ok = (rows[:, None] < N) & col_ok[None, :]
        offs = v * N * M + rows[:, None].to(tl.int64) * M + cols[None, :]
        x = tl.load(u_ptr + offs, mask=ok, other=0.0) * step
        c1 = tl.cos(x)
        s1 = tl.sin(x)
        # g = dL/dstats, layout [V, 2 (cos, sin), NUM_NODES, M]; β_j = t_j (g_sin + i g_cos) / N
        g_cos = g_ptr + v * 2 * NUM_NODES * M + cols
        g_sin = g_cos + NUM_NODES * M
        scale = step / N
        last = (NUM_NODES - 1) * scale
        zero = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_re = zero + (tl.load(g_sin + (NUM_NODES - 1) * M, mask=col_ok, other=0.0) * last)[None, :]
        acc_im = zero + (tl.load(g_cos + (NUM_NODES - 1) * M, mask=col_ok, other=0.0) * last)[None, :]
        for jj in tl.static_range(NUM_NODES - 2):  # Horner: acc <- acc·e^{iΔu} + β_j, j = J-2 .. 1
            j = NUM_NODES - 2 - jj
            b_re = (tl.load(g_sin + j * M, mask=col_ok, other=0.0) * (j * scale))[None, :]
            b_im = (tl.load(g_cos + j * M, mask=col_ok, other=0.0) * (j * scale))[None, :]
            re_next = acc_re * c1 - acc_im * s1 + b_re
            acc_im = acc_re * s1 + acc_im * c1 + b_im
            acc_re = re_next
        tl.store(grad_ptr + offs, acc_re * c1 - acc_im * s1, mask=ok)

    _fwd = triton.autotune(configs=_INTERPRET_CONFIGS if INTERPRET else _FWD_CONFIGS, key=["N", "M"])(_ecf_fwd_kernel)
    _bwd = triton.autotune(configs=_INTERPRET_CONFIGS if INTERPRET else _BWD_CONFIGS, key=["N", "M"])(_ecf_bwd_kernel)


def row_groups(n: int) -> tuple[int, int]:
    """``(groups, rows per group)`` of the forward kernel: at most 64 groups of a multiple of 128 rows."""
    per_group = -(-n // MAX_ROW_GROUPS)
    per_group = -(-per_group // ROW_QUANTUM) * ROW_QUANTUM
    return -(-n // per_group), per_group


def forward_stats(u: torch.Tensor, step: float, num_nodes: int) -> torch.Tensor:
    """The local statistics ``[V, 2, J, M]`` of contiguous float32 ``u`` ``[V, N, M]``: the forward kernel and
    the sum of its row-group partials, without autograd."""
    nviews, n, m = u.shape
    groups, per_group = row_groups(n)
    part = u.new_empty(nviews, groups, 2, num_nodes, m)
    pad = triton.next_power_of_2(num_nodes)
    _fwd[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), groups, nviews)](
        u, part, n, m, step, ROWS_PER_GROUP=per_group, NUM_NODES=num_nodes, NODES_PAD=pad
    )
    return part.sum(1) / n


def backward_grad(u: torch.Tensor, grad: torch.Tensor, step: float, num_nodes: int) -> torch.Tensor:
    """``dL/du`` ``[V, N, M]`` from ``grad = dL/dstats`` ``[V, 2, J, M]``: the backward kernel, without autograd."""
    nviews, n, m = u.shape
    grad = grad.float().contiguous()
    out = torch.empty_like(u)
    _bwd[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]), nviews)](
        u, grad, out, n, m, step, NUM_NODES=num_nodes
    )
    return out


def check_input(u: torch.Tensor) -> None:
    """Refuse, in one line, what the kernels cannot take: a CPU tensor (outside the interpreter), not float32,
    or no triton package."""
    if not (u.is_cuda or INTERPRET):
        raise ValueError(f"impl='triton' needs a CUDA tensor (or TRITON_INTERPRET=1), got device {u.device}")
    if u.dtype != torch.float32:
        raise ValueError(f"impl='triton' takes float32 input (float64 uses impl='chunked'), got {u.dtype}")
    if not AVAILABLE:
        raise RuntimeError("impl='triton' needs the triton package (pip install triton)")
