"""Frozen-feature probes: the attentive probe, the linear probe, and a grid of them trained in parallel.

Only the probe trains; its inputs are features the frozen encoder computed once (``features.py``).

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
are stacked on a leading parameter dimension and read the *same* batch in one forward pass; the loss is
the sum of the per-probe mean cross-entropies, so each probe receives exactly the gradient it would get
alone. :class:`GridAdamW` is AdamW with a learning rate and a weight decay per probe (equal to
``torch.optim.AdamW`` run on each probe separately; tested). Weight decay applies to matrices and the
query, not to biases or LayerNorm parameters. Schedule: linear warm-up then cosine to 0 (V-JEPA 2's
probe configs: no warm-up, cosine to 0, 20 epochs, lr ∈ {5e-3, 3e-3, 1e-3, 3e-4, 1e-4} × wd ∈ {0.01, 0.1,
0.4, 0.8}, AdamW betas (0.9, 0.999)). The probe with the best validation accuracy is chosen (ties: lower
validation loss) and its test accuracy reported; the whole grid is kept in the result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from levjepa.config import check
from levjepa.rng import make_generator

__all__ = [
    "AttentiveProbeGrid",
    "GridAdamW",
    "GridResult",
    "LinearProbeGrid",
    "ProbeConfig",
    "build_probe_grid",
    "choose_probes",
    "evaluate_grid",
    "fit_probe_grid",
    "probe_config",
    "train_probe_grid",
]

ProbeKind = Literal["attentive", "linear"]


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
        for name in ("beta1", "beta2"):
            check(0 <= getattr(self, name) < 1, f"probe.{name}={getattr(self, name)}: must be in [0, 1)")

    def grid(self, kind: ProbeKind) -> list[tuple[float, float]]:
        """(lr, weight decay) of each probe of the grid, weight decay major (V-JEPA's order)."""
        lrs, wds = (
            (self.lrs, self.weight_decays) if kind == "attentive" else (self.linear_lrs, self.linear_weight_decays)
        )
        return [(lr, wd) for wd in wds for lr in lrs]


def probe_config(budget: Literal["demo", "full"] = "full", **overrides: Any) -> ProbeConfig:
    """Named presets. ``full``: the V-JEPA 2 grid (20 attentive probes, 20 epochs). ``demo``: a 2 × 2 grid
    and few epochs, so that three encoders × three tasks fit in a few CPU minutes."""
    if budget == "full":
        cfg = ProbeConfig()
    elif budget == "demo":
        cfg = ProbeConfig(
            lrs=(1e-2, 3e-3),  # higher than V-JEPA's: ~160 steps instead of tens of thousands
            weight_decays=(0.01, 0.1),
            linear_lrs=(1e-2, 1e-3),
            linear_weight_decays=(0.0, 1e-3),
            epochs=10,
            linear_epochs=30,
            batch_size=32,
        )
    else:
        raise ValueError(f"budget={budget!r}: valid choices are demo, full")
    return ProbeConfig(**{**cfg.__dict__, **overrides}) if overrides else cfg


# ----------------------------------------------------------------------------------------------------------
# Stacked layers: G independent copies, parameters on a leading dimension, inputs [G, ..., D].


def _trunc_normal(shape: Sequence[int], std: float, generator: torch.Generator | None) -> Tensor:
    t = torch.empty(*shape)
    nn.init.trunc_normal_(t, std=std, a=-2 * std, b=2 * std, generator=generator)
    return t


class _StackedLinear(nn.Module):
    def __init__(self, g: int, d_in: int, d_out: int, *, std: float, gen: torch.Generator | None, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(_trunc_normal((g, d_in, d_out), std, gen))  # x @ weight[g]
        self.bias = nn.Parameter(torch.zeros(g, d_out)) if bias else None

    def forward(self, x: Tensor) -> Tensor:  # [G, ..., d_in] -> [G, ..., d_out]
        g, d_out = self.weight.shape[0], self.weight.shape[2]
        flat = x.reshape(g, -1, x.shape[-1])
        out = (
            torch.bmm(flat, self.weight) if self.bias is None else torch.baddbmm(self.bias[:, None], flat, self.weight)
        )
        return out.reshape(*x.shape[:-1], d_out)


class _StackedLayerNorm(nn.Module):
    def __init__(self, g: int, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(g, d))
        self.bias = nn.Parameter(torch.zeros(g, d))

    def affine(self, xhat: Tensor) -> Tensor:  # xhat [G, ..., D] already normalised
        shape = (xhat.shape[0],) + (1,) * (xhat.dim() - 2) + (xhat.shape[-1],)
        return xhat * self.weight.view(shape) + self.bias.view(shape)

    def forward(self, x: Tensor) -> Tensor:
        return self.affine(F.layer_norm(x, x.shape[-1:]))


class _StackedMLP(nn.Module):
    def __init__(self, g: int, d: int, hidden: int, *, std: float, gen: torch.Generator | None, layer_id: int):
        super().__init__()
        self.fc1 = _StackedLinear(g, d, hidden, std=std, gen=gen)
        self.fc2 = _StackedLinear(g, hidden, d, std=std, gen=gen)
        with torch.no_grad():
            self.fc2.weight.div_(math.sqrt(2.0 * layer_id))  # V-JEPA's depth rescaling of residual branches

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _StackedSelfBlock(nn.Module):
    """Pre-LN transformer block over the tokens (V-JEPA 2's probe blocks 1..depth-1): x [G, B, L, D]."""

    def __init__(
        self, g: int, d: int, heads: int, hidden: int, *, std: float, gen: torch.Generator | None, layer_id: int
    ):
        super().__init__()
        self.heads = heads
        self.norm1 = _StackedLayerNorm(g, d)
        self.qkv = _StackedLinear(g, d, 3 * d, std=std, gen=gen)
        self.proj = _StackedLinear(g, d, d, std=std, gen=gen)
        with torch.no_grad():
            self.proj.weight.div_(math.sqrt(2.0 * layer_id))
        self.norm2 = _StackedLayerNorm(g, d)
        self.mlp = _StackedMLP(g, d, hidden, std=std, gen=gen, layer_id=layer_id)

    def forward(self, x: Tensor) -> Tensor:
        g, b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(g * b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # [G*B, heads, L, d_h]
        x = x + self.proj(a.transpose(1, 2).reshape(g, b, n, d))
        return x + self.mlp(self.norm2(x))


class _StackedQueryBlock(nn.Module):
    """One learnable query per probe cross-attends the tokens; residual; pre-LN MLP (see the module doc)."""

    def __init__(
        self, g: int, d: int, heads: int, hidden: int, *, std: float, gen: torch.Generator | None, layer_id: int
    ):
        super().__init__()
        self.heads = heads
        self.query = nn.Parameter(_trunc_normal((g, d), std, gen))
        self.norm_x = _StackedLayerNorm(g, d)
        self.q = _StackedLinear(g, d, d, std=std, gen=gen)
        self.k = _StackedLinear(g, d, d, std=std, gen=gen, bias=False)  # a key bias cancels in the softmax
        self.v = _StackedLinear(g, d, d, std=std, gen=gen)
        self.proj = _StackedLinear(g, d, d, std=std, gen=gen)
        self.norm_mlp = _StackedLayerNorm(g, d)
        self.mlp = _StackedMLP(g, d, hidden, std=std, gen=gen, layer_id=layer_id)

    def forward(self, x: Tensor) -> Tensor:
        """x: [B, L, D] shared by all G probes, or [G, B, L, D] (after self-attention blocks). -> [G, B, D]."""
        g, d = self.query.shape
        nh, dh = self.heads, d // self.heads
        xhat = F.layer_norm(x, (d,))  # LN without its affine part; the per-probe γ, β are folded below
        gamma, beta = self.norm_x.weight, self.norm_x.bias  # [G, D]
        q = self.q(self.query[:, None])[:, 0].view(g, nh, dh)  # [G, nh, dh]
        u = torch.einsum("gihd,ghd->ghi", self.k.weight.view(g, d, nh, dh), q) * gamma[:, None] / math.sqrt(dh)
        if x.dim() == 3:  # shared tokens: one GEMM for every probe and head
            b = x.shape[0]
            logits = xhat @ u.reshape(g * nh, d).T  # [B, L, G*nh]
            attn = logits.softmax(dim=1)
            pooled = (attn.transpose(1, 2) @ xhat).view(b, g, nh, d).transpose(0, 1)  # [G, B, nh, D]
        else:
            attn = torch.einsum("gbld,ghd->gbhl", xhat, u).softmax(dim=-1)
            pooled = torch.einsum("gbhl,gbld->gbhd", attn, xhat)
        pooled = pooled * gamma[:, None, None] + beta[:, None, None]  # Σ_n a_n LN(x_n) per head
        wv = self.v.weight.view(g, d, nh, dh)
        heads_out = torch.einsum("gbhi,gihd->gbhd", pooled, wv) + self.v.bias.view(g, 1, nh, dh)
        z = self.query[:, None] + self.proj(heads_out.flatten(2))  # [G, B, D], residual with the query
        return z + self.mlp(self.norm_mlp(z))


class AttentiveProbeGrid(nn.Module):
    """``num_probes`` independent attentive probes (see module doc) reading the same tokens.

    ``forward(tokens [B, L, D]) -> logits [G, B, C]``; tokens may be fp16 (computed in fp32).
    """

    def __init__(
        self,
        num_probes: int,
        dim: int,
        num_classes: int,
        *,
        depth: int = 1,
        num_heads: int = 0,
        mlp_ratio: float = 4.0,
        init_std: float = 0.02,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        heads = num_heads or max(1, dim // 64)
        if dim % heads:
            raise ValueError(f"attentive probe: num_heads={heads} must divide the feature dim {dim}")
        if num_probes < 1 or num_classes < 2 or depth < 1:
            raise ValueError(
                f"attentive probe: need num_probes >= 1, num_classes >= 2, depth >= 1; got {num_probes}, "
                f"{num_classes}, {depth}"
            )
        hidden = int(dim * mlp_ratio)
        kw = {"std": init_std, "gen": generator}
        self.blocks = nn.ModuleList(
            _StackedSelfBlock(num_probes, dim, heads, hidden, layer_id=i + 1, **kw) for i in range(depth - 1)
        )
        self.pool = _StackedQueryBlock(num_probes, dim, heads, hidden, layer_id=max(1, depth - 1), **kw)
        self.head = _StackedLinear(num_probes, dim, num_classes, **kw)
        self.num_probes, self.dim, self.num_classes, self.depth, self.num_heads = (
            num_probes,
            dim,
            num_classes,
            depth,
            heads,
        )

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.dim() != 3 or tokens.shape[-1] != self.dim:
            raise ValueError(f"attentive probe: tokens must be [B, L, {self.dim}], got {list(tokens.shape)}")
        x = tokens.to(self.pool.query.dtype)  # fp16 cached tokens are computed in the probe's dtype
        if len(self.blocks):
            x = x.expand(self.num_probes, *x.shape).contiguous()
            for blk in self.blocks:
                x = blk(x)
        return self.head(self.pool(x))  # [G, B, C]


class LinearProbeGrid(nn.Module):
    """``num_probes`` linear classifiers on standardised pooled features: ``[B, D] -> [G, B, C]``."""

    def __init__(self, num_probes: int, dim: int, num_classes: int, *, generator: torch.Generator | None = None):
        super().__init__()
        self.head = _StackedLinear(num_probes, dim, num_classes, std=0.01, gen=generator)
        self.register_buffer("feat_mean", torch.zeros(dim))
        self.register_buffer("feat_std", torch.ones(dim))
        self.num_probes, self.dim, self.num_classes = num_probes, dim, num_classes

    @torch.no_grad()
    def fit_standardizer(self, x: Tensor) -> None:
        """Fix the per-feature mean / std from the training features [N, D]."""
        x = x.to(self.feat_mean.dtype)
        self.feat_mean.copy_(x.mean(0))
        self.feat_std.copy_(x.std(0, unbiased=False).clamp_min(1e-6))

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[-1] != self.dim:
            raise ValueError(f"linear probe: features must be [B, {self.dim}], got {list(x.shape)}")
        z = (x.to(self.feat_mean.dtype) - self.feat_mean) / self.feat_std
        return self.head(z.expand(self.num_probes, *z.shape))


# ----------------------------------------------------------------------------------------------------------
# Optimisation


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
    def step(self, lr_scale: float = 1.0) -> None:
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2 = 1 - b1**self.t, 1 - b2**self.t
        lrs = self.base_lrs * lr_scale
        for p, m, v, dec in zip(self.params, self.m, self.v, self.decay, strict=True):
            if p.grad is None:
                continue
            shape = (-1,) + (1,) * (p.dim() - 1)
            lr = lrs.view(shape)
            if dec:
                p.mul_(1 - lr * self.wds.view(shape))
            m.lerp_(p.grad, 1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v / bc2).sqrt_().add_(self.eps)
            p.sub_(lr / bc1 * m / denom)


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from 1 to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# ----------------------------------------------------------------------------------------------------------
# Training and evaluation


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
            "epochs": self.epochs,
            "seconds": self.seconds,
            "grid": grid,
            **self.extra,
        }


def build_probe_grid(
    kind: ProbeKind,
    cfg: ProbeConfig,
    dim: int,
    num_classes: int,
    *,
    generator: torch.Generator | None = None,
    num_probes: int | None = None,
) -> nn.Module:
    """The stacked grid of ``kind`` probes (``num_probes`` defaults to the grid size of ``cfg``)."""
    g = num_probes or len(cfg.grid(kind))
    if kind == "attentive":
        return AttentiveProbeGrid(
            g,
            dim,
            num_classes,
            depth=cfg.depth,
            num_heads=cfg.num_heads,
            mlp_ratio=cfg.mlp_ratio,
            init_std=cfg.init_std,
            generator=generator,
        )
    if kind == "linear":
        return LinearProbeGrid(g, dim, num_classes, generator=generator)
    raise ValueError(f"probe kind {kind!r}: valid choices are attentive, linear")


def _param_decay(model: nn.Module) -> tuple[list[Tensor], list[bool]]:
    params, decay = [], []
    for name, p in model.named_parameters():
        params.append(p)
        decay.append(p.dim() >= 3 or name.endswith("query"))  # per-probe matrices and the query
    return params, decay


Labels = Tensor | Mapping[str, Tensor]


def _task_slices(classes: Mapping[Any, int], g: int) -> dict[Any, tuple[slice, int]]:
    """Probe rows and class count of each task: task i owns probes [i·g, (i+1)·g) and logits [:C_i]."""
    return {t: (slice(i * g, (i + 1) * g), c) for i, (t, c) in enumerate(classes.items())}


def _grid_loss(logits: Tensor, ys: Mapping[Any, Tensor], slices: Mapping[Any, tuple[slice, int]]) -> Tensor:
    """Sum over probes of each probe's mean cross-entropy (so every probe gets exactly its own gradient)."""
    loss = logits.new_zeros(())
    for t, (sl, c) in slices.items():
        lg = logits[sl, :, :c]  # [g, b, C_t]
        loss = loss + F.cross_entropy(lg.reshape(-1, c), ys[t].repeat(lg.shape[0])) * lg.shape[0]
    return loss


@torch.no_grad()
def evaluate_grid(
    model: nn.Module,
    x: Tensor,
    ys: Mapping[Any, Tensor],
    slices: Mapping[Any, tuple[slice, int]],
    *,
    batch_size: int = 256,
    device: str = "cpu",
) -> dict[Any, tuple[Tensor, Tensor]]:
    """Per task: accuracy (%) and mean cross-entropy of each of its probes, two tensors [g]."""
    model.eval()
    sums: dict[Any, list[Tensor]] = {}
    for i in range(0, len(x), batch_size):
        logits = model(x[i : i + batch_size].to(device))  # [G, b, C_max]
        for t, (sl, c) in slices.items():
            yb = ys[t][i : i + batch_size].to(device)
            lg = logits[sl, :, :c]
            correct = (lg.argmax(-1) == yb).sum(1).double()
            loss = F.cross_entropy(lg.transpose(1, 2), yb.expand(lg.shape[0], -1), reduction="none").sum(1).double()
            prev = sums.get(t)
            sums[t] = [correct, loss] if prev is None else [prev[0] + correct, prev[1] + loss]
    if not sums:
        raise ValueError("evaluate_grid: empty evaluation split")
    return {t: ((100.0 * c / len(x)).cpu(), (lo / len(x)).cpu()) for t, (c, lo) in sums.items()}


def _label_map(y: Labels) -> dict[Any, Tensor]:
    return {t: v.long() for t, v in y.items()} if isinstance(y, Mapping) else {None: y.long()}


def _class_counts(num_classes: int | Mapping[str, int] | None, ys_train: dict[Any, Tensor], ys_val: dict[Any, Tensor]):
    if isinstance(num_classes, Mapping):
        return {t: int(num_classes[t]) for t in ys_train}
    if num_classes is not None:
        return {t: int(num_classes) for t in ys_train}
    return {t: int(max(ys_train[t].max(), ys_val[t].max())) + 1 for t in ys_train}


def fit_probe_grid(
    kind: ProbeKind,
    cfg: ProbeConfig,
    x: Tensor,
    ys: Mapping[Any, Tensor],
    classes: Mapping[Any, int],
    *,
    generator: torch.Generator,
    device: str | torch.device = "cpu",
) -> tuple[nn.Module, dict[Any, tuple[slice, int]]]:
    """Train the (lr × wd) grid of ``kind`` probes of every task on the training inputs ``x`` and labels ``ys``
    (task -> [N]) as one stacked model: each task owns ``len(cfg.grid(kind))`` probes and its first
    ``classes[task]`` logits. ``generator`` draws the initialisation, then each epoch's order. Returns the
    model and each task's (probe rows, classes)."""
    grid = cfg.grid(kind)
    slices = _task_slices(classes, len(grid))
    model = build_probe_grid(
        kind, cfg, x.shape[-1], max(classes.values()), generator=generator, num_probes=len(grid) * len(classes)
    ).to(device)
    if isinstance(model, LinearProbeGrid):
        model.fit_standardizer(x.to(device))
    params, decay = _param_decay(model)
    lrs, wds = [lr for lr, _ in grid] * len(classes), [wd for _, wd in grid] * len(classes)
    opt = GridAdamW(params, lrs, wds, decay=decay, betas=(cfg.beta1, cfg.beta2))
    epochs = cfg.epochs if kind == "attentive" else cfg.linear_epochs
    n, bs = len(x), min(cfg.batch_size, len(x))
    steps_per_epoch = math.ceil(n / bs)
    total, warmup = epochs * steps_per_epoch, int(cfg.warmup_epochs * steps_per_epoch)
    step = 0
    for _ in range(epochs):
        model.train()
        order = torch.randperm(n, generator=generator)
        for i in range(0, n, bs):
            idx = order[i : i + bs]
            loss = _grid_loss(
                model(x[idx].to(device, non_blocking=True)), {t: y[idx].to(device) for t, y in ys.items()}, slices
            )
            opt.zero_grad()
            loss.backward()
            opt.step(lr_factor(step, total, warmup))
            step += 1
    return model, slices


def choose_probes(
    kind: ProbeKind,
    cfg: ProbeConfig,
    val: Mapping[Any, tuple[Tensor, Tensor]],
    test: Mapping[Any, tuple[Tensor, Tensor]] | None,
    *,
    seconds: float,
    extra: dict[str, Any] | None = None,
) -> dict[Any, GridResult]:
    """Per task, the probe of the grid with the best validation accuracy (ties: the lower validation loss),
    reported with its test accuracy; the whole grid is kept in the result. ``val`` / ``test``: task ->
    (accuracy %, loss) per probe, as :func:`evaluate_grid` returns them."""
    grid = cfg.grid(kind)
    results = {}
    for t, (val_acc, val_loss) in val.items():
        best = min(range(len(grid)), key=lambda i, va=val_acc, vl=val_loss: (-float(va[i]), float(vl[i])))
        results[t] = GridResult(
            kind=kind if kind == "linear" or cfg.depth == 1 else f"attentive{cfg.depth}",
            lrs=[lr for lr, _ in grid],
            weight_decays=[wd for _, wd in grid],
            val_acc=[float(a) for a in val_acc],
            val_loss=[float(v) for v in val_loss],
            test_acc=None if test is None else [float(a) for a in test[t][0]],
            best=best,
            epochs=cfg.epochs if kind == "attentive" else cfg.linear_epochs,
            seconds=seconds,
            extra=dict(extra or {}),
        )
    return results


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
    """Train the (lr × wd) grid of ``kind`` probes on cached features (:func:`fit_probe_grid`); choose on
    ``val``, report on ``test`` (:func:`choose_probes`).

    ``train``/``val``/``test``: (inputs, labels). Inputs are tokens [N, L, D] (attentive) or pooled features
    [N, D] (linear); labels int64 [N]. The features are frozen tensors: nothing here touches an encoder.

    Labels may be a mapping task -> [N] (with ``num_classes`` a mapping too): then one grid per task is
    stacked into the same probe dimension and every task's probes read the same batches in one forward
    pass (the inputs are read and normalised once for all tasks); returns task -> result. Each probe still
    trains exactly as it would alone (its loss term depends only on its parameters).
    """
    start = time.perf_counter()
    multi = isinstance(train[1], Mapping)
    ys_train, ys_val = _label_map(train[1]), _label_map(val[1])
    if len(train[0]) == 0 or any(len(v) != len(train[0]) for v in ys_train.values()):
        raise ValueError(
            f"train_probe_grid: {len(train[0])} inputs for labels of lengths {[len(v) for v in ys_train.values()]}"
        )
    classes = _class_counts(num_classes, ys_train, ys_val)
    gen = generator if generator is not None else make_generator("probe", 0)
    model, slices = fit_probe_grid(kind, cfg, train[0], ys_train, classes, generator=gen, device=device)
    val_res = evaluate_grid(model, val[0], ys_val, slices, device=str(device))
    test_res = None if test is None else evaluate_grid(model, test[0], _label_map(test[1]), slices, device=str(device))
    extra = {"trained_with_tasks": [str(k) for k in classes]} if multi else None
    results = choose_probes(kind, cfg, val_res, test_res, seconds=time.perf_counter() - start, extra=extra)
    return results if multi else results[None]
