"""The shard store: packed members are the files' bytes at the indexed offsets (and plain WebDataset tar);
reading is deterministic and resumable at any step, ranks read disjoint shards, a damaged member is
reported like a bad file while training goes on, a fsspec URL reads the same batches as the local path,
and a run over shards resumes bit-identically after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from data_media import read_pattern_index, write_pattern
from levjepa.cli import main as cli
from levjepa.data import BadFileReport, DataConfig, DataError, PretrainLoader
from levjepa.data.shards import pack, read_index
from levjepa.data.sources import list_media
from levjepa.weights import load_tensors
from train_utils import TINY

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    for i in range(12):
        write_pattern(root / f"clip{i:02d}.mp4", 12 + i % 5)
    return root


@pytest.fixture(scope="module")
def store(videos, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("store")
    result = pack(list_media(str(videos)), dst, shards=4, source_root=str(videos))
    assert (result.members, result.shards, result.failed) == (12, 4, [])
    return dst


def _cfg(source: Path | str, **kw) -> DataConfig:
    base = dict(sources=(str(source),), num_frames=4, frame_stride=2, global_size=16, local_size=8, num_local=2,
                batch_size=2, num_workers=0, resize_on="worker")  # fmt: skip
    return DataConfig(**{**base, **kw})


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.views, b.views, strict=True)) and torch.equal(a.index, b.index)


def test_members_are_the_files_bytes_at_the_indexed_offsets(videos, store):
    index = read_index(str(store))
    assert len(index) == 12 and sorted(index.paths) == sorted(p.name for p in videos.iterdir())
    for j in range(len(index)):
        shard = store / index.shards[index.shard_of(j)]
        with open(shard, "rb") as f:
            f.seek(int(index.offset[j]))
            assert f.read(int(index.size[j])) == (videos / index.paths[j]).read_bytes()
    with tarfile.open(store / index.shards[0]) as tar:  # WebDataset layout: KEY.mp4 + KEY.json per sample
        names = tar.getnames()
        assert names[0].endswith(".mp4") and names[1] == names[0].replace(".mp4", ".json")
        assert json.loads(tar.extractfile(names[1]).read())["path"] == index.paths[0]
    assert index.paths != sorted(index.paths)  # shuffled across shards when packed


def test_shard_reading_is_deterministic_and_resumes_at_any_step(store):
    cfg = _cfg(store)
    run = [next(it) for it in [PretrainLoader(cfg, seed=4)] for _ in range(14)]  # 2+ epochs of 6 batches
    again = PretrainLoader(cfg, seed=4)
    assert all(_same(a, next(again)) for a in run)
    for k in (3, 6, 11):
        resumed = PretrainLoader(cfg, seed=4, start_step=k)
        assert all(_same(a, next(resumed)) for a in run[k:])
    assert not _same(run[0], next(PretrainLoader(cfg, seed=5)))
    pooled = PretrainLoader(DataConfig(**{**cfg.__dict__, "num_workers": 2}), seed=4, start_step=5)
    assert all(_same(a, next(pooled)) for a in run[5:9])  # worker processes read the same members


def test_two_ranks_read_disjoint_shards_and_each_batch_a_run_of_one_shard(store):
    index = read_index(str(store))
    cfg = _cfg(store, samples_per_epoch=12, batch_size=2)
    for epoch in range(3):
        touched = []
        for rank in range(2):
            ds = PretrainLoader(cfg, seed=0, rank=rank, world_size=2).dataset
            _, item = ds.plan(epoch)
            mine = item[ds._group_rank(len(item)) == rank].tolist()
            touched.append({index.shard_of(j) for j in mine})
            assert len(mine) == 6
        assert touched[0].isdisjoint(touched[1]) and touched[0] | touched[1] == set(range(4)), touched
    loader = PretrainLoader(cfg, seed=0, rank=1, world_size=2)
    for _ in range(3):
        batch = next(loader)
        assert len(batch.bad_files) == 0
        windows = [read_pattern_index(batch.views[0][0, b]) for b in range(2)]
        assert all(w == [w[0] + 2 * t for t in range(4)] for w in windows)  # real frames, at stride 2
    with pytest.raises(DataError, match="repack with --shards >= 5"):
        PretrainLoader(_cfg(store, batch_size=1), seed=0, rank=0, world_size=5).dataset.plan(0)


@pytest.fixture(scope="module")
def damaged(videos, tmp_path_factory) -> tuple[Path, str]:
    """A store whose member for clip03.mp4 is garbled in place (same size, header intact)."""
    dst = tmp_path_factory.mktemp("damaged")
    pack(list_media(str(videos)), dst, shards=2, source_root=str(videos))
    index = read_index(str(dst))
    j = index.paths.index("clip03.mp4")
    with open(dst / index.shards[index.shard_of(j)], "r+b") as f:
        f.seek(int(index.offset[j]) + 40)
        f.write(
            torch.randint(0, 256, (int(index.size[j]) - 80,), generator=torch.Generator().manual_seed(0))
            .to(torch.uint8)
            .numpy()
            .tobytes()
        )
    return dst, f"{dst}/{index.shards[index.shard_of(j)]}:{index.names[j]}"


def test_a_damaged_member_is_reported_like_a_bad_file(damaged):
    store, member = damaged
    report = BadFileReport(warn=False)
    loader = PretrainLoader(_cfg(store), seed=0, bad_files=report)
    for _ in range(12):  # two epochs: every member is read
        next(loader)
    assert list(report.files) == [member]
    assert (
        report.files[member].startswith(("unreadable:", "truncated:"))
        and "packed from clip03.mp4" in report.files[member]
    )


def test_training_on_shards_with_a_damaged_member_reports_it(damaged, tmp_path, capsys):
    from levjepa.train import pretrain
    from train_utils import tiny_config

    store, member = damaged
    cfg = tiny_config(f"data.sources={store}", "data.samples_per_epoch=16", "train.steps=2", "train.checkpoint_every=2",
                      "data.batch_size=8", "data.resize_on=device", "data.repeats=2")  # fmt: skip
    summary = pretrain(cfg, tmp_path / "run", progress=False)
    shown = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bad file ")]
    assert len(shown) == 1 and "clip03.mp4" in shown[0]  # one line, named by its shard member and source
    report = json.loads((tmp_path / "run" / "bad_files.json").read_text())
    assert summary.bad_files == 1 and [f["path"] for f in report["files"]] == [member]


def test_a_fsspec_url_reads_the_same_batches(store):
    local = PretrainLoader(_cfg(store), seed=2)
    remote = PretrainLoader(_cfg(f"file://{store}"), seed=2)
    assert all(_same(next(local), next(remote)) for _ in range(4))


def test_without_fsspec_a_url_says_what_to_install(store, monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec.core", None)  # import fails as if fsspec were not installed
    with pytest.raises(DataError, match=r"levjepa\[remote\]"):
        PretrainLoader(_cfg(f"s3://bucket/{store.name}"), seed=0)


def test_pack_and_prepare_shards_commands_resume(videos, tmp_path, capsys):
    dst = tmp_path / "packed"
    (dst).mkdir()
    (dst / ".shard-000001.tar.partial-99").write_bytes(b"stale")
    assert cli(["data", "pack", str(videos), str(dst), "--shards", "3", "--workers", "1"]) == 0
    assert not list(dst.glob(".shard-*")) and len(read_index(str(dst))) == 12
    assert cli(["data", "pack", str(videos), str(dst), "--shards", "3", "--workers", "1"]) == 0
    assert "3 kept from an earlier run" in capsys.readouterr().out
    prepared = tmp_path / "prepared"
    argv = ["data", "prepare", str(videos), str(prepared), "--shards", "2", "--workers", "1", "--short-side", "32"]
    assert cli(argv) == 0
    assert not (prepared / "files").exists() and len(read_index(str(prepared))) == 12
    batch = next(PretrainLoader(_cfg(prepared), seed=0))
    assert batch.views[0].shape == (1, 2, 3, 4, 16, 16) and not batch.bad_files


def _cli(run_dir: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "levjepa", "pretrain", "--no-progress", "--run-dir", str(run_dir), *args]
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # ~20 s: three training processes; the loader-level resume test above is the fast twin
def test_kill_9_then_resume_over_shards_is_bit_identical(store, tmp_path):
    k = 6
    common = ["--preset", "demo-cpu", *TINY, f"data.sources={store}", "data.samples_per_epoch=16",
              f"train.steps={2 * k}", f"train.checkpoint_every={k}", "train.log_every=2"]  # fmt: skip
    straight, victim = _cli(tmp_path / "a", *common), _cli(tmp_path / "b", *common)
    latest = tmp_path / "b" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not (latest.is_file() and latest.read_text() == f"step_{k:06d}"):
        assert victim.poll() is None, victim.stderr.read()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    assert not (tmp_path / "b" / "checkpoints" / f"step_{2 * k:06d}").exists(), "killed too late to test resume"
    resumed = subprocess.Popen(
        [sys.executable, "-m", "levjepa", "pretrain", "--no-progress", "--resume", str(tmp_path / "b")],
        env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert straight.wait(timeout=300) == 0, straight.stderr.read()
    a, _ = load_tensors(tmp_path / "a" / f"checkpoints/step_{2 * k:06d}" / "model.safetensors")
    b, _ = load_tensors(tmp_path / "b" / f"checkpoints/step_{2 * k:06d}" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_data_check_lists_a_damaged_member(damaged, capsys):
    store, member = damaged
    report = store.parent / f"{store.name}_check.json"
    assert cli(["data", "check", str(store), "--workers", "1", "--json", str(report)]) == 0
    rows = json.loads(report.read_text())["files"]
    assert len(rows) == 12 and [r["path"] for r in rows if not r["ok"]] == [member]
    assert "shard store: 2 shard(s)" in capsys.readouterr().out
