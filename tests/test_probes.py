"""Probes: the folded attentive probe equals a literal multi-head implementation, the grid trains each probe
exactly as if it were alone, separable features are learned (~100 %) and shuffled labels give chance."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from levjepa.config import ConfigError, apply_overrides
from levjepa.eval.probes import AttentiveProbeGrid, LinearProbeGrid, ProbeConfig, probe_config
from levjepa.eval.source import MemorySource
from levjepa.eval.trainer import GridAdamW, _grid_loss, _task_slices, standardizer, train_probe_grid


def _ln(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def _literal_mha(q_in, kv_in, wq, bq, wk, bk, wv, bv, wo, bo, heads):
    """Textbook multi-head attention: q_in [Q, D], kv_in [L, D]; x @ W convention."""
    q, k, v = q_in @ wq + bq, kv_in @ wk + bk, kv_in @ wv + bv
    d = q.shape[-1]
    dh = d // heads
    outs = []
    for h in range(heads):
        s = slice(h * dh, (h + 1) * dh)
        a = torch.softmax(q[:, s] @ k[:, s].T / math.sqrt(dh), dim=-1)
        outs.append(a @ v[:, s])
    return torch.cat(outs, -1) @ wo + bo


def _literal_probe(grid: AttentiveProbeGrid, g: int, tokens: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
    """Probe g of the grid computed literally, clip by clip, with an arbitrary key bias (which must cancel)."""
    heads, out = grid.num_heads, []
    for x in tokens.double():
        for blk in grid.blocks:
            h = _ln(x, blk.norm1.weight[g], blk.norm1.bias[g])
            d = x.shape[-1]
            qkv = h @ blk.qkv.weight[g] + blk.qkv.bias[g]
            wq, wk, wv = blk.qkv.weight[g].split(d, dim=1)
            bq, bk, bv = blk.qkv.bias[g].split(d)
            x = x + _literal_mha(h, h, wq, bq, wk, bk, wv, bv, blk.proj.weight[g], blk.proj.bias[g], heads)
            del qkv
            h = _ln(x, blk.norm2.weight[g], blk.norm2.bias[g])
            x = (
                x
                + F.gelu(h @ blk.mlp.fc1.weight[g] + blk.mlp.fc1.bias[g]) @ blk.mlp.fc2.weight[g]
                + blk.mlp.fc2.bias[g]
            )
        p = grid.pool
        q0 = p.query[g][None]
        kv = _ln(x, p.norm_x.weight[g], p.norm_x.bias[g])
        z = q0 + _literal_mha(
            q0, kv, p.q.weight[g], p.q.bias[g], p.k.weight[g], key_bias, p.v.weight[g], p.v.bias[g],
            p.proj.weight[g], p.proj.bias[g], heads,
        )  # fmt: skip
        h = _ln(z, p.norm_mlp.weight[g], p.norm_mlp.bias[g])
        z = z + F.gelu(h @ p.mlp.fc1.weight[g] + p.mlp.fc1.bias[g]) @ p.mlp.fc2.weight[g] + p.mlp.fc2.bias[g]
        out.append((z @ grid.head.weight[g] + grid.head.bias[g])[0])
    return torch.stack(out)


@pytest.mark.parametrize("depth", [1, 4])
def test_attentive_probe_equals_literal_multihead_attention(depth):
    gen = torch.Generator().manual_seed(0)
    grid = AttentiveProbeGrid(3, 16, 5, depth=depth, num_heads=4, generator=gen).double()
    with torch.no_grad():  # move every parameter off its init so LN affines, biases etc. all matter
        for p in grid.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    tokens = torch.randn(4, 7, 16, generator=gen, dtype=torch.float64) * 2 + 1
    got = grid(tokens)
    assert got.shape == (3, 4, 5)
    with torch.no_grad():
        for g in range(3):
            want = _literal_probe(grid, g, tokens, key_bias=torch.randn(16, generator=gen, dtype=torch.float64))
            torch.testing.assert_close(got[g], want, rtol=1e-9, atol=1e-9)


def test_probe_is_order_invariant_over_tokens_but_not_blind_to_them():
    """One query over all tokens with no position encoding: a set function of the tokens."""
    gen = torch.Generator().manual_seed(1)
    grid = AttentiveProbeGrid(2, 16, 3, num_heads=2, generator=gen)
    with torch.no_grad():
        for p in grid.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    x = torch.randn(3, 10, 16, generator=gen)
    perm = torch.randperm(10, generator=gen)
    torch.testing.assert_close(grid(x), grid(x[:, perm]), rtol=1e-5, atol=1e-6)
    x2 = x.clone()
    x2[:, 3] += 2.0 * torch.randn(16, generator=gen)  # (a constant shift would vanish in the LayerNorm)
    assert (grid(x) - grid(x2)).abs().max() > 1e-3


@pytest.mark.parametrize("depth", [1, 3])
def test_a_key_mask_reads_as_if_the_masked_tokens_were_absent(depth):
    """A stream's fixed-size token buffer, partly empty, gives the logits of the tokens it holds: each row of the
    batch masks a different number of tokens, and what they hold (large random values) must not matter."""
    gen = torch.Generator().manual_seed(2)
    grid = AttentiveProbeGrid(2, 16, 3, depth=depth, num_heads=2, generator=gen).double()
    with torch.no_grad():
        for p in grid.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    x = torch.randn(3, 9, 16, generator=gen, dtype=torch.float64)
    kept = [9, 5, 1]
    key_mask = torch.arange(9)[None] >= 9 - torch.tensor(kept)[:, None]  # the last n tokens of each row
    got = grid(x + 50 * torch.randn(x.shape, generator=gen, dtype=x.dtype) * ~key_mask[..., None], key_mask)
    for b, n in enumerate(kept):
        torch.testing.assert_close(got[:, b], grid(x[b : b + 1, 9 - n :])[:, 0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(grid(x, torch.ones(3, 9, dtype=torch.bool)), grid(x), rtol=1e-12, atol=1e-12)


def test_grid_adamw_equals_torch_adamw_per_probe():
    gen = torch.Generator().manual_seed(0)
    lrs, wds = [1e-2, 3e-3, 1e-3], [0.0, 0.1, 0.8]
    w = torch.randn(3, 4, 5, generator=gen, requires_grad=True)
    b = torch.randn(3, 5, generator=gen, requires_grad=True)
    refs = [(w[g].detach().clone().requires_grad_(), b[g].detach().clone().requires_grad_()) for g in range(3)]
    opt = GridAdamW([w, b], lrs, wds, decay=[True, False])
    ref_opts = [
        torch.optim.AdamW([{"params": [rw], "weight_decay": wd}, {"params": [rb], "weight_decay": 0.0}], lr=lr)
        for (rw, rb), lr, wd in zip(refs, lrs, wds, strict=True)
    ]
    for step in range(5):
        x = torch.randn(6, 4, generator=gen)
        scale = 1.0 - 0.1 * step
        opt.zero_grad()
        ((x @ w + b[:, None]) ** 2).sum().backward()
        opt.step(scale)
        for (rw, rb), ropt, lr in zip(refs, ref_opts, lrs, strict=True):
            for group in ropt.param_groups:
                group["lr"] = lr * scale
            ropt.zero_grad()
            ((x @ rw + rb) ** 2).sum().backward()
            ropt.step()
    for g, (rw, rb) in enumerate(refs):
        torch.testing.assert_close(w[g], rw, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b[g], rb, rtol=1e-5, atol=1e-6)


def _copy_probe(src: torch.nn.Module, g: int, dst: torch.nn.Module) -> None:
    with torch.no_grad():
        for (name, p), (name2, q) in zip(src.named_parameters(), dst.named_parameters(), strict=True):
            assert name == name2
            q.copy_(p[g : g + 1])


def test_grid_trains_each_probe_as_if_alone():
    """Summing per-probe losses and stepping GridAdamW == training each probe by itself."""
    gen = torch.Generator().manual_seed(0)
    lrs, wds = [3e-3, 1e-3], [0.05, 0.4]
    grid = AttentiveProbeGrid(2, 8, 3, num_heads=2, generator=gen)
    singles = [AttentiveProbeGrid(1, 8, 3, num_heads=2) for _ in range(2)]
    for g, s in enumerate(singles):
        _copy_probe(grid, g, s)

    def opt_for(model, lr, wd):
        params = list(model.parameters())
        decay = [p.dim() >= 3 or n.endswith("query") for n, p in model.named_parameters()]
        return GridAdamW(params, lr, wd, decay=decay)

    opt = opt_for(grid, lrs, wds)
    s_opts = [opt_for(s, [lr], [wd]) for s, lr, wd in zip(singles, lrs, wds, strict=True)]
    for _ in range(3):
        x, y = torch.randn(5, 6, 8, generator=gen), torch.randint(0, 3, (5,), generator=gen)
        logits = grid(x)
        loss = F.cross_entropy(logits.reshape(-1, 3), y.repeat(2)) * 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        for s, so in zip(singles, s_opts, strict=True):
            so.zero_grad()
            F.cross_entropy(s(x)[0], y).backward()
            so.step()
    for g, s in enumerate(singles):
        for p, q in zip(grid.parameters(), s.parameters(), strict=True):
            torch.testing.assert_close(p[g : g + 1], q, rtol=1e-5, atol=1e-6)


def test_tasks_stacked_in_one_grid_train_as_separate_grids():
    """Two tasks (4 and 2 classes) in one stacked model == each task's probe trained alone."""
    gen = torch.Generator().manual_seed(5)
    joint = AttentiveProbeGrid(2, 8, 4, num_heads=2, generator=gen)  # probe 0: task a, probe 1: task b
    alone = {"a": AttentiveProbeGrid(1, 8, 4, num_heads=2), "b": AttentiveProbeGrid(1, 8, 2, num_heads=2)}
    with torch.no_grad():
        for g, t in enumerate(("a", "b")):
            for (name, p), q in zip(joint.named_parameters(), alone[t].parameters(), strict=True):
                q.copy_(p[g : g + 1, ..., : q.shape[-1]] if name.startswith("head") else p[g : g + 1])
    slices = _task_slices({"a": 4, "b": 2}, 1)

    def opt_for(model, n):
        decay = [p.dim() >= 3 or name.endswith("query") for name, p in model.named_parameters()]
        return GridAdamW(list(model.parameters()), [2e-3] * n, [0.1] * n, decay=decay)

    opt, opts = opt_for(joint, 2), {t: opt_for(m, 1) for t, m in alone.items()}
    for _ in range(3):
        x = torch.randn(6, 5, 8, generator=gen)
        ys = {"a": torch.randint(0, 4, (6,), generator=gen), "b": torch.randint(0, 2, (6,), generator=gen)}
        opt.zero_grad()
        _grid_loss(joint(x), ys, slices).backward()
        opt.step()
        for t, m in alone.items():
            opts[t].zero_grad()
            F.cross_entropy(m(x)[0], ys[t]).backward()
            opts[t].step()
    x = torch.randn(4, 5, 8, generator=gen)
    out = joint(x)
    torch.testing.assert_close(out[0], alone["a"](x)[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[1, :, :2], alone["b"](x)[0], rtol=1e-5, atol=1e-6)


def _separable_splits(num_classes: int, sizes=(384, 128, 256), *, tokens=12, dim=16, signal=3.0):
    """Each clip: Gaussian noise tokens, two of which (at random positions) carry its class vector."""
    means = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(100)) * signal
    splits = []
    for seed, n in enumerate(sizes):
        gen = torch.Generator().manual_seed(seed)
        y = torch.randint(0, num_classes, (n,), generator=gen)
        x = torch.randn(n, tokens, dim, generator=gen)
        pos = torch.stack([torch.randperm(tokens, generator=gen)[:2] for _ in range(n)])
        x[torch.arange(n)[:, None], pos] += means[y][:, None]
        splits.append((x.half(), y))  # cached tokens are fp16
    return splits


def test_probes_reach_100_percent_on_separable_features_and_chance_on_shuffled_labels():
    gen = torch.Generator().manual_seed(0)
    c = 4
    train, val, test = _separable_splits(c)
    cfg = ProbeConfig(lrs=(1e-2, 3e-3), weight_decays=(0.01,), epochs=25, batch_size=32)
    res = train_probe_grid("attentive", cfg, train, val, test, num_classes=c, generator=gen)
    assert res.best_val >= 98.0 and res.best_test >= 98.0, res.to_json()
    pooled = [(x.float().mean(1), y) for x, y in (train, val, test)]
    lin = train_probe_grid("linear", cfg, *pooled, num_classes=c, generator=gen)
    assert lin.best_test >= 98.0, lin.to_json()

    # shuffled labels (every split, independently): the features say nothing about them, so accuracy is
    # chance, 25 % within binomial noise (shuffling only the training labels would instead learn a random
    # but consistent relabelling of the 4 clusters: any accuracy from 0 to 100 %, 25 % only on average)
    def shuffle(split):
        return split[0], split[1][torch.randperm(len(split[1]), generator=gen)]

    sigma = 100 * math.sqrt(0.25 * 0.75 / len(test[1]))
    sh = train_probe_grid("attentive", cfg, *map(shuffle, (train, val, test)), num_classes=c, generator=gen)
    assert abs(sh.best_test - 25.0) < 4 * sigma, sh.to_json()
    shl = train_probe_grid("linear", cfg, *map(shuffle, pooled), num_classes=c, generator=gen)
    assert abs(shl.best_test - 25.0) < 4 * sigma, shl.to_json()
    # the whole grid is reported, the best chosen on validation
    js = res.to_json()
    assert len(js["grid"]) == 2 and js["best"]["val_acc"] == max(r["val_acc"] for r in js["grid"])
    # several tasks trained in one stacked grid: each keeps its own accuracy (separable vs chance)
    both = train_probe_grid(
        "attentive",
        cfg,
        (train[0], {"real": train[1], "noise": shuffle(train)[1]}),
        (val[0], {"real": val[1], "noise": shuffle(val)[1]}),
        (test[0], {"real": test[1], "noise": shuffle(test)[1]}),
        num_classes={"real": c, "noise": c},
        generator=gen,
    )
    assert both["real"].best_test >= 98.0 and abs(both["noise"].best_test - 25.0) < 4 * sigma


def test_linear_probe_standardises_with_train_statistics():
    """The standardiser streamed over batches of 7 (float64 sums) is the whole split's mean and std."""
    gen = torch.Generator().manual_seed(0)
    probe = LinearProbeGrid(2, 3, 2, generator=gen)
    x = torch.randn(50, 3, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 100.0, 0.01]) + 7
    mean, std = standardizer(MemorySource({"x": x}, {"t": torch.zeros(50)}), "x", batch_size=7)
    torch.testing.assert_close(mean, x.mean(0).float(), atol=0, rtol=1e-6)
    torch.testing.assert_close(std, x.std(0, unbiased=False).float(), atol=0, rtol=1e-5)
    probe.set_standardizer(mean, std)
    z = (x.float() - probe.feat_mean) / probe.feat_std
    torch.testing.assert_close(z.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(z.std(0, unbiased=False), torch.ones(3), atol=1e-4, rtol=0)


def test_probe_config_validates_and_overrides():
    cfg = apply_overrides(probe_config("demo"), ["depth=4", "lrs=1e-3,1e-4"])
    assert cfg.depth == 4 and cfg.lrs == (1e-3, 1e-4)
    assert len(probe_config("full").grid("attentive")) == 20  # V-JEPA 2's 5 lr x 4 wd
    with pytest.raises(ConfigError, match="depth"):
        ProbeConfig(depth=0)
    with pytest.raises(ConfigError, match="weight_decays"):
        ProbeConfig(weight_decays=())
    with pytest.raises(ValueError, match="budget"):
        probe_config("huge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tokens must be"):
        AttentiveProbeGrid(1, 8, 2, num_heads=2)(torch.zeros(2, 8))
