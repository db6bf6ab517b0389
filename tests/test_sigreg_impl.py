"""The fast SIGReg paths equal the straightforward autograd reference: chunked (CPU twin) and Triton."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from levjepa.objective import _chunked, draw_directions, sigreg
from levjepa.objective.sigreg import reference_ecf_stats

pytestmark = pytest.mark.usefixtures("one_thread")


ROOT = Path(__file__).resolve().parents[1]


def _values_and_grads(z: torch.Tensor, a: torch.Tensor, impl: str, weights: torch.Tensor):
    """Per-direction values and the gradients w.r.t. z and the directions of a weighted sum of them."""
    zz = z.clone().requires_grad_(True)
    aa = a.clone().requires_grad_(True)
    values = sigreg(zz, aa, reduction="none", impl=impl)
    (values * weights).sum().backward()
    return values.detach(), zz.grad, aa.grad


def _stats_and_grad(fn, u: torch.Tensor, g: torch.Tensor):
    uu = u.clone().requires_grad_(True)
    stats = fn(uu)
    (stats * g).sum().backward()
    return stats.detach(), uu.grad


def _chunked_stats_and_grad(u: torch.Tensor, g: torch.Tensor, step: float, chunk: int | None = None):
    """The chunked forward and backward called directly (what ``levjepa::ecf_stats`` runs for ``chunked``)."""
    return _chunked.forward_stats(u, step, 17, chunk), _chunked.backward_grad(u, g, step, 17, chunk)


@pytest.mark.parametrize(("shape", "m"), [((37, 6), 9), ((3, 50, 8), 33)])
def test_chunked_equals_reference_in_float64(shape, m):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(*shape, generator=g, dtype=torch.float64) * 1.4 + 0.3
    a = torch.randn(shape[-1], m, generator=g, dtype=torch.float64)
    weights = torch.rand(*shape[:-2], m, generator=g, dtype=torch.float64)  # distinct per-direction weights
    ref = _values_and_grads(z, a, "reference", weights)
    fast = _values_and_grads(z, a, "chunked", weights)
    for r, f in zip(ref, fast, strict=True):
        torch.testing.assert_close(f, r, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunk_boundaries_do_not_matter(chunk):
    # ragged last chunk, one-row chunks, one chunk for everything: same statistics and gradients
    g = torch.Generator().manual_seed(1)
    u = torch.randn(2, 45, 11, generator=g, dtype=torch.float64) * 2
    upstream = torch.randn(2, 2, 17, 11, generator=g, dtype=torch.float64)
    t = torch.arange(17, dtype=torch.float64) * (3.0 / 16)
    ref = _stats_and_grad(lambda x: reference_ecf_stats(x, t), u, upstream)
    fast = _chunked_stats_and_grad(u, upstream, 3.0 / 16, chunk)
    for r, f in zip(ref, fast, strict=True):
        torch.testing.assert_close(f, r, rtol=1e-10, atol=1e-12)


def test_cpu_worker_threads_split_the_chunks_without_changing_the_result():
    # on CPU the chunks are dealt to one Python thread per intra-op thread; rows must not be lost or doubled
    g = torch.Generator().manual_seed(5)
    u = torch.randn(3, 101, 13, generator=g, dtype=torch.float64)
    upstream = torch.randn(3, 2, 17, 13, generator=g, dtype=torch.float64)
    t = torch.arange(17, dtype=torch.float64) * (3.0 / 16)
    ref = _stats_and_grad(lambda x: reference_ecf_stats(x, t), u, upstream)
    torch.set_num_threads(3)  # the autouse fixture restores the previous count
    fast = _chunked_stats_and_grad(u, upstream, 3.0 / 16, 8)
    assert torch.get_num_threads() == 3
    for r, f in zip(ref, fast, strict=True):
        torch.testing.assert_close(f, r, rtol=1e-10, atol=1e-12)


def test_chunked_float32_stays_close_to_float64():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(2, 512, 16, generator=g) * 1.3
    a = draw_directions(16, 64, seed=3)
    w = torch.ones(2, 64)
    exact = _values_and_grads(z.double(), a.double(), "reference", w.double())
    single = _values_and_grads(z, a, "chunked", w)
    torch.testing.assert_close(single[0].double(), exact[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(single[1].double(), exact[1], rtol=1e-4, atol=1e-5)


def test_chunked_keeps_only_n_by_m_tensors_for_backward():
    # what autograd saves: the reference keeps N x M x nodes tensors, the chunked path only N x M ones
    z = torch.randn(64, 16, requires_grad=True)
    a = draw_directions(16, 32, seed=0)
    sizes: dict[str, list[int]] = {}
    for impl in ("reference", "chunked"):
        saved: list[int] = []

        def pack(t, saved=saved):
            saved.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            sigreg(z, a, impl=impl)
        sizes[impl] = saved
    assert max(sizes["reference"]) == 64 * 32 * 17
    assert max(sizes["chunked"]) == 64 * 32


_INTERPRETED_RUN = """
import sys, torch
from levjepa.objective import _chunked, triton_sigreg
from levjepa.objective.sigreg import ecf_stats
assert triton_sigreg.AVAILABLE and triton_sigreg.INTERPRET, "triton is a test dependency: pip install triton"
cases, step = torch.load(sys.argv[1])
results = []
for u, upstream in cases:
    uu = u.clone().requires_grad_(True)
    stats = ecf_stats(uu, 17, step * 16, "triton")
    (stats * upstream).sum().backward()
    out = {"operator": (stats.detach(), uu.grad)}
    out["fused"] = (triton_sigreg.forward_stats(u, step, 17), triton_sigreg.backward_grad(u, upstream, step, 17))
    out["twin"] = (_chunked.forward_stats(u, step, 17), _chunked.backward_grad(u, upstream, step, 17))
    results.append(out)
torch.save(results, sys.argv[2])
"""


def _run_interpreted(cases: list[tuple[torch.Tensor, torch.Tensor]], step: float) -> list[dict]:
    """Run the Triton kernels through Triton's CPU interpreter in a fresh process: TRITON_INTERPRET must be
    set before triton is first imported, which in this process may already have happened."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.pt", Path(tmp) / "out.pt"
        torch.save((cases, step), src)
        env = dict(os.environ, TRITON_INTERPRET="1")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
        proc = subprocess.run(
            [sys.executable, "-c", _INTERPRETED_RUN, str(src), str(dst)], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return torch.load(dst)


def test_triton_kernels_equal_the_chunked_path_under_the_interpreter():
    g = torch.Generator().manual_seed(4)
    step = 3.0 / 16
    # ragged tiles in N and M; 300 rows make 3 row groups of 128 in the forward kernel (the last one ragged)
    cases = []
    for views, n, m in ((1, 37, 21), (2, 40, 16), (1, 300, 20)):
        cases.append((torch.randn(views, n, m, generator=g) * 1.5 + 0.2, torch.randn(views, 2, 17, m, generator=g)))
    for (u, upstream), out in zip(cases, _run_interpreted(cases, step), strict=True):
        for f, c, op in zip(out["fused"], out["twin"], out["operator"], strict=True):
            torch.testing.assert_close(f, c, rtol=1e-5, atol=2e-6)
            assert torch.equal(op, f)  # the levjepa::ecf_stats operator runs the same kernels
        exact = _chunked_stats_and_grad(u.double(), upstream.double(), step)
        torch.testing.assert_close(out["fused"][0].double(), exact[0], rtol=1e-5, atol=2e-6)
        torch.testing.assert_close(out["fused"][1].double(), exact[1], rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_statistics_operator_is_registered_for_autograd_and_compile(dtype):
    """``levjepa::ecf_stats`` (what ``torch.compile`` keeps whole in a compiled loss): its schema, fake tensor
    and autograd registrations agree with what it computes (``torch.library.opcheck``), and its statistics and
    gradient are the chunked forward's and backward's."""
    g = torch.Generator().manual_seed(5)
    u = (torch.randn(2, 30, 8, generator=g, dtype=dtype) * 1.3).requires_grad_(True)
    torch.library.opcheck(torch.ops.levjepa.ecf_stats.default, (u, 3.0 / 16, 17, "chunked"))
    upstream = torch.randn(2, 2, 17, 8, generator=g, dtype=dtype)
    via_op = _stats_and_grad(lambda x: torch.ops.levjepa.ecf_stats(x, 3.0 / 16, 17, "chunked"), u.detach(), upstream)
    direct = _chunked_stats_and_grad(u.detach(), upstream, 3.0 / 16)
    for a, b in zip(via_op, direct, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_triton_on_cuda_equals_reference():
    assert torch.cuda.is_available()
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(2, 1000, 64, generator=g, device="cuda") * 1.2
    a = draw_directions(64, 300, seed=1, device="cuda")
    w = torch.rand(2, 300, generator=g, device="cuda")
    ref = _values_and_grads(z.double(), a.double(), "reference", w.double())
    fused = _values_and_grads(z, a, "triton", w)
    for r, f in zip(ref, fused, strict=True):
        torch.testing.assert_close(f.double(), r, rtol=1e-3, atol=1e-4)
