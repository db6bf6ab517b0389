"""Frozen evaluation of levjepa encoders (SPEC §5): probe, select, classify.

Read ``harness.py`` first (``evaluate(encoders, task, config)``: the one pipeline), then ``probes.py`` (the
attentive and linear probes, stacked into grids), ``trainer.py`` (the probe trainer: the lr × wd grid, its
optimiser and loop, written once) and ``source.py`` (what the trainer reads: features in memory or in a
feature store on disk, one interface); ``knn.py`` is the kNN readout and ``video_knn.py`` the public real-video
kNN protocol. Two tasks feed the harness: labelled clips in memory (``clips_task.py``; the built-in benchmark is
``synthetic_task.py``) and a user's labelled split files at any size (``dataset_task.py``: ``labelled.py``
reads and checks them, ``protocols.py`` holds ssv2, k400, in1k, diving48, Kinetics CSV and SSv2 JSON; their
features streamed to disk, or encoded every epoch by ``online.py``; ``plan.py`` says what a run will cost).
``config.py`` holds :class:`EvalConfig` and the probe names, ``result.py`` the table and JSON,
``probe_records.py`` the finished probes a stopped run reads back. ``select.py`` is what ``levjepa select``
runs; ``kept_probes.py`` keeps the probes a run chose (classifier directories) and ``predict.py`` runs a
classifier on files (``levjepa classify``). Features on disk (the feature-set format, stores, extraction,
codecs, readouts, the in-memory cache) live in ``levjepa.features``; weights in ``levjepa.formats``.
"""

from __future__ import annotations

from levjepa.eval.config import EvalConfig
from levjepa.eval.harness import evaluate
from levjepa.eval.knn import knn_evaluate, knn_predict
from levjepa.eval.probes import AttentiveProbeGrid, LinearProbeGrid, ProbeConfig, probe_config
from levjepa.eval.result import EvalResult
from levjepa.eval.synthetic_task import evaluate_benchmark
from levjepa.eval.trainer import train_probe_grid
from levjepa.features.cache import Features, compute_features

__all__ = [
    "AttentiveProbeGrid",
    "EvalConfig",
    "EvalResult",
    "Features",
    "LinearProbeGrid",
    "ProbeConfig",
    "compute_features",
    "evaluate",
    "evaluate_benchmark",
    "knn_evaluate",
    "knn_predict",
    "probe_config",
    "train_probe_grid",
]
