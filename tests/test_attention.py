"""Attention masks from the tokens actually present, and the causality they buy in the whole encoder."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from levjepa.model import VideoEncoder, encoder_config
from levjepa.model.attention import (
    SHORT_KEYS,
    TokenMeta,
    attend,
    attend_spans,
    attn_bias,
    bidirectional,
    block_causal,
    build_attn_mask,
    frame_kernel,
    key_spans,
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


# ---- whole frames without a mask ----------------------------------------------------------------------------


def _frames_meta(sizes: list[int], cls: str | None, first_slot: int = 0) -> TokenMeta:
    """Patches of consecutive slots (``sizes[i]`` tokens of slot ``first_slot + i``) with CLS at the newest slot
    first (``cls="first"``), last (the streaming encoder's keys) or absent."""
    frame = torch.cat([torch.full((n,), first_slot + i) for i, n in enumerate(sizes)])
    is_cls = torch.zeros_like(frame, dtype=torch.bool)
    newest = torch.tensor([first_slot + len(sizes) - 1])
    if cls == "first":
        frame, is_cls = torch.cat([newest, frame]), torch.cat([torch.tensor([True]), is_cls])
    elif cls == "last":
        frame, is_cls = torch.cat([frame, newest]), torch.cat([is_cls, torch.tensor([True])])
    return TokenMeta(frame[None], is_cls[None])


@pytest.mark.parametrize("window", [None, 1, 2, 5])
@pytest.mark.parametrize(
    ("q_sizes", "q_cls", "k_sizes", "k_cls", "k_first"),
    [
        ([4, 4, 4, 4], "first", [4, 4, 4, 4], "first", 0),  # a clip: CLS, then whole frames
        ([3, 1, 5, 2], "first", [3, 1, 5, 2], "first", 0),  # frames of different sizes (tube dropping, ragged)
        ([4, 4], None, [4, 4, 4, 4], None, -2),  # streaming: two new frames against the cache and themselves
        ([1], "first", [4, 4, 4], "last", 0),  # a CLS readout over a stream's cache
    ],
)
def test_key_spans_are_the_block_causal_mask(q_sizes, q_cls, k_sizes, k_cls, k_first, window):
    """The spans stand for exactly the mask ``block_causal`` gives, whatever the frame sizes and windows."""
    q = _frames_meta(q_sizes, q_cls)
    if q_cls == "first" and len(q_sizes) == 1 and k_cls == "last":
        q = TokenMeta(torch.tensor([[len(k_sizes) - 1]]), torch.tensor([[True]]))  # CLS alone, at the newest slot
    k = _frames_meta(k_sizes, k_cls, first_slot=k_first)
    spans = key_spans("block_causal", q, k, window)
    assert spans is not None
    assert torch.equal(spans.dense(k.frame.shape[1]), block_causal(q, k, window)[0])
    # every query is in exactly one span, in order
    assert [a for a, _ in spans.queries] == [0] + [b for _, b in spans.queries[:-1]]


def test_key_spans_refuse_layouts_that_are_not_whole_frames():
    m = _frames_meta([3, 3], "first")
    shuffled = TokenMeta(m.frame[:, [0, 1, 4, 2, 5, 3, 6]], m.is_cls)  # slots 0, 1, 0, 1, ...: 3 key ranges a row
    assert key_spans("block_causal", shuffled, shuffled) is None
    per_clip = TokenMeta(m.frame.expand(2, -1), m.is_cls.expand(2, -1))  # one row per clip (dropping)
    assert key_spans("block_causal", per_clip, per_clip) is None
    with pytest.raises(ValueError, match="valid choices are block_causal, bidirectional"):
        key_spans("causal", m, m)


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("queries", [None, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attend_spans_equals_masked_attention_forward_and_backward(window, queries, dtype):
    """Unmasked attention over each run's keys is masked SDPA over all of them: outputs and the gradients of
    queries, keys and values within 1e-5 (float32; 1e-12 in float64), long frames through SDPA's fused
    kernel and short ones through the two-matmul path."""
    g = torch.Generator().manual_seed(0)
    m = _frames_meta([70, 70, 70, 70], "first")  # 281 tokens: long and short runs of keys
    spans = key_spans("block_causal", m, m, window)
    assert spans is not None
    bias = attn_bias(block_causal(m, m, window)[:, None], torch.zeros(1, dtype=dtype))
    b, h, n, hd = 2, 3, m.frame.shape[1], 16
    q, k, v = (torch.randn(b, h, n, hd, generator=g, dtype=dtype, requires_grad=True) for _ in range(3))
    nq = n if queries is None else queries
    grad = torch.randn(b, h, nq, hd, generator=g, dtype=dtype)
    want = torch.nn.functional.scaled_dot_product_attention(q[:, :, :nq], k, v, attn_mask=bias[:, :, :nq])
    got = attend_spans(q[:, :, :nq], k, v, spans, queries)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for w, x in zip(
        (want, *torch.autograd.grad(want, (q, k, v), grad)),
        (got, *torch.autograd.grad(got, (q, k, v), grad)),
        strict=True,
    ):
        assert x.shape == w.shape
        assert float((x - w).abs().max()) <= tol * max(1.0, float(w.abs().max()))


def test_flex_kernel_computes_the_spans_forward():
    """The FlexAttention form of the spans (the CUDA option) is the same function; PyTorch's CPU FlexAttention
    has a forward only, so the gradients are checked by the GPU test."""
    g = torch.Generator().manual_seed(1)
    m = _frames_meta([8, 8, 8], "first")
    spans = key_spans("block_causal", m, m, 2)
    assert spans is not None
    q, k, v = (torch.randn(1, 2, 25, 16, generator=g) for _ in range(3))
    with frame_kernel("flex"):
        got = attend_spans(q, k, v, spans)
        cls = attend_spans(q[:, :, :1], k, v, spans, queries=1)  # CLS alone (the last block of training)
    want = attend_spans(q, k, v, spans)
    assert float((got - want).abs().max()) < 1e-5
    assert float((cls - want[:, :, :1]).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="valid choices are sdpa, flex"), frame_kernel("dense"):
        pass


class _LargestScores(TorchDispatchMode):
    """Records the shape of every ``[..., n, n]`` output of any op (``n`` the tokens of a clip)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.square = n, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == t.shape[-2] == self.n:
                self.square.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("window", [None, 2])
def test_no_token_by_token_tensor_exists_when_whole_frames_are_kept(window):
    """Inference and ρ = 0 training keep whole frames: no op of the forward or the backward makes an ``L × L``
    tensor (the attention pattern costs O(L)); with dropping, the per-clip bias does."""
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=0.0))
    video = torch.randn(2, 3, 6, 32, 32)  # 6 frames of 16 tokens
    n = 1 + 6 * 16
    with _LargestScores(n) as seen:
        enc.forward_features(video, window=window).tokens.sum().backward()
        enc.forward_views(video[None], generator=torch.Generator().manual_seed(0)).sum().backward()  # ρ = 0
    assert seen.square == []
    dropping = VideoEncoder(encoder_config("vit-test", drop_ratio=0.25))
    with _LargestScores(1 + 72) as seen:
        dropping.forward_features(video, drop=True, generator=torch.Generator().manual_seed(0))
    assert seen.square  # the check can fail


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["sdpa", "flex"])
def test_spans_on_cuda_equal_the_dense_mask(kernel):
    """Whole frames on CUDA, by each frame kernel, against SDPA with the dense mask on the same GPU: outputs and
    the gradients of queries, keys and values (float32), and bf16 outputs within bf16's rounding."""
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    g = torch.Generator(device="cuda").manual_seed(0)
    m = _frames_meta([196] * 8, "first")  # 8 frames of 14 × 14 patches, CLS first
    spans = key_spans("block_causal", m, m)
    assert spans is not None
    allowed = block_causal(m, m)[:, None].cuda()
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        q, k, v = (torch.randn(2, 4, 1 + 8 * 196, 64, generator=g, device="cuda", dtype=dtype) for _ in range(3))
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        grad = torch.randn_like(q)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        with frame_kernel(kernel):
            got = attend_spans(q, k, v, spans)
        for w, x in zip(
            (want, *torch.autograd.grad(want, (q, k, v), grad)),
            (got, *torch.autograd.grad(got, (q, k, v), grad)),
            strict=True,
        ):
            assert float((x - w).float().abs().max()) <= tol * max(1.0, float(w.float().abs().max()))
