"""One evaluation harness: ``evaluate(encoders, task, config)`` for every frozen-probe evaluation.

A **task** says what the labelled splits are and where each encoder's features come from; the harness does
the rest the same way for all of them: for each encoder, the features of every split (a feature source,
``levjepa.eval.source``), then every probe of ``config.probes`` on every label set of ``config.tasks``
(:func:`probe_sources`: the stacked grids of ``levjepa.eval.trainer``, kNN of ``levjepa.eval.knn``), then the
chance levels, the split sizes and the results-info dict, built here once. Every encoder gets the same
probe seed, so columns differ only by the encoder. Two tasks exist:

* ``levjepa.eval.clips_task.LabelledSplits`` — labelled clips in memory (the built-in benchmark,
  ``levjepa.eval.synthetic_task``), features computed once per encoder and optionally cached;
* ``levjepa.eval.dataset_task.DatasetTask`` — a user's labelled split files, features streamed to feature
  stores on disk (every rank builds its share; rank 0 trains the probes).

A task may keep each encoder's finished probes for a rerun to continue from (``records(name)``;
``DatasetTask``: beside its feature stores, ``levjepa.eval.probe_records``).

:func:`keep_probes` keeps the chosen probes of a result (``levjepa.eval.kept_probes``) with what each records
of its task, for ``levjepa probe`` and any script alike.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from levjepa.data.eval_clip import ViewSpec
from levjepa.eval.clips_task import LabelledSplits
from levjepa.eval.config import EvalConfig, probe_spec
from levjepa.eval.dataset_task import DatasetTask
from levjepa.eval.kept_probes import save_probes
from levjepa.eval.knn import knn_from_sources
from levjepa.eval.probe_records import ProbeRecords
from levjepa.eval.result import EvalResult, Result
from levjepa.eval.source import FeatureSource
from levjepa.eval.trainer import train_probes
from levjepa.formats.reading.load import LoadedEncoder
from levjepa.model.vit import VideoEncoder
from levjepa.rng import make_generator

__all__ = ["Task", "evaluate", "keep_probes", "probe_sources"]


class Task(Protocol):
    """What :func:`evaluate` needs from a task."""

    @property
    def num_classes(self) -> Mapping[str, int]: ...  # label set -> class count

    @property
    def image_source(self) -> str: ...  # what the clips show (every result states it)

    @property
    def clip_text(self) -> str: ...  # the clips' size and views, for the caption

    @property
    def report_seconds(self) -> bool: ...  # whether the wall time means something to report

    def prepare(self, encoders: Mapping[str, VideoEncoder], cfg: EvalConfig) -> bool:
        """Work every rank does before any probe; True on the rank that trains the probes."""
        ...

    def sources(self, name: str, encoder: VideoEncoder, cfg: EvalConfig) -> dict[str, FeatureSource]:
        """split -> the features of ``encoder`` (``train``, ``val`` and optionally ``test``)."""
        ...

    def info(self) -> dict[str, Any]:
        """What the results-info dict adds for this task."""
        ...


def probe_sources(
    sources: Mapping[str, FeatureSource],
    cfg: EvalConfig,
    num_classes: Mapping[str, int],
    records: ProbeRecords | None = None,
) -> dict[str, dict[str, Result]]:
    """task -> probe -> result: every probe of ``cfg.probes`` on every task of ``num_classes``, one encoder's
    features (the probes never see the encoder). The grids of all tasks share one stacked model per probe.
    ``records``: a probe finished before (a stopped evaluation run again) is read back from there, and each
    probe finished here is written there (``levjepa.eval.probe_records``)."""
    tasks = list(num_classes)
    out: dict[str, dict[str, Result]] = {t: {} for t in tasks}
    for probe in cfg.probes:
        key = records.key(probe, cfg, num_classes) if records is not None else ""
        done = records.load(key) if records is not None else None
        if done is None:
            done = _probe(probe, sources, cfg, num_classes)
            if records is not None:
                records.save(key, done)
        for t in tasks:
            out[t][probe] = done[t]
    return out


def _probe(
    probe: str, sources: Mapping[str, FeatureSource], cfg: EvalConfig, num_classes: Mapping[str, int]
) -> dict[str, Result]:
    """task -> the result of ``probe`` trained (or, kNN, evaluated) on ``sources``."""
    tasks = list(num_classes)
    train, val, test = sources["train"], sources["val"], sources.get("test")
    if probe == "knn":
        return {t: knn_from_sources(train, val, test, task=t, num_classes=num_classes[t]) for t in tasks}
    spec = probe_spec(probe)  # the kind it trains and the input it reads (levjepa.model.probe_kinds)
    res = train_probes(
        spec.kind,
        cfg.probe_cfg,
        spec.input,
        train,
        val,
        test,
        classes=num_classes,
        generator=make_generator("probe", cfg.seed, ",".join(tasks), probe),
        seed_generators=[make_generator("probe", cfg.seed + s, ",".join(tasks), probe) for s in range(1, cfg.seeds)],
        device=cfg.device,
        keep=cfg.keep_heads,
        progress=cfg.progress,
    )
    return {t: res[t] for t in tasks}


def _records(task: Task, name: str) -> ProbeRecords | None:
    """Where a task keeps the finished probes of encoder ``name`` for a rerun to continue from: its
    ``records(name)``, a method a task may have (``DatasetTask``: beside its feature stores); None otherwise."""
    records = getattr(task, "records", None)
    return records(name) if records is not None else None


def _chance(labels: torch.Tensor, num_classes: int) -> float:
    """Accuracy (%) of always answering the majority class."""
    return 100.0 * float(torch.bincount(labels, minlength=num_classes).max()) / max(1, len(labels))


def evaluate(encoders: Mapping[str, VideoEncoder], task: Task, cfg: EvalConfig) -> EvalResult | None:
    """Every encoder (a module or a ``LoadedEncoder``) on ``task``: one table (see the module doc). Returns
    None on the ranks that do not train the probes. Encoders are left as they were found."""
    names = list(cfg.tasks or task.num_classes)  # () = every label set of the task
    for t in names:
        if t not in task.num_classes:
            raise ValueError(f"task {t!r}: valid tasks here are {', '.join(task.num_classes)}")
    cfg = dataclasses.replace(cfg, tasks=tuple(names))
    classes = {t: task.num_classes[t] for t in names}
    modules = {name: getattr(enc, "encoder", enc) for name, enc in encoders.items()}
    if not task.prepare(modules, cfg):
        return None
    start = time.perf_counter()
    results, timings = {}, {}
    chance: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for name, enc in modules.items():
        t0 = time.perf_counter()
        sources = task.sources(name, enc, cfg)
        t1 = time.perf_counter()
        try:
            results[name] = probe_sources(sources, cfg, classes, _records(task, name))
        finally:
            for src in sources.values():
                src.close()
        timings[name] = {"features_s": t1 - t0, "probes_s": time.perf_counter() - t1}
        reported = sources.get("test", sources["val"])
        chance = {t: _chance(reported.file_labels(t), c) for t, c in classes.items()}
        sizes = {s: src.files for s, src in sources.items()}
    probe_cfg = cfg.probe_cfg
    info: dict[str, Any] = {
        "title": cfg.title,
        "image_source": task.image_source,
        "clip": task.clip_text,
        "split_sizes": sizes,
        "has_test": "test" in sizes,
        "budget": cfg.budget,
        "probe_depth": probe_cfg.depth,
        "grid": "vjepa2" if probe_cfg.schedule == "vjepa2" else "budget",
        "probe_config": {k: list(v) if isinstance(v, tuple) else v for k, v in probe_cfg.__dict__.items()},
        "device": str(cfg.device),
        "seed": cfg.seed,
        "seeds": cfg.seeds,
        "tokens": cfg.tokens,
        "online": cfg.online,
        **task.info(),
    }
    if task.report_seconds:
        info.update(timings_s=timings, seconds=time.perf_counter() - start)
    return EvalResult(list(encoders), names, list(cfg.probes), results, chance, info)


def keep_probes(
    result: EvalResult,
    loaded: Mapping[str, LoadedEncoder],
    task: Task,
    root: Path,
    *,
    encoder_source: str,
    tokens: str = "full",
) -> list[Path]:
    """Keep the chosen probe of each task and probe name of every column of ``loaded`` but the random-init
    baseline (``levjepa.eval.kept_probes``): under ``root``, or ``root/<weights>`` with several columns. What a
    kept probe records of its task — the views a file is read as, the class names, the split files — comes
    from the task: a labelled index's test views, names and files; the built-in benchmark's clips (one view of
    their size and frames) and class indices. Returns the chosen probes' directories."""
    if isinstance(task, DatasetTask):
        protocol, labels, files = task.test_views.views, {task.name: task.label_names}, task.paths
    elif isinstance(task, LabelledSplits):
        _, _, t, h, _ = next(iter(task.clips.values())).shape  # [N, C, T, H, W]
        protocol, files = ViewSpec(int(h), int(t), 1, 1, 1), {}
        labels = {name: tuple(str(i) for i in range(c)) for name, c in task.num_classes.items()}
    else:
        raise TypeError(f"keep_probes: a {type(task).__name__} task records no views for its kept probes")
    columns = kept_columns(loaded)
    kept: list[Path] = []
    for name in columns:
        out = root if len(columns) == 1 else root / loaded[name].weights
        kept += save_probes(
            result,
            name,
            loaded[name],
            out,
            protocol=protocol,
            labels=labels,
            encoder_source=encoder_source,
            files=files,
            tokens=tokens,
        )
    return kept


def kept_columns(loaded: Mapping[str, LoadedEncoder]) -> list[str]:
    """The pretrained columns, whose chosen probes are kept (not the ``random-init`` baseline)."""
    return [name for name in loaded if name != "random-init"]
