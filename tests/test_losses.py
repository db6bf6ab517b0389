"""LeVJEPA and LeJEPA losses, the objective config and the per-step objective modules."""

from __future__ import annotations

import pytest
import torch

from levjepa.config import ConfigError, apply_overrides, from_dict, to_dict
from levjepa.objective import (
    ObjectiveConfig,
    ObjectiveOutput,
    build_objective,
    draw_directions,
    lejepa_loss,
    levjepa_loss,
    localejepa_loss,
    sigreg,
)
from levjepa.rng import make_generator

pytestmark = pytest.mark.usefixtures("one_thread")


def _z(v=5, b=24, k=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(v, b, k, generator=g, dtype=dtype)


def test_levjepa_invariance_is_the_papers_sum_with_the_pinned_mean_scale():
    z = _z()
    a = draw_directions(8, 32, seed=1, dtype=torch.float64)
    out = levjepa_loss(z, directions=a)
    v1, _, k = z.shape
    # 1/(V+1) sum_v ||z_0 - z_v||^2 per clip, averaged over clips, divided by K (the .pow(2).mean() scale)
    per_clip = sum(((z[0] - z[v]) ** 2).sum(-1) for v in range(v1)) / v1
    assert out.terms["invariance"].item() == pytest.approx(per_clip.mean().item() / k, rel=1e-12)
    per_view = torch.stack([sigreg(z[v], a) for v in range(v1)])
    assert out.terms["sigreg"].item() == pytest.approx(per_view.mean().item(), rel=1e-12)
    for v in range(v1):
        assert out.terms[f"sigreg/view{v}"].item() == pytest.approx(per_view[v].item(), rel=1e-12)
    expected = per_clip.mean() / k + 0.02 * per_view.mean()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert all(t.dim() == 0 and not t.requires_grad for t in out.terms.values())


def test_levjepa_gradients_reach_every_view_including_the_global_one():
    z = _z().requires_grad_(True)
    levjepa_loss(z, directions=draw_directions(8, 16, seed=0, dtype=torch.float64)).loss.backward()
    assert (z.grad.abs().sum(dim=(1, 2)) > 0).all()
    # invariance alone pulls z_0 toward the mean of the others: its gradient is -2/(V+1)/(B K) sum_v (z_v - z_0)
    z2 = _z().requires_grad_(True)
    levjepa_loss(z2, lam=0.0, directions=draw_directions(8, 4, seed=0, dtype=torch.float64)).loss.backward()
    v1, b, k = z2.shape
    expected = -2.0 / (v1 * b * k) * (z2.detach()[1:] - z2.detach()[0]).sum(0)
    torch.testing.assert_close(z2.grad[0], expected)


def test_lejepa_prediction_targets_the_mean_of_the_global_views():
    z = _z(v=6)
    a = draw_directions(8, 16, seed=2, dtype=torch.float64)
    out = lejepa_loss(z, num_global_views=2, directions=a)
    mu = (z[0] + z[1]) / 2
    pred = torch.stack([((mu - z[v]) ** 2).mean() for v in range(6)]).mean()
    reg = torch.stack([sigreg(z[v], a) for v in range(6)]).mean()
    assert out.terms["pred"].item() == pytest.approx(pred.item(), rel=1e-12)
    assert out.loss.item() == pytest.approx((0.95 * pred + 0.05 * reg).item(), rel=1e-12)
    # with every view global the target is the all-view mean (the pinned minimal example)
    all_global = lejepa_loss(z, num_global_views=6, directions=a)
    assert all_global.terms["pred"].item() == pytest.approx(z.var(0, unbiased=False).mean().item(), rel=1e-12)


def test_losses_run_in_float32_under_bf16_input():
    z = _z(dtype=torch.float32)
    a = draw_directions(8, 16, seed=3)
    out = levjepa_loss(z.bfloat16(), directions=a)
    assert out.loss.dtype == torch.float32
    ref = levjepa_loss(z.bfloat16().float(), directions=a)
    assert out.loss.item() == pytest.approx(ref.loss.item(), rel=1e-6)


@pytest.mark.parametrize(
    ("z", "kwargs", "match"),
    [
        (torch.randn(4, 8), {}, r"\[V, B, K\].*got \(4, 8\)"),
        (torch.randn(2, 1, 8), {}, r"N=1 samples"),
        (torch.randn(3, 4, 8), {"num_global_views": 4}, r"num_global_views=4 but z has 3 view slots"),
    ],
)
def test_bad_loss_input_raises(z, kwargs, match):
    with pytest.raises(ValueError, match=match):
        lejepa_loss(z, **kwargs)


# ----------------------------------------------------------------------------------------------- config
def test_config_defaults_round_trip_and_overrides():
    cfg = ObjectiveConfig()
    assert (cfg.name, cfg.lam_value, cfg.num_directions, cfg.num_nodes, cfg.t_max) == ("levjepa", 0.02, 1024, 17, 3.0)
    assert ObjectiveConfig(name="lejepa").lam_value == 0.05
    assert ObjectiveConfig(name="localejepa").lam_value == 0.1
    assert ObjectiveConfig(name="lejepa", lam=0.2).lam_value == 0.2
    assert from_dict(ObjectiveConfig, to_dict(cfg)) == cfg
    changed = apply_overrides(cfg, ["name=lejepa", "lam=0.1", "num_global_views=2", "impl=chunked"])
    assert (changed.name, changed.lam, changed.num_global_views, changed.impl) == ("lejepa", 0.1, 2, "chunked")
    assert apply_overrides(changed, ["lam=none"]).lam is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "vicreg"}, "objective.name='vicreg': valid choices are levjepa, lejepa, localejepa"),
        ({"name": "lejepa", "lam": 1.5}, r"objective.lam=1.5: .* \[0, 1\]"),
        ({"lam": -0.1}, "objective.lam=-0.1"),
        ({"num_directions": 0}, "objective.num_directions=0"),
        ({"num_nodes": 1}, "objective.num_nodes=1"),
        ({"t_max": 0.0}, "objective.t_max=0.0"),
        ({"impl": "cuda"}, "objective.impl='cuda'"),
        ({"min_cluster_size": 1}, "objective.min_cluster_size=1"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ObjectiveConfig(**kwargs)


# ---------------------------------------------------------------------------------------------- modules
@pytest.mark.parametrize("name", ["levjepa", "lejepa", "localejepa"])
def test_objective_module_uses_the_directions_of_its_step(name):
    globals_ = 1 if name == "levjepa" else 2  # LeVJEPA has one global view (refused otherwise, below)
    cfg = ObjectiveConfig(name=name, num_directions=32, local_directions=16, seed=5, num_global_views=globals_)
    objective = build_objective(cfg)
    z = _z(v=4, b=32)
    out = objective(z, 11)
    assert isinstance(out, ObjectiveOutput) and out.loss.dim() == 0
    again = build_objective(cfg)(z, 11)
    assert out.loss.item() == again.loss.item()  # a pure function of (z, seed, step): same on every rank
    assert objective(z, 12).loss.item() != out.loss.item()  # fresh directions every step
    a = objective.directions(8, 11, z.device, 32 if name != "localejepa" else 16).double()
    if name == "levjepa":
        expected = levjepa_loss(z, 0.02, directions=a)
    elif name == "lejepa":
        expected = lejepa_loss(z, 0.05, num_global_views=2, directions=a)
    else:
        gen = make_generator("kmeans", 5, 11)
        from levjepa.objective import cosine_kmeans

        labels = cosine_kmeans(z.mean(0), 4, 10, generator=gen)
        expected = localejepa_loss(z, 0.1, directions=a, labels=labels)
    assert out.loss.item() == pytest.approx(expected.loss.item(), rel=1e-6)
    assert set(out.terms) == set(expected.terms)


def test_objective_module_rejects_a_tensor_step_and_bad_shapes():
    objective = build_objective(ObjectiveConfig(num_directions=8))
    with pytest.raises(ValueError, match="step must be a Python int"):
        objective(_z(), torch.tensor(3))
    with pytest.raises(ValueError, match=r"\[V, B, K\]"):
        objective(torch.randn(24, 8), 0)
    with pytest.raises(ValueError, match="ObjectiveConfig"):
        build_objective({"name": "levjepa"})


def test_objective_forward_reads_no_tensor_value_on_the_host(monkeypatch):
    z = _z(v=3, b=16, dtype=torch.float32).requires_grad_(True)
    modules = [
        build_objective(ObjectiveConfig(name=n, num_directions=16, local_directions=16), check_finite=False)
        for n in ("levjepa", "lejepa", "localejepa")
    ]

    def forbidden(*args, **kwargs):
        raise AssertionError("host read of a tensor value inside the objective's forward pass")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    losses = [m(z, 3).loss for m in modules]
    sum(losses).backward()
    monkeypatch.undo()
    assert torch.isfinite(z.grad).all()


def test_the_levjepa_objective_refuses_a_second_global_view():
    """LeVJEPA's invariance compares every view with the one global view z_0: a second global view would be
    treated as a local one, silently. It is refused in one line that names LeJEPA, which averages them."""
    with pytest.raises(ConfigError, match="compares every view with its one global view"):
        ObjectiveConfig(name="levjepa", num_global_views=2)
    assert ObjectiveConfig(name="lejepa", num_global_views=2).num_global_views == 2
    assert ObjectiveConfig(name="localejepa", num_global_views=2).num_global_views == 2


@pytest.mark.parametrize("name", ["levjepa", "lejepa", "localejepa"])
def test_check_finite_is_fixed_at_construction(name):
    """By default a CPU objective refuses non-finite projections in one line; built with ``check_finite=False``
    (what the trainer does) it computes a non-finite loss instead, which skips the step."""
    cfg = ObjectiveConfig(name=name, num_directions=16, local_directions=16)
    z = _z(v=3, b=16, dtype=torch.float32)
    z[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        build_objective(cfg)(z, 0)
    quiet = build_objective(cfg, check_finite=False)
    assert quiet.check_finite is False and build_objective(cfg).check_finite is None
    assert not torch.isfinite(quiet(z, 0).loss)
