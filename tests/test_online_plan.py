"""Evaluation that fits (issue 45): a grid of 12 attentive probes trains from one store pass (one encoder forward
per view); the online mode runs the encoder every epoch instead (``epochs`` forwards per training view, one per
validation and test view) and stores no token; ``probe --plan`` counts the disk and the forwards before
anything runs, exactly as the store then takes them."""

from __future__ import annotations

import numpy as np
import pytest

import levjepa.eval.online as online
import levjepa.features.store as feature_store
from levjepa.cli import main
from levjepa.data import clip_augment
from levjepa.eval.config import EvalConfig
from levjepa.eval.dataset_task import dataset_task
from levjepa.eval.harness import evaluate
from levjepa.eval.plan import plan
from levjepa.eval.probes import probe_config
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.reading.views import model_views
from test_classify import write_index
from test_export import make_run_dir


@pytest.fixture
def setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    media = tmp_path / "media"
    files = [str(write_index(media, s, n, seed)) for s, n, seed in (("train", 12, 0), ("val", 6, 1), ("test", 9, 2))]
    run = make_run_dir(tmp_path, steps=(5,))
    loaded = load_encoder(run)
    views, _ = model_views(loaded, size=16, frames=4)
    return files, run, loaded, views


def _counting(monkeypatch, module):
    seen = []
    real = module.encode

    def counted(encoder, views, *args, **kwargs):
        seen.append(len(views))
        return real(encoder, views, *args, **kwargs)

    monkeypatch.setattr(module, "encode", counted)
    return seen


def test_a_twelve_probe_grid_trains_from_one_encoder_pass(setting, tmp_path, monkeypatch):
    files, _, loaded, views = setting
    seen = _counting(monkeypatch, feature_store)
    task = dataset_task(files, views=views, workers=0, features_dir=tmp_path / "f")
    grid = probe_config("demo", lrs=(1e-2, 3e-3, 1e-3), weight_decays=(0.0, 0.01, 0.1, 0.4), epochs=3)
    cfg = EvalConfig(tasks=(task.name,), probes=("attentive",), probe=grid)
    result = evaluate({"e": loaded.encoder}, task, cfg)
    assert result is not None and len(result.results["e"][task.name]["attentive"].val_acc) == 12
    assert sum(seen) == 12 + 6 + 9  # one forward per view, whatever the epochs and the grid


@pytest.mark.parametrize("seeds", [1, 2])
def test_online_encodes_every_epoch_and_stores_no_token(setting, tmp_path, monkeypatch, seeds):
    files, _, loaded, views = setting
    seen = _counting(monkeypatch, online)
    task = dataset_task(files, views=views, workers=0, features_dir=tmp_path / "f")
    cfg = EvalConfig(
        tasks=(task.name,), probes=("attentive",), probe=probe_config("demo", epochs=3), online=True, seeds=seeds
    )
    said = plan(task, loaded, cfg)
    result = evaluate({"e": loaded.encoder}, task, cfg)
    assert result is not None and "online" in result.caption()
    cap = result.caption()  # the protocol by name, its transform, the seeds and the grid
    assert "augmented every epoch (online) the reference protocol (" + clip_augment.DESCRIPTION in cap
    assert ("1 probe seed (0)" if seeds == 1 else "2 probe seeds 0…1 (one pass, each its own init, batch order and "
            "training views") in cap and "levjepa's grid and schedule" in cap  # fmt: skip
    # every epoch for training views (each seed reads its own batches), once for val and test
    assert sum(seen) == seeds * 3 * 12 + 6 + 9
    assert sum(s.forwards for s in said.splits) == sum(seen) + 12 + 6 + 9  # + the store of CLS and mean
    assert not list((tmp_path / "f").rglob("tokens-*.npy"))


@pytest.mark.parametrize("k", [0, 3])
def test_the_plan_counts_what_the_store_takes(setting, tmp_path, monkeypatch, capsys, k):
    # k = 3: a store of 3 augmented training views per file holds 3 rows a file and takes 3 forwards a file
    files, run, loaded, views = setting
    seen = _counting(monkeypatch, feature_store)
    task = dataset_task(files, views=views, workers=0, features_dir=tmp_path / "f", train_views=k)
    cfg = EvalConfig(tasks=(task.name,), probes=("attentive", "linear"), tokens="pool2-int8")
    said = plan(task, loaded, cfg)
    assert [s.rows for s in said.splits] == [12 * max(1, k), 6, 9]
    task.prepare({"e": loaded.encoder}, cfg)
    assert sum(seen) == sum(s.forwards for s in said.splits)
    for split in said.splits:
        stored = sum(
            np.load(p, mmap_mode="r").nbytes for p in task.stores["e"][split.split].glob("*-0*.npy")
        )  # cls, mean, int8 tokens and their scales
        assert split.disk == stored, split.split
    assert said.measured["encode_s"] > 0 and sum(said.estimate_s.values()) > 0
    if k:
        return
    # the command prints it and computes nothing
    args = ["probe", str(run), "--task", "index:" + ",".join(files), "--size", "16", "--frames", "4", "--plan"]
    assert main([*args, "--workers", "0", "--features", str(tmp_path / "g")]) == 0
    out = capsys.readouterr().out
    assert "| train | 12 | 1 | 12 |" in out and "estimated time" in out and not (tmp_path / "g").exists()


def test_online_tokens_of_unaugmented_views_are_the_stores_tokens(setting, tmp_path):
    # validation and test read online are the store's views, unaugmented: the same tokens, row for row, in any
    # batch (the encoder runs batch_size views at a time over a batch of samples)
    import torch

    from levjepa.eval.online import OnlineSource

    files, _, loaded, views = setting
    task = dataset_task(files, views=views, workers=0, features_dir=tmp_path / "f")
    cfg = EvalConfig(tasks=(task.name,), probes=("attentive",))
    task.prepare({"e": loaded.encoder}, cfg)
    sources = task.sources("e", loaded.encoder, cfg)
    stored = sources["test"]
    live = OnlineSource(stored, task.splits["test"], task.test_views.views, loaded.encoder, augment=False, batch_size=2)
    idx = torch.tensor([4, 0, 7, 3, 1])
    np.testing.assert_array_equal(live.read("tokens", idx).numpy(), stored.read("tokens", idx).numpy())
    assert live.forwards == 5
    for src in sources.values():
        src.close()
