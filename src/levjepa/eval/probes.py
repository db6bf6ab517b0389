"""Frozen-feature probes: the attentive probe, the linear probe, and a stacked grid of each.

Only the probe trains; its inputs are features the frozen encoder computed once (``source.py``).

**Attentive probe** (SPEC §5, the LeVJEPA paper's appendix C.1, the V-JEPA protocol). One learnable query
``q0 ∈ R^D`` reads every output token ``x_1..x_L`` of the encoder (CLS and all patches, nothing dropped)
through one multi-head cross-attention layer, with a residual connection to the query, then a pre-LN
2-layer GELU MLP block, then a linear classifier::

    z = q0 + W_o · MHA(q = W_q q0 + b_q, k = W_k LN(x), v = W_v LN(x) + b_v)
    z = z + W_2 GELU(W_1 LN(z) + b_1) + b_2          (hidden width mlp_ratio · D, default 4 · D)
    logits = W_c z + b_c

This is V-JEPA's ``CrossAttentionBlock`` (LN on the tokens, not on the query) followed by its linear head.
``depth = 4`` gives **V-JEPA 2's variant**: three pre-LN self-attention blocks over the tokens (no
positional encoding, the query does not take part), then the cross-attention block above. Init as in
V-JEPA: weights trunc-normal(0.02), biases 0, LayerNorms (1, 0), the query trunc-normal(0.02), and each
block's last MLP weight divided by ``sqrt(2 · layer_id)``.

*Computing the single-query cross-attention cheaply.* Write ``LN(x_n) = γ ⊙ x̂_n + β`` with ``x̂_n`` the
parameter-free normalised token. For head ``h`` (width ``d_h``) the logit is
``q_h · k_h(x_n) / √d_h = x̂_n · u_h / √d_h + c_h`` with ``u_h = γ ⊙ (W_k[:, h] q_h)`` and ``c_h`` the same
for every token, so the softmax drops it (and a key bias, which only adds to ``c_h``, is omitted). Since
the weights sum to 1, ``Σ_n a_n v_h(x_n) = W_v[:, h] (γ ⊙ Σ_n a_n x̂_n + β) + b_v``. The probe therefore
never projects the ``L`` tokens: it costs ``4 · heads · L · D`` FLOPs per clip and probe instead of
``4 · L · D²``, and the normalised tokens ``x̂`` are shared by every probe of the grid (one GEMM with all
probes' ``u`` side by side). ``tests/test_probes.py`` checks this against a literal multi-head
implementation.

**Linear probe** (appendix C.2): mean of the patch tokens, standardised with the training split's mean and
standard deviation (fixed, so the probe stays a linear function of the features, like MAE's affine-free
BatchNorm before its linear head), then ``Linear(D, C)``.

**The grid** (V-JEPA's ``multihead_kwargs``). ``G`` probes with different (learning rate, weight decay)
are stacked on a leading parameter dimension and read the *same* batch in one forward pass
(:func:`build_probe_grid`; the kinds are registered in ``levjepa.model.probe_kinds``, the modules live in
``levjepa.model.probe_heads``, and the classifier that ``probe`` keeps, ``finetune`` trains and ``classify``
runs takes one row of them); how they train — the
loss, the optimiser, the schedule, the choice on validation — is ``levjepa.eval.trainer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from levjepa.config import check
from levjepa.model.probe_heads import AttentiveProbeGrid, LinearProbeGrid
from levjepa.model.probe_kinds import head_kind

__all__ = [
    "GRIDS",
    "VJEPA2_LRS",
    "VJEPA2_WDS",
    "AttentiveProbeGrid",
    "LinearProbeGrid",
    "ProbeConfig",
    "ProbeKind",
    "build_probe_grid",
    "probe_config",
]

ProbeKind = str  # a kind of levjepa.model.probe_kinds: attentive, linear, or one registered there
SCHEDULES = ("levjepa", "vjepa2")
GRIDS = ("budget", "vjepa2")  # probe --grid: the budget's grid, or V-JEPA 2's 20 heads and schedules
VJEPA2_LRS = (5e-3, 3e-3, 1e-3, 3e-4, 1e-4)  # configs/eval/vitl/*.yaml multihead_kwargs (lr = start_lr)
VJEPA2_WDS = (0.01, 0.1, 0.4, 0.8)  # their weight_decay (= final_weight_decay)


@dataclass(frozen=True)
class ProbeConfig:
    """How one kind of probe is trained. The grid is ``weight_decays × lrs`` (G = product of their lengths)."""

    depth: int = 1  # attentive blocks: 1 = the paper's probe, 4 = V-JEPA 2's variant
    num_heads: int = 0  # attention heads of the attentive probe; 0 = max(1, D // 64)
    mlp_ratio: float = 4.0
    lrs: tuple[float, ...] = (5e-3, 3e-3, 1e-3, 3e-4, 1e-4)
    weight_decays: tuple[float, ...] = (0.01, 0.1, 0.4, 0.8)
    linear_lrs: tuple[float, ...] = (1e-2, 3e-3, 1e-3)
    linear_weight_decays: tuple[float, ...] = (0.0, 1e-4, 1e-3)
    epochs: int = 20
    linear_epochs: int = 50
    batch_size: int = 64
    warmup_epochs: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    init_std: float = 0.02
    average_last: float = 0.0  # evaluate the uniform average of the weights over this last fraction of steps
    select: str = "acc"  # choose on val by accuracy (ties: loss) or by loss (ties: accuracy)
    schedule: str = "levjepa"  # levjepa (warm-up from 0, cosine) or vjepa2 (its schedulers, every parameter decayed)
    final_wd_ratio: float = 1.0  # vjepa2: weight decay cosine from each head's to this fraction of it (1: constant)

    def __post_init__(self) -> None:
        check(self.depth >= 1, f"probe.depth={self.depth}: must be >= 1 (1 = paper's probe, 4 = V-JEPA 2's)")
        check(self.num_heads >= 0, f"probe.num_heads={self.num_heads}: must be >= 0 (0 = D // 64)")
        check(self.mlp_ratio > 0, f"probe.mlp_ratio={self.mlp_ratio}: must be > 0")
        for name in ("lrs", "linear_lrs"):
            vals = getattr(self, name)
            check(len(vals) > 0 and all(v > 0 for v in vals), f"probe.{name}={vals}: need >= 1 positive value")
        for name in ("weight_decays", "linear_weight_decays"):
            vals = getattr(self, name)
            check(len(vals) > 0 and all(v >= 0 for v in vals), f"probe.{name}={vals}: need >= 1 value >= 0")
        for name in ("epochs", "linear_epochs", "batch_size"):
            check(getattr(self, name) >= 1, f"probe.{name}={getattr(self, name)}: must be >= 1")
        check(self.warmup_epochs >= 0, f"probe.warmup_epochs={self.warmup_epochs}: must be >= 0")
        check(self.init_std > 0, f"probe.init_std={self.init_std}: must be > 0")
        check(0 <= self.average_last <= 1, f"probe.average_last={self.average_last}: must be in [0, 1]")
        check(self.select in ("acc", "loss"), f"probe.select={self.select!r}: valid choices are acc, loss")
        check(self.schedule in SCHEDULES, f"probe.schedule={self.schedule!r}: valid choices are {', '.join(SCHEDULES)}")
        check(self.final_wd_ratio >= 0, f"probe.final_wd_ratio={self.final_wd_ratio}: must be >= 0")
        for name in ("beta1", "beta2"):
            check(0 <= getattr(self, name) < 1, f"probe.{name}={getattr(self, name)}: must be in [0, 1)")

    def grid(self, kind: ProbeKind) -> list[tuple[float, float]]:
        """(lr, weight decay) of each probe of the grid of ``kind``, weight decay major (V-JEPA's order): the
        attentive kind trains ``lrs × weight_decays``, the linear kind ``linear_lrs × linear_weight_decays``
        (``levjepa.model.probe_kinds.HeadKind.settings``)."""
        return head_kind(kind).grid(self)

    def epochs_of(self, kind: ProbeKind) -> int:
        """The epochs a grid of ``kind`` trains (``epochs`` attentive, ``linear_epochs`` linear)."""
        return head_kind(kind).epochs(self)


def probe_config(budget: Literal["demo", "full"] = "full", **overrides: Any) -> ProbeConfig:
    """Named presets. ``full``: the V-JEPA 2 grid values (20 attentive probes, 20 epochs) on levjepa's schedule.
    ``demo``: a 2 × 2 grid and few epochs, so that three encoders × three tasks fit in a few CPU minutes.
    ``grid="vjepa2"`` (``probe --grid vjepa2``): V-JEPA 2's 20 attentive heads as its eval configs
    (``configs/eval/vitl/*.yaml``) train them — lr ∈ :data:`VJEPA2_LRS` × wd ∈ :data:`VJEPA2_WDS`, 20 epochs, each
    head its own AdamW (betas 0.9, 0.999) decaying every parameter, no warm-up (``start_lr = lr``), cosine lr to 0
    and cosine wd from each head's own to ``final_weight_decay`` (= it), chosen on val by accuracy — whatever the
    budget (which keeps its batch size and linear grid). Its result also carries V-JEPA 2's report, the best
    head's accuracy on the evaluation split (``levjepa.eval.trainer.GridResult.best_on_eval``)."""
    grid = overrides.pop("grid", "budget")  # a keyword: grid="vjepa2"
    if grid not in GRIDS:
        raise ValueError(f"grid={grid!r}: valid choices are {', '.join(GRIDS)}")
    if budget == "full":
        cfg = ProbeConfig()
    elif budget == "demo":
        cfg = ProbeConfig(
            lrs=(1e-2, 3e-3),  # higher than V-JEPA's: ~160 steps instead of tens of thousands
            weight_decays=(0.01, 0.1),
            linear_lrs=(1e-2, 1e-3),
            linear_weight_decays=(0.0, 1e-3),
            epochs=20,  # 10 left the attentive probe seed-dependent (bench/eval.md, "Probe seeds (issue 53)")
            linear_epochs=30,
            batch_size=32,
            select="loss",  # with 20 epochs: steadier and higher on the bench tasks (bench/eval.md, "Probe seeds")
        )
    else:
        raise ValueError(f"budget={budget!r}: valid choices are demo, full")
    if grid == "vjepa2":
        cfg = ProbeConfig(**{**cfg.__dict__, "lrs": VJEPA2_LRS, "weight_decays": VJEPA2_WDS, "epochs": 20,
                             "warmup_epochs": 0.0, "schedule": "vjepa2", "final_wd_ratio": 1.0, "select": "acc",
                             "beta1": 0.9, "beta2": 0.999, "average_last": 0.0})  # fmt: skip
    return ProbeConfig(**{**cfg.__dict__, **overrides}) if overrides else cfg


def build_probe_grid(
    kind: ProbeKind,
    cfg: ProbeConfig,
    dim: int,
    num_classes: int,
    *,
    generator: torch.Generator | None = None,
    num_probes: int | None = None,
) -> nn.Module:
    """The stacked grid of ``kind`` probes (``levjepa.model.probe_kinds``; ``num_probes`` defaults to the grid
    size of ``cfg``)."""
    build = head_kind(kind).build
    g = num_probes or len(cfg.grid(kind))
    return build(
        g,
        dim,
        num_classes,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        init_std=cfg.init_std,
        generator=generator,
    )
