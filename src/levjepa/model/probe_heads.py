"""The attentive and linear probe heads, stacked: ``G`` independent heads read the same inputs in one pass.

One head definition serves every readout of levjepa: the frozen probes train a grid of them
(``levjepa.eval.probes``, ``levjepa.eval.trainer``), a kept probe is one row of that grid (``G = 1``), and
the classifier (``levjepa.model.classifier``: encoder + head) fine-tunes and runs the same module. The
architecture, the V-JEPA protocol it follows, and why the single-query cross-attention never projects the
tokens are in ``levjepa.eval.probes``'s module doc; ``tests/test_probes.py`` checks it against a literal
multi-head implementation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["AttentiveProbeGrid", "LinearProbeGrid"]


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

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        g, b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(g * b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = None if key_mask is None else key_mask[None, :, None, None, :].expand(g, -1, -1, -1, -1).flatten(0, 1)
        a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)  # [G*B, heads, L, d_h]
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

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """x: [B, L, D] shared by all G probes, or [G, B, L, D] (after self-attention blocks). -> [G, B, D].
        ``key_mask`` [B, L] (True = read): the query attends only those tokens."""
        g, d = self.query.shape
        nh, dh = self.heads, d // self.heads
        xhat = F.layer_norm(x, (d,))  # LN without its affine part; the per-probe γ, β are folded below
        gamma, beta = self.norm_x.weight, self.norm_x.bias  # [G, D]
        q = self.q(self.query[:, None])[:, 0].view(g, nh, dh)  # [G, nh, dh]
        u = torch.einsum("gihd,ghd->ghi", self.k.weight.view(g, d, nh, dh), q) * gamma[:, None] / math.sqrt(dh)
        if x.dim() == 3:  # shared tokens: one GEMM for every probe and head
            b = x.shape[0]
            logits = xhat @ u.reshape(g * nh, d).T  # [B, L, G*nh]
            if key_mask is not None:
                logits = logits.masked_fill(~key_mask[:, :, None], float("-inf"))
            attn = logits.softmax(dim=1)
            pooled = (attn.transpose(1, 2) @ xhat).view(b, g, nh, d).transpose(0, 1)  # [G, B, nh, D]
        else:
            logits = torch.einsum("gbld,ghd->gbhl", xhat, u)
            if key_mask is not None:
                logits = logits.masked_fill(~key_mask[None, :, None, :], float("-inf"))
            attn = logits.softmax(dim=-1)
            pooled = torch.einsum("gbhl,gbld->gbhd", attn, xhat)
        pooled = pooled * gamma[:, None, None] + beta[:, None, None]  # Σ_n a_n LN(x_n) per head
        wv, bv = self.v.weight.view(g, d, nh, dh), self.v.bias
        assert bv is not None  # the value projection has a bias
        heads_out = torch.einsum("gbhi,gihd->gbhd", pooled, wv) + bv.view(g, 1, nh, dh)
        z = self.query[:, None] + self.proj(heads_out.flatten(2))  # [G, B, D], residual with the query
        return z + self.mlp(self.norm_mlp(z))


class AttentiveProbeGrid(nn.Module):
    """``num_probes`` independent attentive probes (see module doc) reading the same tokens.

    ``forward(tokens [B, L, D], key_mask [B, L] | None) -> logits [G, B, C]``; tokens may be fp16 (computed in
    fp32). ``key_mask`` (True = read) leaves tokens out as if they were absent: a stream that has not yet filled
    its window reads a fixed-size token buffer (``levjepa.formats.deployment.classifier_graphs``).
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
        std, gen = init_std, generator
        self.blocks = nn.ModuleList(
            _StackedSelfBlock(num_probes, dim, heads, hidden, std=std, gen=gen, layer_id=i + 1)
            for i in range(depth - 1)
        )
        self.pool = _StackedQueryBlock(num_probes, dim, heads, hidden, std=std, gen=gen, layer_id=max(1, depth - 1))
        self.head = _StackedLinear(num_probes, dim, num_classes, std=std, gen=gen)
        self.num_probes, self.dim, self.num_classes, self.depth, self.num_heads = (
            num_probes,
            dim,
            num_classes,
            depth,
            heads,
        )

    def forward(self, tokens: Tensor, key_mask: Tensor | None = None) -> Tensor:
        if tokens.dim() != 3 or tokens.shape[-1] != self.dim:
            raise ValueError(f"attentive probe: tokens must be [B, L, {self.dim}], got {list(tokens.shape)}")
        x = tokens.to(self.pool.query.dtype)  # fp16 cached tokens are computed in the probe's dtype
        if len(self.blocks):
            x = x.expand(self.num_probes, *x.shape).contiguous()
            for blk in self.blocks:
                x = blk(x, key_mask)
        return self.head(self.pool(x, key_mask))  # [G, B, C]


class LinearProbeGrid(nn.Module):
    """``num_probes`` linear classifiers on standardised pooled features: ``[B, D] -> [G, B, C]``."""

    feat_mean: Tensor  # buffers [D]: the training features' mean and standard deviation
    feat_std: Tensor

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
