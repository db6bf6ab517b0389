"""Frozen evaluation on labelled splits: the built-in benchmark's three tasks, or a user's labelled index.

The built-in benchmark (``levjepa.data.synthetic``): a real image (Fashion-MNIST or scikit-learn digits —
every result states which) moving over a textured background. Three readouts of one set of clips:

* ``appearance`` — the image's class (IN1K-like, 10 classes);
* ``motion`` — the on-screen direction, 8 classes (SSv2-like: needs more than one frame);
* ``arrow`` — arrow of time, forward vs reversed (2 classes: forward motion decelerates).

For each encoder the features of the train / val / test clips are computed **once** (``features.py``:
frozen, ``eval()``, no dropping) and every probe of every task reads them: the attentive probe (tokens),
the linear probe (mean-pooled patches), kNN (CLS). The grids of the three tasks are stacked into one
model per probe kind and trained on the same batches (each probe still trains as if alone), so the
tokens are read once per batch for all tasks. Probe grids are chosen on val and reported on test
(``probes.py``, ``knn.py``). Every encoder gets the same probe seed, so columns differ only by the encoder.

Budgets. ``full``: every clip of the splits and the V-JEPA 2 grid (20 attentive probes, 20 epochs).
``demo``: the first 512 / 128 / 256 clips of train / val / test (the splits are in random order) and a
2 × 2 grid with few epochs — sized so that three encoders at demo size (vit-demo, 16×64×64 clips, 1024
tokens per clip) fit in about three minutes on 2 idle CPU cores. The encoder's forward dominates: ≈ 80 ms
of CPU time per clip (≈ 3.7 GFLOPs, attention over 1025 tokens being most of it), so 3 × 896 clips cost
≈ 2 minutes; the probes of all three tasks add ≈ 10–15 s per encoder (``bench/eval.md``).
The table's caption states the clip counts, the image source and the clip size.

What is evaluated and how — tasks, probes, budget, probe config, seed, device, batch size, feature cache —
is one frozen :class:`EvalConfig`, passed unchanged from ``evaluate_benchmark`` / ``evaluate_splits`` down to
the probes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from levjepa.config import apply_overrides, check, to_dict
from levjepa.data.config import SyntheticConfig
from levjepa.data.synthetic import load_split
from levjepa.eval.features import Features, cached_features
from levjepa.eval.knn import KnnResult, knn_evaluate
from levjepa.eval.probes import GridResult, ProbeConfig, probe_config, train_probe_grid
from levjepa.model.vit import VideoEncoder
from levjepa.rng import make_generator
from levjepa.train.config import PretrainConfig

__all__ = [
    "BENCHMARK_TITLE",
    "BUDGET_LIMITS",
    "PROBES",
    "TASKS",
    "BenchmarkResult",
    "EvalConfig",
    "LabelledSplits",
    "benchmark_splits",
    "evaluate_benchmark",
    "evaluate_encoder_on_splits",
    "evaluate_features",
    "synthetic_config_for",
]

TASKS = ("appearance", "motion", "arrow")
PROBES = ("attentive", "linear", "linear_cls", "knn")
# what each probe reads and which probe model it trains (kNN trains none)
PROBE_INPUTS = {"attentive": "tokens", "linear": "mean", "linear_cls": "cls", "knn": "cls"}
PROBE_KINDS = {"attentive": "attentive", "linear": "linear", "linear_cls": "linear"}
PROBE_LABELS = {"attentive": "attentive", "linear": "linear (mean)", "linear_cls": "linear (CLS)", "knn": "kNN (CLS)"}
SPLITS = ("train", "val", "test")
# split sizes of the "demo" budget for 16x64x64 clips; smaller clips get proportionally more of them (the
# budget is a fixed number of pixels to encode), up to the whole split
BUDGET_LIMITS: dict[str, dict[str, int] | None] = {"demo": {"train": 512, "val": 128, "test": 256}, "full": None}
DEMO_REFERENCE_PIXELS = 16 * 64 * 64

Result = GridResult | KnnResult


@dataclass
class LabelledSplits:
    """Clips and labels of train / val (/ test) splits, for one or several tasks."""

    clips: dict[str, Tensor]  # split -> uint8 [N, C, T, H, W]
    labels: dict[str, dict[str, Tensor]]  # split -> task -> int64 [N]
    num_classes: dict[str, int]  # task -> classes
    image_source: str  # what the clips show ("fashion-mnist", "digits", an index file, ...)
    key: str  # names the data for the feature cache

    @property
    def tasks(self) -> list[str]:
        return list(self.num_classes)

    @property
    def sizes(self) -> dict[str, int]:
        return {s: len(c) for s, c in self.clips.items()}

    @property
    def clip_text(self) -> str:
        c = next(iter(self.clips.values()))
        return f"{c.shape[2]}×{c.shape[3]}×{c.shape[4]} (T×H×W)"


@dataclass(frozen=True)
class EvalConfig:
    """How frozen encoders are evaluated on labelled splits: the one object every function below takes."""

    tasks: tuple[str, ...] = TASKS  # which labels of the splits to probe
    probes: tuple[str, ...] = PROBES  # attentive (every token), linear (mean-pooled patches), knn (CLS)
    budget: Literal["demo", "full"] = "demo"  # the probe grid and (built-in benchmark) the split sizes
    probe: ProbeConfig | None = None  # how probes train; None: probe_config(budget)
    seed: int = 0  # probe initialisation and batch order, the same for every encoder (columns differ by it only)
    device: str = "cpu"
    batch_size: int = 8  # clips per encoder forward
    cache_dir: str | None = None  # feature cache, keyed by the weights and the data
    progress: bool = False
    title: str = ""  # what the table's caption calls the evaluation

    def __post_init__(self) -> None:
        check(self.budget in BUDGET_LIMITS, f"budget={self.budget!r}: valid choices are {', '.join(BUDGET_LIMITS)}")
        check(len(self.tasks) > 0, "eval: at least one task")
        for p in self.probes:
            check(p in PROBES, f"probe {p!r}: valid choices are {', '.join(PROBES)}")
        check(self.batch_size >= 1, f"eval.batch_size={self.batch_size}: must be >= 1")

    @property
    def probe_cfg(self) -> ProbeConfig:
        return self.probe if self.probe is not None else probe_config(self.budget)


def synthetic_config_for(run_config: PretrainConfig | None, overrides: Sequence[str] = ()) -> SyntheticConfig:
    """The benchmark config a run trained with (``data.synthetic`` of its config), else the default."""
    cfg = run_config.data.synthetic if run_config is not None else SyntheticConfig()
    return apply_overrides(cfg, list(overrides))


def benchmark_splits(cfg: SyntheticConfig, budget: Literal["demo", "full"] = "demo") -> LabelledSplits:
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


def _probe_input(f: Features, probe: str) -> Tensor:
    """What each probe reads: every token (attentive), mean-pooled patches (linear), CLS (linear_cls, kNN).

    The encoder has no absolute position embedding (3D RoPE), so mean-pooled patches cannot say *where* or
    *in which frame* something is; the CLS, which the pretraining objective trains directly and which attends
    every patch with relative positions, can. Reporting both linear readouts shows which one carries a task.
    """
    if probe not in PROBE_INPUTS:
        raise ValueError(f"probe {probe!r}: valid choices are {', '.join(PROBES)}")
    source = PROBE_INPUTS[probe]
    if source == "tokens":
        if f.tokens is None:
            raise ValueError("the attentive probe needs every token: compute the features with keep_tokens=True")
        return f.tokens
    return f.mean if source == "mean" else f.cls


def evaluate_features(
    feats: Mapping[str, Features], splits: LabelledSplits, cfg: EvalConfig
) -> dict[str, dict[str, Result]]:
    """task -> probe -> result, from cached features of each split (probes never see the encoder)."""
    tasks, probes = cfg.tasks, cfg.probes
    out: dict[str, dict[str, Result]] = {t: {} for t in tasks}
    classes = {t: splits.num_classes[t] for t in tasks}
    for probe in probes:
        data = {s: (_probe_input(f, probe), {t: splits.labels[s][t] for t in tasks}) for s, f in feats.items()}
        if probe == "knn":
            for t in tasks:
                pick = {s: (x, y[t]) for s, (x, y) in data.items()}
                out[t][probe] = knn_evaluate(pick["train"], pick["val"], pick.get("test"), num_classes=classes[t])
            continue
        # every task's grid in one stacked model: the tokens are read once per batch for all tasks
        res = train_probe_grid(
            PROBE_KINDS[probe],  # type: ignore[arg-type]
            cfg.probe_cfg,
            data["train"],
            data["val"],
            data.get("test"),
            num_classes=classes,
            generator=make_generator("probe", cfg.seed, ",".join(tasks), probe),
            device=cfg.device,
        )
        assert isinstance(res, dict)
        for t in tasks:
            out[t][probe] = res[t]
    return out


def evaluate_encoder_on_splits(
    encoder: VideoEncoder, splits: LabelledSplits, cfg: EvalConfig
) -> tuple[dict[str, dict[str, Result]], dict[str, float]]:
    """Features of every split once (cached when ``cfg.cache_dir``), then every probe of every task; returns
    task -> probe -> result and the seconds spent on features and on probes."""
    t0 = time.perf_counter()
    feats = {
        s: cached_features(
            encoder,
            clips,
            key=f"{splits.key}-{s}",
            cache_dir=cfg.cache_dir,
            keep_tokens="attentive" in cfg.probes,
            batch_size=cfg.batch_size,
            device=cfg.device,
            progress=cfg.progress,
            desc=f"features {s}",
        )
        for s, clips in splits.clips.items()
    }
    t1 = time.perf_counter()
    res = evaluate_features(feats, splits, cfg)
    return res, {"features_s": t1 - t0, "probes_s": time.perf_counter() - t1}


@dataclass
class BenchmarkResult:
    """Accuracy (%) of every encoder × task × probe; ``results[encoder][task][probe]`` keeps the whole grid."""

    encoders: list[str]
    tasks: list[str]
    probes: list[str]
    results: dict[str, dict[str, dict[str, Result]]]
    chance: dict[str, float]  # task -> majority-class accuracy (%) of the reported split
    info: dict[str, Any] = field(default_factory=dict)

    def accuracy(self, encoder: str, task: str, probe: str) -> float:
        return self.results[encoder][task][probe].reported

    def caption(self) -> str:
        i = self.info
        sizes = "/".join(str(v) for v in i.get("split_sizes", {}).values())
        split = "test" if i.get("has_test", True) else "val (no test split given)"
        return (
            f"Frozen-encoder accuracy (%) on {split} of the probe chosen on val — {i.get('title', 'benchmark')}; "
            f"image source: {i.get('image_source')}; clips {i.get('clip')}; train/val/test {sizes} clips; "
            f"budget {i.get('budget')}; chance = the majority class's share of that split."
        )

    def table(self) -> str:
        head = ["task", "probe", *self.encoders, "chance"]
        lines = [self.caption(), "", "| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
        for task in self.tasks:
            for probe in self.probes:
                label = PROBE_LABELS.get(probe, probe)
                if probe == "attentive" and self.info.get("probe_depth", 1) != 1:
                    label = "attentive4"
                accs = [f"{self.accuracy(e, task, probe):.1f}" for e in self.encoders]
                lines.append(f"| {task} | {label} | " + " | ".join(accs) + f" | {self.chance[task]:.1f} |")
        if "seconds" in self.info:
            lines.append("")
            lines.append(f"({self.info['seconds']:.0f} s on {self.info.get('device', 'cpu')}.)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "info": self.info,
            "chance": self.chance,
            "accuracy": {
                e: {t: {p: self.accuracy(e, t, p) for p in self.probes} for t in self.tasks} for e in self.encoders
            },
            "results": {
                e: {t: {p: r.to_json() for p, r in tp.items()} for t, tp in te.items()}
                for e, te in self.results.items()
            },
        }


def chance_levels(splits: LabelledSplits, tasks: Sequence[str]) -> dict[str, float]:
    split = "test" if "test" in splits.labels else "val"
    out = {}
    for t in tasks:
        y = splits.labels[split][t]
        out[t] = 100.0 * float(torch.bincount(y, minlength=splits.num_classes[t]).max()) / max(1, len(y))
    return out


def evaluate_splits(encoders: Mapping[str, VideoEncoder], splits: LabelledSplits, cfg: EvalConfig) -> BenchmarkResult:
    """Every encoder through :func:`evaluate_encoder_on_splits`; one table."""
    for t in cfg.tasks:
        if t not in splits.num_classes:
            raise ValueError(f"task {t!r}: valid tasks here are {', '.join(splits.num_classes)}")
    start = time.perf_counter()
    results, timings = {}, {}
    for name, enc in encoders.items():
        enc = getattr(enc, "encoder", enc)  # a LoadedEncoder or the module itself
        results[name], timings[name] = evaluate_encoder_on_splits(enc, splits, cfg)
    probe_cfg = cfg.probe_cfg
    info = {
        "title": cfg.title,
        "image_source": splits.image_source,
        "clip": splits.clip_text,
        "split_sizes": splits.sizes,
        "has_test": "test" in splits.clips,
        "budget": cfg.budget,
        "probe_depth": probe_cfg.depth,
        "probe_config": {k: list(v) if isinstance(v, tuple) else v for k, v in probe_cfg.__dict__.items()},
        "device": str(cfg.device),
        "seed": cfg.seed,
        "timings_s": timings,
        "seconds": time.perf_counter() - start,
    }
    tasks, probes = list(cfg.tasks), list(cfg.probes)
    return BenchmarkResult(list(encoders), tasks, probes, results, chance_levels(splits, tasks), info)


BENCHMARK_TITLE = "built-in benchmark (moving image over texture: appearance, motion direction, arrow of time)"


def evaluate_benchmark(
    encoders: Mapping[str, VideoEncoder], synthetic: SyntheticConfig, cfg: EvalConfig = EvalConfig()
) -> BenchmarkResult:
    """The built-in benchmark (``synthetic``: its config) for each named encoder: the table the CPU demo
    prints for pretrained (EMA and online) vs random-init encoders. Encoders are left as they were found
    (their train/eval mode is restored, their parameters untouched)."""
    for t in cfg.tasks:
        if t not in TASKS:
            raise ValueError(f"task {t!r}: valid tasks are {', '.join(TASKS)}")
    splits = benchmark_splits(synthetic, cfg.budget)
    return evaluate_splits(encoders, splits, cfg if cfg.title else dataclasses.replace(cfg, title=BENCHMARK_TITLE))
