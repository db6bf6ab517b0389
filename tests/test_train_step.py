"""train_step: it learns, local accumulation averages micro-batch gradients, non-finite steps are skipped untouched.

The global (GradCache) accumulation is checked in ``test_accumulation.py``.
"""

from __future__ import annotations

import copy
from dataclasses import fields, replace
from typing import Literal, get_args, get_origin, get_type_hints

import pytest
import torch

from levjepa.data import PretrainLoader
from levjepa.model import EncoderConfig
from levjepa.objective import build_objective
from levjepa.rng import make_generator, sample_keys
from levjepa.train.loop import build_models
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, clip_gradients, compile_regions, compile_step, train_step
from train_utils import tiny_config


def _setup(*overrides: str):
    cfg = tiny_config(*overrides)
    model = Pretrainer(*build_models(cfg, seed=0))
    objective = build_objective(cfg.objective, check_finite=False)  # as in the loop: non-finite input skips the step
    return cfg, model, objective, build_optimizer(model, cfg.optim)


def _batches(cfg, n: int):
    it = iter(PretrainLoader(cfg.data, seed=0))
    return [next(it).augment_to_device("cpu") for _ in range(n)]


def test_one_step_lowers_the_loss_by_what_the_gradient_predicts():
    # AdamW's first step moves each weight by -lr * g / (|g| + eps); to first order the loss on the same
    # batch (same dropping, same SIGReg directions) then falls by lr * sum g^2 / (|g| + eps). In float64
    # at a tiny lr the second-order rest is ~1e-4 of that: a property of any correct gradient and step.
    cfg, model, objective, _ = _setup("optim.warmup_steps=0", "optim.weight_decay=0")
    model.double()
    opt = build_optimizer(model, cfg.optim)
    views = [v.double() for v in _batches(cfg, 1)[0]]

    def loss() -> float:
        with torch.no_grad():
            return float(objective(model(views, make_generator(0, "drop")), 0).loss)

    before, lr = loss(), 1e-6
    train_step(model, objective, opt, [views], [make_generator(0, "drop")], step=0, lr=lr, grad_clip=None)
    predicted = lr * sum(float((p.grad.square() / (p.grad.abs() + cfg.optim.eps)).sum()) for p in model.parameters())
    assert predicted > 0
    assert before - loss() == pytest.approx(predicted, rel=0.01)


def test_loss_falls_on_a_fixed_batch():
    # 20 steps on one batch, then the loss of the trained and of the initial weights on that batch, each at
    # the same five evaluation steps (fresh SIGReg directions, same dropping). The margin is measured
    # against the spread the directions alone cause, not tuned to one machine's rounding.
    cfg, model, objective, opt = _setup("optim.warmup_steps=0", "objective.lam=0.02")
    initial = Pretrainer(*build_models(cfg, seed=0))
    (views,) = _batches(cfg, 1)
    for step in range(20):
        out = train_step(model, objective, opt, [views], [make_generator(0, "drop")], step=step, lr=1e-3, grad_clip=1.0)
        assert not bool(out.skipped)

    def losses(m) -> torch.Tensor:
        with torch.no_grad():
            z = m(views, make_generator(0, "drop"))
            return torch.tensor([float(objective(z, s).loss) for s in range(100, 105)])

    trained, untrained = losses(model), losses(initial)
    spread = float(untrained.max() - untrained.min())
    assert bool((trained < untrained).all()), (trained, untrained)
    assert float((untrained - trained).mean()) > 5 * spread, (trained, untrained)


def test_local_accumulation_gradient_is_the_mean_of_micro_batch_gradients():
    # accumulation="local" (the official code's): one loss per micro-batch, gradients averaged
    cfg, model, objective, opt = _setup("optim.warmup_steps=0", "optim.weight_decay=0")
    micro = _batches(cfg, 2)
    gens = [make_generator(0, i, "drop") for i in range(2)]
    ref_model = Pretrainer(*build_models(cfg, seed=0))
    ref_model.load_state_dict(model.state_dict())
    # reference: gradients of each micro-batch separately, averaged by hand, then the same SGD-free check
    grads = []
    for views, i in zip(micro, range(2), strict=True):
        ref_model.zero_grad()
        z = ref_model(views, make_generator(0, i, "drop"))
        objective(z, 0).loss.backward()
        grads.append([p.grad.clone() for p in ref_model.parameters()])
    mean_grad = [(a + b) / 2 for a, b in zip(*grads, strict=True)]
    train_step(model, objective, opt, micro, gens, step=0, lr=1e-3, grad_clip=None, accumulation="local")
    for p, g in zip(model.parameters(), mean_grad, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-7)


def test_non_finite_step_is_skipped_and_changes_nothing():
    cfg, model, objective, opt = _setup()
    (views,) = _batches(cfg, 1)
    train_step(model, objective, opt, [views], [make_generator(0, "drop")], step=0, lr=1e-3)
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "num_batches" not in k}
    opt_before = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state.items()}
    poisoned = [v.clone() for v in views]
    poisoned[0][0, 0] = float("nan")  # one whole clip of the global view: survives dropping
    out = train_step(model, objective, opt, [poisoned], [make_generator(0, "drop")], step=1, lr=1e-3)
    assert bool(out.skipped) and not torch.isfinite(out.loss)
    after = model.state_dict()
    for k, v in before.items():
        assert torch.equal(v, after[k]), k
    for p, s in opt.state.items():
        for n, t in s.items():
            assert torch.equal(t, opt_before[p][n]), n


def _model_options() -> list[tuple[str, ...]]:
    """One override per value of every on/off or named-choice field of EncoderConfig that differs from the
    tiny config's (read from the dataclass, so an option added later is covered without editing this list),
    the other tubelet size, and the legacy bias without the final norm."""
    base = tiny_config().model
    hints = get_type_hints(EncoderConfig)
    options: list[tuple[str, ...]] = []
    for f in fields(EncoderConfig):
        kind = hints[f.name]
        values = (False, True) if kind is bool else get_args(kind) if get_origin(kind) is Literal else ()
        current = getattr(base, f.name)
        options += [(f"model.{f.name}={str(v).lower()}",) for v in values if v != current]
    options += [("model.tubelet=1",), ("model.tubelet=2", "model.tubelet_init=random")]
    options += [("model.tubelet=2", "model.tubelet_init=inflate")]
    options += [("model.final_norm=false", "model.final_norm_bias=true")]
    distinct = {tiny_config(*o).model: o for o in reversed(options)}  # one case per distinct encoder
    return [o for m, o in distinct.items() if m != base][::-1]


def _dead_parameters(*overrides: str) -> tuple[list[str], set[str]]:
    """Trainable parameters whose gradient after one float64 GradCache step is zero up to rounding, and the
    names of all trainable ones.

    A gradient that is zero in exact arithmetic (a structural zero, e.g. a constant shift that BatchNorm
    removes) shows in float64 as rounding noise ~1e-17; AdamW would step such a weight on that noise."""
    cfg, model, objective, _ = _setup(*overrides)
    model.double()
    opt = build_optimizer(model, cfg.optim)
    it = iter(PretrainLoader(replace(cfg.data, batch_size=4), seed=0, micro_batches=2))
    micro, keys = [], []
    for _ in range(2):  # two micro-batches: the GradCache path
        batch = next(it)
        micro.append([v.double() for v in batch.augment_to_device("cpu")])
        keys.append(sample_keys(0, "drop", batch.epoch, positions=batch.index))
    train_step(model, objective, opt, micro, keys, step=0, lr=1e-3)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    norms = {n: float(p.grad.norm()) if p.grad is not None else 0.0 for n, p in trainable.items()}
    return sorted(n for n, g in norms.items() if g <= 1e-9 * max(norms.values())), set(trainable)


@pytest.mark.parametrize(
    "overrides",
    [
        (),
        ("objective.name=lejepa", "data.num_global=2", "objective.num_global_views=2"),
        ("objective.name=localejepa",),
    ],
)
def test_every_trainable_parameter_gets_a_gradient(overrides):
    dead, trainable = _dead_parameters(*overrides)
    # LocaLeJEPA ignores a constant shift of z: the projector's output bias is frozen, not trained on noise
    assert ("projector.net.3.bias" in trainable) == ("objective.name=localejepa" not in overrides)
    assert not dead, dead


@pytest.mark.parametrize("overrides", _model_options(), ids=" ".join)
def test_every_parameter_gets_a_gradient_under_every_model_option(overrides):
    # the bias just before the readout only shifts every CLS by one constant vector, which the projector's
    # BatchNorm removes: the final norm's bias, or without a final norm the last block's mlp.fc2 bias. It
    # exists only with final_norm_bias=true (weights written before it was removed) and must then be caught
    dead, _ = _dead_parameters(*overrides)
    cfg = tiny_config(*overrides).model
    if not cfg.final_norm_bias:
        assert not dead, dead
    elif cfg.final_norm:
        assert dead == ["encoder.norm.bias"]
    else:
        assert dead == [f"encoder.blocks.{cfg.depth - 1}.mlp.fc2.bias"]


@pytest.mark.parametrize("scale", [1e-3, 0.5, 0.999999, 1.0, 1.000001, 2.0, 1e3, float("inf"), float("nan")])
def test_clip_gradients_is_torchs_clip_bit_for_bit(scale):
    # the CPU path skips the multiply by 1.0 when the norm is within the bound: gradients and norm must still be
    # exactly clip_grad_norm_'s, below the bound, at it (scale ~1: the factor rounds to 1 or just under), above
    # it, and for an infinite or NaN norm
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    grads = [torch.randn(s) for s in shapes]
    bound = float(torch.nn.utils.get_total_norm(grads))  # the norm at scale 1
    grads = [g * scale for g in grads]
    ours, theirs = ([torch.nn.Parameter(torch.zeros(s)) for s in shapes] for _ in range(2))
    for a, b, g in zip(ours, theirs, grads, strict=True):
        a.grad, b.grad = g.clone(), g.clone()
    norm = clip_gradients(ours, bound)
    want = torch.nn.utils.clip_grad_norm_(theirs, bound, foreach=True)
    torch.testing.assert_close(norm, want, rtol=0, atol=0, equal_nan=True)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0, equal_nan=True)


@pytest.mark.slow  # torch.compile: ~16 s a case on the 2-core machine
@pytest.mark.parametrize("objective_name", ["levjepa", "lejepa"])
def test_the_captured_step_is_the_eager_step(objective_name):
    """``train.compile``'s CUDA form on the CPU (``compile_regions`` with ``fullgraph=True``: each view group's
    forward — keyed dropping to normalised CLS —, the projector and the loss, SIGReg's operator inside it, are
    one graph each, with nothing between their kernels, what a CUDA graph captures): two steps of GradCache over
    two micro-batches (the re-forward replays the group graphs) give the eager step's losses, gradients and
    weights."""
    overrides = ("optim.warmup_steps=0", f"objective.name={objective_name}", "train.batch_size=16")
    cfg, model, objective, opt = _setup(*overrides)
    twin, twin_objective = copy.deepcopy(model), build_objective(cfg.objective, check_finite=False)
    twin_opt = build_optimizer(twin, cfg.optim)
    torch._dynamo.reset()
    compile_regions(twin, twin_objective, backend="aot_eager", fullgraph=True)
    micro = _batches(cfg, 2)
    keys = [sample_keys(0, "drop", 0, positions=range(8 * i, 8 * i + 8)) for i in range(2)]
    for step in range(2):
        want = train_step(model, objective, opt, micro, keys, step=step, lr=1e-3, grad_clip=1.0)
        got = train_step(twin, twin_objective, twin_opt, micro, keys, step=step, lr=1e-3, grad_clip=1.0)
        assert float((got.loss - want.loss).abs()) <= 1e-5 * float(want.loss.abs())
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert float((q.grad - p.grad).abs().max()) <= 1e-4 * float(p.grad.abs().max()) + 1e-9, name
            assert float((q - p).detach().abs().max()) <= 1e-5, name


@pytest.mark.gpu
def test_the_cuda_graph_step_is_the_eager_step():
    """``train.compile`` on CUDA (``compile_step``: the regions as CUDA graphs, ``mode="reduce-overhead"``)
    against the eager step on the same GPU, GradCache over two micro-batches, three steps: the same losses and
    weights to float32 rounding of the TF32-free products."""
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    cfg, model, objective, opt = _setup("optim.warmup_steps=0", "train.batch_size=16")
    model = model.to(dev)
    opt = build_optimizer(model, cfg.optim)
    twin = copy.deepcopy(model)
    twin_objective = build_objective(cfg.objective, check_finite=False)
    twin_opt = build_optimizer(twin, cfg.optim)
    torch._dynamo.reset()
    compile_step(twin, twin_objective, dev)
    micro = [[v.to(dev) for v in b] for b in _batches(cfg, 2)]
    keys = [sample_keys(0, "drop", 0, positions=range(8 * i, 8 * i + 8), device=dev) for i in range(2)]
    for step in range(3):
        want = train_step(model, objective, opt, micro, keys, step=step, lr=1e-3, grad_clip=1.0)
        got = train_step(twin, twin_objective, twin_opt, micro, keys, step=step, lr=1e-3, grad_clip=1.0)
        assert float((got.loss - want.loss).abs()) <= 1e-4 * float(want.loss.abs()), step
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert float((q - p).detach().abs().max()) <= 1e-4, name
