"""One optimizer step: views → encoder (dropping on) → projector → objective → AdamW.

``train_step`` is module-level and free of loop state so it can be tested alone (STYLE 5). It clips the
global gradient norm and steps the fused AdamW — which skips the update on the device when the loss or the
gradient norm is not finite. Nothing here waits for the device: the returned loss, terms, norm and skip
flag are device tensors the loop reads on logging steps.

**The loss sees the whole effective batch** (``accumulation="global"``, the default). The objective is a
function of the whole batch, not a mean of per-clip terms: SIGReg's statistic is ``N · Σ w |φ̂ − φ|²`` with
``N`` the batch, and the projector's BatchNorm normalises with batch statistics. So a loss computed per
micro-batch (``"local"``, the official code's gradient accumulation) trains a different objective for every
split of ``train.batch_size`` into ranks × micro-batches. With ``A > 1`` micro-batches per rank the step
runs GradCache (Gao et al., 2021):

1. encode every micro-batch (the last one with its graph kept, the others under ``no_grad``) and cache
   its CLS ``[V, B_micro, D]``;
2. concatenate the caches into the rank's batch, run the projector and the objective **once** on it (its
   BatchNorm and SIGReg's all-reduce make that the global batch over ranks), and backpropagate into the
   projector and the cached CLS;
3. backpropagate the cached CLS gradient through the last micro-batch's kept graph, then re-encode every
   other micro-batch with grad — the same tokens dropped: dropping is keyed per clip, or a generator is
   rewound — and backpropagate its slice: ``cls.backward(gradient=grad)``. A caller's generator is left
   where one pass over the micro-batches leaves it (the replays are undone).

Loss and gradients equal those of one pass over the whole batch (``tests/test_accumulation.py``: 4 × 16
equals 64 to 1e-12 in float64, and 2 gloo ranks × 2 equal 1 × 4). The cost is one extra no-grad
encoder forward for all micro-batches but the last, ``1 + (A−1)/A · fwd/(fwd+bwd)`` in step time; memory
stays that of one micro-batch plus the projector on the rank's batch and the cached CLS. Measured against
plain accumulation, with the command: ``bench/train.md`` (Accumulation: GradCache against plain
accumulation).

Why GradCache rather than accumulating SIGReg's characteristic-function sums in a first pass (the statistic
depends on the batch only through them): the gradient of every sample depends on the *global* sums, so
that route also needs a second forward of every micro-batch (encoder and projector: the graphs of all
micro-batches cannot be kept) — at least the same extra forward as GradCache, plus a two-pass
BatchNorm — and it is specific to SIGReg; GradCache re-runs only the encoder and serves every objective
(LeJEPA, LocaLeJEPA's k-means over the batch) unchanged.

Over ranks, gradients are averaged by DDP in the single-pass and ``"local"`` paths; in the GradCache path
the projector's backward happens outside any per-micro-batch forward, so DDP's hooks do not apply and one
explicit ``levjepa.distributed.all_reduce_gradients`` averages them after the last micro-batch (the same
mean DDP takes; the loop does not wrap the model in DDP then).

**Compiled** (``train.compile``, :func:`compile_step`): on CUDA the step runs as three compiled regions with
static shapes, each captured as a CUDA graph (``mode="reduce-overhead"``): a view group's whole forward —
keyed token dropping, patch embedding, the blocks, the final norm (``VideoEncoder.compile_views``; GradCache's
re-forward replays the same graph) —, the projector, and the loss (``Objective.compile_terms``, SIGReg's
statistics inside it as one operator); their backward graphs likewise. What stays eager between them is a few
launches: the per-view keys, concatenating the groups' CLS, the seeded directions, gradient clipping and the
fused AdamW step. A step on a GPU is launch-bound at ρ = 0.95 (``bench/gpu.md``), so this is its fast path.
On the CPU ``train.compile`` compiles the block stack alone (``VideoEncoder.compile_blocks``), the form
measured there (``bench/train.md``). ``tests/test_train_step.py`` holds the CUDA form to the eager step on
the CPU (each region one graph, ``fullgraph=True``).

Precision: under ``autocast_dtype=torch.bfloat16`` the encoder and projector run in bf16; the
projections are cast to float32 (float64 stays float64) before the objective, whose characteristic-function
statistics are float32 anyway. Under ``torch.float16`` (GPUs without bf16: V100, T4) a ``scaler``
(``torch.amp.GradScaler``) multiplies the loss before every backward (GradCache's cached CLS gradient is
then scaled too, so every micro-batch's backward is), the gradients are unscaled after the rank average and
before clipping, and a step whose scaled gradients overflowed is skipped like any non-finite step while the
scaler halves its scale (and doubles it after ``growth_interval`` clean steps).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from levjepa import distributed
from levjepa.model.vit import VideoEncoder
from levjepa.objective.build import Objective
from levjepa.objective.losses import loss_dtype
from levjepa.train.optim import step_unless_nonfinite

__all__ = [
    "Accumulation",
    "DropSource",
    "Pretrainer",
    "StepOutput",
    "clip_gradients",
    "compile_regions",
    "compile_step",
    "train_step",
]

Accumulation = Literal["global", "local"]
DropSource = torch.Tensor | torch.Generator  # per-clip int64 keys [B] (training) or one generator


class Pretrainer(nn.Module):
    """Encoder + projector: view groups → projections ``z`` of shape ``[V, B, K]`` (global views first).

    The projector's BatchNorm normalises the CLS embeddings of all ``V·B`` views of the batch it is given
    together, in one call ([choice]; under several ranks its statistics cover every rank's rows).
    """

    def __init__(self, encoder: VideoEncoder, projector: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.projector = projector

    def encode(self, views: Sequence[torch.Tensor], drop: DropSource) -> torch.Tensor:
        """CLS of every view ``[V, B, D]``; dropping keyed by ``drop`` (see ``VideoEncoder.forward_views``)."""
        if isinstance(drop, torch.Generator):
            return self.encoder.forward_views(*views, generator=drop)
        return self.encoder.forward_views(*views, keys=drop)

    def project(self, cls: torch.Tensor) -> torch.Tensor:
        """``[V, B, D]`` → ``[V, B, K]``, one projector call over all ``V·B`` rows."""
        v, b, d = cls.shape
        return self.projector(cls.reshape(v * b, d)).reshape(v, b, -1)

    def forward(self, views: Sequence[torch.Tensor], drop: DropSource) -> torch.Tensor:
        return self.project(self.encode(views, drop))


@dataclass
class StepOutput:
    loss: torch.Tensor  # the step's loss (local mode: mean over micro-batches), detached
    terms: dict[str, torch.Tensor]  # objective terms (local mode: means over micro-batches), detached
    grad_norm: torch.Tensor  # global gradient norm before clipping
    skipped: torch.Tensor  # bool: the update was skipped (non-finite loss or gradient)
    z: torch.Tensor  # projections the loss saw (local mode: the last micro-batch's), detached


def _autocast(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    return torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None)


StepResult = tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]  # loss, terms, z


def _scaled(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> torch.Tensor:
    """The loss to backpropagate: times the fp16 loss scale when there is a scaler."""
    return loss if scaler is None else scaler.scale(loss)


def _single_or_local(
    model: nn.Module,
    objective: nn.Module,
    micro_batches: Sequence[Sequence[torch.Tensor]],
    drops: Sequence[DropSource],
    step: int,
    autocast_dtype: torch.dtype | None,
    scaler: torch.amp.GradScaler | None = None,
) -> StepResult:
    """One pass per micro-batch, each with its own loss (``1/n`` of it backpropagated); DDP syncs the last."""
    n = len(micro_batches)
    loss_sum: torch.Tensor | None = None
    terms_sum: dict[str, torch.Tensor] = {}
    z = torch.empty(0)
    for i, (views, drop) in enumerate(zip(micro_batches, drops, strict=True)):
        last = i == n - 1
        no_sync = model.no_sync() if (not last and distributed.is_ddp(model)) else contextlib.nullcontext()
        with no_sync:
            with _autocast(views[0].device.type, autocast_dtype):
                z = model(views, drop)
            out = objective(loss_dtype(z), step)
            _scaled(out.loss / n, scaler).backward()
        loss = out.loss.detach()
        loss_sum = loss if loss_sum is None else loss_sum + loss
        for key, value in out.terms.items():
            terms_sum[key] = terms_sum[key] + value if key in terms_sum else value
    assert loss_sum is not None
    return loss_sum / n, {k: v / n for k, v in terms_sum.items()}, z.detach()


def _grad_cache(
    model: nn.Module,
    objective: nn.Module,
    micro_batches: Sequence[Sequence[torch.Tensor]],
    drops: Sequence[DropSource],
    step: int,
    autocast_dtype: torch.dtype | None,
    scaler: torch.amp.GradScaler | None = None,
) -> StepResult:
    """GradCache over the rank's micro-batches (module docstring): one loss on the whole batch."""
    core = model.module if distributed.is_ddp(model) else model
    assert isinstance(core, Pretrainer)
    device_type = micro_batches[0][0].device.type
    rewind: list[torch.Tensor | None] = []  # a generator's state before each cached pass, to replay it
    cached = []
    with _autocast(device_type, autocast_dtype):
        with torch.no_grad():
            for views, drop in zip(micro_batches[:-1], drops[:-1], strict=True):
                rewind.append(drop.get_state() if isinstance(drop, torch.Generator) else None)
                cached.append(core.encode(views, drop))
        last = core.encode(micro_batches[-1], drops[-1])  # its graph is kept: no re-run for this one
    sizes = [c.shape[1] for c in (*cached, last)]
    cls = torch.cat([*cached, last.detach()], dim=1).requires_grad_(True)  # [V, B_rank, D]
    del cached
    with _autocast(device_type, autocast_dtype):
        z = core.project(cls)
    out = objective(loss_dtype(z), step)
    _scaled(out.loss, scaler).backward()  # cls.grad carries the scale into every micro-batch's backward
    assert cls.grad is not None  # the objective's backward reached the cached CLS
    grads = cls.grad.split(sizes, dim=1)
    last.backward(grads[-1])
    del last
    # where one pass over the micro-batches left each generator: the replays below rewind it, and a reused
    # generator must go on from here, not from the last replay (it would draw the last micro-batch's tokens)
    ends = [(g, g.get_state()) for g in {id(d): d for d in drops if isinstance(d, torch.Generator)}.values()]
    for i, (views, drop) in enumerate(zip(micro_batches[:-1], drops[:-1], strict=True)):
        state = rewind[i]
        if state is not None:
            assert isinstance(drop, torch.Generator)
            drop.set_state(state)  # the same tokens as in the cached pass
        with _autocast(device_type, autocast_dtype):
            again = core.encode(views, drop)
        again.backward(grads[i])
    for generator, end in ends:
        generator.set_state(end)
    return out.loss.detach(), out.terms, z.detach()


def compile_regions(model: Pretrainer, objective: Objective, **kwargs: Any) -> None:
    """Compile the step's three regions in place (module docstring, "Compiled"), each with ``kwargs`` for
    ``torch.compile`` and static shapes: a view group's forward, the projector, the loss terms."""
    kwargs.setdefault("dynamic", False)
    model.encoder.compile_views(**kwargs)
    model.projector.compile(**kwargs)
    objective.compile_terms(**kwargs)


def compile_step(model: Pretrainer, objective: Objective, device: torch.device) -> None:
    """``train.compile``: on CUDA the three regions as CUDA graphs (:func:`compile_regions` with
    ``mode="reduce-overhead"``); on other devices the encoder's block stack (module docstring)."""
    if device.type == "cuda":
        compile_regions(model, objective, mode="reduce-overhead")
    else:
        model.encoder.compile_blocks()


def clip_gradients(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)``: the total gradient norm (a 0-d
    tensor), every gradient scaled by ``min(1, max_norm / (norm + 1e-6))``. PyTorch multiplies the
    gradients by that factor even when it is exactly 1, so as never to read the norm on the host (a
    synchronisation on a GPU); on the CPU reading it is free, and a step whose norm is within the bound skips
    the multiply of every gradient by 1.0 (the same gradients, bit for bit)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or grads[0].device.type != "cpu":
        return torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm, foreach=True)
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if not float(max_norm / (norm + 1e-6)) >= 1.0:  # PyTorch's factor, as it computes it, is below 1 (or NaN)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm


def train_step(
    model: nn.Module,
    objective: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Sequence[torch.Tensor]],
    drops: Sequence[DropSource],
    *,
    step: int,
    lr: float,
    grad_clip: float | None = None,
    autocast_dtype: torch.dtype | None = None,
    accumulation: Accumulation = "global",
    scaler: torch.amp.GradScaler | None = None,
) -> StepOutput:
    """Accumulate gradients over ``micro_batches`` (each a list of float view groups) and step once.

    ``drops``: one per micro-batch, the per-clip int64 keys ``[B]`` of its token dropping (what the loop
    passes: ``levjepa.rng.sample_keys``) or a ``torch.Generator``. ``model``: a :class:`Pretrainer`, or one
    wrapped in DDP; without DDP on several ranks the gradients are averaged over ranks here.
    ``accumulation``: ``"global"`` (one loss on the whole batch, GradCache when there are several
    micro-batches) or ``"local"`` (one loss per micro-batch, gradients averaged); see the module docstring.
    ``scaler``: fp16's loss scaling (module docstring), updated here after the step.
    """
    if len(micro_batches) != len(drops) or not micro_batches:
        raise ValueError(f"need one drop source per micro-batch, got {len(micro_batches)} and {len(drops)}")
    if accumulation not in ("global", "local"):
        raise ValueError(f"accumulation={accumulation!r}: valid choices are global, local")
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    if micro_batches[0][0].is_cuda:
        torch.compiler.cudagraph_mark_step_begin()  # a new step: CUDA graphs may reuse the last one's buffers
    if accumulation == "global" and len(micro_batches) > 1:
        loss, terms, z = _grad_cache(model, objective, micro_batches, drops, step, autocast_dtype, scaler)
        synced_by_ddp = False
    else:
        loss, terms, z = _single_or_local(model, objective, micro_batches, drops, step, autocast_dtype, scaler)
        synced_by_ddp = distributed.is_ddp(model)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not synced_by_ddp:
        distributed.all_reduce_gradients(params)  # mean over ranks; nothing alone
    if scaler is not None:
        scaler.unscale_(optimizer)  # the true gradients, before clipping; records overflows for update()
    grad_norm = clip_gradients(params, grad_clip if grad_clip else math.inf)
    skipped = step_unless_nonfinite(optimizer, loss, grad_norm)  # fine-tuning's step skips the same way
    if scaler is not None:
        scaler.update()  # an overflow (found by unscale_) halves the scale; growth_interval clean steps double it
    return StepOutput(loss=loss, terms=terms, grad_norm=grad_norm.detach(), skipped=skipped, z=z)
