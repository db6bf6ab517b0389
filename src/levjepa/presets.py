"""Named pretraining presets: functions returning a full ``PretrainConfig`` (STYLE 3).

=====================  ==========================================================================
preset                 what it reproduces
=====================  ==========================================================================
demo-cpu               a CPU run of under 10 minutes on 2 cores: a small ViT (``vit-demo``, 2-frame tubelets)
                       pretrained on the built-in appearance/motion benchmark (16×32×32 clips, 1 global
                       32-px + 2 local 24-px views, ρ = 0.5, block-causal, 800 steps), then frozen probes
                       against the same encoder at random initialisation. The README's main command
                       (see ``demo_cpu``).
demo-cpu-long          800 steps of the recipe the learning curve was measured with (4 local views,
                       32-d projections, the crops and lr of ``bench/quality.md`` § 1.5; § 4).
vit-tiny-consumer      the paper's consumer-hardware run (§5.3): ViT-Tiny, batch 128, 1 global + 4
                       local views, ρ = 0.95, block-causal, bf16 on one GPU; needs ``data.sources``.
vit-b-paper            the paper's controlled ViT-B/16 setting (SPEC §2–4): 224/96 views, V = 4,
                       ρ = 0.95, AdamW lr 4e-4, betas (0.9, 0.95), wd 0.04, warm-up from 1e-4 over 1200
                       steps then flat, bf16, effective batch 3072 (gradient accumulation over
                       ``data.batch_size`` × ranks), 240 epochs of K710-20 % ≈ 10.3k steps; needs
                       ``data.sources``.
=====================  ==========================================================================

**The batch the loss sees** (``train.accumulation=global``, the default): the whole effective batch
``train.batch_size`` on any number of GPUs and micro-batches, so SIGReg's N — which with λ sets the balance
of the two loss terms, about as ``λ·N`` (``bench/train.md``) — is a property of the preset, not of the
hardware: demo-cpu N = 64 (λ = 0.3), vit-tiny-consumer N = 128 (λ = 0.02), vit-b-paper N = 3072 (λ = 0.02;
it was ``128 × GPUs`` under the official code's per-micro-batch loss, ``train.accumulation=local``). The paper
itself keeps λ = 0.02 from N = 128 to N = 3072.

The objective is switched with ``objective.name=levjepa|lejepa|localejepa`` on any preset (LeJEPA's
recommended start adds ``data.num_global=2 objective.num_global_views=2 data.num_local=8``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from levjepa.config import ConfigError
from levjepa.data import DataConfig, SyntheticConfig
from levjepa.model import encoder_config
from levjepa.objective import ObjectiveConfig
from levjepa.train.config import OptimConfig, PretrainConfig, TrainConfig

__all__ = ["DEMO_MARGIN", "DEMO_PROBE", "DEMO_TARGETS", "PRESETS", "demo_misses", "needs_sources", "preset"]


# What demo-cpu promises (issues 11 and 29): on each task of the built-in benchmark, the best probe of the
# pretrained (EMA) encoder reaches DEMO_TARGETS (%) and beats the same architecture at random initialisation, drawn
# from the same seed, by at least DEMO_MARGIN points. Held on every seed and thread count measured with AVX-512;
# with AVX2 at one thread the digit's margin fell a point short (docs/demo.md).
DEMO_TARGETS = {"appearance": 70.0, "motion": 90.0, "arrow": 95.0}
DEMO_MARGIN = 15.0
# The attentive probe the promise was measured with (ten seeds, bench/quality.md § 9): the demo budget as it was
# then, 10 epochs chosen on val accuracy. The demo budget's own recipe now (20 epochs chosen on val loss, steadier
# over probe seeds: bench/eval.md, "Probe seeds") also reads the digit better from a *random* encoder (seed 0:
# 74.5 vs 68.5 %), so the margin above is a fact about this probe; docs/demo.md has both readings.
DEMO_PROBE = {"epochs": 10, "select": "acc"}


def demo_misses(
    pretrained: Mapping[str, Mapping[str, float]], random_init: Mapping[str, Mapping[str, float]]
) -> list[str]:
    """What a demo result misses of its promise, one line per target or margin (empty: every one met). Each
    argument is one encoder's accuracies ``{task: {probe: %}}`` (``EvalResult.to_json()["accuracy"][name]``);
    a task is read by its best probe (compared at 1e-6 %, below any test split's resolution, so that float
    rounding of an accuracy cannot decide a verdict)."""
    misses = []
    for task, target in DEMO_TARGETS.items():
        p, r = round(max(pretrained[task].values()), 6), round(max(random_init[task].values()), 6)
        if p < target:
            misses.append(f"{task}: {p:.1f} < {target:.0f}")
        if p - r < DEMO_MARGIN:
            misses.append(f"{task}: {p:.1f} vs random init {r:.1f}, {p - r:+.1f} < +{DEMO_MARGIN:.0f}")
    return misses


def _demo_synthetic(num_train: int = 1600) -> SyntheticConfig:
    """The benchmark the CPU demos train and probe on (measured reasons in ``bench/quality.md``)."""
    return SyntheticConfig(
        image_source="digits",  # what `pip install` brings everywhere, so the README's table is the user's
        size=32,
        num_train=num_train,
        texture_contrast=0.0,
        object_scale=0.55,
        friction=0.85,  # forward speed x0.85 per frame: 0.09 of the start speed by the last frame
        speed=0.058,  # 1.9 px/frame at the start: the whole trajectory fits inside with room to spare
        background_motion_p=0.0,
        background_value=(0.1, 0.2),
        background_saturation=(0.0, 0.25),
        object_saturation=(0.0, 0.25),
        object_value=(0.85, 1.0),
        boundary="inside",
        pretrain_clips="fresh",
    )


def demo_cpu(steps: int = 800) -> PretrainConfig:
    """The README's main job: 800 steps of pretraining on 2 CPU cores, then frozen probes of appearance, motion
    and the arrow of time against the same encoder at random initialisation, within the quick start's 10-minute
    budget. What it reaches and how long it takes: the README's table and ``bench/quality.md`` § 9 (ten seed ×
    thread runs of this recipe; §§ 3 and 7 measured the 320-step demo it grew from).

    Where it departs from the paper's video defaults, and why. Each choice was measured with
    ``bench/quality.py``; the runs, their commands and numbers are in ``bench/quality.md``, whose § 8 lists them
    choice by choice:

    * A benchmark an encoder can learn from at all: digits (the image source every install has), the object
      wholly inside the frame, a dark background (HSV value 0.1–0.2) and near-grey colours (saturation
      0–0.25). With mid-grey backgrounds ImageNet normalisation gives every flat patch the same ± direction
      and the encoder stayed at chance even *with labels*; with strongly coloured objects and backgrounds the
      CLS spent itself on colour (§ 1.1, § 1.3).
    * Fresh clips (``pretrain_clips="fresh"``): every draw of a train image is rendered with new motion,
      position and colours, as a video corpus never repeats a clip; the probes read the fixed splits.
    * **Tubelets of 2 frames** (τ = 2, the paper's option; it defaults to τ = 1) with ρ = 0.5: each token
      sees two frames, so displacement is in the patch embedding itself. With τ = 1 and uniform dropping the
      CLS learned appearance and where the object sits but not where it goes (§ 1.3, ``bench/quality.py
      factors``); τ = 2 at ρ = 0.5 keeps as many tokens as τ = 1 at ρ = 0.75. A stronger deceleration (friction
      0.85) makes the arrow of time easier to read (§ 1.4).
    * **Inflated tubelet filters** (``tubelet_init="inflate"``, I3D / ViViT's filter inflation; the paper
      leaves the init open): each output's τ = 2 filter starts as one draw repeated over both frames. With
      every weight drawn, a *random* encoder's 2-frame tokens are random motion filters that a probe reads
      almost as well as a pretrained encoder, so pretraining has no margin left to show; inflated, the random
      encoder does not see motion while pretraining still learns it (§ 1.5).
    * 16×32×32 clips with 8-px patches (16 patches per frame) so that the run and its evaluation fit the
      time; local views of 24 px (3×3 patches: a 16-px view keeps too few tokens to see motion, § 1.2).
    * **Two local views, 800 steps** (the paper's V = 4 costs more per clip, ``bench/quality.md`` § 9): more
      optimiser steps of the same batch of 64 in the 10 minutes, which § 9 measured to carry the digit
      further on the seeds where it was weakest. 800 rather than 640 or 720 (the cosine stretched over them):
      the digit's margin over random init is thinnest on the seed whose random encoder reads it best, short
      of its 15 points at 640 and within half a point of them at 720, where a change of rounding alone moved
      it across the line (§ 9, "800 steps"; the times measured: ``bench/quality.md`` § 9 and the README).
    * A smaller model and head: ``vit-demo`` (width 128, depth 4, 4 heads) with **MLPs of ratio 2** in its
      blocks (256 hidden, not the ViT's 4 × 128): a cheaper step, which is what keeps 800 steps inside the
      time, with motion and the arrow learned as well or better; the digit's margin over random init is the
      thin one, since a random encoder with narrower MLPs reads the digit better (§ 9, "MLP ratio 2"). Its
      projector is ``Linear(128, 1024) → BatchNorm → GELU → Linear(1024,
      512)``: 1024 wide, **projections of 512 dimensions** (twice the paper's 256). With 32 the three
      cues competed for the projection: which was learned first, and when, moved with the seed, and on some
      seeds motion and the arrow came too late; 64 still left the arrow short on the seeds whose motion came
      last; at 128 one seed's CLS held no arrow at all, and a probe read it from the patch tokens only just at
      its target (§ 9, "more projection dimensions", "128 dimensions", "256 projection dimensions"); at 256,
      once the CLS token was decayed as the official code does (issue 44), seed 4's CLS held no arrow again and
      the arrow sat 0.8–2 points above its target on three seeds: 512 puts it back (§ 9, "512 dimensions").
    * λ = 0.3, not 0.02, at N = 64 (one batch, no accumulation). Away from the Gaussian target SIGReg's
      pull on the weights grows about ∝ N while the invariance term's does not, so ``λ·N`` sets the balance
      (``bench/train.md``, λ against the batch N); the paper uses 0.02 at N = 128 and at N = 3072 alike. A
      smaller λ here let the motion features crowd out appearance (§ 1.3, § 1.4).
    * A shorter, faster optimiser schedule: AdamW lr 1.7e-3 (the paper's 4e-4), a 50-step linear warm-up from
      1.7e-4 (not 1200 steps), then a cosine decay to 1.7e-4 at the last step (not flat); betas and weight
      decay are the paper's. In the 320-step runs of § 1.5 and § 1.6 the lr traded appearance against motion and
      the arrow, and the balance was narrow.
    * Augmentations suited to the benchmark: no flips (a flip reverses the motion label), local crops of
      30–70 % of the frame, strong hue change and grayscale (colour is a random per-clip nuisance here). A
      crop must hold enough of the digit to share it with the global view: with smaller crops the invariance
      was met mostly by motion (§ 1.6).
    * EMA decay 0.95 every step (the paper's 0.9999 every 32 steps would barely move in a few hundred
      steps): with the EMA's warm-up (``levjepa.train.ema``: β_n = min(0.95, n / (n + 10))) the average
      leans on the last few tens of steps. At 0.99 it lagged behind the online encoder on the seeds still
      learning motion at the end (§ 9).
    """
    return PretrainConfig(
        preset="demo-cpu",
        model=encoder_config(
            "vit-demo", tubelet=2, tubelet_init="inflate", drop_ratio=0.5, mlp_ratio=2.0, proj_dim=512
        ),
        data=DataConfig(
            sources=("synthetic",),
            synthetic=_demo_synthetic(),
            num_frames=16,
            global_size=32,
            local_size=24,
            num_local=2,
            local_scale=(0.3, 0.7),
            flip_p=0.0,
            hue=0.5,
            grayscale_p=0.5,
            batch_size=64,
            num_workers=2,
        ),
        objective=ObjectiveConfig(name="levjepa", lam=0.3),
        optim=OptimConfig(lr=1.7e-3, start_lr=1.7e-4, warmup_steps=50, schedule="cosine", final_lr=1.7e-4),
        train=TrainConfig(
            steps=steps,
            batch_size=64,
            device="cpu",
            precision="fp32",
            ema_decay=0.95,
            ema_every=1,
            checkpoint_every=100,
            keep_last=4,
            log_every=20,
            eval_at_end=True,
            eval_budget="demo",
        ),
    )


def demo_cpu_long() -> PretrainConfig:
    """The four-view recipe of issue 11's demo (320 steps then) at 800 steps, to carry every target with room:
    the cosine over all of them, in the recipe its numbers were measured with (``bench/quality.md``
    § 4, § 8): 4 local views with crops of 15–50 % of the frame, 32-dimensional projections, MLP ratio 4, lr
    1.4e-3 (§ 1.5) and EMA decay 0.99. ``demo-cpu``'s crops and lr (§ 1.6), its two views, 512 dimensions, MLP
    ratio 2 and EMA decay (§ 9) were chosen for its 10 minutes. Everything else is ``demo-cpu``'s."""
    cfg = demo_cpu(steps=800)
    return replace(
        cfg,
        preset="demo-cpu-long",
        model=replace(cfg.model, proj_dim=32, mlp_ratio=4.0),
        data=replace(cfg.data, num_local=4, local_scale=(0.15, 0.5)),
        optim=replace(cfg.optim, lr=1.4e-3, start_lr=1.4e-4, final_lr=1.4e-4),
        train=replace(cfg.train, checkpoint_every=200, ema_decay=0.99),
    )


def vit_tiny_consumer() -> PretrainConfig:
    """The paper's consumer-hardware run (LeVJEPA §5.3, SPEC §3): ViT-Tiny pretrained on one 16 GB GPU with
    batch 128 (no accumulation: N = 128 at the paper's λ = 0.02), 1 global + 4 local views at the default
    224 / 96 geometry, ρ = 0.95, block-causal attention, bf16 on CUDA (``train.precision=auto``), and the
    official optimiser. 39k steps × 128 clips ≈ the paper's 5M sampled clips; checkpoints every 2000 steps.
    It has no built-in data: point ``data.sources`` at the videos (the paper used 8 Walking Tours videos)."""
    return PretrainConfig(
        preset="vit-tiny-consumer",
        model=encoder_config("vit-tiny"),
        data=DataConfig(batch_size=128, num_local=4),
        objective=ObjectiveConfig(name="levjepa"),
        optim=OptimConfig(),
        train=TrainConfig(steps=39_000, batch_size=128, checkpoint_every=2000, log_every=50),
    )


def vit_b_paper() -> PretrainConfig:
    """The paper's controlled ViT-B/16 setting (SPEC §2–4; the module table): effective batch 3072 made of
    ``data.batch_size`` 128 per GPU and micro-batch × GPU accumulation, 10.3k steps (240 epochs of K710-20 %),
    the official optimiser, bf16 on CUDA. Needs ``data.sources``."""
    return PretrainConfig(
        preset="vit-b-paper",
        model=encoder_config("vit-base"),
        data=DataConfig(batch_size=128, num_local=4),
        objective=ObjectiveConfig(name="levjepa"),
        optim=OptimConfig(
            lr=4e-4, start_lr=1e-4, warmup_steps=1200, schedule="flat", betas=(0.9, 0.95), weight_decay=0.04
        ),
        train=TrainConfig(steps=10_300, batch_size=3072, precision="auto", checkpoint_every=500, log_every=20),
    )


PRESETS: dict[str, Callable[[], PretrainConfig]] = {
    "demo-cpu": demo_cpu,
    "demo-cpu-long": demo_cpu_long,
    "vit-tiny-consumer": vit_tiny_consumer,
    "vit-b-paper": vit_b_paper,
}
_NEEDS_SOURCES = {"vit-tiny-consumer", "vit-b-paper"}


def preset(name: str) -> PretrainConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()


def needs_sources(cfg: PretrainConfig) -> bool:
    """Presets for real corpora must be pointed at data (they have no built-in default)."""
    return cfg.preset in _NEEDS_SOURCES and cfg.data.sources == DataConfig().sources
