"""FLOPs accounting for LeVJEPA: forward and training FLOPs per clip for any encoder config, and per run.

Conventions (the usual ones, e.g. Kaplan et al., fvcore, ``torch.utils.flop_counter``):

* Only matrix products are counted, one multiply-add = 2 FLOPs. Bias adds, LayerNorm/BatchNorm, softmax,
  GELU and RoPE rotations are element-wise and left out (< 1 % of a ViT).
* Encoder, per view with ``L`` tokens (kept patches + 1 CLS), width ``D``, MLP hidden ``H``, depth ``n``:
  ``qkv = n·2·L·D·3D``, ``attention = n·4·L²·D`` (``QKᵀ`` and ``AV``; the block-causal mask is *not*
  credited: a training step's kernels compute every score of the kept tokens; inference on whole frames
  computes only the block-causal ones, about half, ``levjepa.model.attention.KeySpans``),
  ``attn_proj = n·2·L·D²``, ``mlp = n·2·L·2·D·H``,
  ``patch_embed = 2·E·(C·τ·p²)·D`` with ``E`` the embedded patches: the kept ones (ours, dropping before the
  embedding) or all of them (``embed_all``: the paper's order, ≈ 6.4 GFLOPs per clip at ViT-B).
* Projector per view: ``2·(D·2048 + 2048·256)``. SIGReg per view: the projection ``2·K·M`` plus
  ``5·M·J`` element-wise FLOPs (``t·u``, cos, sin and two accumulations per direction and node; ``M = 1024``
  directions, ``J = 17`` nodes); the invariance term ``3·K`` per view. All three are < 0.1 % of the total.
* Training = forward + backward with backward = 2 × forward (gradients w.r.t. inputs and weights), except
  the patch embedding, whose input (pixels) needs no gradient: backward = 1 × forward there. Activation
  recomputation (``grad_checkpointing``) would add one more forward and is not counted. The optimizer step,
  data decoding and augmentation are per step or on the CPU and are not counted.
* The count is the architecture's — every block on every kept token — as the paper counts it. levjepa's
  training step computes the last block for CLS alone (the patch tokens' last outputs feed nothing there;
  ``VideoEncoder.forward_views``), so it does fewer encoder FLOPs than counted here (how many per model:
  ``bench/train.md``, "The last block computes CLS alone").
* Per run: ``clips × epochs × training FLOPs per clip``. The paper's controlled setting is 240 epochs on a
  20 % class-balanced subset of K710; we assume K710 has ≈ 658 k training clips, so 20 % ≈ 131,600 clips
  (``K710_20PCT_CLIPS``).

Checks against the paper (``levjepa flops``, ``tests/test_flops.py``): the default ViT-B/16 (1 × 224 + 4 ×
96 views of 16 frames, ρ = 0.95) costs 1.45·10¹¹ training FLOPs per clip (1.58·10¹¹ embedding every patch
as the paper does), the paper's ≈ 1.5·10¹¹; 240 epochs × 131,600 clips give 4.6 EFLOPs (5.0 with
``embed_all``), the paper's 4.8.

Why the cost does not fall exactly 20× at ρ = 0.95: the per-token terms (qkv, projections, MLP) fall with
the token count, 5445 -> 278 per clip (19.6×: CLS is always kept, 3136·0.05 rounds up), attention falls
with its square (≈ 390× for the global view), and the patch embedding does not fall at all when every patch
is embedded first. In FLOPs the total therefore falls *more* than 20× (≈ 28× here, 25× in the paper's order)
because full-length attention is ~30 % of the ρ = 0 cost (ViT-B; ~64 % for the narrower ViT-T, whose
FLOPs fall 49×). Measured time follows neither exactly (``bench/encoder.md``): kernels run short sequences
and long attention at different efficiencies, and per-step costs (optimizer, data) do not shrink at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from levjepa.model.config import EncoderConfig
from levjepa.model.tokens import num_kept

__all__ = [
    "K710_20PCT_CLIPS",
    "ClipFlops",
    "encoder_flops",
    "rho_sweep",
    "run_flops",
    "training_flops_per_clip",
    "view_tokens",
]

K710_20PCT_CLIPS = 131_600  # the paper's default 20 % class-balanced subset of K710 (~658k clips assumed)

ENCODER_TERMS = ("patch_embed", "qkv", "attention", "attn_proj", "mlp")


def view_tokens(cfg: EncoderConfig, frames: int, size: int, drop_ratio: float | None) -> tuple[int, int]:
    """``(N, kept)``: grid patch tokens of a ``frames × size × size`` view and how many stay at ``drop_ratio``
    (``None``: no dropping), following ``cfg.drop_mode``."""
    if frames % cfg.tubelet or size % cfg.patch_size or frames < 1 or size < 1:
        raise ValueError(
            f"view {frames}x{size}x{size}: frames must be a multiple of tubelet={cfg.tubelet} and size a "
            f"multiple of patch_size={cfg.patch_size}"
        )
    t, s = frames // cfg.tubelet, (size // cfg.patch_size) ** 2
    n = t * s
    if drop_ratio is None:
        return n, n
    if not 0.0 <= drop_ratio < 1.0:
        raise ValueError(f"drop_ratio={drop_ratio!r}: expected 0 <= drop_ratio < 1")
    return n, (t * num_kept(s, drop_ratio) if cfg.drop_mode == "tube" else num_kept(n, drop_ratio))


def encoder_flops(
    cfg: EncoderConfig, frames: int = 16, size: int = 224, *, drop_ratio: float | None = None, embed_all: bool = False
) -> dict[str, float]:
    """Forward FLOPs of the encoder on one view of one clip, per term (see the module docstring)."""
    n, kept = view_tokens(cfg, frames, size, drop_ratio)
    d, h, depth = cfg.dim, cfg.mlp_hidden, cfg.depth
    seq = kept + 1  # + CLS
    patch_in = cfg.in_chans * cfg.tubelet * cfg.patch_size**2
    return {
        "patch_embed": 2.0 * (n if embed_all else kept) * patch_in * d,
        "qkv": depth * 2.0 * seq * d * 3 * d,
        "attention": depth * 4.0 * seq * seq * d,
        "attn_proj": depth * 2.0 * seq * d * d,
        "mlp": depth * 2.0 * seq * 2 * d * h,
    }


def _backward_factor(term: str) -> float:
    return 1.0 if term == "patch_embed" else 2.0


@dataclass(frozen=True)
class ClipFlops:
    """FLOPs of one training clip (all its views), per term: ``forward`` and ``training`` (= fwd + bwd)."""

    forward: dict[str, float]
    training: dict[str, float]
    tokens: dict[str, int] = field(default_factory=dict)  # "global"/"local": sequence length of one view incl. CLS

    @property
    def forward_total(self) -> float:
        return sum(self.forward.values())

    @property
    def training_total(self) -> float:
        return sum(self.training.values())


def training_flops_per_clip(
    cfg: EncoderConfig,
    *,
    frames: int = 16,
    global_size: int = 224,
    local_size: int = 96,
    num_global: int = 1,
    num_local: int = 4,
    drop_ratio: float | None = None,
    embed_all: bool = False,
    sigreg_directions: int = 1024,
    sigreg_nodes: int = 17,
) -> ClipFlops:
    """Forward and training FLOPs of one clip with ``num_global`` + ``num_local`` views, dropping at
    ``drop_ratio`` (default ``cfg.drop_ratio``), projector, SIGReg and invariance loss included."""
    rho = cfg.drop_ratio if drop_ratio is None else drop_ratio
    fwd = dict.fromkeys(ENCODER_TERMS, 0.0)
    views = ((num_global, global_size), (num_local, local_size))
    for count, size in views:
        for term, value in encoder_flops(cfg, frames, size, drop_ratio=rho, embed_all=embed_all).items():
            fwd[term] += count * value
    n_views = num_global + num_local
    k, m, j = cfg.proj_dim, sigreg_directions, sigreg_nodes
    fwd["projector"] = n_views * 2.0 * (cfg.dim * cfg.proj_hidden + cfg.proj_hidden * k)
    fwd["objective"] = n_views * (2.0 * k * m + 5.0 * m * j + 3.0 * k)
    training = {term: value * (1.0 + _backward_factor(term)) for term, value in fwd.items()}
    tokens = {
        name: view_tokens(cfg, frames, size, rho)[1] + 1
        for name, (count, size) in zip(("global", "local"), views, strict=True)
        if count
    }
    return ClipFlops(forward=fwd, training=training, tokens=tokens)


def run_flops(cfg: EncoderConfig, *, clips: int = K710_20PCT_CLIPS, epochs: int = 240, **view_kwargs: Any) -> float:
    """Training FLOPs of a run: ``clips × epochs × training_flops_per_clip(cfg, **view_kwargs)``."""
    return clips * epochs * training_flops_per_clip(cfg, **view_kwargs).training_total


def rho_sweep(cfg: EncoderConfig, rhos: tuple[float, ...], **view_kwargs: Any) -> list[dict[str, float]]:
    """Training FLOPs per clip at each ρ, per term group, with the ratio ``cost(ρ = first) / cost(ρ)``."""
    rows = []
    for rho in rhos:
        c = training_flops_per_clip(cfg, drop_ratio=rho, **view_kwargs).training
        rows.append(
            {
                "rho": rho,
                "patch_embed": c["patch_embed"],
                "per_token": c["qkv"] + c["attn_proj"] + c["mlp"],
                "attention": c["attention"],
                "head_objective": c["projector"] + c["objective"],
                "total": sum(c.values()),
            }
        )
    for row in rows:
        row["speedup"] = rows[0]["total"] / row["total"]
    return rows
