"""LocaLeJEPA's local uniform-ball regularizer: target char. function, power, invariances, fallback."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import special

from levjepa.objective import (
    cosine_kmeans,
    draw_directions,
    epps_pulley_nodes,
    local_ball_reg,
    localejepa_loss,
    uniform_ball_cf,
)
from levjepa.objective.sigreg import epps_pulley_from_stats, reference_ecf_stats

pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ball(n: int, d: int, seed: int) -> torch.Tensor:
    """Uniform samples in the ball of radius sqrt(d+2) (unit covariance)."""
    g = _gen(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    radius = math.sqrt(d + 2) * torch.rand(n, 1, generator=g, dtype=torch.float64) ** (1.0 / d)
    return x / x.norm(dim=1, keepdim=True) * radius


def _bessel_cf(t: float, d: int) -> float:
    """Closed form: Gamma(d/2+1) (2/(tR))^{d/2} J_{d/2}(tR), in log space for large d."""
    r = math.sqrt(d + 2)
    x = t * r
    log_scale = special.gammaln(d / 2 + 1) + (d / 2) * math.log(2 / x)
    return float(math.exp(log_scale) * special.jv(d / 2, x))


@pytest.mark.parametrize("d", [1, 2, 3, 8, 64, 256])
def test_uniform_ball_cf_matches_the_bessel_closed_form(d):
    t, _, _ = epps_pulley_nodes(17, 3.0)
    phi = uniform_ball_cf(t, d)
    assert phi[0].item() == pytest.approx(1.0, abs=1e-15)
    for j in range(1, 17):
        assert phi[j].item() == pytest.approx(_bessel_cf(t[j].item(), d), abs=1e-12)
    # unit covariance: phi(t) = 1 - t^2/2 + O(t^4) like the Gaussian, but it is not the Gaussian
    small = torch.tensor([1e-3], dtype=torch.float64)
    assert uniform_ball_cf(small, d).item() == pytest.approx(1 - 0.5e-6, abs=1e-11)
    assert (phi - torch.exp(-(t**2) / 2)).abs().max() > 1e-4


def _score(x: torch.Tensor, target: torch.Tensor, a: torch.Tensor) -> float:
    """Mean over directions of N sum_j w_j |phi_hat(t_j) - target_j|^2 (no re-centring)."""
    _, w, _ = epps_pulley_nodes(17, 3.0)
    t = torch.arange(17, dtype=torch.float64) * (3.0 / 16)
    stats = reference_ecf_stats((x @ a).unsqueeze(0), t)
    return epps_pulley_from_stats(stats, x.shape[0], w, target).mean().item()


def test_ball_samples_are_null_under_the_ball_target_and_gaussian_ones_under_the_gaussian_target():
    d, n = 3, 4096
    t, w, gauss = epps_pulley_nodes(17, 3.0)
    ball_cf = uniform_ball_cf(t, d)
    a = draw_directions(d, 128, seed=0, dtype=torch.float64)
    ball = _ball(n, d, seed=1)
    gaussian = torch.randn(n, d, generator=_gen(2), dtype=torch.float64)
    null_ball = float((w * (1 - ball_cf**2)).sum())  # E[EP] for iid samples of the target itself
    null_gauss = float((w * (1 - gauss**2)).sum())
    assert _score(ball, ball_cf, a) == pytest.approx(null_ball, rel=0.35)
    assert _score(gaussian, gauss, a) == pytest.approx(null_gauss, rel=0.35)
    assert _score(ball, gauss, a) > 10 * null_gauss
    assert _score(gaussian, ball_cf, a) > 10 * null_ball


def test_the_regularizer_uses_the_ball_target():
    # one cluster holding the whole batch: ball samples score low, Gaussian ones high
    d, n = 3, 2048
    a = draw_directions(d, 64, seed=3, dtype=torch.float64)
    labels = torch.zeros(n, dtype=torch.long)
    ball = _ball(n, d, seed=4).unsqueeze(0)
    gaussian = torch.randn(1, n, d, generator=_gen(5), dtype=torch.float64)
    reg_ball, _ = local_ball_reg(ball, labels, a, num_clusters=1)
    reg_gauss, _ = local_ball_reg(gaussian, labels, a, num_clusters=1)
    assert reg_gauss.item() > 10 * reg_ball.item()


def _clustered(v=2, per=12, k=6, seed=6):
    g = _gen(seed)
    centres = torch.randn(4, k, generator=g, dtype=torch.float64) * 5
    labels = torch.arange(4).repeat_interleave(per)
    z = centres[labels] + torch.randn(v, 4 * per, k, generator=g, dtype=torch.float64)
    return z, labels


def test_translating_one_cluster_leaves_its_statistic_and_the_loss_unchanged():
    z, labels = _clustered()
    a = draw_directions(6, 32, seed=7, dtype=torch.float64)
    reg, info = local_ball_reg(z, labels, a, num_clusters=4)
    moved = z.clone()
    shift = torch.randn(2, 1, 6, generator=_gen(8), dtype=torch.float64) * 10  # a different shift per view
    moved[:, labels == 1] += shift
    reg2, info2 = local_ball_reg(moved, labels, a, num_clusters=4)
    torch.testing.assert_close(info2["cluster_stats"], info["cluster_stats"], rtol=1e-10, atol=1e-10)
    assert reg2.item() == pytest.approx(reg.item(), rel=1e-10)
    # control: stretching that cluster does change its statistic (and only that one)
    stretched = z.clone()
    stretched[:, labels == 1] *= 3.0
    _, info3 = local_ball_reg(stretched, labels, a, num_clusters=4)
    assert info3["cluster_stats"][1].item() > 2 * info["cluster_stats"][1].item()
    torch.testing.assert_close(info3["cluster_stats"][[0, 2, 3]], info["cluster_stats"][[0, 2, 3]])


def test_cluster_statistics_are_size_weighted_then_averaged_equally():
    z, labels = _clustered(per=10)
    labels = labels.clone()
    labels[:6] = 1  # sizes 4, 16, 10, 10
    a = draw_directions(6, 16, seed=9, dtype=torch.float64)
    a = a / a.norm(dim=0)  # unit columns in float64, as the regularizer uses them
    reg, info = local_ball_reg(z, labels, a, num_clusters=4)
    t, w, _ = epps_pulley_nodes(17, 3.0)
    target = uniform_ball_cf(t, 6)
    d = torch.zeros(2, 4, dtype=torch.float64)
    for q in range(4):
        members = z[:, labels == q]
        resid = members - members.mean(1, keepdim=True)
        stats = reference_ecf_stats(resid @ a, t)
        d[:, q] = members.shape[1] * epps_pulley_from_stats(stats, 1.0, w, target).mean(-1)
    torch.testing.assert_close(info["cluster_stats"], d.mean(0))
    assert reg.item() == pytest.approx(d.mean().item(), rel=1e-12)  # 1/(|Q| V) sum_q sum_v D_qv
    assert info["clusters_used"].item() == 4 and info["kmeans_fallback"].item() == 0


def test_small_clusters_are_dropped_and_no_cluster_left_falls_back_to_the_batch():
    z, labels = _clustered(per=5)
    a = draw_directions(6, 16, seed=10, dtype=torch.float64)
    labels = labels.clone()
    labels[:3] = 1  # sizes 2, 8, 5, 5: cluster 0 is dropped
    _, info = local_ball_reg(z, labels, a, num_clusters=4)
    assert info["clusters_used"].item() == 3 and info["kmeans_fallback"].item() == 0
    assert info["cluster_stats"][0].item() == 0.0
    tiny = torch.arange(20) % 10  # ten clusters of two: none has 4 members
    reg, info = local_ball_reg(z, tiny, a, num_clusters=10)
    whole, _ = local_ball_reg(z, torch.zeros(20, dtype=torch.long), a, num_clusters=1)
    assert info["kmeans_fallback"].item() == 1 and info["clusters_used"].item() == 1
    assert reg.item() == pytest.approx(whole.item(), rel=1e-12)


def test_fewer_samples_than_clusters_is_a_reported_fallback_not_a_crash():
    z = torch.randn(2, 3, 5, generator=_gen(11), dtype=torch.float64, requires_grad=True)
    out = localejepa_loss(z, num_clusters=4, num_directions=8, generator=_gen(12))
    out.loss.backward()
    assert out.terms["kmeans_fallback"].item() == 1.0 and out.terms["clusters_used"].item() == 1.0
    assert torch.isfinite(z.grad).all()


def test_kmeans_finds_separated_clusters_and_its_assignment_gets_no_gradient():
    z, truth = _clustered(per=16)
    labels = cosine_kmeans(z.mean(0), 4, 10, generator=_gen(13))
    assert labels.dtype == torch.int64 and not labels.requires_grad
    # the same partition up to a renaming of the clusters
    pairs = {(int(a), int(b)) for a, b in zip(labels, truth, strict=True)}
    assert len(pairs) == 4 and len({p[0] for p in pairs}) == 4
    # the loss's gradient is the gradient with the assignment held fixed: nothing flows into k-means
    zz = z.clone().requires_grad_(True)
    localejepa_loss(zz, num_directions=16, generator=_gen(14)).loss.backward()
    gen = _gen(14)
    a = draw_directions(6, 16, generator=gen, dtype=torch.float64)
    fixed = cosine_kmeans(z.mean(0), 4, 10, generator=gen)
    z2 = z.clone().requires_grad_(True)
    localejepa_loss(z2, directions=a, labels=fixed).loss.backward()
    torch.testing.assert_close(zz.grad, z2.grad, rtol=1e-12, atol=1e-14)


def test_localejepa_loss_combines_prediction_and_regularizer_with_lambda():
    z, labels = _clustered()
    a = draw_directions(6, 16, seed=15, dtype=torch.float64)
    out = localejepa_loss(z, directions=a, labels=labels)
    reg, _ = local_ball_reg(z, labels, a, num_clusters=4)
    pred = (z - z.mean(0)).square().mean()
    assert out.terms["pred"].item() == pytest.approx(pred.item(), rel=1e-12)
    assert out.terms["localreg"].item() == pytest.approx(reg.item(), rel=1e-12)
    assert out.loss.item() == pytest.approx((0.9 * pred + 0.1 * reg).item(), rel=1e-12)
    # re-centring lets gradients flow through the cluster means: a shared shift of every member of a
    # cluster has zero regularizer gradient
    zz = z.clone().requires_grad_(True)
    reg_only, _ = local_ball_reg(zz, labels, a, num_clusters=4)
    reg_only.backward()
    for q in range(4):
        torch.testing.assert_close(zz.grad[:, labels == q].sum(1), torch.zeros(2, 6, dtype=torch.float64))


def test_bad_labels_raise():
    z = torch.randn(2, 8, 4)
    with pytest.raises(ValueError, match=r"labels must have shape \[8\]"):
        local_ball_reg(z, torch.zeros(7, dtype=torch.long), torch.randn(4, 3), num_clusters=2)
    with pytest.raises(ValueError, match=r"directions must be \[4, M\]"):
        local_ball_reg(z, torch.zeros(8, dtype=torch.long), torch.randn(5, 3), num_clusters=2)


def test_epps_pulley_nodes_are_the_trapezoid_rule_under_the_gaussian_window():
    t, w, phi = epps_pulley_nodes(17, 3.0)
    step = 3.0 / 16
    trapezoid = torch.full((17,), 2 * step, dtype=torch.float64)
    trapezoid[0] = trapezoid[-1] = step
    assert torch.equal(t, torch.arange(17, dtype=torch.float64) * step)
    assert torch.equal(phi, torch.exp(-0.5 * t.square()))
    assert torch.allclose(w, trapezoid * phi, rtol=0, atol=1e-15)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["levjepa", "lejepa", "localejepa"])
def test_objectives_run_without_a_host_device_synchronisation(name):
    """Forward and backward of each objective on CUDA under ``set_sync_debug_mode("error")`` (the first call,
    with its autotuning and caches, runs outside it): a synchronisation stalls the training step's pipeline."""
    from levjepa.objective import ObjectiveConfig, build_objective

    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    objective = build_objective(ObjectiveConfig(name=name, num_global_views=1))
    z = torch.randn(5, 256, 256, device="cuda", requires_grad=True)
    objective(z, 0).loss.backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        objective(z, 1).loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
