"""Streaming inference: frames arrive one (or a few) at a time; a per-layer KV cache of past patch tokens
means the past is never recomputed, and CLS can be read out over the frames seen so far at any moment.

Paper fact (SPEC §2, LeVJEPA §3.9): under block-causal attention a patch of frame ``t`` reads only patches
of frames ``≤ t`` and never CLS, so ``H_t = F(x_1..x_t)``: the features of past frames do not change when
new frames arrive. Hence, per layer, the keys/values of past patch tokens can be cached and each new
frame's tokens attend ``[cache, themselves]`` under the same block-causal predicate
(``levjepa.model.attention.block_causal``), computed from the cached tokens' frame ids.

Design:

* ``push(frames [B, C, t, H, W])`` (``t`` a multiple of the tubelet) embeds the new frames at their absolute
  temporal positions (the count of frames pushed since ``reset``), runs them through every block with the
  layer's cache as extra keys/values, appends their rotated keys/values to the cache, and returns their
  patch features ``[B, t/τ·H'·W', D]`` after the final norm, in time-major order. With readout layers
  (``encoder.cfg.readout_layers``) both ``push`` and ``cls`` return the encoder's readout, ``n·D`` channels of
  the blocks named (``VideoEncoder.readout``), and run no block after the deepest of them.
* ``cls()`` runs the CLS token alone through the blocks; at each layer it reads the cached patch keys/values
  of that layer and itself (nothing is stored), placed where the full forward places it
  (``VideoEncoder.cls_meta`` of the newest pushed slot). Cost: ``depth`` single-query attentions.
* For every prefix, patch features and CLS equal ``encoder.forward_features`` on the same frames
  (float32, ≤ 1e-5; ``tests/test_stream.py``).
* ``window = W`` frames (a multiple of the tubelet) bounds memory and per-frame cost: the cache keeps only
  the last ``W`` frames' tokens, new tokens of frame ``t`` read frames ``t − W < s ≤ t`` and CLS reads the
  last ``W`` frames. That equals ``forward_features(frames, window=W)`` on the whole stream (the banded
  block-causal mask); a window covering the whole stream equals the plain forward. RoPE is relative for
  patch-patch scores and CLS sits at the newest slot, so a long stream with a window sees the same relative
  offsets as training clips of ``W`` frames.
* :func:`stream_video` pushes a decoded video one tubelet at a time, reading CLS every ``every`` frames (and
  after the last whole tubelet) and timing every push (``levjepa stream``).
* **Precision**: a frozen reader runs ``push`` and ``cls`` under the frozen forward's one precision rule,
  ``levjepa.infer.encode.precision(device)`` (bf16 autocast on CUDA, float32 elsewhere), and casts what they
  return to float32 — as :func:`stream_video` and ``levjepa extract --stream`` do — so a stream's features
  are the numbers ``encode()`` gives the same frames. The class itself sets no precision: under float32 (the
  tests' CPU) it equals the full forward to 1e-5.
* Each push (and each ``cls()``) builds its block-causal mask once, as the additive bias every layer's SDPA
  call takes (``levjepa.model.attention.attn_bias``), ``[1, 1, L_new, L_cache + L_new]`` for the whole batch.
* The cache grows by concatenation (one copy of the cached keys/values per push and layer); the
  attention of a new frame is already linear in the cache size, so this does not change the order of the
  per-frame cost.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from levjepa.data.views import normalize
from levjepa.infer.encode import precision
from levjepa.model.attention import AttnPattern, TokenMeta, attn_bias, build_attn_mask
from levjepa.model.vit import VideoEncoder

__all__ = ["StreamingEncoder", "stream_video"]


class _LayerCache:
    """Rotated keys/values ``[B, h, L, hd]`` of one layer's cached patch tokens."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def peek(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.k is None or self.v is None:
            return k, v
        return torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k, self.v = self.peek(k, v)
        return self.k, self.v

    def drop_first(self, n: int) -> None:
        if self.k is not None and self.v is not None and n > 0:
            self.k, self.v = self.k[:, :, n:], self.v[:, :, n:]


class StreamingEncoder:
    """``StreamingEncoder(encoder, window=None)``: ``push`` frames, read ``cls()``, ``reset()`` between videos."""

    def __init__(self, encoder: VideoEncoder, window: int | None = None) -> None:
        if encoder.cfg.attention != "block_causal":
            raise ValueError(
                f"StreamingEncoder: encoder.cfg.attention={encoder.cfg.attention!r}; streaming needs "
                "'block_causal' (with bidirectional attention past features depend on future frames)"
            )
        self.encoder = encoder
        self.window = window
        self._window_slots = encoder.window_slots(window)  # validates: frames, a multiple of the tubelet
        self.reset()

    def reset(self) -> None:
        """Forget every frame (start a new video)."""
        self._caches = [_LayerCache() for _ in self.encoder.blocks]
        self._frames: Tensor | None = None  # [L_cache] temporal slot of each cached token
        self._next_slot = 0
        self._shape: tuple[int, int, int, int] | None = None  # (B, C, H, W) of this stream

    @property
    def frames_seen(self) -> int:
        return self._next_slot * self.encoder.cfg.tubelet

    @property
    def cached_tokens(self) -> int:
        return 0 if self._frames is None else int(self._frames.numel())

    @torch.no_grad()
    def push(self, frames: Tensor) -> Tensor:
        """Encode new frames ``[B, C, t, H, W]``; returns their patch features ``[B, L_new, D]``."""
        enc = self.encoder
        enc.check_input(frames, "frames")
        b, c, _, h, w = frames.shape
        if self._shape is not None and (b, c, h, w) != self._shape:
            raise ValueError(
                f"frames: shape {tuple(frames.shape)} does not continue this stream of [B, C, H, W] = "
                f"{self._shape} (any T); call reset() to start a new video"
            )
        self._shape = (b, c, h, w)
        x, positions = enc.patch_embed(frames, t_offset=self._next_slot)  # [B, L, D], [B, L, 3]
        new = positions[0, :, 0]  # [L] temporal slots (same for every clip)
        keys = new if self._frames is None else torch.cat([self._frames, new])  # [L_cache + L]
        q, k = TokenMeta.patches(new[None]), TokenMeta.patches(keys[None])
        attn_mask = attn_bias(build_attn_mask("block_causal", q, k, self._window_slots), x)  # [1, 1, L, L_cache + L]
        rope = enc.rope(positions[:1])  # [1, 1, L, hd], broadcast over the batch
        states = self._blocks(x, rope, attn_mask, "append")
        self._frames = keys
        self._next_slot += frames.shape[2] // enc.cfg.tubelet
        if self._window_slots is not None:  # evict slots older than the window: a prefix, the cache is time-major
            per_slot = (h // enc.cfg.patch_size) * (w // enc.cfg.patch_size)
            stale = max(0, keys.numel() - self._window_slots * per_slot)
            self._frames = keys[stale:]
            for cache in self._caches:
                cache.drop_first(stale)
        return enc.readout(states)

    @torch.no_grad()
    def cls(self) -> Tensor:
        """CLS ``[B, D]`` over the frames in the cache (all seen frames, or the last ``window``)."""
        if self._frames is None or self._shape is None:
            raise RuntimeError("StreamingEncoder.cls(): no frames pushed since the last reset()")
        enc = self.encoder
        dev = self._frames.device
        x = enc.cls_token.expand(self._shape[0], 1, -1)  # [B, 1, D]
        position, q = enc.cls_meta(self._next_slot - 1, dev)  # at the newest pushed slot, as in the full forward
        k = TokenMeta.patches(self._frames[None]).cat(q)  # the cached patches, then CLS (cache.peek's order)
        attn_mask = attn_bias(build_attn_mask("block_causal", q, k, self._window_slots), x)  # [1, 1, 1, L_cache + 1]
        rope = enc.rope(position)
        return enc.readout(self._blocks(x, rope, attn_mask, "peek"))[:, 0]

    def _blocks(self, x: Tensor, rope: tuple[Tensor, Tensor], attn_mask: AttnPattern, cache: str) -> dict[int, Tensor]:
        """``x`` through the blocks up to the deepest readout layer, each reading its layer's cache (``"append"``:
        the new tokens join it; ``"peek"``: they read it only); the outputs of the readout layers, before the
        norm. The blocks after the deepest readout layer are never run, and their caches stay empty."""
        layers = self.encoder.readout_layers
        states: dict[int, Tensor] = {}
        for i in range(max(layers) + 1):
            layer = self._caches[i]
            x = self.encoder.blocks[i](x, rope, attn_mask, layer.append if cache == "append" else layer.peek)
            if i in layers:
                states[i] = x
        return states


@torch.inference_mode()
def stream_video(
    encoder: VideoEncoder, frames: torch.Tensor, *, window: int | None, every: int, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Push uint8 frames ``[F, H, W, 3]`` one tubelet at a time under ``precision(device)``; returns readouts
    (float32) and per-push latencies.
    Frames past the last whole tubelet are left out; fewer frames than one tubelet raise ``ValueError``
    (``levjepa stream`` pads a short video with its last frame first)."""
    tau = encoder.cfg.tubelet
    if frames.shape[0] < tau:
        raise ValueError(f"stream_video: {frames.shape[0]} frame(s), fewer than one tubelet ({tau} frames)")
    streamer = StreamingEncoder(encoder, window=window)
    cls, at, latency = [], [], []
    usable = (frames.shape[0] // tau) * tau
    for start in range(0, usable, tau):
        clip = frames[start : start + tau].permute(3, 0, 1, 2).unsqueeze(0)  # [1, C, tau, H, W]
        x = normalize(clip.to(device))
        t0 = time.perf_counter()
        with precision(device):  # the frozen forward's rule (module doc)
            streamer.push(x)
        seen = start + tau
        if seen % every == 0 or seen == usable:
            with precision(device):
                readout = streamer.cls()
            cls.append(readout[0].float().cpu())
            at.append(seen - 1)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        latency.append((time.perf_counter() - t0) * 1e3)
    return {"cls": torch.stack(cls), "frame": torch.tensor(at), "latency_ms": torch.tensor(latency)}
