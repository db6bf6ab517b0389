"""The synthetic task: the built-in benchmark's three readouts of one set of clips (``levjepa.data.synthetic``).

A real image (Fashion-MNIST or scikit-learn digits — every result states which) moving over a textured
background:

* ``appearance`` — the image's class (IN1K-like, 10 classes);
* ``motion`` — the on-screen direction, 8 classes (SSv2-like: needs more than one frame);
* ``arrow`` — arrow of time, forward vs reversed (2 classes: forward motion decelerates).

The clips are held in memory (``levjepa.eval.clips_task.LabelledSplits``) and evaluated by the one harness
(``levjepa.eval.harness``): probes chosen on val, reported on test.

Budgets. ``full``: every clip of the splits and the V-JEPA 2 grid (20 attentive probes, 20 epochs).
``demo``: the first 512 / 128 / 256 clips of train / val / test for 16×64×64 clips (the splits are in random
order; smaller clips get proportionally more of them, up to the whole split) and a 2 × 2 grid with few
epochs, sized so that the CPU demo's evaluation stays short; its cost is measured in ``bench/eval.md``
(§ "Cost of the demo evaluation"). The table's caption states the clip counts, the image source and the
clip size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Literal

from levjepa.config import apply_overrides, to_dict
from levjepa.data.config import SyntheticConfig
from levjepa.data.synthetic import load_split
from levjepa.eval.clips_task import LabelledSplits
from levjepa.eval.config import EvalConfig
from levjepa.eval.harness import evaluate
from levjepa.eval.result import EvalResult
from levjepa.model.vit import VideoEncoder
from levjepa.train.config import PretrainConfig

__all__ = [
    "BUDGET_LIMITS",
    "SYNTHETIC_TITLE",
    "TASKS",
    "evaluate_benchmark",
    "synthetic_config_for",
    "synthetic_splits",
]

TASKS = ("appearance", "motion", "arrow")
SPLITS = ("train", "val", "test")
# split sizes of the "demo" budget for 16x64x64 clips; smaller clips get proportionally more of them (the
# budget is a fixed number of pixels to encode), up to the whole split
BUDGET_LIMITS: dict[str, dict[str, int] | None] = {"demo": {"train": 512, "val": 128, "test": 256}, "full": None}
DEMO_REFERENCE_PIXELS = 16 * 64 * 64
SYNTHETIC_TITLE = "built-in benchmark (moving image over texture: appearance, motion direction, arrow of time)"


def synthetic_config_for(run_config: PretrainConfig | None, overrides: Sequence[str] = ()) -> SyntheticConfig:
    """The benchmark config a run trained with (``data.synthetic`` of its config), else the default."""
    cfg = run_config.data.synthetic if run_config is not None else SyntheticConfig()
    return apply_overrides(cfg, list(overrides))


def synthetic_splits(cfg: SyntheticConfig, budget: Literal["demo", "full"] = "demo") -> LabelledSplits:
    """The built-in benchmark's splits (``levjepa.data.synthetic.load_split``), cut to the budget's sizes."""
    if budget not in BUDGET_LIMITS:
        raise ValueError(f"budget={budget!r}: valid choices are {', '.join(BUDGET_LIMITS)}")
    limits = BUDGET_LIMITS[budget]
    if limits is not None:
        scale = max(1.0, DEMO_REFERENCE_PIXELS / (cfg.num_frames * cfg.size * cfg.size))
        limits = {split: int(n * scale) for split, n in limits.items()}
    clips, labels = {}, {}
    source, num_classes = "", {}
    for split in SPLITS:
        data = load_split(cfg, split)  # type: ignore[arg-type]
        n = len(data) if limits is None else min(len(data), limits[split])
        clips[split] = data.clips[:n]
        labels[split] = {t: data.labels[t][:n] for t in TASKS}
        source, num_classes = data.image_source, {t: data.num_classes[t] for t in TASKS}
    digest = hashlib.sha1(json.dumps(to_dict(cfg), sort_keys=True).encode()).hexdigest()[:12]
    sizes = "-".join(str(len(c)) for c in clips.values())
    return LabelledSplits(clips, labels, num_classes, source, key=f"synthetic-{digest}-{sizes}")


def evaluate_benchmark(
    encoders: Mapping[str, VideoEncoder], synthetic: SyntheticConfig, cfg: EvalConfig | None = None
) -> EvalResult:
    """The built-in benchmark (``synthetic``: its config) for each named encoder: the table the CPU demo
    prints for pretrained (EMA and online) vs random-init encoders. Encoders are left as they were found
    (their train/eval mode is restored, their parameters untouched)."""
    cfg = cfg if cfg is not None else EvalConfig()
    for t in cfg.tasks:
        if t not in TASKS:
            raise ValueError(f"task {t!r}: valid tasks are {', '.join(TASKS)}")
    splits = synthetic_splits(synthetic, cfg.budget)
    result = evaluate(encoders, splits, cfg if cfg.title else dataclasses.replace(cfg, title=SYNTHETIC_TITLE))
    assert result is not None  # in-memory clips: every process trains its probes
    return result
