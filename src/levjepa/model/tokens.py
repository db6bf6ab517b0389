"""Video -> patch tokens with their grid positions, and token dropping.

Paper facts (SPEC §2.1-2.2, LeVJEPA §3.8.1, appendix B):

* **Per-frame patch embedding.** A clip ``[B, C, T, H, W]`` is cut into ``τ×p×p`` patches (``p = 16``,
  ``τ = 1`` by default, ``τ = 2`` the ablated option); each patch is one token, embedded by one linear map
  (a Conv3d with kernel = stride = ``(τ, p, p)`` is the same map). 16×224×224 -> 16·14·14 = 3136 tokens,
  16×96×96 -> 576.
* **Positions travel with tokens.** Token ``n`` of the grid ``(T', H', W') = (T/τ, H/p, W/p)`` sits at
  ``(t, y, x)`` with ``n = (t·H' + y)·W' + x`` (time-major). Every function here returns ``positions``
  ``[B, L, 3]`` (long) beside the tokens, gathered with the *same* ``keep_idx``, so a kept token keeps its
  original grid position however many of its neighbours were dropped (3D RoPE and the block-causal mask
  read these, never ``index // tokens_per_frame``).
* **Token dropping** (training only): each view keeps ``n_keep = max(1, round((1 − ρ)·N))`` of its ``N``
  patch tokens (round half up): ρ = 0.95 gives 3136 -> 157 and 576 -> 29. ``uniform`` draws the kept set
  uniformly among all ``N`` tokens of each clip independently; ``tube`` draws ``max(1, round((1 − ρ)·H'W'))``
  spatial positions per clip and keeps them in every temporal slot. Dropped tokens leave the sequence (no
  mask tokens). ``keep_idx`` is sorted ascending, so kept tokens stay in time-major order (grouped by frame).
  Randomness comes only from what is passed in: per-clip ``keys`` (training: the kept set of a clip's view
  is a function of the sample and the view alone, whatever rank or micro-batch holds it, so a run can
  resume on another number of GPUs; see :mod:`levjepa.rng`) or one ``torch.Generator`` for the batch.
* **Drop before embedding.** The patch embedding is per patch and linear, so gathering the kept patches'
  pixels and embedding only those gives the same tokens as embedding all patches and gathering
  (``tests/test_tokens.py`` checks it). The paper embeds all 3136 first, which at ViT-B costs ≈ 6.4 GFLOPs
  per clip for tokens that are thrown away; :meth:`PatchEmbed.forward` with ``keep_idx`` embeds only the
  kept ones and is what the encoder uses.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from levjepa.rng import counter_hash

__all__ = ["PatchEmbed", "check_video", "gather_tokens", "grid_positions", "num_kept", "sample_keep_idx"]


def num_kept(n: int, drop_ratio: float) -> int:
    """Tokens kept out of ``n`` at drop ratio ρ: ``max(1, round_half_up((1 − ρ)·n))``."""
    return max(1, math.floor((1.0 - drop_ratio) * n + 0.5))


def check_video(video: object, *, in_chans: int, patch_size: int, tubelet: int, name: str = "video") -> None:
    """Raise ``ValueError`` naming ``name``, its shape/dtype and what was expected, unless ``video`` is a
    non-empty floating tensor ``[B, C, T, H, W]`` with ``C = in_chans``, ``H, W`` multiples of the patch size
    and ``T`` a multiple of the tubelet."""
    expected = f"a normalised float tensor [B, C={in_chans}, T, H, W] (H, W multiples of {patch_size}"
    expected += f", T a multiple of {tubelet})" if tubelet > 1 else ")"
    if not isinstance(video, Tensor):
        raise ValueError(f"{name}: expected {expected}, got {type(video).__name__}")
    shape = tuple(video.shape)
    if video.dim() != 5:
        raise ValueError(f"{name}: expected {expected}, got shape {shape} ({video.dim()} dims)")
    if not video.is_floating_point():
        hint = (
            " (uint8 frames must be normalised with the ImageNet mean/std first)" if video.dtype == torch.uint8 else ""
        )
        raise ValueError(f"{name}: expected {expected}, got dtype {video.dtype} with shape {shape}{hint}")
    _, c, t, h, w = shape
    if min(shape) == 0:
        raise ValueError(f"{name}: expected {expected}, got an empty tensor of shape {shape}")
    if c != in_chans:
        raise ValueError(f"{name}: expected {in_chans} channels in dim 1 of [B, C, T, H, W], got shape {shape}")
    if h % patch_size or w % patch_size:
        raise ValueError(f"{name}: H and W must be multiples of the patch size {patch_size}, got shape {shape}")
    if t % tubelet:
        raise ValueError(f"{name}: T must be a multiple of the tubelet {tubelet}, got shape {shape}")


def grid_positions(t: int, h: int, w: int, *, device: torch.device | None = None) -> Tensor:
    """``[t·h·w, 3]`` long ``(t, y, x)`` of every grid token in time-major order."""
    tt, yy, xx = torch.meshgrid(
        torch.arange(t, device=device),
        torch.arange(h, device=device),
        torch.arange(w, device=device),
        indexing="ij",
    )
    return torch.stack([tt, yy, xx], dim=-1).reshape(-1, 3)


def _scores(batch: int, n: int, generator: torch.Generator | None, keys: Tensor | None) -> Tensor:
    """``[batch, n]`` i.i.d. random scores: hashes of ``(key of the clip, token)`` or uniforms from ``generator``."""
    if keys is not None:
        if keys.shape != (batch,):
            raise ValueError(f"keys: expected one int64 key per clip, shape ({batch},), got {tuple(keys.shape)}")
        return counter_hash(keys, n)
    if generator is None:
        raise ValueError("token dropping needs per-clip keys (keys=...) or an explicit torch.Generator (generator=...)")
    return torch.rand(batch, n, generator=generator, device=generator.device)


def sample_keep_idx(
    batch: int,
    grid: tuple[int, int, int],
    drop_ratio: float,
    mode: str,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    *,
    keys: Tensor | None = None,
) -> Tensor:
    """``keep_idx`` ``[batch, n_keep]`` (long, ascending) of the tokens each clip keeps.

    ``uniform``: ``n_keep = num_kept(T'H'W', ρ)`` indices drawn without replacement per clip (the top-k of
    i.i.d. scores is a uniformly random subset). ``tube``: ``num_kept(H'W', ρ)`` spatial positions per
    clip, kept in each of the ``T'`` slots, ``n_keep = T'·num_kept(H'W', ρ)``. The scores come from
    ``keys`` (int64 ``[batch]``, one per clip: ``levjepa.rng.counter_hash`` of the key and the token index,
    distinct within a clip, so the subset is well defined on any device) or, without keys, from
    ``generator`` (uniforms on its device); the indices are moved to ``device``.

    Per-clip keys are vectorised: one pass of integer ops over ``[batch, n]`` on the device, about 60 small
    kernels per view group. Drawing each clip from its own ``torch.Generator`` instead (a generator, a
    ``rand``, a top-k and a sort per clip) costs as much on one CPU thread and ~2,500 kernel launches per
    micro-batch on a GPU; one generator for the whole batch is cheaper, but then a clip's tokens depend on
    its place in the batch. The costs, measured: ``bench/train.md`` § Keyed token dropping.
    """
    t, h, w = grid
    if mode == "uniform":
        n = t * h * w
        scores = _scores(batch, n, generator, keys)
        keep_idx = scores.topk(num_kept(n, drop_ratio), dim=1).indices.sort(dim=1).values
    elif mode == "tube":
        s = h * w
        scores = _scores(batch, s, generator, keys)
        spatial = scores.topk(num_kept(s, drop_ratio), dim=1).indices.sort(dim=1).values  # [B, k]
        slots = torch.arange(t, device=spatial.device) * s  # [T']
        keep_idx = (slots[None, :, None] + spatial[:, None, :]).flatten(1)  # [B, T'·k], ascending
    else:
        raise ValueError(f"drop mode {mode!r}: valid choices are uniform, tube")
    return keep_idx.to(device) if device is not None else keep_idx


def gather_tokens(x: Tensor, keep_idx: Tensor) -> Tensor:
    """``x[b, keep_idx[b]]`` for ``x`` ``[B, N, ...]`` and ``keep_idx`` ``[B, K]`` -> ``[B, K, ...]``."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], keep_idx]


class PatchEmbed(nn.Module):
    """One linear map per ``τ×p×p`` patch (pixels flattened in ``(C, τ, p, p)`` order, as a Conv3d weight)."""

    def __init__(self, patch_size: int, tubelet: int, in_chans: int, dim: int) -> None:
        super().__init__()
        self.patch_size, self.tubelet, self.in_chans = patch_size, tubelet, in_chans
        self.proj = nn.Linear(in_chans * tubelet * patch_size * patch_size, dim)

    @torch.no_grad()
    def inflate_(self) -> None:
        """Filter inflation: frame 0's filter repeated over the τ frames, divided by √τ (``tubelet_init``)."""
        p, tau = self.patch_size, self.tubelet
        w = self.proj.weight.view(-1, self.in_chans, tau, p, p)  # (C, τ, p, p) order, as ``patches`` gives
        w.copy_(w[:, :, :1].expand_as(w) / math.sqrt(tau))

    def grid(self, video: Tensor) -> tuple[int, int, int]:
        _, _, t, h, w = video.shape
        return t // self.tubelet, h // self.patch_size, w // self.patch_size

    def patches(self, video: Tensor) -> Tensor:
        """The patches as a strided view ``[B, T', H', W', C, τ, p, p]`` (no copy for a contiguous video)."""
        b, c, _, _, _ = video.shape
        t, h, w = self.grid(video)
        p, tau = self.patch_size, self.tubelet
        v = video.reshape(b, c, t, tau, h, p, w, p)
        return v.permute(0, 2, 4, 6, 1, 3, 5, 7)

    def embed(self, pixels: Tensor) -> Tensor:
        w = self.proj.weight
        if pixels.dtype != w.dtype and not torch.is_autocast_enabled(pixels.device.type):
            pixels = pixels.to(w.dtype)
        return self.proj(pixels)

    def forward(self, video: Tensor, keep_idx: Tensor | None = None, *, t_offset: int = 0) -> tuple[Tensor, Tensor]:
        """Tokens ``[B, L, D]`` and positions ``[B, L, 3]``: all ``N`` patches, or the kept ones when given
        ``keep_idx`` ``[B, K]`` (their pixels gathered first, only those embedded)."""
        b = video.shape[0]
        t, h, w = self.grid(video)
        grid = grid_positions(t, h, w, device=video.device)  # [N, 3]
        pv = self.patches(video)  # [B, T', H', W', C, τ, p, p]
        if keep_idx is None:
            pixels = pv.reshape(b, t * h * w, -1)  # [B, N, C·τ·p·p]
            positions = grid.expand(b, -1, -1)
        else:
            positions = grid[keep_idx]  # [B, K, 3]
            bidx = torch.arange(b, device=video.device)[:, None]
            pixels = pv[bidx, positions[..., 0], positions[..., 1], positions[..., 2]].flatten(2)  # [B, K, C·τ·p·p]
        if t_offset:
            positions = positions + positions.new_tensor([t_offset, 0, 0])
        return self.embed(pixels), positions
