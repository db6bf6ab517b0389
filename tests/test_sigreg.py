"""SIGReg: the Epps–Pulley statistic's constants, null value, power, invariances, bounds and input checks."""

from __future__ import annotations

import math

import pytest
import torch

from levjepa.objective import SIGReg, draw_directions, epps_pulley_nodes, null_value, sigreg
from levjepa.rng import derive_seed, make_generator

pytestmark = pytest.mark.usefixtures("one_thread")


NULL = 1.0524642


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ep_direct(u: torch.Tensor, num_nodes: int = 17, t_max: float = 3.0) -> torch.Tensor:
    """EP of 1-D samples u [N] written out node by node, independently of the library's vectorised code."""
    n = u.shape[0]
    dt = t_max / (num_nodes - 1)
    total = torch.zeros((), dtype=torch.float64)
    for j in range(num_nodes):
        t = j * dt
        w = (dt if j in (0, num_nodes - 1) else 2 * dt) * math.exp(-t * t / 2)
        c = torch.cos(t * u.double()).mean()
        s = torch.sin(t * u.double()).mean()
        total = total + w * ((c - math.exp(-t * t / 2)) ** 2 + s**2)
    return n * total


# ------------------------------------------------------------------------------------------- constants
def test_nodes_and_weights_are_the_symmetric_trapezoid_times_the_gaussian_window():
    t, w, phi = epps_pulley_nodes(17, 3.0)
    assert t.shape == w.shape == phi.shape == (17,)
    torch.testing.assert_close(t, torch.linspace(0, 3, 17, dtype=torch.float64))
    dt = 3.0 / 16
    assert w[0].item() == pytest.approx(dt)  # half weight at t=0: the symmetric half shares that node
    assert w[-1].item() == pytest.approx(dt * math.exp(-4.5))
    for j in range(1, 16):
        assert w[j].item() == pytest.approx(2 * dt * math.exp(-((j * dt) ** 2) / 2), rel=1e-14)
    torch.testing.assert_close(phi, torch.exp(-(t**2) / 2))
    # the doubled trapezoid integrates the window e^{-t^2/2} over [-3, 3]: sqrt(2 pi) erf(3 / sqrt 2)
    assert w.sum().item() == pytest.approx(math.sqrt(2 * math.pi) * math.erf(3 / math.sqrt(2)), rel=1e-4)


def test_null_value_analytic():
    # E|phi_hat - phi|^2 = (1 - e^{-t^2}) / N for iid N(0,1): E[EP] = sum_j w_j (1 - e^{-t_j^2}), any N
    assert null_value() == pytest.approx(NULL, abs=1e-7)
    t, w, _ = epps_pulley_nodes(17, 3.0)
    assert null_value() == pytest.approx(float((w * (1 - torch.exp(-(t**2)))).sum()), rel=1e-15)


@pytest.mark.parametrize("n", [64, 2048])
def test_gaussian_samples_give_the_null_value_at_any_n(n):
    z = torch.randn(12, n, 32, generator=_gen(1))  # 12 independent view slots
    per_view = sigreg(z, num_directions=128, reduction="none", generator=_gen(2)).mean(-1)
    se = per_view.std().item() / math.sqrt(12)
    assert se < 0.06
    assert per_view.mean().item() == pytest.approx(NULL, abs=max(3 * se, 0.05))


def test_non_gaussian_inputs_score_far_above_the_null():
    n, k = 2048, 16
    z = torch.randn(n, k, generator=_gen(3), dtype=torch.float64)
    eye = torch.eye(k, dtype=torch.float64)
    unif = (torch.rand(n, k, generator=_gen(4), dtype=torch.float64) - 0.5) * math.sqrt(12)  # mean 0, var 1
    cases = {
        "shifted": (z + 0.5, None),
        "scaled": (z * 1.5, None),
        "uniform (same mean and variance)": (unif, eye),  # coordinate directions: the projections are uniform
        "anisotropic": (z * torch.linspace(0.3, 1.7, k, dtype=torch.float64), None),
        "collapsed to a line": (z[:, :1].expand(-1, k).contiguous(), None),
        "collapsed to a point": (torch.zeros(n, k, dtype=torch.float64) + 0.01 * z, None),
    }
    base = sigreg(z, num_directions=128, generator=_gen(5)).item()
    assert base < 2.0  # one batch and correlated directions (K=16): near the null, not on it
    for name, (x, a) in cases.items():
        value = sigreg(x, a, num_directions=128, generator=_gen(5)).item()
        assert value > 10 * NULL, f"{name}: {value}"


# --------------------------------------------------------------------------------------- invariances
def test_permuting_samples_leaves_every_value_unchanged():
    z = torch.randn(3, 50, 8, generator=_gen(6), dtype=torch.float64) * 1.7 + 0.3
    a = draw_directions(8, 32, seed=7, dtype=torch.float64)
    perm = torch.randperm(50, generator=_gen(8))
    torch.testing.assert_close(
        sigreg(z, a, reduction="none"), sigreg(z[:, perm], a, reduction="none"), rtol=1e-12, atol=1e-12
    )


def test_explicit_directions_reproduce_per_direction_values():
    z = torch.randn(40, 6, generator=_gen(9), dtype=torch.float64) * 1.3
    a = torch.randn(6, 5, generator=_gen(10), dtype=torch.float64)
    per_direction = sigreg(z, a, reduction="none")
    assert per_direction.shape == (5,)
    for m in range(5):
        u = z @ (a[:, m] / a[:, m].norm())
        torch.testing.assert_close(per_direction[m], _ep_direct(u), rtol=1e-12, atol=1e-12)
        # a single column, rescaled: columns are unit-normalised before use
        torch.testing.assert_close(sigreg(z, 3.5 * a[:, m : m + 1]), per_direction[m], rtol=1e-12, atol=1e-12)
    assert sigreg(z, a).item() == pytest.approx(per_direction.mean().item(), rel=1e-14)


def test_views_are_tested_separately_and_averaged():
    z = torch.randn(3, 30, 5, generator=_gen(11), dtype=torch.float64)
    z[1] = z[1] * 2.0
    a = draw_directions(5, 16, seed=1, dtype=torch.float64)
    per_view = sigreg(z, a, reduction="none")
    assert per_view.shape == (3, 16)
    for v in range(3):
        torch.testing.assert_close(per_view[v], sigreg(z[v], a, reduction="none"), rtol=1e-12, atol=1e-12)
    assert sigreg(z, a).item() == pytest.approx(per_view.mean().item(), rel=1e-14)


def test_generator_none_is_seed_zero_and_generators_are_honoured():
    z = torch.randn(20, 4, generator=_gen(12))
    seed_zero = make_generator("directions", 0)  # levjepa.rng's stream for directions drawn without a generator
    assert sigreg(z, num_directions=8).item() == sigreg(z, num_directions=8, generator=seed_zero).item()
    assert sigreg(z, num_directions=8, generator=_gen(1)).item() != sigreg(z, num_directions=8).item()


# ------------------------------------------------------------------------------------------ the module
def test_module_draws_fresh_seeded_directions_per_step():
    z = torch.randn(2, 64, 16, generator=_gen(13))
    reg = SIGReg(num_directions=64, seed=3)
    a5 = reg.directions(16, 5)
    torch.testing.assert_close(a5, SIGReg(num_directions=64, seed=3).directions(16, 5))  # any rank, any run
    assert not torch.allclose(a5, reg.directions(16, 6))
    assert not torch.allclose(a5, SIGReg(num_directions=64, seed=4).directions(16, 5))
    torch.testing.assert_close(a5.norm(dim=0), torch.ones(64))
    assert reg(z, step=5).item() == pytest.approx(sigreg(z, a5).item(), rel=1e-6)
    # without a step, an internal counter (saved in the state dict) plays that role
    reg2 = SIGReg(num_directions=64, seed=3)
    reg2(z)
    state = reg2.state_dict()
    reg3 = SIGReg(num_directions=64, seed=3)
    reg3.load_state_dict(state)
    assert reg3(z).item() == pytest.approx(sigreg(z, reg.directions(16, 1)).item(), rel=1e-6)


def test_derived_seeds_differ_for_nearby_pairs():
    seeds = {derive_seed("sigreg", s, t) for s in range(4) for t in range(50)}
    assert len(seeds) == 200
    assert derive_seed("sigreg", 0, 1) != derive_seed("kmeans", 0, 1)


def test_forward_reads_no_tensor_value_on_the_host(monkeypatch):
    # A host read (.item(), .tolist(), bool(t), ...) is a device sync on a GPU; on CPU we can forbid them.
    z = torch.randn(2, 32, 8, requires_grad=True)
    reg = SIGReg(num_directions=16, seed=1, check_finite=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("host read of a tensor value inside the forward pass")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    loss = reg(z, step=7) + sigreg(z, num_directions=8, check_finite=False, impl="reference")
    loss.backward()
    monkeypatch.undo()
    assert torch.isfinite(z.grad).all()


# -------------------------------------------------------------------------------------------- numerics
def test_bf16_autocast_keeps_float32_statistics():
    z = torch.randn(2, 256, 32, generator=_gen(14)) * 1.2
    a = draw_directions(32, 64, seed=2)
    exact = sigreg(z, a, reduction="none")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = sigreg(z, a, reduction="none")
        from_bf16_input = sigreg(z.bfloat16(), a, reduction="none")
    assert under_autocast.dtype == torch.float32 and from_bf16_input.dtype == torch.float32
    torch.testing.assert_close(under_autocast, exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(from_bf16_input, sigreg(z.bfloat16().float(), a, reduction="none"))
    # what a bf16 projection would have given instead: visibly different, so the check above has teeth
    u_bf16 = (z.bfloat16() @ a.bfloat16()).float()
    t, w, phi = epps_pulley_nodes(dtype=torch.float32)
    x = u_bf16.unsqueeze(-1) * t
    err = (torch.cos(x).mean(1) - phi).square() + torch.sin(x).mean(1).square()
    bf16_values = 256 * (err * w).sum(-1)
    assert (bf16_values - exact).abs().max() > 1e-2


def test_float64_input_is_computed_in_float64():
    z = torch.randn(100, 8, generator=_gen(15), dtype=torch.float64)
    a = draw_directions(8, 4, seed=0, dtype=torch.float64)
    out = sigreg(z, a, reduction="none")
    assert out.dtype == torch.float64
    for m in range(4):
        assert out[m].item() == pytest.approx(_ep_direct(z @ (a[:, m] / a[:, m].norm())).item(), rel=1e-13)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_one_huge_outlier_keeps_loss_and_projection_gradients_bounded(impl):
    # coordinate directions: the projections are the coordinates themselves, so dEP/du = dEP/dz
    k = 4
    z = torch.randn(256, k, generator=_gen(16), dtype=torch.float64)
    z[0] *= 1e6
    z.requires_grad_(True)
    per_direction = sigreg(z, torch.eye(k, dtype=torch.float64), reduction="none", impl=impl)
    per_direction.sum().backward()
    t, w, _ = epps_pulley_nodes()
    bound = 4 * float((w * t).sum())  # |dEP/du_i| <= sum_j w_j t_j |2 (phi_hat - phi)| <= 4 sum_j w_j t_j
    assert torch.isfinite(per_direction).all() and per_direction.max().item() < 4 * 256 * float(w.sum())
    assert torch.isfinite(z.grad).all()
    assert z.grad.abs().max().item() <= bound
    assert z.grad[0].abs().max().item() <= bound
    # a moment penalty has no such bound: its gradient grows with the outlier
    zz = z.detach().clone().requires_grad_(True)
    zz.square().mean(0).sum().backward()
    assert zz.grad[0].abs().max().item() > 1e3 * bound


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("z", "directions", "match"),
    [
        (torch.randn(8), None, r"z must have shape \[N, K\] or \[V, N, K\], got shape \(8,\)"),
        (torch.randn(2, 2, 3, 4), None, r"got shape \(2, 2, 3, 4\)"),
        (torch.randn(1, 4), None, r"N=1 samples .* needs N >= 2"),
        (torch.randint(0, 3, (5, 4)), None, r"floating-point"),
        (torch.randn(5, 4), torch.randn(3, 7), r"directions has shape \(3, 7\) but z has K=4 .* expected \[4, M\]"),
        (torch.randn(5, 4), torch.randn(4), r"directions must be a \[K, M\] tensor, got \(4,\)"),
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), None, r"z \(shape \(2, 2\)\) contains 1 non-finite"),
        (torch.randn(5, 4), torch.zeros(4, 2), r"non-zero columns"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(z, directions, match):
    with pytest.raises(ValueError, match=match):
        sigreg(z, directions)


def test_bad_options_raise():
    z = torch.randn(5, 4)
    with pytest.raises(ValueError, match="reduction"):
        sigreg(z, reduction="sum")
    with pytest.raises(ValueError, match="impl"):
        sigreg(z, impl="cuda")
    with pytest.raises(ValueError, match="num_nodes"):
        sigreg(z, num_nodes=1)
    with pytest.raises(ValueError, match="num_directions"):
        sigreg(z, num_directions=0)
    with pytest.raises(ValueError, match=r"impl='triton' needs a CUDA tensor"):
        sigreg(z, impl="triton")  # a CPU tensor outside the interpreter
