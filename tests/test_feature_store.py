"""The dataset-scale feature store: rows equal the encoder's features of each view, 2 gloo ranks write the
same files as 1 process, a kill -9 then the same command gives the same files, bad files are reported and
skipped, and a store computed with other settings is refused."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dist_utils import run_gloo
from levjepa.data import normalize, write_video
from levjepa.data.eval_clip import ViewSpec, load_eval_clip
from levjepa.data.sources import parse_index
from levjepa.features.extract import ExtractConfig
from levjepa.features.feature_set import FeatureSet
from levjepa.features.store import StoreConfig, build_store
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _video(path: Path, n: int, seed: int, h: int = 20, w: int = 28) -> None:
    y, x = np.mgrid[0:h, 0:w]
    frames = np.stack(
        [
            np.stack([(x * 7 + 11 * i + seed) % 256, (y * 5 + 3 * i) % 256, (x + y + seed * 13) % 256], -1)
            for i in range(n)
        ]
    ).astype(np.uint8)
    write_video(path, frames, fps=10)


def make_media(root: Path, videos: int = 5, images: int = 6) -> Path:
    """A labelled index of small videos and images, plus two unreadable files; returns the index path."""
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(videos):
        _video(root / f"v{i}.mp4", 12 + 3 * i, seed=i)
        lines.append(f"v{i}.mp4 {i % 3}")
    for i in range(images):
        rng = np.random.default_rng(i)
        Image.fromarray(rng.integers(0, 256, (18, 24, 3), dtype=np.uint8)).save(root / f"im{i}.png")
        lines.append(f"im{i}.png {i % 3}")
    (root / "broken.mp4").write_text("not a video")
    lines.insert(3, "broken.mp4 1")
    lines.append("missing.mp4 2")
    (root / "index.txt").write_text("\n".join(lines) + "\n")
    return root / "index.txt"


CFG = StoreConfig(ViewSpec(16, 4, 2, segments=2, crops=3), batch_size=5, workers=0, shard_items=4)


def _encoder() -> torch.nn.Module:
    return random_encoder(encoder_config("vit-test"), seed=1).encoder


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    return make_media(tmp_path_factory.mktemp("media"))


def test_rows_are_the_encoders_features_of_each_view(index, tmp_path, one_thread):
    enc = _encoder()
    items = parse_index(index)
    res = build_store(enc, items, tmp_path / "s", CFG)
    assert res.bad_files == 2 and res.files == len(items) - 2 and res.rows == 6 * res.files
    bad = json.loads((tmp_path / "s" / "bad_files.json").read_text())
    assert {Path(f["path"]).name for f in bad["files"]} == {"broken.mp4", "missing.mp4"}
    store = FeatureSet(tmp_path / "s")
    assert len(store) == res.rows
    # every item's rows: segment-major, 3 crops each; pick some rows out of order and check them
    rows = np.array([len(store) - 1, 0, 7, 13])
    tokens, cls, mean = store.read("tokens", rows), store.read("cls", rows), store.read("mean", rows)
    assert tokens.dtype == np.float16 and cls.dtype == np.float32
    for j, r in enumerate(rows):
        it = items[store.item[r]]
        assert store.labels[r] == it.label and store.files[store.item[r]] == it.path
        views = ViewSpec(size=16, frames=4, frame_stride=2, segments=2, crops=3).load(it.path, 8)
        v = views[store.segment[r] * 3 + store.crop[r]]
        with torch.inference_mode():
            out = enc.eval().forward_features(normalize(v[None]))
        torch.testing.assert_close(torch.from_numpy(cls[j]), out.cls[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.from_numpy(mean[j]), out.patches[0].mean(0), atol=1e-5, rtol=1e-5)
        assert np.array_equal(tokens[j, 0], out.cls[0].half().numpy())
    # the arrays are plain .npy: memory-mappable by anyone
    mm = np.load(tmp_path / "s" / "tokens-00000.npy", mmap_mode="r")
    assert mm.shape[1:] == tokens.shape[1:] and mm.shape[0] == store.meta["shard_rows"][0]


def test_one_segment_one_crop_is_the_standard_eval_clip(index):
    it = parse_index(index)[1]
    views = ViewSpec(size=16, frames=4, frame_stride=2).load(it.path, 8)
    clip = load_eval_clip(it.path, num_frames=4, size=16, patch=8, frame_stride=2)
    assert torch.equal(views[0], clip.permute(3, 0, 1, 2))


def test_other_settings_are_refused(index, tmp_path, one_thread):
    items = parse_index(index)[:3]
    build_store(_encoder(), items, tmp_path / "s", CFG)
    with pytest.raises(ValueError, match=r"another setting \(segments 2 -> 1, crops 3 -> 1.*delete it"):
        build_store(_encoder(), items, tmp_path / "s", StoreConfig(ViewSpec(16, 4), workers=0))
    with pytest.raises(ValueError, match="another encoder"):
        build_store(random_encoder(encoder_config("vit-test"), seed=2).encoder, items, tmp_path / "s", CFG)
    # workers and batch size may change: the same store, nothing recomputed
    again = build_store(_encoder(), items, tmp_path / "s", StoreConfig(**{**CFG.__dict__, "batch_size": 2}))
    assert again.shards_done == 0 and again.shards_skipped == 1


def _sharded(rank: int, world: int, index: str, out: str) -> dict[str, str]:
    build_store(_encoder(), parse_index(index), out, CFG)
    return _digest(Path(out))


@pytest.mark.distributed
def test_two_gloo_ranks_write_the_same_files_as_one_process(index, tmp_path, one_thread):
    build_store(_encoder(), parse_index(index), tmp_path / "one", CFG)
    two = run_gloo(_sharded, 2, str(index), str(tmp_path / "two"))
    assert two[0] == two[1] == _digest(tmp_path / "one")
    assert len([n for n in two[0] if n.startswith("index-")]) == 4  # 13 items in shards of 4


SCRIPT = """
import sys, time, torch
torch.set_num_threads(1)
import levjepa.features.feature_set as fs
from levjepa.data.sources import parse_index
from levjepa.data.eval_clip import ViewSpec
from levjepa.features.store import StoreConfig, build_store
if len(sys.argv) > 3:  # hold still once shard 1 is written, until the test kills the job: the cut is exact
    write = fs.atomic_write_text
    def write_then_hold(path, *args, **kwargs):
        write(path, *args, **kwargs)
        if path.name == "index-00001.jsonl":
            time.sleep(600)
    fs.atomic_write_text = write_then_hold
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config
enc = random_encoder(encoder_config("vit-test"), seed=1).encoder
cfg = StoreConfig(ViewSpec(16, 4, 2, segments=2, crops=3), batch_size=5, workers=1, shard_items=2)
build_store(enc, parse_index(sys.argv[1]), sys.argv[2], cfg)
"""


def _run(index: Path, out: Path, hold: bool = False) -> subprocess.Popen:
    """The store job in a process group of its own; ``hold``: it stops after shard 1, to be killed there (with
    only a poll for the shard's file, the job could write every other shard before the kill lands)."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, "-c", SCRIPT, str(index), str(out), *(["hold"] if hold else [])]
    return subprocess.Popen(args, env=env, start_new_session=True)


def test_kill_9_then_the_same_command_gives_the_same_files(index, tmp_path):
    """Decoding in a worker process; the job is killed (the whole process group) after its second shard."""
    assert _run(index, tmp_path / "full").wait(timeout=300) == 0
    proc = _run(index, tmp_path / "cut", hold=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "cut" / "index-00001.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "cut" / "index.jsonl").exists()  # it really stopped half-way
    # what a kill during a write leaves: a temporary of a shard still to do, which the rerun must not keep
    todo = [k for k in range(7) if not (tmp_path / "cut" / f"index-{k:05d}.jsonl").exists()]
    assert todo == [2, 3, 4, 5, 6]  # killed where it held: after shard 1
    (tmp_path / "cut" / f".tokens-{todo[-1]:05d}.npy.k9x2.tmp").write_bytes(b"half a shard")
    assert _run(index, tmp_path / "cut").wait(timeout=300) == 0
    assert _digest(tmp_path / "cut") == _digest(tmp_path / "full")
    store = FeatureSet(tmp_path / "cut")
    assert store.meta["shard_rows"] == [12, 6, 12, 12, 12, 12, 0] and len(store) == 66  # 6 views per good file


def test_the_views_record_spells_every_manifest_as_the_folders_written_before_it():
    """``ViewSpec.record`` is the one spelling of the views in a manifest (issue 67); the settings below are what
    the two hand-spelled manifests wrote before it (printed by the code at a396bdd), so a store keeps its name (a
    hash of its settings) and an extraction folder is continued, not refused as another setting."""
    store = {
        "frames": 16,
        "frame_stride": 4,
        "size": 224,
        "segments": 2,
        "crops": 3,
        "tokens": True,
        "shard_items": 256,
    }
    assert StoreConfig(ViewSpec(224, 16, 4, segments=2, crops=3)).storage() == store
    rated = StoreConfig(ViewSpec(64, 8, 2, fps=7.5, image_frames=2), train_views=2).storage()
    assert rated == {
        **{"frames": 8, "frame_stride": 2, "size": 64, "segments": 1, "crops": 1, "tokens": True, "shard_items": 256},
        **{"fps": 7.5, "image_frames": 2, "train_views": 2, "view_seed": 0, "train_transform": "vjepa-frozen-eval"},
    }
    windows = {"frames": 8, "frame_stride": 2, "fps": None, "size": 16, "stride": 4, "patches": False, "stream": False}
    assert ExtractConfig(ViewSpec(16, 8, 2), stride=4).storage() == {**windows, "shard_rows": 4096}
    per_video = ExtractConfig(ViewSpec(16, 8, 2, fps=5.0, image_frames=2), stride=4, format="per_video").storage()
    assert per_video == {**windows, "fps": 5.0, "per_video_array": "mean", "image_frames": 2}
