"""Augmented training views (issues 53, 65): one train transform (V-JEPA's frozen-evaluation transform,
``levjepa.data.clip_augment``) for the K-view stores and the online probes; each stored view is that transform of
the decoded file, encoded; a store is deterministic per seed and resumes; ``set_epoch`` picks view
``epoch mod K``; K absent writes the store it always did."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import levjepa.features.feature_set as feature_set
from levjepa.data import clip_augment
from levjepa.data.clip_augment import ViewKey, train_transform
from levjepa.data.eval_clip import ViewSpec, load_train_views
from levjepa.data.sources import parse_index
from levjepa.eval.config import EvalConfig
from levjepa.eval.dataset_task import dataset_task
from levjepa.eval.harness import evaluate
from levjepa.eval.online import _views
from levjepa.eval.probes import probe_config
from levjepa.eval.source import StoreSource
from levjepa.features.feature_set import FeatureSet
from levjepa.features.store import StoreConfig, build_store
from levjepa.infer.encode import encode
from test_feature_store import _digest, _encoder, make_media
from test_online_plan import setting  # noqa: F401  (a fixture)

VIEWS = ViewSpec(16, 4, 2, segments=2, crops=1)
K = 3
CFG = StoreConfig(VIEWS, batch_size=5, workers=0, shard_items=4, train_views=K, view_seed=7)


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    return make_media(tmp_path_factory.mktemp("media"))


def test_the_transform_follows_its_key():
    frames = torch.randint(0, 200, (4, 30, 40, 3), dtype=torch.uint8)
    a = train_transform(frames, 24, ViewKey(0, 5, 1))
    assert a.shape == (4, 24, 24, 3) and a.dtype == torch.uint8
    assert torch.equal(train_transform(frames, 24, ViewKey(0, 5, 1)), a)
    draws = {train_transform(frames, 24, ViewKey(0, 5, k)).sum().item() for k in range(6)}
    assert len(draws) > 1  # other views, other draws


def test_store_rows_are_the_transform_of_the_decoded_file(index, tmp_path, one_thread):
    enc = _encoder()
    items = parse_index(index)
    res = build_store(enc, items, tmp_path / "s", CFG)
    assert res.rows == K * VIEWS.segments * res.files
    store = FeatureSet(tmp_path / "s")
    assert store.config["train_views"] == K and store.config["view_seed"] == 7
    view = store.column("view")
    assert list(view[: 2 * K]) == [0, 0, 1, 1, 2, 2] and list(store.segment[: 2 * K]) == [0, 1] * K
    rows = np.array([len(store) - 1, 0, 9, 4])
    tokens, cls = store.read("tokens", rows), store.read("cls", rows)
    for j, r in enumerate(rows):
        it = items[store.item[r]]
        clip = load_train_views(it.path, VIEWS, 8, ViewKey(7, int(store.item[r]), int(view[r])), it.kind)
        out = encode(enc, clip[store.segment[r]][None], "cpu")
        assert out.tokens is not None
        np.testing.assert_array_equal(tokens[j], out.tokens[0].numpy())
        torch.testing.assert_close(torch.from_numpy(cls[j]), out.cls[0], atol=1e-5, rtol=1e-5)


def test_a_k_view_store_is_deterministic_per_seed_and_recorded(index, tmp_path, one_thread):
    items = parse_index(index)[:6]
    build_store(_encoder(), items, tmp_path / "a", CFG)
    build_store(_encoder(), items, tmp_path / "b", StoreConfig(**{**CFG.__dict__, "batch_size": 2}))
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    build_store(_encoder(), items, tmp_path / "c", StoreConfig(**{**CFG.__dict__, "view_seed": 8}))
    a, c = FeatureSet(tmp_path / "a"), FeatureSet(tmp_path / "c")
    rows = np.arange(len(a))
    assert not np.array_equal(a.read("tokens", rows), c.read("tokens", rows))
    with pytest.raises(ValueError, match="view_seed 7 -> 8"):
        build_store(_encoder(), items, tmp_path / "a", StoreConfig(**{**CFG.__dict__, "view_seed": 8}))
    with pytest.raises(ValueError, match="train_views 3 -> 2"):
        build_store(_encoder(), items, tmp_path / "a", StoreConfig(**{**CFG.__dict__, "train_views": 2}))


def test_a_k_view_store_resumes_after_a_kill_between_shards(index, tmp_path, one_thread, monkeypatch):
    items = parse_index(index)
    build_store(_encoder(), items, tmp_path / "full", CFG)
    write = feature_set.atomic_write_text

    class Killed(Exception):
        pass

    def write_then_die(path, *args, **kwargs):
        write(path, *args, **kwargs)
        if path.name == "index-00001.jsonl":
            raise Killed

    monkeypatch.setattr(feature_set, "atomic_write_text", write_then_die)
    with pytest.raises(Killed):
        build_store(_encoder(), items, tmp_path / "cut", CFG)
    monkeypatch.setattr(feature_set, "atomic_write_text", write)
    assert not (tmp_path / "cut" / "index.jsonl").exists() and (tmp_path / "cut" / "index-00001.jsonl").exists()
    again = build_store(_encoder(), items, tmp_path / "cut", CFG)
    assert again.shards_skipped == 2 and again.shards_done == 2
    assert _digest(tmp_path / "cut") == _digest(tmp_path / "full")


def test_online_and_store_views_are_one_transform(index, tmp_path, one_thread):
    enc = _encoder()
    items = parse_index(index)[:3]
    build_store(enc, items, tmp_path / "s", CFG)
    store = FeatureSet(tmp_path / "s")
    for item in range(3):
        for epoch in range(K):
            live = _views(VIEWS, 8, True, 7, epoch, (items[item].path, items[item].kind, item, 0))
            same = load_train_views(items[item].path, VIEWS, 8, ViewKey(7, item, epoch), items[item].kind)
            assert torch.equal(live, same)  # the same key: the same pixels
            rows = np.nonzero((store.item == item) & (store.column("view") == epoch))[0]
            out = encode(enc, live, "cpu")
            assert out.tokens is not None
            np.testing.assert_array_equal(store.read("tokens", rows), out.tokens.numpy())


def test_set_epoch_reads_view_epoch_mod_k(index, tmp_path, one_thread):
    build_store(_encoder(), parse_index(index), tmp_path / "s", CFG)
    src = StoreSource(FeatureSet(tmp_path / "s"))
    view = src.store.column("view")
    idx = torch.tensor([3, 0, 5])
    first = src.read("tokens", idx)
    for epoch in range(7):
        src.set_epoch(epoch)
        assert (view[src.rows] == epoch % K).all()
        rows = src.rows[idx.numpy()].reshape(-1)
        got = src.read("tokens", idx).numpy()
        np.testing.assert_array_equal(got.reshape(len(rows), -1, got.shape[-1]), src.store.read("tokens", rows))
        if epoch % K == 0:
            np.testing.assert_array_equal(got, first.numpy())  # view 0 before any set_epoch
    assert src.info()["train_views"] == "3 augmented views per video"
    assert src.file_cls().shape[0] == src.files  # kNN: a file's CLS averaged over all its views
    src.close()


def test_k_absent_writes_the_store_it_always_did(index, tmp_path, one_thread):
    fixed = StoreConfig(VIEWS, batch_size=5, workers=0, shard_items=4)
    assert fixed.storage() == {
        "frames": 4,
        "frame_stride": 2,
        "size": 16,
        "segments": 2,
        "crops": 1,
        "tokens": True,
        "shard_items": 4,
    }  # the settings (and so the store's name) of a store without augmented views, as before them
    build_store(_encoder(), parse_index(index), tmp_path / "s", fixed)
    rows = [json.loads(line) for line in (tmp_path / "s" / "index-00000.jsonl").read_text().splitlines()]
    assert all(list(r) == ["file", "label", "item", "segment", "crop"] for r in rows)
    assert StoreSource(FeatureSet(tmp_path / "s")).info()["train_views"] == "fixed centre crops"


def test_probes_train_from_k_views_with_the_run_seed(setting, tmp_path, monkeypatch):  # noqa: F811
    files, _, loaded, views = setting
    task = dataset_task(files, views=views, workers=0, features_dir=tmp_path / "f", train_views=2)
    cfg = EvalConfig(tasks=(task.name,), probes=("attentive",), probe=probe_config("demo", epochs=3), seed=4)
    seen: list[int] = []
    real = StoreSource.set_epoch

    def spy(self: StoreSource, epoch: int) -> None:
        seen.append(epoch)
        real(self, epoch)

    monkeypatch.setattr(StoreSource, "set_epoch", spy)
    result = evaluate({"e": loaded.encoder}, task, cfg)
    assert result is not None and result.info["train_views"] == "2 augmented views per video"
    cap = result.caption()  # the views, their transform, and that they are not the reference protocol's draws
    assert "2 augmented views per video reused over the epochs" in cap and clip_augment.DESCRIPTION in cap
    assert "(attentive: 2 lr × 2 wd heads, 3 epochs" in cap and "1 probe seed (4)" in cap
    assert seen == [0, 1, 2]  # the trainer calls it at the start of every epoch
    train = FeatureSet(task.stores["e"]["train"])
    assert train.config["train_views"] == 2 and train.config["view_seed"] == 4
    assert FeatureSet(task.stores["e"]["val"]).config.get("train_views") is None  # test views: unchanged
    with pytest.raises(ValueError, match="drop --train-views"):
        online = EvalConfig(tasks=(task.name,), probes=("attentive",), online=True)
        task.prepare({"e": loaded.encoder}, online)


def _resolved(monkeypatch, argv: list[str]) -> tuple[int, bool]:
    """What ``levjepa probe ARGV --plan`` hands the library: the task's K and the evaluation's online flag."""
    import levjepa.commands.probe as cli_probe
    from levjepa.cli import main

    seen: list[tuple[int, bool]] = []

    class _Said:
        def text(self) -> str:
            return ""

    def spy(task, loaded, cfg):  # type: ignore[no-untyped-def]
        seen.append((task.train_views.train_views, cfg.online))
        return _Said()

    monkeypatch.setattr(cli_probe, "plan", spy)
    assert main(["probe", *argv, "--plan", "--workers", "0"]) == 0
    return seen[0]


def test_the_training_views_are_one_named_choice(setting, tmp_path, monkeypatch, capsys):  # noqa: F811
    """``--train-views online`` is the reference protocol (and ``--online`` its other spelling), ``fixed`` the
    centre crops (= 0), K a K-view store; a protocol's default is used only when none is given."""
    files, run, _, _ = setting
    base = [str(run), "--task", "index:" + ",".join(files), "--size", "16", "--frames", "4"]
    assert _resolved(monkeypatch, base) == (0, False)
    assert _resolved(monkeypatch, [*base, "--train-views", "online"]) == (0, True)
    assert _resolved(monkeypatch, [*base, "--online"]) == (0, True)
    assert _resolved(monkeypatch, [*base, "--online", "--train-views", "online"]) == (0, True)
    assert _resolved(monkeypatch, [*base, "--train-views", "fixed"]) == (0, False)
    assert _resolved(monkeypatch, [*base, "--train-views", "3"]) == (3, False)
    from levjepa.cli import main

    for bad, said in ((["--online", "--train-views", "2"], "choose one"), (["--train-views", "two"], "online")):
        assert main(["probe", *base, *bad, "--plan", "--workers", "0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("levjepa probe: --") and said in err[0], err


@pytest.mark.parametrize("default", [0, 2, "online"])
def test_a_protocols_default_training_views_give_way_to_the_options(setting, monkeypatch, default):  # noqa: F811
    import dataclasses

    from levjepa.eval import protocols

    files, run, _, _ = setting
    monkeypatch.setitem(
        protocols.PROTOCOLS, "in1k", dataclasses.replace(protocols.PROTOCOLS["in1k"], train_views=default)
    )
    base = [str(run), "--task", "index:" + ",".join(files), "--protocol", "in1k", "--image-frames", "one"]
    expected = (0, True) if default == "online" else (default, False)
    assert _resolved(monkeypatch, base) == expected
    assert _resolved(monkeypatch, [*base, "--train-views", "fixed"]) == (0, False)
    assert _resolved(monkeypatch, [*base, "--train-views", "online"]) == (0, True)


def test_the_video_protocols_train_as_the_reference_by_default(setting, monkeypatch, capsys):  # noqa: F811
    """``--protocol ssv2`` (k400, diving48) is V-JEPA's frozen evaluation: online views of its transform unless
    told otherwise; a store's codec without a store is one line naming the way out."""
    files, run, _, _ = setting
    base = [str(run), "--task", "index:" + ",".join(files), "--slots", "2"]
    for name in ("ssv2", "k400", "diving48"):
        assert _resolved(monkeypatch, [*base, "--protocol", name]) == (0, True)
    assert _resolved(monkeypatch, [*base, "--protocol", "in1k", "--image-frames", "one"]) == (0, False)
    assert _resolved(monkeypatch, [*base, "--protocol", "ssv2", "--train-views", "4", "--tokens", "int8"]) == (4, False)
    from levjepa.cli import main

    assert main(["probe", *base, "--protocol", "ssv2", "--tokens", "int8", "--plan", "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tokens int8" in err[0] and "--train-views K" in err[0], err


def test_an_online_caption_says_which_probes_read_the_online_views():
    from levjepa.eval.result import EvalResult

    info = {"train_views": "augmented every epoch (online)", "train_transform": clip_augment.NAME, "online": True}
    both = EvalResult(["e"], ["t"], ["attentive", "linear"], {}, {}, info).caption()
    assert "the reference protocol (" + clip_augment.DESCRIPTION + "); the other probes: fixed centre crops" in both
    alone = EvalResult(["e"], ["t"], ["attentive"], {}, {}, info).caption()
    assert "the other probes" not in alone
    linear = {"train_views": "fixed centre crops", "online": True}  # online asked for, no probe reads tokens
    assert "online views are the attentive's" in EvalResult(["e"], ["t"], ["linear"], {}, {}, linear).caption()
