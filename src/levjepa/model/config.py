"""The encoder's typed config and its named presets.

``EncoderConfig`` holds every architectural choice of the LeVJEPA encoder (SPEC §2, paper appendix B):

* sizes: ViT-Tiny 192/12/3, Small 384/12/6, Base 768/12/12 (the default, ViT-B/16), Large 1024/24/16,
  Huge 1280/32/16; plus ``vit-test`` (unit tests) and ``vit-demo`` (the 10-minute CPU demo on 64-px clips);
* tokens: spatial patch 16, temporal patch ``tubelet`` τ = 1 (τ = 2 as the option the paper ablates);
* token dropping: ratio ρ = 0.95 applied to each view's patch tokens in training, ``uniform`` (default;
  IN1K 50.7 %) or ``tube`` (the same spatial positions in every frame; IN1K 39.6 %);
* attention: ``block_causal`` (default; IN1K 51.2 %) or ``bidirectional`` (50.7 %);
* a final LayerNorm (on by default; the papers discuss removing it but never ablate that), without a bias
  (``final_norm_bias=False``): its bias only shifts every CLS by one constant vector, which the projector's
  bias-free Linear maps to a constant and its BatchNorm subtracts again, so the bias would get an exactly
  zero gradient and AdamW would step it on rounding noise. Without the final norm (``final_norm=False``)
  the last block's ``mlp.fc2`` bias is that constant shift, and it goes the same way. ``True`` rebuilds
  encoders written before (``levjepa.load`` does so by itself for such weights);
* the projector ``Linear(d, 2048) -> BatchNorm -> GELU -> Linear(2048, 256)`` (training only).

Choices the papers leave open, all fields with defaults:

* ``rope_base = 10000``: the RoPE frequency base (V-JEPA 2's), see ``levjepa.model.rope``.
* ``rope_layout = "levjepa"``: levjepa's 3D RoPE (every channel rotated, true rotations, CLS at the newest
  slot). ``"vjepa2"`` is the official LeVJEPA code's layout (V-JEPA 2's pretrained-compatible frequencies,
  ``d − 3·2·((d//3)//2)`` channels unrotated, CLS unrotated): set by ``levjepa import`` so official weights
  compute the official function (``levjepa.formats.reading.official``).

Not architecture: ``readout_layers`` says which blocks a frozen reader reads (``forward_features``, and so
``probe``, ``extract``, kept probes, ``classify``, exports and the hub classes): ``None``, the default, the last
block through the final norm; otherwise each block named (negative from the end), each through the final norm,
concatenated on channels in the order given (``levjepa.model.readout_layers``: V-JEPA 2's and 2.1's readouts,
``--layers``). Stored normalised (non-negative, ``None`` for the last block alone) and written only when set (a
config that reads the last block is written as before the field existed); training reads the last block's CLS
whatever it says, and a continued run keeps its own.

Not architecture: ``init_from`` names the weights a pretraining run starts from at step 0 (a levjepa run,
an export, an imported official model or a checkpoint file; ``None``: random init). It is recorded with the
run and left unchanged on ``--resume``, which continues from the run's own checkpoints.
* ``init_std = 0.02``: truncated-normal init of every linear/patch weight and of CLS (timm / V-JEPA),
  biases zero, LayerNorm (1, 0), residual output projections scaled by ``1/sqrt(2·layer)`` (V-JEPA).
* ``tubelet_init = "random"``: how a τ > 1 patch embedding starts. ``random``: every weight drawn (timm /
  V-JEPA's Conv3d). ``inflate``: one τ = 1 filter drawn per output and repeated over the τ frames, divided
  by √τ (I3D / ViViT "filter inflation", at the default init's scale): the initial token sees the frames'
  sum and no difference between them, so a *random* encoder is not a bank of random motion filters; the
  weights are free to tell the frames apart as soon as training starts (``bench/quality.md``).
* ``norm_eps = 1e-6`` for every LayerNorm (timm/V-JEPA ViTs).
* ``grad_checkpointing``: recompute each block in the backward pass (saves activation memory for
  ViT-L/H at ~1/3 more compute); off by default.

Each field is validated in ``__post_init__``: a wrong value raises ``ConfigError`` (a ``ValueError``)
naming the field, its value and what would be valid.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from levjepa.config import OMIT_DEFAULT, ConfigError, check
from levjepa.model.readout_layers import normalize_layers
from levjepa.model.rope import ROPE_LAYOUTS

__all__ = ["ENCODER_PRESETS", "EncoderConfig", "encoder_config"]

DROP_MODES = ("uniform", "tube")
TUBELET_INITS = ("random", "inflate")
ATTENTIONS = ("block_causal", "bidirectional")
# every size of the architecture and its largest accepted value (ViT-H's are 1280 / 32 / 16 / 14 / 2)
_SIZES = {
    "dim": 1 << 16,
    "depth": 1024,
    "heads": 1024,
    "patch_size": 1024,
    "tubelet": 256,
    "in_chans": 64,
    "proj_hidden": 1 << 20,
    "proj_dim": 1 << 20,
}


@dataclass(frozen=True)
class EncoderConfig:
    dim: int = 768
    depth: int = 12
    heads: int = 12
    mlp_ratio: float = 4.0
    patch_size: int = 16
    tubelet: int = 1
    in_chans: int = 3
    drop_ratio: float = 0.95
    drop_mode: Literal["uniform", "tube"] = "uniform"
    attention: Literal["block_causal", "bidirectional"] = "block_causal"
    final_norm: bool = True
    final_norm_bias: bool = False  # True only for weights written before the bias was removed
    qkv_bias: bool = True
    proj_hidden: int = 2048
    proj_dim: int = 256
    rope_base: float = 10000.0
    init_std: float = 0.02
    tubelet_init: Literal["random", "inflate"] = "random"
    norm_eps: float = 1e-6
    grad_checkpointing: bool = False
    rope_layout: Literal["levjepa", "vjepa2"] = "levjepa"
    init_from: str | None = None  # not architecture: the weights a pretraining run starts from (see above)
    # not architecture: the blocks a frozen reader reads, concatenated on channels (None: the last; see above)
    readout_layers: tuple[int, ...] | None = field(default=None, metadata={OMIT_DEFAULT: True})

    def __post_init__(self) -> None:
        for name, high in _SIZES.items():  # upper bounds: a typo's extra zeros fail here, not as an allocation
            value = getattr(self, name)
            check(
                isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high,
                f"model.{name}={value!r}: expected a whole number 1..{high}",
            )
        check(
            self.dim % self.heads == 0,
            f"model.dim={self.dim} is not divisible by model.heads={self.heads}: choose heads among the "
            f"divisors of dim, e.g. {', '.join(str(h) for h in range(1, 17) if self.dim % h == 0)}",
        )
        head_dim = self.dim // self.heads
        check(
            head_dim % 2 == 0 and head_dim >= 6,
            f"model.dim / model.heads: head dim {self.dim}/{self.heads} = {head_dim}; 3D RoPE needs an even "
            "head dim of at least 6 (one rotated pair per axis t, y, x)",
        )
        check(0 < self.mlp_ratio <= 64, f"model.mlp_ratio={self.mlp_ratio!r}: expected a number in (0, 64]")
        check(
            0.0 <= self.drop_ratio < 1.0,
            f"model.drop_ratio={self.drop_ratio!r}: expected 0 <= drop_ratio < 1 (0.95 in the paper)",
        )
        check(
            self.drop_mode in DROP_MODES,
            f"model.drop_mode={self.drop_mode!r}: valid choices are {', '.join(DROP_MODES)}",
        )
        check(
            self.attention in ATTENTIONS,
            f"model.attention={self.attention!r}: valid choices are {', '.join(ATTENTIONS)}",
        )
        check(self.rope_base > 1.0, f"model.rope_base={self.rope_base!r}: expected a number > 1")
        check(
            self.tubelet_init in TUBELET_INITS,
            f"model.tubelet_init={self.tubelet_init!r}: valid choices are {', '.join(TUBELET_INITS)}",
        )
        check(self.init_std > 0, f"model.init_std={self.init_std!r}: expected a positive number")
        check(self.norm_eps > 0, f"model.norm_eps={self.norm_eps!r}: expected a positive number")
        check(
            self.rope_layout in ROPE_LAYOUTS,
            f"model.rope_layout={self.rope_layout!r}: valid choices are {', '.join(ROPE_LAYOUTS)}",
        )
        check(
            self.init_from is None or (isinstance(self.init_from, str) and self.init_from != ""),
            f"model.init_from={self.init_from!r}: expected a path (a run, an export, a checkpoint) or none",
        )
        layers = normalize_layers(self.readout_layers, self.depth, f"model.readout_layers={self.readout_layers}")
        object.__setattr__(self, "readout_layers", layers)  # normalised: the last block alone is None

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.dim * self.mlp_ratio)

    @property
    def readout_dim(self) -> int:
        """Channels of what a frozen reader reads: ``dim`` per readout layer."""
        return self.dim * (1 if self.readout_layers is None else len(self.readout_layers))


ENCODER_PRESETS: dict[str, EncoderConfig] = {
    "vit-tiny": EncoderConfig(dim=192, depth=12, heads=3),
    "vit-small": EncoderConfig(dim=384, depth=12, heads=6),
    "vit-base": EncoderConfig(dim=768, depth=12, heads=12),
    "vit-large": EncoderConfig(dim=1024, depth=24, heads=16),
    "vit-huge": EncoderConfig(dim=1280, depth=32, heads=16),
    # tiny, for unit tests: head dim 16 -> RoPE pairs t/y/x = 2/3/3
    "vit-test": EncoderConfig(dim=32, depth=2, heads=2, patch_size=8, proj_hidden=64, proj_dim=16),
    # the 10-minute CPU demo on 64-px clips (8x8 patches per frame)
    "vit-demo": EncoderConfig(dim=128, depth=4, heads=4, patch_size=8, proj_hidden=1024, proj_dim=128),
}


def encoder_config(name: str = "vit-base", **overrides: Any) -> EncoderConfig:
    """The preset ``name`` with ``overrides`` applied (validated), e.g. ``encoder_config("vit-small", tubelet=2)``."""
    if name not in ENCODER_PRESETS:
        raise ConfigError(f"unknown encoder preset {name!r}: valid names are {', '.join(ENCODER_PRESETS)}")
    fields = [f.name for f in dataclasses.fields(EncoderConfig)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigError(f"unknown EncoderConfig field(s) {', '.join(unknown)}: valid fields are {', '.join(fields)}")
    return dataclasses.replace(ENCODER_PRESETS[name], **overrides)
