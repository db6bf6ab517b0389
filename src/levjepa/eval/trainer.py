"""The probe trainer: the (lr × wd) grid of one kind of probe, for every task, trained from any feature source.

Written once for features in memory and on disk (``levjepa.eval.source``): the trainer reads batches of
samples through :meth:`FeatureSource.read` and never knows where they live.

**The grid** (V-JEPA's ``multihead_kwargs``). ``G`` probes with different (learning rate, weight decay)
are stacked on a leading parameter dimension (``levjepa.eval.probes.build_probe_grid``) and read the *same*
batch in one forward pass; the loss is the sum of the per-probe mean cross-entropies, so each probe
receives exactly the gradient it would get alone. Several tasks (label sets of the same samples) stack
their grids into the same model: task ``i`` owns probes ``[i·G, (i+1)·G)`` and its first ``C_i`` logits, so
the inputs are read once per batch for all tasks. :class:`GridAdamW` is AdamW with a learning rate and a
weight decay per probe (equal to ``torch.optim.AdamW`` run on each probe separately; tested). Weight decay
applies to matrices and the query, not to biases or LayerNorm parameters. Schedule: levjepa's one
``levjepa.train.optim.warmup_cosine``, linear warm-up from 0 then cosine to 0 (V-JEPA 2's probe configs: no
warm-up, cosine to 0, 20 epochs, lr ∈ {5e-3, 3e-3, 1e-3, 3e-4,
1e-4} × wd ∈ {0.01, 0.1, 0.4, 0.8}, AdamW betas (0.9, 0.999)). The linear probe's standardiser is the
training samples' mean and standard deviation, accumulated in float64 over the same batches the trainer
reads (one pass, bounded memory).

**Evaluation and choice.** A file's views (its ``crops`` consecutive samples) have their class
probabilities averaged; accuracy counts files and the validation loss is the cross-entropy of those
averaged probabilities. The probe with the best validation accuracy is chosen (ties: lower validation
loss) — or, with ``ProbeConfig.select = "loss"`` (the demo budget), the lowest validation loss (ties: higher
accuracy) — and its test accuracy reported; the whole grid is kept in the result. With ``average_last > 0``
the probes evaluated are the uniform average of their weights over that last fraction of steps.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from levjepa.data.progress import Progress
from levjepa.eval.probes import ProbeConfig, ProbeKind, build_probe_grid
from levjepa.eval.source import FeatureSource, MemorySource
from levjepa.model.probe_kinds import head_kind
from levjepa.rng import make_generator
from levjepa.train.optim import warmup_cosine

__all__ = [
    "GridAdamW",
    "GridResult",
    "choose_probes",
    "evaluate_probes",
    "probe_row",
    "standardizer",
    "train_probe_grid",
    "train_probes",
]


class GridAdamW:
    """AdamW over stacked parameters [G, ...] with a learning rate and a weight decay per probe g.

    Per element: ``m ← β1 m + (1−β1) g``, ``v ← β2 v + (1−β2) g²``, ``p ← p (1 − lr_g wd_g)`` (decoupled, only
    for parameters in ``decay``), ``p ← p − lr_g · (m / (1−β1^t)) / (√(v / (1−β2^t)) + eps)`` — the update of
    ``torch.optim.AdamW``, run for every probe at once.
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        lrs: Sequence[float],
        weight_decays: Sequence[float],
        *,
        decay: Sequence[bool],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        self.params = list(params)
        g = len(lrs)
        if len(weight_decays) != g or any(p.shape[0] != g for p in self.params) or len(decay) != len(self.params):
            raise ValueError("GridAdamW: every parameter needs a leading probe dimension of len(lrs) == len(wds)")
        dev = self.params[0].device
        self.base_lrs = torch.tensor(list(lrs), dtype=torch.float32, device=dev)
        self.wds = torch.tensor(list(weight_decays), dtype=torch.float32, device=dev)
        self.decay = list(decay)
        self.betas, self.eps, self.t = betas, eps, 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, lr_scale: float = 1.0, wd_scale: float = 1.0) -> None:
        """One step at learning rates ``lr_scale · lrs`` and weight decays ``wd_scale · weight_decays``."""
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2 = 1 - b1**self.t, 1 - b2**self.t
        lrs = self.base_lrs * lr_scale
        wds = self.wds * wd_scale
        for p, m, v, dec in zip(self.params, self.m, self.v, self.decay, strict=True):
            if p.grad is None:
                continue
            shape = (-1,) + (1,) * (p.dim() - 1)
            lr = lrs.view(shape)
            if dec:
                p.mul_(1 - lr * wds.view(shape))
            m.lerp_(p.grad, 1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v / bc2).sqrt_().add_(self.eps)
            p.sub_(lr / bc1 * m / denom)


@dataclass
class GridResult:
    """Every probe of a grid: its (lr, wd), validation and test accuracy (%); ``best`` chosen on validation."""

    kind: str
    lrs: list[float]
    weight_decays: list[float]
    val_acc: list[float]
    val_loss: list[float]
    test_acc: list[float] | None
    best: int
    epochs: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    # kept heads (``keep="best"`` / ``"all"`` of :func:`train_probes`): grid index -> the state dict of that
    # one probe (a row of the grid, ``levjepa.model.classifier.build_head``), and its HeadConfig fields
    heads: dict[int, dict[str, Tensor]] = field(default_factory=dict, repr=False)
    head_fields: dict[str, Any] = field(default_factory=dict, repr=False)
    # probe seeds 1..N-1 trained in the same pass (train_probes' seed_generators); this result is seed 0's
    seeds: list[GridResult] = field(default_factory=list, repr=False)

    @property
    def seed_reported(self) -> list[float]:
        """The reported accuracy of every probe seed, seed 0 first."""
        return [self.reported] + [r.reported for r in self.seeds]

    @property
    def mean_reported(self) -> float:
        """The mean over the probe seeds of the reported accuracy (``reported`` with one seed)."""
        accs = self.seed_reported
        return accs[0] if len(accs) == 1 else sum(accs) / len(accs)

    @property
    def sd_reported(self) -> float | None:
        """The sample standard deviation over the probe seeds (None with one seed)."""
        accs = self.seed_reported
        return statistics.stdev(accs) if len(accs) > 1 else None

    @property
    def best_on_eval(self) -> float:
        """V-JEPA 2's report: the best head's accuracy on the evaluation split itself (test, else val) — no
        choice on a held-out split, so optimistic against :attr:`reported` by the grid's spread."""
        return max(self.val_acc if self.test_acc is None else self.test_acc)

    @property
    def seed_best_on_eval(self) -> list[float]:
        return [self.best_on_eval] + [r.best_on_eval for r in self.seeds]

    @property
    def best_val(self) -> float:
        return self.val_acc[self.best]

    @property
    def best_test(self) -> float | None:
        return None if self.test_acc is None else self.test_acc[self.best]

    @property
    def reported(self) -> float:
        """The number to report: test accuracy of the probe chosen on validation (validation if no test)."""
        return self.best_val if self.test_acc is None else self.test_acc[self.best]

    def to_json(self) -> dict[str, Any]:
        grid = [
            {
                "lr": lr,
                "weight_decay": wd,
                "val_acc": va,
                "val_loss": vl,
                **({"test_acc": self.test_acc[i]} if self.test_acc is not None else {}),
            }
            for i, (lr, wd, va, vl) in enumerate(
                zip(self.lrs, self.weight_decays, self.val_acc, self.val_loss, strict=True)
            )
        ]
        return {
            "kind": self.kind,
            "best": {
                "index": self.best,
                "lr": self.lrs[self.best],
                "weight_decay": self.weight_decays[self.best],
                "val_acc": self.best_val,
                "test_acc": self.best_test,
            },
            "reported_acc": self.reported,
            "best_on_eval_acc": self.best_on_eval,  # V-JEPA 2's report (the best head on the evaluation split)
            "epochs": self.epochs,
            "seconds": self.seconds,
            "grid": grid,
            **self.extra,
            **(
                {
                    "seeds": len(self.seeds) + 1,
                    "seed_reported_acc": self.seed_reported,
                    "mean_reported_acc": self.mean_reported,
                    "sd_reported_acc": self.sd_reported,
                    "seed_results": [r.to_json() for r in self.seeds],
                }
                if self.seeds
                else {}
            ),
        }


def _param_decay(model: nn.Module) -> tuple[list[Tensor], list[bool]]:
    params: list[Tensor] = []
    decay: list[bool] = []
    for name, p in model.named_parameters():
        params.append(p)
        decay.append(p.dim() >= 3 or name.endswith("query"))  # per-probe matrices and the query
    return params, decay


def probe_row(model: nn.Module, row: int, num_classes: int) -> dict[str, Tensor]:
    """The state dict of probe ``row`` of a stacked grid as a grid of one (its first ``num_classes`` logits)."""
    g = getattr(model, "num_probes")  # noqa: B009 (both grid classes have it)
    out = {}
    for name, t in model.state_dict().items():
        if name.endswith(("feat_mean", "feat_std")):  # the linear probe's standardiser is shared
            out[name] = t.detach().clone()
            continue
        if t.shape[0] != g:
            raise ValueError(f"probe_row: {name} {list(t.shape)} has no probe dimension of {g}")
        r = t[row : row + 1].detach()
        if name.startswith("head."):
            r = r[..., :num_classes]
        out[name] = r.clone()
    return out


def _head_fields(kind: ProbeKind, model: nn.Module, what: str) -> dict[str, Any]:
    """What ``HeadConfig`` needs to rebuild one probe of ``model`` (besides the class count)."""
    fields: dict[str, Any] = {"kind": kind, "input": what, "dim": int(getattr(model, "dim"))}  # noqa: B009
    return {**fields, **head_kind(kind).head_fields(model)}


def _task_slices(classes: Mapping[str, int], g: int, seed: int = 0) -> dict[str, tuple[slice, int]]:
    """Probe rows and class count of each task: task i owns probes [i·g, (i+1)·g) and logits [:C_i] — of seed
    block ``seed``, which holds rows [seed·T·g, (seed+1)·T·g) of a stack of several seeds' grids."""
    off = seed * len(classes) * g
    return {t: (slice(off + i * g, off + (i + 1) * g), c) for i, (t, c) in enumerate(classes.items())}


def _seed_slices(classes: Mapping[str, int], g: int, seeds: int) -> dict[tuple[int, str], tuple[slice, int]]:
    """(seed, task) -> probe rows and class count, for ``seeds`` blocks of every task's grid stacked seed-major."""
    return {(s, t): v for s in range(seeds) for t, v in _task_slices(classes, g, s).items()}


def _label_of(key: str | tuple[int, str]) -> str:
    return key if isinstance(key, str) else key[1]


def _grid_loss(logits: Tensor, ys: Mapping[str, Tensor], slices: Mapping[Any, tuple[slice, int]]) -> Tensor:
    """Sum over probes of each probe's mean cross-entropy (so every probe gets exactly its own gradient).
    ``slices``: task (or (seed, task)) -> its probe rows and class count."""
    loss = logits.new_zeros(())
    for key, (sl, c) in slices.items():
        lg = logits[sl, :, :c]  # [g, b, C_t]
        loss = loss + F.cross_entropy(lg.reshape(-1, c), ys[_label_of(key)].repeat(lg.shape[0])) * lg.shape[0]
    return loss


def _schedule(cfg: ProbeConfig, step: int, total: int, warmup: int) -> tuple[float, float]:
    """(learning-rate scale, weight-decay scale) of optimizer step ``step`` (0-based) of ``total``.

    ``levjepa``: ``warmup_cosine`` (linear warm-up from 0 over ``warmup`` steps, cosine to 0), constant weight decay.
    ``vjepa2`` (``evals/video_classification_frozen``: ``WarmupCosineLRSchedule`` and ``CosineWDSchedule``, stepped
    *before* each optimizer step, so step ``k = step + 1`` of ``T``): during warm-up from ``start_lr`` (its configs:
    ``start_lr = lr``, so 1), then ``½ (1 + cos(π (k − W) / (T − W)))`` down to ``final_lr = 0``; weight decay
    ``r + (1 − r) · ½ (1 + cos(π k / T))`` of each head's own, ``r`` = ``final_wd_ratio`` (its configs:
    ``final_weight_decay = weight_decay``, r = 1)."""
    if cfg.schedule == "levjepa":
        return warmup_cosine(step, peak=1.0, total=total, warmup=warmup), 1.0
    k = step + 1
    if k < warmup:
        lr = 1.0
    else:
        lr = max(0.0, 0.5 * (1.0 + math.cos(math.pi * (k - warmup) / max(1, total - warmup))))
    r = cfg.final_wd_ratio
    wd = r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * k / total))
    return lr, (max(r, wd) if r <= 1 else min(r, wd))


def _batches(n: int, bs: int, order: Tensor | None = None) -> list[Tensor]:
    idx = torch.arange(n) if order is None else order
    return [idx[i : i + bs] for i in range(0, n, bs)]


@torch.no_grad()
def standardizer(source: FeatureSource, what: str, batch_size: int) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation (float32 [D]) of input ``what`` over ``source``'s samples, in one streamed
    pass accumulated in float64."""
    total, sq, n = None, None, 0
    for idx in _batches(len(source), batch_size):
        x = source.read(what, idx).double()
        total = x.sum(0) if total is None else total + x.sum(0)
        sq = (x * x).sum(0) if sq is None else sq + (x * x).sum(0)
        n += len(x)
    assert total is not None and sq is not None
    mean = total / n
    std = (sq / n - mean * mean).clamp_min(0).sqrt()
    return mean.float(), std.float().clamp_min(1e-6)


@torch.no_grad()
def evaluate_probes(
    model: nn.Module,
    source: FeatureSource,
    what: str,
    slices: Mapping[Any, tuple[slice, int]],
    *,
    batch_size: int,
    device: str,
) -> dict[Any, tuple[Tensor, Tensor]]:
    """Per task: accuracy (%) and loss of each of its probes (two tensors [g]), per file (see the module doc)."""
    model.eval()
    crops, files = source.crops, source.files
    if files == 0:
        raise ValueError(f"{source.name}: empty evaluation split")
    sums: dict[Any, list[Tensor]] = {}
    for fb in _batches(files, max(1, batch_size // crops)):
        sb = (fb[:, None] * crops + torch.arange(crops)[None, :]).reshape(-1)
        logits = model(source.read(what, sb).to(device))  # [G, B·crops, C_max]
        for t, (sl, c) in slices.items():
            lg = logits[sl, :, :c]
            probs = lg.float().softmax(-1).reshape(lg.shape[0], len(fb), crops, -1).mean(2)  # [g, B, C]
            y = source.labels[_label_of(t)][sb[::crops]].to(device)
            correct = (probs.argmax(-1) == y).sum(1).double()
            nll = F.nll_loss(probs.clamp_min(1e-12).log().transpose(1, 2), y.expand(len(probs), -1), reduction="none")
            loss = nll.sum(1).double()
            prev = sums.get(t)
            sums[t] = [correct, loss] if prev is None else [prev[0] + correct, prev[1] + loss]
    return {t: ((100.0 * c / files).cpu(), (lo / files).cpu()) for t, (c, lo) in sums.items()}


def choose_probes(
    kind: ProbeKind,
    cfg: ProbeConfig,
    val: Mapping[str, tuple[Tensor, Tensor]],
    test: Mapping[str, tuple[Tensor, Tensor]] | None,
    *,
    seconds: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, GridResult]:
    """Per task, the probe of the grid with the best validation accuracy (ties: the lower validation loss),
    reported with its test accuracy; the whole grid is kept in the result. ``val`` / ``test``: task ->
    (accuracy %, loss) per probe, as :func:`evaluate_probes` returns them."""
    grid = cfg.grid(kind)
    results = {}
    for t, (val_acc, val_loss) in val.items():
        if cfg.select == "loss":
            scores = [(float(v), -float(a)) for a, v in zip(val_acc, val_loss, strict=True)]
        else:
            scores = [(-float(a), float(v)) for a, v in zip(val_acc, val_loss, strict=True)]
        best = scores.index(min(scores))
        results[t] = GridResult(
            kind=head_kind(kind).result_kind(cfg.depth),
            lrs=[lr for lr, _ in grid],
            weight_decays=[wd for _, wd in grid],
            val_acc=[float(a) for a in val_acc],
            val_loss=[float(v) for v in val_loss],
            test_acc=None if test is None else [float(a) for a in test[t][0]],
            best=best,
            epochs=cfg.epochs_of(kind),
            seconds=seconds,
            extra=dict(extra or {}),
        )
    return results


def _stack(blocks: Sequence[nn.Module], kind: ProbeKind, cfg: ProbeConfig, dim: int, num_classes: int) -> nn.Module:
    """One grid of ``len(blocks) · rows`` probes holding the trained ``blocks`` (grids of ``rows`` probes each),
    block ``s`` in rows [s·rows, (s+1)·rows): what evaluation, choice and keeping read."""
    if len(blocks) == 1:
        return blocks[0]
    rows = int(getattr(blocks[0], "num_probes"))  # noqa: B009 (every grid kind has it)
    model = build_probe_grid(
        kind, cfg, dim, num_classes, generator=make_generator("probe-stack", 0), num_probes=rows * len(blocks)
    )
    states = [b.state_dict() for b in blocks]
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.dim() > 0 and t.shape[0] == rows * len(blocks):
                t.copy_(torch.cat([st[name] for st in states]))
            else:  # shared (the linear probe's standardiser, set from the data, the same in every block)
                t.copy_(states[0][name])
    return model.to(next(blocks[0].parameters()).device)


class _WeightAverage:
    """Uniform average (Polyak) of every parameter over the steps ``>= start`` of training: after each such
    step ``a ← a + (p − a) / k`` (k = steps averaged so far), so ``a`` is exactly the mean of the k weights."""

    def __init__(self, params: Sequence[Tensor], start: int):
        self.params, self.start, self.k = list(params), start, 0
        self.avg: list[Tensor] = []

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Call after optimiser step number ``step`` (0-based)."""
        if step < self.start:
            return
        self.k += 1
        if self.k == 1:
            self.avg = [p.detach().clone() for p in self.params]
            return
        for a, p in zip(self.avg, self.params, strict=True):
            a.add_(p.detach() - a, alpha=1.0 / self.k)

    @torch.no_grad()
    def apply(self) -> None:
        """Write the average into the parameters (nothing if no step was averaged)."""
        for a, p in zip(self.avg, self.params, strict=True):
            p.copy_(a)


def train_probes(
    kind: ProbeKind,
    cfg: ProbeConfig,
    what: str,
    train: FeatureSource,
    val: FeatureSource,
    test: FeatureSource | None = None,
    *,
    classes: Mapping[str, int],
    generator: torch.Generator,
    seed_generators: Sequence[torch.Generator] = (),
    device: str = "cpu",
    keep: Literal["none", "best", "all"] = "none",
    progress: bool = False,
) -> dict[str, GridResult]:
    """Train the (lr × wd) grid of ``kind`` probes reading input ``what`` for every task of ``classes``
    (task -> class count) on ``train``, choose on ``val``, report on ``test``; returns task -> result.
    ``generator`` draws the initialisation, then each epoch's order. ``keep``: the results also hold the
    chosen probe's weights (``best``) or every probe's (``all``), as ``GridResult.heads``. ``progress``: a bar,
    or a line every 30 s off a terminal, over the grid's epochs.

    **Probe seeds.** ``seed_generators`` (N − 1 of them) train N − 1 more copies of every grid in the same
    pass: block ``s`` draws its initialisation and then every epoch's batch order from ``seed_generators[s − 1]``
    alone, so it is exactly the run that generator would make by itself (``levjepa probe --seed seed+s``), and
    block 0 is exactly the one-seed run. The N blocks are independent draws of the probe's training: the spread
    of their accuracies is the seed-to-seed spread a user would see, and their mean's standard error is
    sd / √N. Each block reads its own batches (N reads a step) and is chosen on ``val`` by itself; a result's
    ``seeds`` holds blocks 1..N − 1 (its own fields are block 0's)."""
    start = time.perf_counter()
    n = len(train)
    if n == 0:
        raise ValueError(f"{train.name}: no training sample")
    grid = cfg.grid(kind)
    generators = [generator, *seed_generators]
    nseeds = len(generators)
    one = _task_slices(classes, len(grid))  # a block's rows: every task's grid
    rows = len(grid) * len(classes)
    dim, width = train.dim(what), max(classes.values())
    blocks = [build_probe_grid(kind, cfg, dim, width, generator=g, num_probes=rows).to(device) for g in generators]
    trains = [train.seed_view(s) for s in range(nseeds)]  # block s reads the views of seed + s
    if any(len(t) != n for t in trains):
        raise ValueError(f"{train.name}: the seed blocks' training views hold different samples")
    distinct = list({id(t): t for t in trains}.values())
    bs = min(cfg.batch_size, n)
    if head_kind(kind).standardize:  # its grid has set_standardizer (levjepa.model.probe_kinds)
        stats = {id(src): standardizer(src, what, bs) for src in distinct}
        for b, src in zip(blocks, trains, strict=True):
            mean, std = stats[id(src)]
            getattr(b, "set_standardizer")(mean.to(device), std.to(device))  # noqa: B009
    lrs, wds = [lr for lr, _ in grid] * len(classes), [wd for _, wd in grid] * len(classes)
    opts, averages = [], []
    epochs = cfg.epochs_of(kind)
    steps_per_epoch = math.ceil(n / bs)
    total, warmup = epochs * steps_per_epoch, int(cfg.warmup_epochs * steps_per_epoch)
    for b in blocks:
        params, decay = _param_decay(b)
        if cfg.schedule == "vjepa2":  # V-JEPA 2's AdamW decays every parameter of its heads
            decay = [True] * len(params)
        opts.append(GridAdamW(params, lrs, wds, decay=decay, betas=(cfg.beta1, cfg.beta2)))
        averages.append(_WeightAverage(params, start=total - max(1, round(cfg.average_last * total))))
    step = 0
    bar = Progress(epochs, f"{kind} probes ({rows * nseeds})", "epoch", show=progress)
    for epoch in range(epochs):
        for src in distinct:
            src.set_epoch(epoch)  # a source of augmented views reads this epoch's (levjepa.eval.source)
        for b in blocks:
            b.train()
        orders = [_batches(n, bs, torch.randperm(n, generator=g)) for g in generators]
        for batch in zip(*orders, strict=True):  # step by step, each block on its own batch
            lr, wd = _schedule(cfg, step, total, warmup)
            for b, opt, average, idx, block_src in zip(blocks, opts, averages, batch, trains, strict=True):
                x = block_src.read(what, idx).to(device, non_blocking=True)
                loss = _grid_loss(b(x), {t: block_src.labels[t][idx].to(device) for t in classes}, one)
                opt.zero_grad()
                loss.backward()
                opt.step(lr, wd)
                if cfg.average_last > 0:
                    average.update(step)
            step += 1
        bar.update(1)
    bar.close()
    if cfg.average_last > 0:
        for average in averages:
            average.apply()
    model = _stack(blocks, kind, cfg, dim, width)
    slices = _seed_slices(classes, len(grid), nseeds)
    ev = {"batch_size": 2 * cfg.batch_size, "device": str(device)}
    val_res = evaluate_probes(model, val, what, slices, **ev)  # type: ignore[arg-type]
    test_res = None if test is None else evaluate_probes(model, test, what, slices, **ev)  # type: ignore[arg-type]
    seconds = time.perf_counter() - start
    per_seed = [
        choose_probes(
            kind,
            cfg,
            {t: val_res[(s, t)] for t in classes},
            None if test_res is None else {t: test_res[(s, t)] for t in classes},
            seconds=seconds,
            extra=train.info(),
        )
        for s in range(nseeds)
    ]
    results = per_seed[0]
    for t in classes:
        results[t].seeds = [per_seed[s][t] for s in range(1, nseeds)]
    if keep != "none":
        for t, (sl, c) in _task_slices(classes, len(grid)).items():
            res = results[t]
            keep_rows = range(len(grid)) if keep == "all" else [res.best]
            res.heads = {i: probe_row(model, sl.start + i, c) for i in keep_rows}
            res.head_fields = {
                **_head_fields(kind, model, what),
                "mlp_ratio": cfg.mlp_ratio,
                "init_std": cfg.init_std,
                "num_classes": c,
            }
    return results


Labels = Tensor | Mapping[str, Tensor]


def train_probe_grid(
    kind: ProbeKind,
    cfg: ProbeConfig,
    train: tuple[Tensor, Labels],
    val: tuple[Tensor, Labels],
    test: tuple[Tensor, Labels] | None = None,
    *,
    num_classes: int | Mapping[str, int] | None = None,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> GridResult | dict[str, GridResult]:
    """:func:`train_probes` on tensors in memory: ``train``/``val``/``test`` are (inputs, labels), inputs tokens
    [N, L, D] (attentive) or pooled features [N, D] (linear), labels int64 [N] — or a mapping task -> [N]
    (with ``num_classes`` a mapping too), then every task's grid is stacked into one model and task ->
    result returned."""
    multi = isinstance(train[1], Mapping)

    def source(split: tuple[Tensor, Labels]) -> MemorySource:
        y = split[1]
        return MemorySource({"x": split[0]}, dict(y) if isinstance(y, Mapping) else {"": y})

    src = {"train": source(train), "val": source(val)} | ({} if test is None else {"test": source(test)})
    if isinstance(num_classes, Mapping):
        classes = {t: int(num_classes[t]) for t in src["train"].labels}
    elif num_classes is not None:
        classes = {t: int(num_classes) for t in src["train"].labels}
    else:
        ys = src["train"].labels, src["val"].labels
        classes = {t: int(max(ys[0][t].max(), ys[1][t].max())) + 1 for t in ys[0]}
    gen = generator if generator is not None else make_generator("probe", 0)
    res = train_probes(
        kind, cfg, "x", src["train"], src["val"], src.get("test"), classes=classes, generator=gen, device=str(device)
    )
    if multi:
        return res
    res[""].extra.pop("trained_with_tasks")
    return res[""]
