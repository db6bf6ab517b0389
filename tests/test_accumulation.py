"""Gradient accumulation with global-batch semantics (GradCache): the split of the batch does not matter.

4 micro-batches of 16 give the loss and every gradient (the projector's BatchNorm included) of one batch of
64, and 2 gloo ranks × 2 micro-batches give those of 1 rank × 4, to 1e-12 in float64 (they agree to ~1e-14:
the order of float64 sums, nothing more). The old per-micro-batch loss (``accumulation="local"``) does not,
which keeps these comparisons from being vacuous.
"""

from __future__ import annotations

import pytest
import torch

from dist_utils import run_gloo
from levjepa import distributed
from levjepa.data import PretrainLoader
from levjepa.objective import build_objective
from levjepa.rng import make_generator, sample_keys
from levjepa.train.loop import build_models
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, train_step
from train_utils import tiny_config

OVERRIDES = ("optim.warmup_steps=0", "optim.weight_decay=0", "data.synthetic.num_train=64")


def _model(cfg) -> Pretrainer:
    model = Pretrainer(*build_models(cfg, seed=0)).double()
    return distributed.convert_sync_batchnorm(model)  # as the trainer does: BatchNorm over every rank (alone: plain)


def _micro_batches(cfg, batch: int, micro: int, rank: int = 0, world: int = 1):
    data = cfg.data.__class__(**{**cfg.data.__dict__, "batch_size": batch})
    loader = PretrainLoader(data, seed=0, rank=rank, world_size=world, micro_batches=micro)
    views, keys = [], []
    for _ in range(micro):
        b = next(loader)
        views.append([v.double() for v in b.augment_to_device("cpu")])
        keys.append(sample_keys(0, "drop", b.epoch, positions=b.index))
    return views, keys


def _step(cfg, views, drops, accumulation: str = "global"):
    model = _model(cfg)
    objective = build_objective(cfg.objective)
    opt = build_optimizer(model, cfg.optim)
    out = train_step(model, objective, opt, views, drops, step=3, lr=1e-3, grad_clip=None, accumulation=accumulation)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers() if b.is_floating_point()}
    return float(out.loss), {k: float(v) for k, v in out.terms.items()}, grads, buffers


TOL = 1e-12  # float64 rounding of differently ordered sums; a wrong gradient term is many orders larger


def _assert_same(a, b, tol: float = TOL) -> None:
    loss_a, terms_a, grads_a, buffers_a = a
    loss_b, terms_b, grads_b, buffers_b = b
    assert loss_a == pytest.approx(loss_b, rel=tol, abs=tol)
    assert terms_a.keys() == terms_b.keys()
    for k in terms_a:
        assert terms_a[k] == pytest.approx(terms_b[k], rel=tol, abs=tol), k
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=tol, atol=tol, msg=name)
    for name in buffers_a:  # the projector's BatchNorm running statistics: one update from the whole batch
        torch.testing.assert_close(buffers_a[name], buffers_b[name], rtol=tol, atol=tol, msg=name)


def _concat(views, keys):
    whole = [torch.cat([v[g] for v in views], dim=1) for g in range(len(views[0]))]
    return [whole], [torch.cat(keys)]


def test_four_micro_batches_of_16_equal_one_batch_of_64():
    cfg = tiny_config(*OVERRIDES)
    views, keys = _micro_batches(cfg, 16, 4)
    whole, whole_keys = _concat(views, keys)
    one = _step(cfg, whole, whole_keys)
    _assert_same(_step(cfg, views, keys), one)
    grads_local = _step(cfg, views, keys, accumulation="local")[2]  # the per-micro-batch loss differs
    gap = max(float((grads_local[n] - one[2][n]).abs().max()) for n in grads_local)
    assert gap > 1e-3


@pytest.mark.parametrize("shared", [False, True])
def test_grad_cache_rewinds_a_generator_to_drop_the_same_tokens_again(shared):
    # with generators (no per-clip keys; one per micro-batch, or one shared by all) the reference is the
    # definition: every micro-batch encoded with its graph, one loss on the concatenated CLS, one backward
    cfg = tiny_config(*OVERRIDES)
    views, _ = _micro_batches(cfg, 16, 3)

    def generators():
        one = make_generator(0, "drop")
        return [one] * 3 if shared else [make_generator(0, i, "drop") for i in range(3)]

    used = generators()
    got = _step(cfg, views, used)
    model = _model(cfg)
    once = generators()
    cls = torch.cat([model.encode(v, g) for v, g in zip(views, once, strict=True)], dim=1)
    loss = build_objective(cfg.objective)(model.project(cls), 3).loss
    loss.backward()
    assert got[0] == pytest.approx(float(loss.detach()), rel=TOL, abs=TOL)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[2][name], p.grad, rtol=TOL, atol=TOL, msg=name)
    # the caller's generators end where one pass over the micro-batches leaves them, replays undone: a
    # reused generator draws the next step's tokens afresh instead of replaying the last micro-batch's
    for g, ref in zip(used, once, strict=True):
        assert torch.equal(g.get_state(), ref.get_state())


def _rank_step(rank: int, world: int):
    cfg = tiny_config(*OVERRIDES)
    views, keys = _micro_batches(cfg, 16, 2, rank=rank, world=world)
    return _step(cfg, views, keys)


@pytest.mark.distributed
def test_two_ranks_by_two_micro_batches_equal_one_rank_by_four():
    cfg = tiny_config(*OVERRIDES)
    views, keys = _micro_batches(cfg, 16, 4)
    one = _step(cfg, views, keys)
    ranks = run_gloo(_rank_step, 2)
    # each rank's loss holds its own rows' invariance (the loop logs the mean over ranks) and the global SIGReg
    loss = sum(r[0] for r in ranks) / 2
    terms = {k: sum(r[1][k] for r in ranks) / 2 for k in ranks[0][1]}
    for r in ranks:  # gradients are averaged over ranks: equal on both, and equal to one rank's
        _assert_same((loss, terms, r[2], r[3]), one)
