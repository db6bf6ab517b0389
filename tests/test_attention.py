"""Attention masks from the tokens actually present, and the causality they buy in the whole encoder."""

from __future__ import annotations

import copy

import pytest
import torch

from levjepa.model import VideoEncoder, encoder_config
from levjepa.model.attention import (
    SHORT_KEYS,
    TokenMeta,
    attend,
    attn_bias,
    bidirectional,
    block_causal,
    build_attn_mask,
)


def meta(frames: list[int], cls_at: int | None = 0) -> TokenMeta:
    is_cls = torch.zeros(1, len(frames), dtype=torch.bool)
    if cls_at is not None:
        is_cls[0, cls_at] = True
    return TokenMeta(torch.tensor([frames]), is_cls)


def test_block_causal_truth_table_for_dropped_tokens():
    # CLS (newest slot 3), then the kept patches of slots 0, 0, 2, 3: slot 1 was dropped entirely
    m = meta([3, 0, 0, 2, 3])
    expected = torch.tensor(
        [
            [1, 1, 1, 1, 1],  # CLS reads itself and every patch
            [0, 1, 1, 0, 0],  # slot-0 patches read slot 0 only, never CLS
            [0, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],  # slot 2 reads slots 0 and 2 (1 is absent), not 3
            [0, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(block_causal(m, m)[0], expected)
    windowed = expected.clone()
    windowed[3, 1:3] = False  # window of 2 slots: slot 2 reads slots 1..2
    windowed[4, 1:3] = False  # slot 3 reads 2..3
    windowed[0, 1:3] = False  # CLS (slot 3) reads the last 2 slots
    assert torch.equal(block_causal(m, m, window=2)[0], windowed)


def test_block_causal_equals_a_brute_force_loop_on_random_token_sets():
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 6, (3, 12), generator=g).sort(dim=1).values
    frames = torch.cat([torch.full((3, 1), 5), frames], dim=1)  # CLS first at the newest slot
    is_cls = torch.zeros(1, 13, dtype=torch.bool)
    is_cls[0, 0] = True
    m = TokenMeta(frames, is_cls)
    got = build_attn_mask("block_causal", m, m)
    assert got.shape == (3, 1, 13, 13)
    for b in range(3):
        for i in range(13):
            for j in range(13):
                if i == 0:
                    want = True
                else:
                    want = j != 0 and frames[b, j] <= frames[b, i]
                assert bool(got[b, 0, i, j]) == want


def test_bidirectional_reads_everything_and_needs_no_mask():
    m = meta([1, 0, 1])
    assert bidirectional(m, m).all()
    assert build_attn_mask("bidirectional", m, m) is None
    with pytest.raises(ValueError, match="block-causal"):
        build_attn_mask("bidirectional", m, m, window=2)
    with pytest.raises(ValueError, match="valid choices are block_causal, bidirectional"):
        build_attn_mask("causal", m, m)


def _perturb_after(video: torch.Tensor, t: int) -> torch.Tensor:
    out = video.clone()
    out[:, :, t + 1 :] = torch.randn_like(out[:, :, t + 1 :])
    return out


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("tubelet", [1, 2])
def test_changing_future_frames_leaves_the_past_unchanged_and_changes_cls(drop, tubelet):
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", tubelet=tubelet, drop_ratio=0.5)).eval()
    video = torch.randn(2, 3, 8, 24, 24)
    for t in range(tubelet - 1, 7, tubelet):  # t: the last frame left untouched
        changed = _perturb_after(video, t)
        with torch.no_grad():
            a = enc.forward_features(video, drop=drop, generator=torch.Generator().manual_seed(1))
            b = enc.forward_features(changed, drop=drop, generator=torch.Generator().manual_seed(1))
        assert torch.equal(a.positions, b.positions)  # same keep_idx: it depends on the seed, not the pixels
        past = a.positions[..., 0] <= t // tubelet
        assert past.any() and (~past).any()
        torch.testing.assert_close(a.patches[past], b.patches[past], rtol=0, atol=1e-6)
        assert (a.patches[~past] - b.patches[~past]).abs().max() > 1e-3
        assert (a.cls - b.cls).abs().max() > 1e-3


def test_bidirectional_lets_the_future_in():
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", attention="bidirectional")).eval()
    video = torch.randn(1, 3, 4, 16, 16)
    with torch.no_grad():
        a, b = enc.forward_features(video), enc.forward_features(_perturb_after(video, 1))
    past = a.positions[..., 0] <= 1
    assert (a.patches[past] - b.patches[past]).abs().max() > 1e-3


@pytest.mark.parametrize("attention", ["block_causal", "bidirectional"])
def test_patches_never_read_cls_under_block_causal(attention):
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", attention=attention)).eval()
    other = copy.deepcopy(enc)
    with torch.no_grad():
        other.cls_token.add_(torch.randn_like(other.cls_token))
        video = torch.randn(2, 3, 4, 16, 16)
        a, b = enc.forward_features(video), other.forward_features(video)
    assert (a.cls - b.cls).abs().max() > 1e-3
    if attention == "block_causal":
        assert torch.equal(a.patches, b.patches)
    else:  # sanity: the check can fail
        assert (a.patches - b.patches).abs().max() > 1e-4


@pytest.mark.gpu
def test_cuda_path_equals_cpu_path():
    """The CUDA kernels SDPA picks for a boolean mask (memory-efficient) equal the CPU path."""
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", patch_size=16, dim=64, heads=2))
    gpu = copy.deepcopy(enc).cuda()
    views = (torch.randn(1, 3, 3, 16, 64, 64), torch.randn(2, 3, 3, 16, 32, 32))
    cpu_cls = enc.forward_views(*views, generator=torch.Generator().manual_seed(5))
    gpu_cls = gpu.forward_views(*(v.cuda() for v in views), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(gpu_cls.cpu(), cpu_cls, rtol=1e-4, atol=1e-4)
    cpu_cls.square().sum().backward()
    gpu_cls.square().sum().backward()
    for (name, p), q in zip(enc.named_parameters(), gpu.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize("mask", ["none", "bias", "bool"])
@pytest.mark.parametrize("keys", [30, SHORT_KEYS, SHORT_KEYS + 1])
def test_attend_is_sdpa_on_short_and_long_sequences(mask, keys, monkeypatch):
    """The short-sequence CPU path (two matmuls and a softmax) is the same function as SDPA, forward and
    backward, on block-causal masks of dropped tokens; beyond ``SHORT_KEYS`` keys, or with a boolean mask,
    SDPA itself runs."""
    g = torch.Generator().manual_seed(keys)
    b, h, hd = 3, 2, 16
    frames = torch.sort(torch.randint(0, 8, (b, keys), generator=g), dim=1).values
    tokens = TokenMeta(frames, torch.zeros(b, keys, dtype=torch.bool))
    allowed = block_causal(tokens, tokens)[:, None]  # [B, 1, L, L], every row reads at least itself
    attn_mask = {"none": None, "bias": attn_bias(allowed, torch.zeros(1)), "bool": allowed}[mask]
    q, k, v = (torch.randn(b, h, keys, hd, generator=g, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, keys, hd, generator=g)

    sdpa = torch.nn.functional.scaled_dot_product_attention
    want = sdpa(q, k, v, attn_mask=attn_mask)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    calls = []
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw)
    )
    got = attend(q, k, v, attn_mask)
    got_grads = torch.autograd.grad(got, (q, k, v), grad)
    assert bool(calls) == (keys > SHORT_KEYS or mask == "bool")
    for w, x in zip((want, *want_grads), (got, *got_grads), strict=True):
        assert torch.allclose(x, w, rtol=0, atol=1e-6 * float(w.abs().max()))
