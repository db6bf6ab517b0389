"""Frozen evaluation of levjepa encoders (SPEC §5): load, probe, extract, select.

Read ``probes.py`` first (the attentive and linear probes and their parallel lr × wd grid), then
``features.py`` (features computed once, frozen, nothing dropped) and ``benchmark.py`` (the built-in
appearance / motion / arrow-of-time benchmark). A user's labelled dataset, at any size:
``dataset_eval.py`` — the split files and views (``protocols.py``: ssv2, k400, in1k, diving48; Kinetics
CSV, SSv2 JSON), features streamed to disk (``feature_store.py``), probes trained from disk
(``disk_probe.py``). ``extract.py`` and ``select.py`` are what the ``levjepa extract | select`` commands run;
weights are read and written by ``levjepa.formats``.
"""

from __future__ import annotations

from levjepa.eval.benchmark import BenchmarkResult, EvalConfig, evaluate_benchmark
from levjepa.eval.features import Features, compute_features
from levjepa.eval.knn import knn_evaluate, knn_predict
from levjepa.eval.probes import AttentiveProbeGrid, LinearProbeGrid, ProbeConfig, probe_config, train_probe_grid

__all__ = [
    "AttentiveProbeGrid",
    "BenchmarkResult",
    "EvalConfig",
    "Features",
    "LinearProbeGrid",
    "ProbeConfig",
    "compute_features",
    "evaluate_benchmark",
    "knn_evaluate",
    "knn_predict",
    "probe_config",
    "train_probe_grid",
]
