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
(:func:`build_probe_grid`); how they train — the loss, the optimiser, the schedule, the choice on
validation — is ``levjepa.eval.trainer``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from levjepa.config import check

__all__ = ["AttentiveProbeGrid", "LinearProbeGrid", "ProbeConfig", "ProbeKind", "build_probe_grid", "probe_config"]

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
    def set_standardizer(self, mean: Tensor, std: Tensor) -> None:
        """Fix the per-feature mean / std (of the training features: ``levjepa.eval.trainer.standardizer``)."""
        self.feat_mean.copy_(mean)
        self.feat_std.copy_(std)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[-1] != self.dim:
            raise ValueError(f"linear probe: features must be [B, {self.dim}], got {list(x.shape)}")
        z = (x.to(self.feat_mean.dtype) - self.feat_mean) / self.feat_std
        return self.head(z.expand(self.num_probes, *z.shape))


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
