"""Label-free embedding monitors: spread, effective rank, dead dimensions, per-view SIGReg."""

from __future__ import annotations

import math

import pytest
import torch

from levjepa.objective import draw_directions, effective_rank, embedding_diagnostics, sigreg

pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_isotropic_gaussian_embeddings_look_healthy():
    z = torch.randn(4096, 32, generator=_gen(0))
    d = embedding_diagnostics(z)
    assert d["std/mean"].item() == pytest.approx(1.0, abs=0.02)
    assert d["std/min"].item() > 0.95
    assert 30.0 < d["effective_rank"].item() <= 32.0
    assert d["dead_fraction"].item() == 0.0
    assert d["sigreg"].item() == pytest.approx(1.0524642, abs=0.5)
    assert all(v.dim() == 0 and v.dtype == torch.float32 and not v.requires_grad for v in d.values())


def test_effective_rank_counts_the_dimensions_actually_used():
    g = _gen(1)
    basis = torch.linalg.qr(torch.randn(64, 64, generator=g, dtype=torch.float64))[0]
    for r in (1, 5, 20):
        z = torch.randn(2000, r, generator=g, dtype=torch.float64) @ basis[:, :r].T  # rank r, even spread
        assert effective_rank(z).item() == pytest.approx(r, rel=0.1)
    # exp(entropy) of the eigenvalue distribution: two equal eigenvalues and a tiny one -> ~2
    z = torch.randn(5000, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 1.0, 1e-4], dtype=torch.float64)
    assert effective_rank(z).item() == pytest.approx(2.0, rel=0.02)
    eig = torch.tensor([4.0, 1.0], dtype=torch.float64)
    p = eig / eig.sum()
    z = torch.randn(20000, 2, generator=g, dtype=torch.float64) * eig.sqrt()
    assert effective_rank(z).item() == pytest.approx(math.exp(-(p * p.log()).sum().item()), rel=0.02)


def test_dead_and_shrunken_dimensions_are_reported():
    z = torch.randn(512, 10, generator=_gen(2))
    z[:, :3] *= 1e-4  # three dead coordinates
    z[:, 3] *= 0.5
    d = embedding_diagnostics(z, num_directions=0)
    assert d["dead_fraction"].item() == pytest.approx(0.3)
    assert d["std/min"].item() < 1e-3
    assert "sigreg" not in d
    assert d["effective_rank"].item() < 7.5


def test_per_view_values_for_view_stacks():
    g = _gen(3)
    z = torch.randn(3, 256, 16, generator=g)
    z[2] = z[2] * 3 + 1  # a badly scaled third view
    d = embedding_diagnostics(z, num_directions=64, seed=5)
    a = draw_directions(16, 64, seed=5)
    for v in range(3):
        assert d[f"sigreg/view{v}"].item() == pytest.approx(sigreg(z[v], a).item(), rel=1e-5)
    assert d["sigreg/view2"] > 10 * d["sigreg/view0"]
    stds = z.std(dim=1)
    assert d["std/mean"].item() == pytest.approx(stds.mean().item(), rel=1e-5)
    assert d["std/min"].item() == pytest.approx(stds.min().item(), rel=1e-5)


def test_bad_input_raises():
    with pytest.raises(ValueError, match=r"got shape \(5,\)"):
        embedding_diagnostics(torch.randn(5))
    with pytest.raises(ValueError, match="N=1"):
        embedding_diagnostics(torch.randn(1, 5))
