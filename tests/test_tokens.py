"""Tokens: per-frame patch embedding, positions that travel with tokens, token dropping (keyed per clip or
from a generator), bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from levjepa.model import VideoEncoder, encoder_config
from levjepa.model.tokens import PatchEmbed, gather_tokens, grid_positions, num_kept, sample_keep_idx
from levjepa.rng import counter_hash, fold_keys, sample_keys


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_kept_counts_follow_round_half_up_with_at_least_one():
    assert num_kept(3136, 0.95) == 157  # 16 x 224 x 224, patch 16
    assert num_kept(576, 0.95) == 29  # 16 x 96 x 96
    assert num_kept(196, 0.9) == 20 and num_kept(10, 0.75) == 3  # 2.5 rounds up
    assert num_kept(50, 0.999) == 1 and num_kept(7, 0.0) == 7


def test_encoder_keeps_157_of_3136_and_29_of_576_tokens_per_view():
    enc = VideoEncoder(encoder_config("vit-test", patch_size=16))
    with torch.no_grad():
        big = enc.forward_features(torch.randn(1, 3, 16, 224, 224), drop=True, generator=gen())
        small = enc.forward_features(torch.randn(2, 3, 16, 96, 96), drop=True, generator=gen())
        full = enc.forward_features(torch.randn(1, 3, 16, 96, 96))
    assert big.patches.shape == (1, 157, 32) and big.positions.shape == (1, 157, 3)
    assert small.patches.shape == (2, 29, 32)
    assert full.patches.shape == (1, 576, 32)  # inference: every token, no dropping


def test_kept_tokens_carry_their_original_grid_position_and_pixels():
    torch.manual_seed(0)
    pe = PatchEmbed(patch_size=4, tubelet=2, in_chans=3, dim=5)
    video = torch.randn(2, 3, 6, 12, 16)  # grid (T', H', W') = (3, 3, 4), N = 36
    keep_idx = sample_keep_idx(2, (3, 3, 4), 0.7, "uniform", gen())
    tokens, positions = pe(video, keep_idx)
    assert keep_idx.shape == (2, 11) and positions.dtype == torch.long
    for b in range(2):
        for j in range(keep_idx.shape[1]):
            t, y, x = positions[b, j].tolist()
            assert keep_idx[b, j] == (t * 3 + y) * 4 + x
            pixels = video[b, :, 2 * t : 2 * t + 2, 4 * y : 4 * y + 4, 4 * x : 4 * x + 4].reshape(-1)
            torch.testing.assert_close(tokens[b, j], pe.proj(pixels))


def test_inference_sees_every_token_in_grid_order():
    enc = VideoEncoder(encoder_config("vit-test", tubelet=2))
    with torch.no_grad():
        out = enc.forward_features(torch.randn(2, 3, 4, 16, 24))
    assert torch.equal(out.positions, grid_positions(2, 2, 3).expand(2, -1, -1))
    assert out.positions[0, :, 0].tolist() == [0] * 6 + [1] * 6


def test_dropping_before_or_after_the_embedding_gives_identical_tokens():
    torch.manual_seed(0)
    pe = PatchEmbed(patch_size=16, tubelet=1, in_chans=3, dim=64)
    video = torch.randn(2, 3, 16, 96, 96)
    keep_idx = sample_keep_idx(2, pe.grid(video), 0.95, "uniform", gen())
    kept_first, pos_first = pe(video, keep_idx)  # gather pixels, embed 29 patches
    all_tokens, all_pos = pe(video)  # the paper's order: embed 576, then drop
    torch.testing.assert_close(kept_first, gather_tokens(all_tokens, keep_idx), rtol=0, atol=1e-6)
    assert torch.equal(pos_first, gather_tokens(all_pos, keep_idx))


def test_keep_idx_is_sorted_per_clip_different_across_clips_and_seeded():
    a = sample_keep_idx(8, (16, 14, 14), 0.95, "uniform", gen(1))
    assert (a.diff(dim=1) > 0).all()  # ascending, no repeats: time-major order is kept
    assert len({tuple(row) for row in a.tolist()}) == 8
    assert torch.equal(a, sample_keep_idx(8, (16, 14, 14), 0.95, "uniform", gen(1)))
    assert not torch.equal(a, sample_keep_idx(8, (16, 14, 14), 0.95, "uniform", gen(2)))


def test_uniform_dropping_keeps_every_token_equally_often():
    draws, n, k = 4000, 64, 16
    keep_idx = sample_keep_idx(draws, (4, 4, 4), 1 - k / n, "uniform", gen(3))
    counts = torch.bincount(keep_idx.flatten(), minlength=n).double()
    expected = draws * k / n  # 1000 per token
    std = np.sqrt(draws * (k / n) * (1 - k / n))
    assert (counts - expected).abs().max() < 5 * std
    # frames are not kept alike: the per-frame spatial sets of one clip differ (unlike tube mode)
    pos = grid_positions(4, 4, 4)[keep_idx[:50]]
    assert any(_spatial_sets(p)[0] != _spatial_sets(p)[1] for p in pos)


def _spatial_sets(positions: torch.Tensor) -> list[set[tuple[int, int]]]:
    t_max = int(positions[:, 0].max()) + 1
    return [{(y, x) for t, y, x in positions.tolist() if t == s} for s in range(t_max)]


def test_tube_mode_keeps_identical_spatial_positions_in_every_frame():
    keep_idx = sample_keep_idx(6, (8, 6, 6), 0.9, "tube", gen(4))
    assert keep_idx.shape == (6, 8 * num_kept(36, 0.9))  # 4 spatial positions x 8 frames
    positions = grid_positions(8, 6, 6)[keep_idx]
    spatial = []
    for pos in positions:
        sets = _spatial_sets(pos)
        assert len(sets) == 8 and all(s == sets[0] for s in sets) and len(sets[0]) == 4
        spatial.append(frozenset(sets[0]))
    assert len(set(spatial)) > 1  # but different clips keep different positions
    enc = VideoEncoder(encoder_config("vit-test", drop_mode="tube", drop_ratio=0.75))
    with torch.no_grad():
        out = enc.forward_features(torch.randn(2, 3, 4, 32, 32), drop=True, generator=gen())
    assert out.patches.shape[1] == 4 * 4  # 16 spatial positions -> 4, in each of 4 frames
    assert all(all(s == _spatial_sets(p)[0] for s in _spatial_sets(p)) for p in out.positions)


@pytest.mark.parametrize(
    ("video", "needle"),
    [
        (torch.randn(1, 4, 2, 16, 16), r"expected 3 channels .* got shape \(1, 4, 2, 16, 16\)"),
        (torch.randn(1, 3, 2, 20, 16), r"multiples of the patch size 8, got shape \(1, 3, 2, 20, 16\)"),
        (torch.randn(1, 3, 2, 16, 12), r"multiples of the patch size 8"),
        (torch.randn(0, 3, 2, 16, 16), r"empty tensor of shape \(0, 3, 2, 16, 16\)"),
        (torch.randn(1, 3, 0, 16, 16), r"empty tensor"),
        (torch.zeros(1, 3, 2, 16, 16, dtype=torch.uint8), r"dtype torch.uint8 .*normalised"),
        (torch.zeros(1, 3, 2, 16, 16, dtype=torch.int64), r"dtype torch.int64"),
        (torch.randn(3, 2, 16, 16), r"got shape \(3, 2, 16, 16\) \(4 dims\)"),
        (np.zeros((1, 3, 2, 16, 16), dtype=np.float32), r"got ndarray"),
    ],
)
def test_bad_video_raises_naming_input_shape_and_expectation(video, needle):
    enc = VideoEncoder(encoder_config("vit-test"))
    with pytest.raises(ValueError, match=r"^video: .*" + needle):
        enc.forward_features(video)


def test_video_on_another_device_is_named():
    enc = VideoEncoder(encoder_config("vit-test")).to("meta")
    with pytest.raises(ValueError, match=r"^video: tensor of shape \(1, 3, 2, 16, 16\) is on cpu, the encoder on meta"):
        enc(torch.randn(1, 3, 2, 16, 16))


def test_clip_length_must_be_a_multiple_of_the_tubelet():
    enc = VideoEncoder(encoder_config("vit-test", tubelet=2))
    with pytest.raises(ValueError, match=r"T must be a multiple of the tubelet 2, got shape \(1, 3, 3, 16, 16\)"):
        enc(torch.randn(1, 3, 3, 16, 16))


def test_dropping_needs_an_explicit_generator():
    enc = VideoEncoder(encoder_config("vit-test"))
    with pytest.raises(ValueError, match=r"torch\.Generator"):
        enc(torch.randn(1, 3, 2, 16, 16), drop=True)
    with pytest.raises(ValueError, match=r"keys=\.\.\."):
        enc.forward_views(torch.randn(1, 2, 3, 2, 16, 16))


# ---- keyed dropping (training): a clip's kept tokens are a function of its key alone


def keys(n: int, epoch: int = 0) -> torch.Tensor:
    return sample_keys(0, "drop", epoch, positions=range(n))


def test_counter_hash_is_pinned_distinct_per_row_and_bounded():
    # the kept tokens of a run are part of its reproducibility (resume, another GPU count, CPU vs CUDA):
    # these values must never change silently
    k = torch.tensor([1, 2**62 + 12345], dtype=torch.int64)
    assert counter_hash(k, 4).tolist() == [
        [3405691463, 0, 539734128, 3401107691],
        [1701962156, 2477979782, 3438711698, 1225475692],
    ]
    assert fold_keys(k, 3).tolist() == [1102497106647867105, 4983563755615685553]
    assert torch.equal(fold_keys(k, 2, count=3), torch.stack([fold_keys(k, p) for p in (2, 3, 4)]))  # one pass
    h = counter_hash(keys(16), 5000)
    assert all(len(set(row)) == 5000 for row in h.tolist())  # a bijection of the counter: no ties to rank
    assert int(h.min()) >= 0 and int(h.max()) < 2**32
    with pytest.raises(ValueError, match="int64"):
        counter_hash(torch.zeros(3), 4)


def test_keyed_dropping_keeps_every_token_equally_often_sorted_and_tube_alike():
    draws, n, k = 4000, 64, 16
    keep_idx = sample_keep_idx(draws, (4, 4, 4), 1 - k / n, "uniform", keys=keys(draws))
    assert (keep_idx.diff(dim=1) > 0).all()
    counts = torch.bincount(keep_idx.flatten(), minlength=n).double()
    std = np.sqrt(draws * (k / n) * (1 - k / n))
    assert (counts - draws * k / n).abs().max() < 5 * std
    # two views of one clip (fold_keys parts 0 and 1) overlap as independent draws do: k^2/n = 4 tokens
    a, b = (sample_keep_idx(draws, (4, 4, 4), 0.75, "uniform", keys=fold_keys(keys(draws), v)) for v in (0, 1))
    overlap = torch.zeros(draws, n).scatter_(1, a, 1) * torch.zeros(draws, n).scatter_(1, b, 1)
    assert float(overlap.sum(1).mean()) == pytest.approx(k * k / n, abs=0.1)
    tube = sample_keep_idx(6, (8, 6, 6), 0.9, "tube", keys=keys(6))
    assert all(all(s == _spatial_sets(p)[0] for s in _spatial_sets(p)) for p in grid_positions(8, 6, 6)[tube])


def test_a_clips_kept_tokens_and_cls_do_not_depend_on_the_rest_of_its_batch():
    k = keys(8, epoch=3)
    whole = sample_keep_idx(8, (16, 14, 14), 0.95, "uniform", keys=k)
    order = torch.tensor([5, 2, 7, 0, 1, 6, 3, 4])
    assert torch.equal(sample_keep_idx(8, (16, 14, 14), 0.95, "uniform", keys=k[order]), whole[order])
    assert torch.equal(sample_keep_idx(1, (16, 14, 14), 0.95, "uniform", keys=k[3:4]), whole[3:4])
    enc = VideoEncoder(encoder_config("vit-test", drop_ratio=0.75))
    glob, local = torch.randn(1, 4, 3, 2, 32, 32), torch.randn(2, 4, 3, 2, 16, 16)
    with torch.no_grad():
        cls = enc.forward_views(glob, local, keys=k[:4])  # [3, 4, D]
        halves = [enc.forward_views(glob[:, s], local[:, s], keys=k[:4][s]) for s in (slice(0, 2), slice(2, 4))]
        again = enc.forward_views(glob, local, keys=keys(4, epoch=4))  # another epoch: other tokens
    torch.testing.assert_close(torch.cat(halves, dim=1), cls, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(again, cls)


def test_half_precision_input_is_cast_to_the_weights():
    enc = VideoEncoder(encoder_config("vit-test"))
    video = torch.randn(1, 3, 2, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(enc(video.half()), enc(video.half().float()))


def test_inflated_tubelet_init_sees_the_frames_sum_and_learns_their_difference():
    """``tubelet_init="inflate"``: every output's filter is one draw repeated over the τ frames (÷√τ), so
    swapping the two frames of a tubelet leaves the token unchanged and a static clip embeds as one frame
    does through the drawn filter, times √τ; the default init tells the two frames apart. A gradient step
    can break the symmetry."""
    torch.manual_seed(0)
    video = torch.randn(2, 3, 4, 16, 16)
    swapped = video.reshape(2, 3, 2, 2, 16, 16).flip(3).reshape(2, 3, 4, 16, 16)
    inflated = VideoEncoder(encoder_config("vit-test", tubelet=2, tubelet_init="inflate")).patch_embed
    random = VideoEncoder(encoder_config("vit-test", tubelet=2)).patch_embed
    tok, _ = inflated(video)
    tok_swapped, _ = inflated(swapped)
    torch.testing.assert_close(tok, tok_swapped)
    assert not torch.allclose(random(video)[0], random(swapped)[0], atol=1e-3)
    # a static clip: the drawn τ = 1 filter W0 (stored as W0 / √τ per frame) applied to one frame, times √τ
    static = video[:, :, :1].expand(-1, -1, 4, -1, -1)
    w0 = inflated.proj.weight.view(32, 3, 2, 8, 8)[:, :, 0].reshape(32, -1) * 2**0.5
    frame = inflated.patches(static)[..., 0, :, :].reshape(2, -1, 3 * 64)
    torch.testing.assert_close(inflated(static)[0], (frame @ w0.T) * 2**0.5 + inflated.proj.bias)
    # the inflation is an init, not a constraint: a loss that depends on the frames' order moves them apart
    loss = (inflated(video)[0] - random(video)[0].detach()).pow(2).sum()
    loss.backward()
    g = inflated.proj.weight.grad.view(32, 3, 2, 8, 8)
    assert (g[:, :, 0] - g[:, :, 1]).abs().max() > 1e-3
