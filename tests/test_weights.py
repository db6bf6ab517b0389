"""levjepa.weights: atomic safetensors I/O that refuses pickles without executing them."""

from __future__ import annotations

import os
import pickle
import stat

import pytest
import torch

from levjepa.weights import WeightsError, atomic_write_text, load_tensors, prefixed, save_tensors, write_json


class _Payload:
    """Unpickling this would create a marker file: the loader must never get that far."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_round_trip_with_metadata(tmp_path):
    t = {"encoder.w": torch.randn(3, 4), "projector.b": torch.arange(5)}
    save_tensors(tmp_path / "m.safetensors", t, {"step": 7, "note": "x"})
    back, meta = load_tensors(tmp_path / "m.safetensors")
    torch.testing.assert_close(back["encoder.w"], t["encoder.w"])
    assert meta == {"step": "7", "note": "x"}
    assert list(prefixed(back, "encoder.")) == ["w"]


@pytest.mark.parametrize("kind", ["pickle", "torch_save"])
def test_pickle_bearing_files_are_refused_unexecuted(tmp_path, kind):
    marker = tmp_path / "pwned"
    path = tmp_path / "weights.safetensors"
    if kind == "pickle":
        path.write_bytes(pickle.dumps(_Payload(str(marker))))
    else:
        torch.save({"w": torch.zeros(2), "evil": _Payload(str(marker))}, path)
    with pytest.raises(WeightsError, match="pickle"):
        load_tensors(path)
    assert not marker.exists()


def test_failed_write_keeps_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "latest"
    atomic_write_text(target, "step_000001")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        atomic_write_text(target, "step_000002")
    assert target.read_text() == "step_000001"
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]  # no temporary left behind


def test_missing_and_corrupt_files_raise(tmp_path):
    with pytest.raises(WeightsError, match="no such"):
        load_tensors(tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(WeightsError, match="not a readable"):
        load_tensors(bad)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_files_and_folders_follow_the_umask_as_open_and_mkdir_would(tmp_path, umask):
    from levjepa.train.loop import pretrain
    from train_utils import tiny_config

    old = os.umask(umask)
    try:
        with open(tmp_path / "by_open", "w"):
            pass
        (tmp_path / "by_mkdir").mkdir()
        file_mode = stat.S_IMODE((tmp_path / "by_open").stat().st_mode)
        dir_mode = stat.S_IMODE((tmp_path / "by_mkdir").stat().st_mode)
        assert file_mode == 0o666 & ~umask and dir_mode == 0o777 & ~umask
        run = tmp_path / "run"
        pretrain(tiny_config("train.steps=2", "train.checkpoint_every=2"), run, progress=False)
        write_json(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    ckpt = run / "checkpoints" / "step_000002"
    files = [run / "config.json", run / "env.json", run / "bad_files.json", run / "checkpoints" / "latest",
             *ckpt.iterdir(), tmp_path / "x.json"]  # fmt: skip
    assert len(files) >= 10
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == file_mode, f
    for d in (run, run / "checkpoints", ckpt):
        assert stat.S_IMODE(d.stat().st_mode) == dir_mode, d


def test_truncating_metrics_drops_later_and_half_written_lines(tmp_path):
    from levjepa.weights import truncate_metrics

    lines = ['{"step": 2, "loss": 1.0}', '{"step": 4, "loss": 0.9}', '{"step": 6, "loss": 0.8}', '{"step": 8, "lo']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))  # a kill -9 cut the last line in half
    truncate_metrics(tmp_path, 4)
    assert (tmp_path / "metrics.jsonl").read_text() == lines[0] + "\n" + lines[1] + "\n"
