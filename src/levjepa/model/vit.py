"""The LeVJEPA video encoder: a ViT over per-frame patches with token dropping, 3D RoPE and block-causal
attention (SPEC §2, LeVJEPA §3.5, §3.8-3.9 and appendix B).

Data flow of one call (``B`` clips, ``N`` grid tokens, ``L`` kept tokens, ``D`` width)::

    video [B, C, T, H, W] (normalised float)
      -> keep_idx [B, L] (training: uniform or tube, explicit generator; inference: all N, L = N)
      -> PatchEmbed: kept patches' pixels -> tokens [B, L, D], positions [B, L, 3] = original (t, y, x)
      -> prepend the learnable CLS (one parameter shared by all views, always kept) -> x [B, 1+L, D]
      -> RoPE cos/sin [B, 1, 1+L, hd] and the attention pattern from the tokens present, once for all
         layers: when no token is dropped (inference, ρ = 0) every clip holds whole frames, RoPE is [1, ...]
         and block-causal attention needs no mask (KeySpans: each frame's queries read the keys of frames
         ≤ t, O(L) memory); with dropping, the additive bias [B, 1, 1+L, 1+L] of each clip's kept tokens
      -> depth x pre-LN block: x += attn(LN(x)); x += mlp(LN(x))
      -> final LayerNorm (optional, no bias) -> EncoderOutput(cls [B, D], patches [B, L, D], positions [B, L, 3])

* Token dropping only when asked (``drop=True``: training); evaluation and extraction see every token.
  Dropping happens *before* the patch embedding (same tokens as after it, 6.4 GFLOPs/clip cheaper at
  ViT-B; see ``tokens.py``).
* CLS sits at RoPE position ``(T/τ − 1, 0, 0)`` (see ``rope.py``; :meth:`VideoEncoder.cls_meta`, which the
  streaming encoder uses too) and is masked as in ``attention.py``.
* No absolute position embedding: one set of weights runs any resolution and clip length.
* ``forward_views`` runs each *group* of same-shaped views (the global group at 224, the local group at 96)
  as one transformer call with its ``V_g·B`` clips batched: two calls per step, never a loop over clips or
  views. The ``[ΣV_g, B, D]`` CLS it returns feeds one ``projector(cls.flatten(0, 1))`` call. Since nothing
  in training reads the patch tokens' last outputs, its last block computes CLS alone (its query, attention
  output, MLP and residual; keys and values from every kept token): the same CLS and gradients, without the
  last block's work on the patches.
* Init (a choice; the paper does not say): truncated normal std ``init_std = 0.02`` for every linear
  weight, the patch embedding and CLS (timm / V-JEPA), zero biases, LayerNorm (1, 0), and each block's
  residual output projections (``attn.proj``, ``mlp.fc2``) divided by ``sqrt(2·layer)`` (V-JEPA), so
  deep residual streams start small.
* **Readout layers** (``cfg.readout_layers``, ``levjepa.model.readout_layers``): by default
  :meth:`VideoEncoder.forward_features` reads the last block through the final norm. With readout layers it runs
  the blocks up to the deepest one named (no further), gives each named block's output ``[B, 1+L, D]`` the final
  norm and concatenates them on channels in the order named, ``[B, 1+L, n·D]`` — V-JEPA 2's per-layer final norm,
  V-JEPA 2.1's channel concatenation (that module's doc says why). ``num_features`` is that width.
  :meth:`set_readout_layers` changes it on a built encoder (``--layers``); training (``forward_views``) always
  reads the last block's CLS.
* ``compile_blocks()`` compiles the block stack in place as one region with static shapes (one graph per
  view shape; the state-dict keys are unchanged): ``train.compile``'s fast path on the CPU;
  ``compile_views()`` compiles a view group's whole training forward (dropping, embedding, blocks, norm),
  what CUDA graphs capture on a GPU; ``grad_checkpointing`` recomputes blocks in the backward pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from levjepa.model.attention import Attention, AttnPattern, KVCache, TokenMeta, attn_bias, build_attn_mask, key_spans
from levjepa.model.config import EncoderConfig
from levjepa.model.linear import linear
from levjepa.model.rope import Rope3D
from levjepa.model.tokens import PatchEmbed, check_video, grid_positions, sample_keep_idx
from levjepa.rng import fold_keys

__all__ = ["Block", "Blocks", "EncoderOutput", "VideoEncoder"]


@dataclass
class EncoderOutput:
    cls: Tensor  # [B, D]
    patches: Tensor  # [B, L, D]: all patch tokens at inference, the kept ones when dropping
    positions: Tensor  # [B, L, 3] long: original grid position (t, y, x) of each patch token

    @property
    def tokens(self) -> Tensor:
        """``[B, 1+L, D]``: CLS then the patch tokens (what timm's ``forward_features`` returns)."""
        return torch.cat([self.cls[:, None], self.patches], dim=1)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, out_bias: bool = True) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim, bias=out_bias)

    def forward(self, x: Tensor) -> Tensor:
        return linear(self.act(linear(x, self.fc1)), self.fc2)


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(LN(x))`` then ``x + mlp(LN(x))``."""

    def __init__(self, cfg: EncoderConfig, mlp_out_bias: bool = True) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg.dim, cfg.heads, cfg.qkv_bias)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = MLP(cfg.dim, cfg.mlp_hidden, mlp_out_bias)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        attn_mask: AttnPattern,
        kv_cache: KVCache | None = None,
        queries: int | None = None,
    ) -> Tensor:
        """``[B, L, D]``, or with ``queries`` the first ``queries`` tokens' outputs ``[B, queries, D]`` (their
        attention still reads every token: what a CLS readout of the last block needs)."""
        y = self.attn(self.norm1(x), rope, attn_mask, kv_cache, queries)  # [B, L or queries, D]
        x = x + y if queries is None else x[:, :queries] + y
        return x + self.mlp(self.norm2(x))


class Blocks(nn.ModuleList):
    """The encoder's stack of blocks (``blocks.0``, ``blocks.1``, … as a plain ``ModuleList``), run in order by
    one call, :meth:`forward`: the region ``VideoEncoder.compile_blocks`` compiles whole."""

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        attn_mask: AttnPattern,
        last_queries: int | None = None,
        checkpointing: bool = False,
    ) -> Tensor:
        """``x`` ``[B, 1+L, D]`` through every block; ``last_queries``: the last block computes only the first
        that many tokens' outputs (``Block.forward``'s ``queries``); ``checkpointing``: each block is recomputed
        in the backward pass instead of keeping its activations."""
        last = len(self) - 1
        for i, blk in enumerate(self):
            queries = last_queries if i == last else None
            if checkpointing:
                x = checkpoint(blk, x, rope, attn_mask, None, queries, use_reentrant=False)
            else:
                x = blk(x, rope, attn_mask, None, queries)
        return x

    def outputs(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        attn_mask: AttnPattern,
        layers: Sequence[int],
        checkpointing: bool = False,
    ) -> dict[int, Tensor]:
        """The outputs ``[B, 1+L, D]`` of the blocks ``layers`` (non-negative indices), block by block from ``x``:
        the blocks up to the deepest one named run, none after it (``checkpointing``: as :meth:`forward`)."""
        out: dict[int, Tensor] = {}
        for i in range(max(layers) + 1):
            blk = self[i]
            x = checkpoint(blk, x, rope, attn_mask, use_reentrant=False) if checkpointing else blk(x, rope, attn_mask)
            if i in layers:
                out[i] = x
        return out


class VideoEncoder(nn.Module):
    """The encoder (module docstring). timm's names where a name is shared: ``num_features`` (``dim`` per readout
    layer), ``num_prefix_tokens`` (1: CLS), :meth:`forward_head`, :meth:`forward_intermediates` and
    ``pretrained_cfg`` (mean, std, input size ``(C, T, H, W)``, frames, frame stride: what the weights
    expect, set by the loaders from an export's preprocessing). Unlike timm's, :meth:`forward_features`
    returns an :class:`EncoderOutput` (CLS, patches *and their grid positions*, which travel with the tokens
    whether or not some were dropped); its ``.tokens`` is timm's ``[B, 1+L, D]`` tensor."""

    weights_info: str = ""  # which copy of which weights these are, when read by ``levjepa.load``
    num_prefix_tokens: int = 1

    def __init__(self, cfg: EncoderConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg if cfg is not None else EncoderConfig()
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.tubelet, cfg.in_chans, cfg.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.rope = Rope3D(cfg.head_dim, cfg.rope_base, cfg.rope_layout)
        # without a final norm the last block's mlp.fc2 bias is the constant shift of CLS instead (the same
        # exactly zero gradient): it exists only with final_norm_bias, for weights written before
        last_bias = cfg.final_norm or cfg.final_norm_bias
        self.blocks = Blocks(Block(cfg, i < cfg.depth - 1 or last_bias) for i in range(cfg.depth))
        # no bias by default: the projector's BatchNorm cancels a constant shift of CLS (see EncoderConfig)
        final = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps, bias=cfg.final_norm_bias)
        self.norm = final if cfg.final_norm else nn.Identity()
        self._compiled_group: Callable[..., Tensor] | None = None  # compile_views' compiled group_cls
        self.init_weights()
        # ImageNet's mean and std (levjepa.data.views normalises with them); 16 × 224² every 2nd frame
        self.pretrained_cfg: dict[str, Any] = {
            "mean": (0.485, 0.456, 0.406),
            "std": (0.229, 0.224, 0.225),
            "input_size": (cfg.in_chans, 16, 224, 224),
            "num_frames": 16,
            "frame_stride": 2,
        }

    @property
    def num_features(self) -> int:
        """Channels of :meth:`forward_features`' tokens: ``dim`` per readout layer (``cfg.readout_dim``)."""
        return self.cfg.readout_dim

    @property
    def readout_layers(self) -> tuple[int, ...]:
        """The blocks :meth:`forward_features` reads, non-negative, in channel order (the last block alone by
        default)."""
        layers = self.cfg.readout_layers
        return (self.cfg.depth - 1,) if layers is None else layers

    def set_readout_layers(self, layers: Sequence[int] | None) -> VideoEncoder:
        """Read the blocks ``layers`` from now on (negative from the end; ``None``: the last), concatenated on
        channels (module doc); returns ``self``. ``ConfigError`` in one line, naming the depth, for a block out of
        range. The weights are untouched; the function fingerprint follows the readout."""
        self.cfg = dataclasses.replace(self.cfg, readout_layers=None if layers is None else tuple(layers))
        return self

    def readout(self, states: Mapping[int, Tensor]) -> Tensor:
        """The readout from block outputs before any norm (``states``: block index -> ``[..., D]``, holding at
        least :attr:`readout_layers`): the final norm on each, concatenated on channels in readout order."""
        parts = [self.norm(states[i]) for i in self.readout_layers]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    @torch.no_grad()
    def init_weights(self) -> None:
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.cls_token, std=std)
        if self.cfg.tubelet_init == "inflate" and self.cfg.tubelet > 1:
            self.patch_embed.inflate_()
        for layer, blk in enumerate(self.blocks, start=1):
            assert isinstance(blk, Block)
            blk.attn.proj.weight.div_(math.sqrt(2.0 * layer))
            blk.mlp.fc2.weight.div_(math.sqrt(2.0 * layer))

    def compile_blocks(self, **kwargs: Any) -> VideoEncoder:
        """``torch.compile`` the block stack in place as one region, forward and backward; returns ``self``.

        One graph runs all the blocks of a call (:class:`Blocks`): no boundary between blocks, so the residual
        add of one block and the LayerNorm of the next fuse, and there are two compiled calls per view shape
        and step (forward, backward) instead of two per block. The calls that go through it are the
        encoder's own (``forward``, ``forward_features``, ``forward_views``); ``get_intermediate_layers`` and
        the streaming encoder run the blocks one by one, eagerly.

        Shapes are static (``dynamic=False`` unless ``kwargs`` say otherwise): the kept-token counts are fixed
        per view shape, so training sees a handful of shapes (each view group, with and without grad), each
        compiled once with its sizes known; by default TorchDynamo would turn the second view shape into a
        dynamic-shape graph shared by all, slower kernels and no CUDA graphs (``mode="reduce-overhead"``).
        The state-dict keys are unchanged."""
        kwargs.setdefault("dynamic", False)
        self.blocks.compile(**kwargs)
        return self

    # ---- tokens ---------------------------------------------------------------------------------------
    def check_input(self, video: object, name: str = "video") -> None:
        """``ValueError`` naming ``name``, its shape and what was expected, for anything the encoder cannot take."""
        c = self.cfg
        check_video(video, in_chans=c.in_chans, patch_size=c.patch_size, tubelet=c.tubelet, name=name)
        assert isinstance(video, Tensor)  # check_video raised otherwise
        device = self.cls_token.device
        if video.device != device:
            raise ValueError(
                f"{name}: tensor of shape {tuple(video.shape)} is on {video.device}, the encoder on {device}"
            )

    def window_slots(self, window: int | None) -> int | None:
        """A sliding window of ``window`` frames in temporal slots (``None``: unbounded); ``ValueError`` unless
        it is a positive multiple of the tubelet."""
        if window is None:
            return None
        tau = self.cfg.tubelet
        if not isinstance(window, int) or window < tau or window % tau:
            raise ValueError(f"window={window!r}: expected a positive number of frames, a multiple of tubelet={tau}")
        return window // tau

    def cls_meta(self, newest_slot: int, device: torch.device | str | None = None) -> tuple[Tensor, TokenMeta]:
        """Where CLS sits: its RoPE position ``(newest_slot, 0, 0)`` ``[1, 1, 3]`` (long) and its metadata for the
        attention masks ``[1, 1]``. ``newest_slot`` is the newest temporal slot of the tokens it reads (``T/τ −
        1`` for a clip; the last pushed slot when streaming), so under block-causal attention CLS reads the
        whole clip (or the window ending there) and RoPE sees it where a readout of that moment belongs. In the
        official ``vjepa2`` RoPE layout CLS is not rotated: its RoPE position is ``(0, 0, 0)``, its mask slot
        still ``newest_slot``."""
        rotated_at = newest_slot if self.cfg.rope_layout == "levjepa" else 0
        position = torch.tensor([[[rotated_at, 0, 0]]], dtype=torch.long, device=device)
        frame = torch.full((1, 1), newest_slot, dtype=torch.long, device=device)
        return position, TokenMeta(frame, torch.ones(1, 1, dtype=torch.bool, device=device))

    def _prepare(
        self,
        video: Tensor,
        drop: bool,
        generator: torch.Generator | None,
        window: int | None,
        name: str,
        keys: Tensor | None = None,
        drop_ratio: float | None = None,
    ) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor], AttnPattern]:
        """Tokens with CLS ``[B, 1+L, D]``, patch positions ``[B, L, 3]``, RoPE and the attention pattern, built
        once for every layer (``attention.py``): the spans of whole frames when every clip keeps the whole
        grid, the additive bias otherwise (``None``: bidirectional). ``drop_ratio``: the caller's, else the
        config's."""
        self.check_input(video, name)
        b = video.shape[0]
        grid = self.patch_embed.grid(video)  # (T', H', W')
        keep_idx = None
        if drop:
            if generator is None and keys is None:
                raise ValueError(
                    "drop=True: token dropping needs per-clip keys (keys=...) or an explicit torch.Generator "
                    "(generator=...)"
                )
            c = self.cfg
            ratio = c.drop_ratio if drop_ratio is None else drop_ratio
            keep_idx = sample_keep_idx(b, grid, ratio, c.drop_mode, generator, video.device, keys=keys)
            if keep_idx.shape[1] == math.prod(grid):  # ρ = 0: every token kept (ascending, so the whole grid)
                keep_idx = None
        patches, positions = self.patch_embed(video, keep_idx)  # [B, L, D], [B, L, 3]
        # every clip keeps the whole grid: one row of positions serves the batch (RoPE [1, 1, 1+L, hd], bias
        # [1, 1, 1+L, 1+L], broadcast); with dropping each clip has its own (B rows)
        rows = positions if keep_idx is not None else positions[:1]
        cls_pos, cls_meta = self.cls_meta(grid[0] - 1, video.device)  # CLS at the newest slot
        all_pos = torch.cat([cls_pos.expand(rows.shape[0], 1, 3), rows], dim=1)  # [B or 1, 1+L, 3]
        x = torch.cat([self.cls_token.expand(b, -1, -1).to(patches.dtype), patches], dim=1)  # [B, 1+L, D]
        slots = self.window_slots(window)
        if keep_idx is None and self.cfg.attention == "block_causal" and not torch.compiler.is_compiling():
            # whole frames: the spans, from the metadata of the grid's tokens (PatchEmbed's order) on the host
            host = self.cls_meta(grid[0] - 1)[1].cat(TokenMeta.patches(grid_positions(*grid)[None, :, 0]))
            spans = key_spans("block_causal", host, host, slots)
            if spans is not None:
                return x, positions, self.rope.tables(all_pos, x), spans
        meta = cls_meta.cat(TokenMeta.patches(rows[..., 0]))  # [B or 1, 1+L]
        attn_mask = build_attn_mask(self.cfg.attention, meta, meta, slots)
        return x, positions, self.rope.tables(all_pos, x), attn_bias(attn_mask, x)

    def _encode(
        self,
        video: Tensor,
        drop: bool,
        generator: torch.Generator | None,
        window: int | None,
        name: str,
        keys: Tensor | None = None,
        cls_only: bool = False,
        drop_ratio: float | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Block outputs before the final norm ``[B, 1+L, D]`` (CLS first) and patch positions ``[B, L, 3]``;
        ``cls_only``: the last block computes CLS alone, ``[B, 1, D]`` (the patches' last outputs feed nothing
        a CLS readout uses: their queries, attention output projection and MLP are skipped)."""
        x, positions, rope, attn_mask = self._prepare(video, drop, generator, window, name, keys, drop_ratio)
        recompute = self.cfg.grad_checkpointing and self.training and torch.is_grad_enabled()
        x = self.blocks(x, rope, attn_mask, 1 if cls_only else None, recompute)  # [B, 1+L or 1, D]
        return x, positions

    # ---- public API -----------------------------------------------------------------------------------
    def forward_features(
        self,
        video: Tensor,
        *,
        drop: bool = False,
        generator: torch.Generator | None = None,
        window: int | None = None,
        drop_ratio: float | None = None,
    ) -> EncoderOutput:
        """CLS and patch tokens (after the final norm) with their positions: of the last block, or of the readout
        layers concatenated on channels (``cfg.readout_layers``; module doc).

        ``drop``: keep ``1 − drop_ratio`` of the patch tokens (training; needs ``generator``); ``drop_ratio``
        defaults to the config's (fine-tuning passes its own: a token keep ratio is the caller's, never written
        into the config). ``window``: block-causal attention bounded to the last ``window`` frames (what
        ``StreamingEncoder(window=W)`` computes); ``None`` is unbounded.
        """
        if self.cfg.readout_layers is None:  # the last block: the encoder as it always was
            x, positions = self._encode(video, drop, generator, window, "video", drop_ratio=drop_ratio)
            x = self.norm(x)
        else:
            x, positions, rope, attn_mask = self._prepare(video, drop, generator, window, "video", None, drop_ratio)
            recompute = self.cfg.grad_checkpointing and self.training and torch.is_grad_enabled()
            x = self.readout(self.blocks.outputs(x, rope, attn_mask, self.readout_layers, recompute))
        return EncoderOutput(cls=x[:, 0], patches=x[:, 1:], positions=positions)

    def forward(self, video: Tensor, *, drop: bool = False, generator: torch.Generator | None = None) -> Tensor:
        """CLS readout ``[B, D]``."""
        return self.forward_features(video, drop=drop, generator=generator).cls

    def forward_views(
        self, *groups: Tensor, keys: Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        """Training forward: each group ``[V_g, B, C, T, H, W]`` (same-shaped views of the same ``B`` clips)
        runs as one transformer call on its ``V_g·B`` clips with dropping on; returns the CLS of every view
        stacked in group order, ``[ΣV_g, B, D]``.

        Dropping draws from ``keys`` (int64 ``[B]``, one per clip: view slot ``s`` of clip ``b`` keeps the
        tokens given by ``levjepa.rng.fold_keys(keys, s)[b]``, whatever else is in the batch) or, without
        keys, from one ``generator`` for the whole call.
        """
        if not groups:
            raise ValueError("forward_views: expected at least one view group [V, B, C, T, H, W]")
        if keys is None and generator is None:
            raise ValueError(
                "forward_views: token dropping needs per-clip keys (keys=...) or a generator (generator=...)"
            )
        batch = None
        slot = 0
        cls = []
        for i, views in enumerate(groups):
            if not isinstance(views, Tensor) or views.dim() != 6:
                shape = tuple(views.shape) if isinstance(views, Tensor) else type(views).__name__
                raise ValueError(f"forward_views: groups[{i}] must be [V, B, C, T, H, W], got {shape}")
            v, b = views.shape[:2]
            batch = b if batch is None else batch
            if b != batch:
                raise ValueError(
                    f"forward_views: groups[{i}] has B={b} clips but groups[0] has {batch}: "
                    f"every group must hold views of the same clips (shape {tuple(views.shape)})"
                )
            if keys is not None and keys.shape != (b,):
                raise ValueError(f"forward_views: keys must be int64 [B={b}], got shape {tuple(keys.shape)}")
            view_keys = None if keys is None else fold_keys(keys, slot, count=v).reshape(-1)  # [V·B], view-major
            slot += v
            group = self._compiled_group or self.group_cls
            cls.append(group(views.flatten(0, 1), view_keys, generator, f"groups[{i}]").view(v, b, -1))
        return torch.cat(cls, dim=0)  # [ΣV, B, D]: a copy, as CUDA graphs want of their outputs

    def group_cls(self, video: Tensor, keys: Tensor | None, generator: torch.Generator | None, name: str) -> Tensor:
        """One view group's share of :meth:`forward_views`: CLS after the final norm ``[V·B, D]`` of the clips
        ``video`` ``[V·B, C, T, H, W]`` with dropping on — token dropping, patch embedding, the blocks (the last
        one CLS alone), the norm: the region :meth:`compile_views` compiles."""
        x, _ = self._encode(video, True, generator, None, name, keys, cls_only=True)  # [V·B, 1, D]
        return self.norm(x[:, 0])

    def compile_views(self, **kwargs: Any) -> VideoEncoder:
        """``torch.compile`` the whole training forward of a view group (:meth:`group_cls`) for every later
        :meth:`forward_views` call; returns ``self``. ``dynamic=False`` unless ``kwargs`` say otherwise: one
        graph per view shape and grad mode, from the per-clip keys to the normalised CLS, with no Python between
        its kernels — what CUDA graphs capture (``mode="reduce-overhead"``, ``train.compile`` on CUDA:
        ``levjepa.train.step.compile_step``). The state-dict keys are unchanged."""
        kwargs.setdefault("dynamic", False)
        self._compiled_group = torch.compile(self.group_cls, **kwargs)
        return self

    def get_intermediate_layers(
        self, video: Tensor, n: int | Sequence[int] = 1, *, norm: bool = True
    ) -> list[EncoderOutput]:
        """Outputs of the last ``n`` blocks (``n`` an int) or of the blocks with the given indices (negative
        counts from the end), in depth order, without dropping; ``norm`` applies the final norm."""
        depth = self.cfg.depth
        if isinstance(n, int):
            if not 1 <= n <= depth:
                raise ValueError(f"get_intermediate_layers: n={n} must be in 1..{depth} (the encoder depth)")
            take = set(range(depth - n, depth))
        else:
            bad = [i for i in n if not -depth <= i < depth]
            if bad:
                raise ValueError(f"get_intermediate_layers: block indices {bad} out of range for depth {depth}")
            take = {i % depth for i in n}
        x, positions, rope, attn_mask = self._prepare(video, False, None, None, "video")
        states = self.blocks.outputs(x, rope, attn_mask, sorted(take))
        outs = []
        for i in sorted(take):
            h = self.norm(states[i]) if norm else states[i]
            outs.append(EncoderOutput(cls=h[:, 0], patches=h[:, 1:], positions=positions))
        return outs

    def forward_head(self, x: Tensor | EncoderOutput, pre_logits: bool = False) -> Tensor:
        """timm's pooling step on :meth:`forward_features`' output (an :class:`EncoderOutput` or its ``.tokens``
        ``[B, 1+L, D]``): the CLS ``[B, D]``. The encoder has no classifier, so ``pre_logits`` changes nothing."""
        return x.cls if isinstance(x, EncoderOutput) else x[:, 0]

    def forward_intermediates(
        self,
        video: Tensor,
        indices: int | Sequence[int] | None = None,
        *,
        norm: bool = False,
        output_fmt: str = "NLC",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
    ) -> list[Any] | tuple[Tensor, list[Any]]:
        """timm's ``forward_intermediates``: the patch tokens of the chosen blocks (``indices``: the last ``n``
        blocks for an int, block indices otherwise, every block for ``None``) as ``[B, L, D]`` (``"NLC"``) or
        ``[B, D, T', H', W']`` (``"NCTHW"``), with the CLS beside each when ``return_prefix_tokens`` (pairs
        ``(patches, cls [B, 1, D])``); ``norm`` applies the final norm to them. Returns the list, or
        ``(final tokens [B, 1+L, D], list)`` unless ``intermediates_only``."""
        if output_fmt not in ("NLC", "NCTHW"):
            raise ValueError(f"forward_intermediates: output_fmt={output_fmt!r}: valid choices are NLC, NCTHW")
        outs = self.get_intermediate_layers(video, self.cfg.depth if indices is None else indices, norm=norm)
        grid = self.patch_embed.grid(video)
        inter: list[Any] = []
        for o in outs:
            patches = o.patches
            if output_fmt == "NCTHW":
                patches = patches.transpose(1, 2).reshape(patches.shape[0], -1, *grid)
            inter.append((patches, o.cls[:, None]) if return_prefix_tokens else patches)
        if intermediates_only:
            return inter
        return self.forward_features(video).tokens, inter
