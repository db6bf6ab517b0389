"""Probes trained from feature stores on disk (``levjepa.eval.source.StoreSource`` through the one probe
trainer): the same probes as the in-memory grid on the same features, views averaged per file, and peak
memory that does not grow with the number of clips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from levjepa.eval.config import PROBE_INPUTS
from levjepa.eval.knn import knn_from_sources
from levjepa.eval.probes import probe_config
from levjepa.eval.source import StoreSource, samples
from levjepa.eval.trainer import GridResult, train_probe_grid, train_probes
from levjepa.features.feature_set import FeatureSet
from levjepa.rng import make_generator

SRC = str(Path(__file__).resolve().parents[1] / "src")


def write_store(
    path: Path, tokens: np.ndarray, labels: np.ndarray, *, segments: int = 1, crops: int = 1, shard_items: int = 500
) -> Path:
    """A feature store in the documented format (``levjepa.features.store``) from token arrays
    [files · segments · crops, 1+L, D] (rows of a file consecutive, segment-major)."""
    path.mkdir(parents=True)
    views = segments * crops
    files = len(tokens) // views
    counts = []
    index = []
    for k, f0 in enumerate(range(0, files, shard_items)):
        r0, r1 = f0 * views, min(files, f0 + shard_items) * views
        t = tokens[r0:r1]
        np.save(path / f"tokens-{k:05d}.npy", t.astype(np.float16))
        np.save(path / f"cls-{k:05d}.npy", t[:, 0].astype(np.float32))
        np.save(path / f"mean-{k:05d}.npy", t[:, 1:].astype(np.float32).mean(1))
        counts.append(r1 - r0)
        for off, r in enumerate(range(r0, r1)):
            f, v = divmod(r, views)
            seg, crop = divmod(v, crops)
            index.append(
                {
                    "row": r,
                    "shard": k,
                    "offset": off,
                    "file": f"f{f}.mp4",
                    "label": int(labels[f]),
                    "item": f,
                    "segment": seg,
                    "crop": crop,
                }
            )
    (path / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    meta = {
        "version": 1,
        "config": {"segments": segments, "crops": crops},
        "complete": True,
        "rows": len(tokens),
        "shard_rows": counts,
        "bad_files": 0,
    }
    (path / "store.json").write_text(json.dumps(meta))
    return path


def probe_from_stores(kind, cfg, train, val, test=None, *, num_classes, generator) -> GridResult:
    """The probe trainer on stores (labels: ``labels``)."""
    src = [None if s is None else StoreSource(s) for s in (train, val, test)]
    res = train_probes(
        kind, cfg, PROBE_INPUTS[kind], src[0], src[1], src[2], classes={"labels": num_classes}, generator=generator
    )
    return res["labels"]


def _features(n: int, seed: int, classes: int = 3, tokens: int = 9, dim: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centres = np.random.default_rng(99).normal(size=(classes, dim))
    x = rng.normal(size=(n, tokens, dim)) + 1.5 * centres[y][:, None, :]
    return x.astype(np.float32), y


def test_from_disk_equals_the_in_memory_grid_exactly(tmp_path, one_thread):
    (xt, yt), (xv, yv) = _features(96, 0), _features(40, 1)
    train, val = write_store(tmp_path / "t", xt, yt, shard_items=30), write_store(tmp_path / "v", xv, yv)
    cfg = probe_config("demo", epochs=3, linear_epochs=3, batch_size=16)
    for kind in ("attentive", "linear"):
        disk = probe_from_stores(
            kind, cfg, FeatureSet(train), FeatureSet(val), num_classes=3, generator=make_generator("t", 0)
        )
        st, sv = FeatureSet(train), FeatureSet(val)
        if kind == "attentive":
            inp = (
                torch.from_numpy(st.read("tokens", np.arange(96))),
                torch.from_numpy(sv.read("tokens", np.arange(40))),
            )
        else:
            inp = (torch.from_numpy(st.read("mean", np.arange(96))), torch.from_numpy(sv.read("mean", np.arange(40))))
        mem = train_probe_grid(
            kind,
            cfg,
            (inp[0], torch.from_numpy(yt)),
            (inp[1], torch.from_numpy(yv)),
            num_classes=3,
            generator=make_generator("t", 0),
        )
        # one trainer: the same batches, standardiser and evaluation, so the same bits from either source
        assert disk.val_acc == mem.val_acc and disk.val_loss == mem.val_loss
        assert disk.best_val > 90.0  # separable classes


def test_views_are_grouped_per_file_and_averaged(tmp_path, one_thread):
    """2 segments × 3 crops: 3 samples per file, each reading both segments; accuracy counts files."""
    x, y = _features(20 * 6, 2)
    yf = y[::6]
    store = FeatureSet(write_store(tmp_path / "s", x, yf, segments=2, crops=3))
    smp = samples(store)
    assert len(smp) == 60 and smp.rows.shape == (60, 2)
    assert smp.rows[4].tolist() == [7, 10]  # file 1, crop 1: segment 0 row 6+1, segment 1 row 6+3+1
    assert (smp.labels == np.repeat(yf, 3)).all()
    cfg = probe_config("demo", epochs=1, linear_epochs=1, batch_size=8)
    res = probe_from_stores("linear", cfg, store, store, store, num_classes=3, generator=make_generator("t", 1))
    assert all(round(a * 20 / 100, 6).is_integer() for a in res.val_acc)  # a whole number of 20 files
    assert res.extra["train_samples"] == 60
    knn = knn_from_sources(StoreSource(store), StoreSource(store), task="labels", num_classes=3)
    assert knn.reported > 50.0


SCRIPT = """
import sys, torch
torch.set_num_threads(1)
from levjepa.features.feature_set import FeatureSet
from levjepa.eval.probes import probe_config
from levjepa.eval.source import StoreSource
from levjepa.eval.trainer import train_probes
from levjepa.rng import make_generator
train, val = StoreSource(FeatureSet(sys.argv[1])), StoreSource(FeatureSet(sys.argv[2]))
cfg = probe_config("demo", epochs=1, linear_epochs=1, batch_size=32)
res = train_probes("attentive", cfg, "tokens", train, val, classes={"labels": 3}, generator=make_generator("m", 0))
res = res["labels"]
# VmHWM: this process's peak RSS (ru_maxrss would also count the parent's peak, kept across exec)
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM")][0]
print(int(hwm.split()[1]), res.best_val)
"""


def _peak_rss_kb(train: Path, val: Path) -> int:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(train), str(val)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    return int(out.split()[0])


def test_probe_memory_does_not_grow_with_the_number_of_clips(tmp_path):
    """2k vs 8k clips of 129 fp16 tokens × 64 (8k: 132 MB of tokens on disk, more than the difference
    that holding them would add): peak RSS within 10 %."""
    rss = {}
    for n in (2000, 8000):
        x, y = _features(n, n, tokens=129, dim=64)
        train = write_store(tmp_path / f"t{n}", x, y, shard_items=1000)
        del x
        xv, yv = _features(200, 5, tokens=129, dim=64)
        val = write_store(tmp_path / f"v{n}", xv, yv)
        rss[n] = _peak_rss_kb(train, val)
    assert rss[8000] <= 1.10 * rss[2000], rss
