"""SIGReg: Sketched Isotropic Gaussian Regularization (LeJEPA), the anti-collapse term of LeVJEPA.

SIGReg pushes the *population* of embeddings of each view slot toward ``N(0, I_K)`` by testing many random
one-dimensional projections (Cramér–Wold) with the Epps–Pulley characteristic-function statistic.

For a view slot with samples ``z_1..z_N ∈ R^K`` and unit directions ``a_1..a_M`` (columns of ``A``,
Gaussian, normalised; ``M = 1024`` per step, the same for every view slot and every rank):

    u_im   = <z_i, a_m>                                         projections             [N, M]
    φ̂_m(t) = mean_i cos(t u_im) + i · mean_i sin(t u_im)        empirical char. fn.
    EP_m   = N · Σ_j w_j |φ̂_m(t_j) − e^{−t_j²/2}|²              Epps–Pulley, per direction
    SIGReg = mean over directions m (and view slots v) of EP_m

* Nodes: ``t_j`` evenly on ``[0, t_max]`` (17 nodes on ``[0, 3]``). Weights: the trapezoid rule doubled for
  the symmetric half ``[−t_max, 0]`` (``Δ`` at both ends, ``2Δ`` inside) times the Gaussian window
  ``e^{−t_j²/2}``. ``N`` is the **global** batch size (all ranks).
* Null value: for i.i.d. N(0,1) projections ``E|φ̂(t) − φ(t)|² = (1 − e^{−t²})/N``, so
  ``E[EP] = Σ_j w_j (1 − e^{−t_j²}) = 1.0524642`` per direction, at any N (``null_value()``).
* Bounded: ``|φ̂| ≤ 1`` so ``EP ≤ 4N Σ w`` and ``|∂EP/∂u_i| ≤ 4 Σ_j w_j t_j`` whatever the size of ``u_i``:
  one huge outlier can neither blow up the loss nor its gradient w.r.t. the projections.

Distributed (``levjepa.distributed``): each rank computes its local cos/sin means ``[V, 2, J, M]``;
one differentiable ``all_reduce_mean`` of those statistics (weighted by the local batch sizes, so unequal
per-rank batches are exact too; the count rides in the same tensor) makes them global, and the loss is
computed from the reduced value on every rank. With the all-reduce's adjoint backward each rank's input
gradient is ``world_size ×`` the single-process gradient of its rows, so DDP's gradient averaging yields
the single-process parameter gradients (``tests/test_sigreg_distributed.py`` checks this with gloo).

Implementations of the statistics (``impl``), all returning the same values and gradients:

* ``"reference"``: the straightforward autograd version; keeps three ``N × M × J`` tensors for backward.
  The test oracle.
* ``"chunked"``: :mod:`levjepa.objective._chunked`, a forward and an analytic backward of
  ``e^{i t_j u} = (e^{iΔu})^j`` recurrences in chunks of samples; memory O(N·M). Any device.
* ``"triton"``: :mod:`levjepa.objective.triton_sigreg`, fused GPU kernels (float32).
* ``"auto"``: triton for float32 CUDA tensors when triton imports, chunked otherwise.

``chunked`` and ``triton`` run as one registered operator, ``levjepa::ecf_stats`` (forward) and
``levjepa::ecf_stats_backward`` (its autograd): opaque to ``torch.compile``, so a compiled loss keeps SIGReg inside
its one graph (and, on CUDA with ``mode="reduce-overhead"``, inside one CUDA graph: one launch forward, one backward,
``levjepa.train.step``). ``tests/test_sigreg_impl.py`` checks the registration (``torch.library.opcheck``).

Numerics: the projection and the statistics run in float32 (float64 if the input is float64) with autocast
disabled, so bf16 autocast never degrades the characteristic function. No host–device synchronisation:
nothing reads a tensor value on the host (input values are checked for finiteness only on CPU tensors,
where that costs no device sync, unless asked otherwise with ``check_finite``).

``SIGReg`` (module) draws fresh directions each step from a generator seeded by ``(seed, step)`` on the
input's device: identical on every rank by construction, with the step a Python int (the official code
reads a device step counter with ``.item()`` every step).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from levjepa import distributed, rng

from . import _chunked

__all__ = [
    "SIGReg",
    "cached_epps_pulley_nodes",
    "check_embeddings",
    "draw_directions",
    "ecf_stats",
    "epps_pulley_from_stats",
    "epps_pulley_nodes",
    "global_stats",
    "null_value",
    "reference_ecf_stats",
    "sigreg",
]

Impl = Literal["auto", "reference", "chunked", "triton"]
_IMPLS = ("auto", "reference", "chunked", "triton")
_DIRECTION_EPS = 1e-12


# ----------------------------------------------------------------------------------------------- constants
def epps_pulley_nodes(
    num_nodes: int = 17,
    t_max: float = 3.0,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nodes ``t_j``, quadrature weights ``w_j`` (trapezoid, symmetric doubling, Gaussian window) and the
    standard-normal characteristic function ``e^{−t_j²/2}`` at the nodes; each ``[num_nodes]``."""
    if num_nodes < 2 or not t_max > 0:
        raise ValueError(f"need num_nodes >= 2 and t_max > 0, got num_nodes={num_nodes}, t_max={t_max}")
    step = t_max / (num_nodes - 1)
    t = torch.arange(num_nodes, dtype=dtype, device=device) * step
    phi = torch.exp(-0.5 * t.square())
    # step at both ends, 2·step inside; built by arithmetic, not by writing a Python number into two elements
    # of a CUDA tensor (each such write is a host-device synchronisation)
    i = torch.arange(num_nodes, device=device)
    trapezoid = 2.0 * step - step * ((i == 0) | (i == num_nodes - 1)).to(dtype)
    return t, trapezoid * phi, phi


_NODE_CACHE: dict[tuple[int, float, torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def cached_epps_pulley_nodes(
    num_nodes: int, t_max: float, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``epps_pulley_nodes`` made once per (nodes, t_max, dtype, device): no per-step kernel launches. The
    tensors are shared by every caller: read them, never write into them."""
    key = (num_nodes, float(t_max), dtype, device)
    if key not in _NODE_CACHE:
        _NODE_CACHE[key] = epps_pulley_nodes(num_nodes, t_max, dtype=dtype, device=device)
    return _NODE_CACHE[key]


def null_value(num_nodes: int = 17, t_max: float = 3.0) -> float:
    """``E[EP]`` per direction for i.i.d. standard-normal projections: ``Σ_j w_j (1 − e^{−t_j²})``."""
    t, w, _ = epps_pulley_nodes(num_nodes, t_max)
    return float((w * (1.0 - torch.exp(-t.square()))).sum())


# --------------------------------------------------------------------------------------------- randomness
def draw_directions(
    dim: int,
    num_directions: int,
    *,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``[dim, num_directions]`` Gaussian directions, columns normalised (with an epsilon).

    Drawn in float32 on the generator's device (so float32 and float64 runs see the same directions), then
    moved to ``device``/``dtype``. Give a ``generator`` or a ``seed`` (``levjepa.rng.make_generator("directions",
    seed)`` on ``device`` is used); with neither, seed 0: library code never touches the global RNG.
    """
    if generator is None:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        generator = rng.make_generator("directions", 0 if seed is None else int(seed), device=dev)
    a = torch.randn(dim, num_directions, generator=generator, device=generator.device, dtype=torch.float32)
    a = F.normalize(a, dim=0, eps=_DIRECTION_EPS)
    return a.to(device=device if device is not None else a.device, dtype=dtype)


# ------------------------------------------------------------------------------------------------ checks
def _want_value_check(t: torch.Tensor, check_finite: bool | None) -> bool:
    return t.device.type == "cpu" if check_finite is None else bool(check_finite)


def check_embeddings(z: Any, name: str = "z", *, min_samples: int = 2, check_finite: bool | None = None) -> None:
    """Raise ``ValueError`` unless ``z`` is a floating ``[N, K]`` or ``[V, N, K]`` tensor with ``N >= 2``.

    Finiteness is checked on CPU tensors (no device sync there), on accelerators only if
    ``check_finite=True`` (it synchronises).
    """
    if not isinstance(z, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [N, K] or [V, N, K], got {type(z).__name__}")
    if z.dim() not in (2, 3):
        raise ValueError(f"{name} must have shape [N, K] or [V, N, K], got shape {tuple(z.shape)}")
    if not z.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {z.dtype} (shape {tuple(z.shape)})")
    n, k = z.shape[-2], z.shape[-1]
    if n < min_samples:
        raise ValueError(
            f"{name} has N={n} samples per view (shape {tuple(z.shape)}); the statistic needs N >= {min_samples}"
        )
    if k < 1 or (z.dim() == 3 and z.shape[0] < 1):
        raise ValueError(f"{name} has an empty dimension: shape {tuple(z.shape)}")
    if _want_value_check(z, check_finite) and not bool(torch.isfinite(z).all()):
        bad = int((~torch.isfinite(z)).sum())
        raise ValueError(f"{name} (shape {tuple(z.shape)}) contains {bad} non-finite values (NaN or inf)")


def _check_directions(directions: Any, k: int, check_finite: bool | None) -> None:
    if not isinstance(directions, torch.Tensor) or directions.dim() != 2:
        shape = tuple(directions.shape) if isinstance(directions, torch.Tensor) else type(directions).__name__
        raise ValueError(f"directions must be a [K, M] tensor, got {shape}")
    if directions.shape[0] != k:
        raise ValueError(f"directions has shape {tuple(directions.shape)} but z has K={k} features: expected [{k}, M]")
    if directions.shape[1] < 1:
        raise ValueError(f"directions has no columns: shape {tuple(directions.shape)}")
    if _want_value_check(directions, check_finite):
        norms = directions.detach().norm(dim=0)
        if not bool(torch.isfinite(directions).all()) or not bool((norms > 0).all()):
            raise ValueError(
                f"directions (shape {tuple(directions.shape)}) must be finite with non-zero columns "
                "(each column is normalised to unit length)"
            )


# ------------------------------------------------------------------------------------- statistics (local)
def reference_ecf_stats(u: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Straightforward autograd statistics ``[V, 2, J, M]`` of ``u`` ``[V, N, M]`` (keeps ``N·M·J`` tensors)."""
    x = u.unsqueeze(-1) * t  # [V, N, M, J]
    stats = torch.stack([torch.cos(x).mean(1), torch.sin(x).mean(1)], dim=1)  # [V, 2, M, J]
    return stats.transpose(-1, -2)


def _resolve_impl(impl: str, u: torch.Tensor) -> str:
    if impl not in _IMPLS:
        raise ValueError(f"impl={impl!r}: valid choices are {', '.join(_IMPLS)}")
    if impl != "auto":
        return impl
    if u.is_cuda and u.dtype == torch.float32:
        from . import triton_sigreg

        if triton_sigreg.AVAILABLE:
            return "triton"
    return "chunked"


@torch.library.custom_op("levjepa::ecf_stats", mutates_args=())
def _ecf_op(u: torch.Tensor, step: float, num_nodes: int, impl: str) -> torch.Tensor:
    """The chunked or Triton statistics of contiguous ``u`` as one operator (its backward another, below):
    ``torch.compile`` keeps it whole inside a compiled region and CUDA graphs capture its kernels, so the loss
    of a compiled step is one graph with SIGReg in it (``levjepa.train.step``)."""
    if impl == "triton":
        from . import triton_sigreg

        return triton_sigreg.forward_stats(u, step, num_nodes)
    return _chunked.forward_stats(u, step, num_nodes)


@_ecf_op.register_fake
def _(u: torch.Tensor, step: float, num_nodes: int, impl: str) -> torch.Tensor:
    return u.new_empty(u.shape[0], 2, num_nodes, u.shape[2])


@torch.library.custom_op("levjepa::ecf_stats_backward", mutates_args=())
def _ecf_backward_op(u: torch.Tensor, grad: torch.Tensor, step: float, num_nodes: int, impl: str) -> torch.Tensor:
    """``dL/du`` of :func:`_ecf_op` from ``dL/dstats``."""
    if impl == "triton":
        from . import triton_sigreg

        return triton_sigreg.backward_grad(u, grad, step, num_nodes)
    return _chunked.backward_grad(u, grad, step, num_nodes)


@_ecf_backward_op.register_fake
def _(u: torch.Tensor, grad: torch.Tensor, step: float, num_nodes: int, impl: str) -> torch.Tensor:
    return torch.empty_like(u)


def _ecf_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    u, step, num_nodes, impl = inputs
    ctx.save_for_backward(u)
    ctx.step, ctx.num_nodes, ctx.impl = step, num_nodes, impl


def _ecf_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
    (u,) = ctx.saved_tensors
    return _ecf_backward_op(u, grad.contiguous(), ctx.step, ctx.num_nodes, ctx.impl), None, None, None


_ecf_op.register_autograd(_ecf_backward, setup_context=_ecf_setup)


def ecf_stats(u: torch.Tensor, num_nodes: int, t_max: float, impl: str = "auto") -> torch.Tensor:
    """Local cos/sin means ``[V, 2, J, M]`` of projections ``u`` ``[V, N, M]`` by the chosen implementation:
    ``reference`` in autograd ops, ``chunked`` and ``triton`` through the ``levjepa::ecf_stats`` operator."""
    step = t_max / (num_nodes - 1)
    which = _resolve_impl(impl, u)
    if which == "reference":
        t = torch.arange(num_nodes, device=u.device, dtype=u.dtype) * step
        return reference_ecf_stats(u, t)
    if which == "triton":
        from . import triton_sigreg

        triton_sigreg.check_input(u)
    out: torch.Tensor = torch.ops.levjepa.ecf_stats(u.contiguous(), float(step), int(num_nodes), which)
    return out


def global_stats(stats: torch.Tensor, n_local: int) -> tuple[torch.Tensor, torch.Tensor | float]:
    """Average local statistics over ranks, weighted by batch size, in one differentiable all-reduce.

    Returns ``(global stats, global N)``; alone it returns its input and ``n_local``.
    """
    world = distributed.world_size()
    if world == 1:
        return stats, float(n_local)
    count = stats.new_full((1,), float(n_local))
    packed = distributed.all_reduce_mean(torch.cat([stats.reshape(-1) * n_local, count]))
    mean_count = packed[-1]
    return packed[:-1].reshape(stats.shape) / mean_count, mean_count * world


def epps_pulley_from_stats(
    stats: torch.Tensor, n: torch.Tensor | float, weights: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """``EP[..., m] = n · Σ_j w_j ((C_j − target_j)² + S_j²)`` from stats ``[..., 2, J, M]``."""
    cos_mean, sin_mean = stats.unbind(-3)
    err = (cos_mean - target[:, None]).square() + sin_mean.square()
    return n * torch.einsum("...jm,j->...m", err, weights)


# ------------------------------------------------------------------------------------------- public API
def sigreg(
    z: torch.Tensor,
    directions: torch.Tensor | None = None,
    *,
    num_directions: int = 1024,
    num_nodes: int = 17,
    t_max: float = 3.0,
    generator: torch.Generator | None = None,
    reduction: Literal["mean", "none"] = "mean",
    impl: Impl = "auto",
    check_finite: bool | None = None,
    all_reduce: bool = True,
) -> torch.Tensor:
    """Sliced Epps–Pulley statistic of ``z`` against ``N(0, I)`` (see the module docstring).

    ``z``: ``[N, K]`` or ``[V, N, K]`` (each view slot tested separately over its N samples).
    ``directions``: ``[K, M]`` (columns unit-normalised, then used as given) or ``None`` to draw
    ``num_directions`` from ``generator`` (``draw_directions``' seed 0 if ``None``). ``reduction="mean"``:
    scalar, mean over directions and view slots; ``"none"``: per-direction values ``[M]`` or ``[V, M]``.
    ``impl``: see the module docstring. ``check_finite``: ``None`` checks values on CPU only (free there),
    ``True`` always (synchronises on a GPU), ``False`` never. ``all_reduce=False``: this rank's samples only
    (no collective; for monitors that not every rank runs).
    """
    check_embeddings(z, "z", check_finite=check_finite)
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction={reduction!r}: valid choices are mean, none")
    if num_nodes < 2 or not (t_max > 0 and math.isfinite(t_max)):
        raise ValueError(f"need num_nodes >= 2 and a finite t_max > 0, got num_nodes={num_nodes}, t_max={t_max}")
    k = z.shape[-1]
    cdtype = torch.float64 if z.dtype == torch.float64 else torch.float32  # the statistics' dtype (module doc)
    if directions is None:
        if num_directions < 1:
            raise ValueError(f"num_directions must be >= 1, got {num_directions}")
        a = draw_directions(k, num_directions, generator=generator, device=z.device, dtype=cdtype)
    else:
        _check_directions(directions, k, check_finite)
        a = directions.to(device=z.device, dtype=cdtype)
        a = a / a.norm(dim=0, keepdim=True)
    with torch.autocast(device_type=z.device.type, enabled=False):
        zz = z.to(cdtype)
        views = zz if zz.dim() == 3 else zz.unsqueeze(0)
        u = views @ a  # [V, N, M]
        stats = ecf_stats(u, num_nodes, t_max, impl)
        n_local = views.shape[1]
        stats, n_global = global_stats(stats, n_local) if all_reduce else (stats, float(n_local))
        _, w, phi = cached_epps_pulley_nodes(num_nodes, t_max, cdtype, z.device)
        ep = epps_pulley_from_stats(stats, n_global, w, phi)  # [V, M]
    if reduction == "mean":
        return ep.mean()
    return ep if z.dim() == 3 else ep[0]


class SIGReg(nn.Module):
    """SIGReg with fresh directions every step, drawn from a generator seeded by ``(seed, step)``.

    ``forward(z, step=None)``: ``z`` ``[N, K]`` or ``[V, N, K]``; ``step`` a Python int (the training
    step; ``None`` uses an internal call counter, saved in the state dict). Directions are drawn on
    ``z``'s device, so every rank draws the same ones without communicating, and nothing synchronises.
    ``check_finite`` as for :func:`sigreg`.
    """

    def __init__(
        self,
        num_directions: int = 1024,
        num_nodes: int = 17,
        t_max: float = 3.0,
        seed: int = 0,
        reduction: Literal["mean", "none"] = "mean",
        impl: Impl = "auto",
        check_finite: bool | None = None,
    ) -> None:
        super().__init__()
        if num_directions < 1 or num_nodes < 2 or not t_max > 0:
            raise ValueError(
                f"SIGReg needs num_directions >= 1, num_nodes >= 2, t_max > 0; got {num_directions}, "
                f"{num_nodes}, {t_max}"
            )
        if reduction not in ("mean", "none") or impl not in _IMPLS:
            raise ValueError(f"reduction={reduction!r} (mean, none) or impl={impl!r} ({', '.join(_IMPLS)}) invalid")
        self.num_directions, self.num_nodes, self.t_max = num_directions, num_nodes, t_max
        self.seed, self.reduction, self.impl = seed, reduction, impl
        self.calls = 0
        self.check_finite = check_finite  # as ``sigreg``'s: None checks values on CPU tensors only

    def directions(self, dim: int, step: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The ``[dim, num_directions]`` directions used at ``step`` (float32)."""
        dev = torch.device(device) if device is not None else torch.device("cpu")
        gen = rng.make_generator("sigreg", int(self.seed), int(step), device=dev)
        return draw_directions(dim, self.num_directions, generator=gen, device=dev)

    def forward(self, z: torch.Tensor, step: int | None = None) -> torch.Tensor:
        if step is None:
            step = self.calls
        self.calls += 1
        if not isinstance(z, torch.Tensor) or z.dim() not in (2, 3):
            check_embeddings(z, "z")
        a = self.directions(z.shape[-1], int(step), z.device)
        return sigreg(
            z,
            a,
            num_nodes=self.num_nodes,
            t_max=self.t_max,
            reduction=self.reduction,
            impl=self.impl,
            check_finite=self.check_finite,
        )

    def get_extra_state(self) -> dict[str, int]:
        return {"calls": self.calls}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.calls = int(state.get("calls", 0))

    def extra_repr(self) -> str:
        return (
            f"num_directions={self.num_directions}, num_nodes={self.num_nodes}, t_max={self.t_max}, "
            f"seed={self.seed}, impl={self.impl!r}"
        )
