"""levjepa.weights: atomic safetensors I/O that refuses pickles without executing them."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from levjepa.weights import WeightsError, atomic_write_text, load_tensors, prefixed, save_tensors


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
