"""Readers follow the model (issue 45): a 32-px, 4-frame export is read at 32 px and 4 frames by every reader —
probe, extract, classify, finetune, visualize, stream and the Python API — unless told otherwise, and each says
which views it used; kept probes of two index tasks keep two folders; classify maps class names through the
probe's own and reports a label it never saw instead of scoring it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import levjepa
from levjepa.cli import main
from levjepa.data import write_video
from levjepa.data.eval_clip import ViewSpec
from levjepa.formats.reading.views import model_views
from test_export import make_run_dir


def _videos(root: Path, split: str, n: int, seed: int, names: tuple[str, ...] | None = None) -> Path:
    """``n`` 12-frame 40×48 videos whose brightness says the class; labels as integers or as ``names``."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        label = i % 2
        frames = rng.integers(0, 200, (12, 40, 48, 3)).astype(np.float32) * 0.5 + 60 * label
        write_video(root / f"{split}{i}.mp4", frames.clip(0, 255).astype(np.uint8), fps=10)
        lines.append(f"{split}{i}.mp4 {names[label] if names else label}")
    (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root / f"{split}.txt"


@pytest.fixture
def export32(tmp_path):
    """A levjepa export whose preprocessing is 4 frames of 32 px, every frame (its run's benchmark clips)."""
    run = make_run_dir(tmp_path, steps=(5,))
    config = json.loads((run / "config.json").read_text())
    config["data"]["synthetic"] = {"size": 32, "num_frames": 4}
    (run / "config.json").write_text(json.dumps(config))
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out)]) == 0
    pre = json.loads((out / "config.json").read_text())["preprocessing"]
    assert (pre["size"], pre["num_frames"], pre["frame_stride"]) == (32, 4, 1)
    return out


def test_every_reader_reads_a_32px_export_at_32px_and_says_so(export32, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    media = tmp_path / "clips"
    train, val = _videos(media, "train", 6, 0), _videos(media, "val", 4, 1)
    task = f"index:{train},{val}"
    capsys.readouterr()
    # the Python API
    views, said = model_views(levjepa.load(export32))
    assert views == ViewSpec(size=32, frames=4, frame_stride=1) and said.endswith("(the model's preprocessing)")
    # extract
    assert main(["extract", str(export32), str(val), "--out", str(tmp_path / "x"), "--workers", "0"]) == 0
    said = capsys.readouterr().out
    assert "windows: 4 frames every frame, 32 px (the model's preprocessing)" in said
    sig = json.loads((tmp_path / "x" / "store.json").read_text())["config"]  # the feature set's manifest
    assert (sig["size"], sig["frames"], sig["frame_stride"]) == (32, 4, 1)
    # probe: its feature stores are cut at the model's views, and its kept probes record them
    probe = ["probe", str(export32), "--task", task, "--probe", "linear", "--no-baseline", "--workers", "0"]
    assert main([*probe, "--set", "linear_epochs=1", "--probes-dir", str(tmp_path / "kept")]) == 0
    said = capsys.readouterr().out
    assert "views: 4 frames every frame, 32 px (the model's preprocessing)" in said
    stores = [json.loads(p.read_text())["config"] for p in (tmp_path / "features").glob("*/store.json")]
    assert stores and all((c["size"], c["frames"], c["frame_stride"]) == (32, 4, 1) for c in stores)
    kept = tmp_path / "kept" / "clips" / "linear"
    record = json.loads((kept / "classifier.json").read_text())["protocol"]
    assert (record["size"], record["frames"], record["frame_stride"]) == (32, 4, 1)
    # classify: the classifier's own views
    assert main(["classify", str(kept), str(val), "--workers", "0"]) == 0
    assert "views: 4 frames every frame, 32 px (the classifier's own)" in capsys.readouterr().err
    # visualize and stream
    assert main(["visualize", str(export32), str(media / "val0.mp4"), "--out", str(tmp_path / "vis"), "--no-gif"]) == 0
    assert json.loads(capsys.readouterr().out)["clip"] == [4, 32, 32]
    assert main(["stream", str(export32), str(media / "val0.mp4")]) == 0
    assert "views: frames every frame, 32 px (the model's preprocessing)" in capsys.readouterr().err
    # finetune, and an override said as such
    ft = ["finetune", str(export32), "--task", task, "--out", str(tmp_path / "ft"), "steps=1", "workers=0"]
    assert main([*ft, "batch_size=2", "loggers=", "size=16", "eval_every=1"]) == 0
    assert "views: 4 frames every frame, 16 px (size as given, the rest the model's)" in capsys.readouterr().err
    # the random-init baseline reads what the model reads, in finetune as in probe
    ft = ["finetune", str(export32), "--random-init", "--task", task, "--out", str(tmp_path / "ft-random")]
    assert main([*ft, "steps=1", "workers=0", "batch_size=2", "loggers=", "eval_every=1"]) == 0
    assert "views: 4 frames every frame, 32 px (the model's preprocessing)" in capsys.readouterr().err


def test_a_rate_replaces_the_stride_and_frames_must_fill_tubelets(export32):
    from levjepa.formats.reading.load import load_encoder

    loaded = load_encoder(export32)
    views, said = model_views(loaded, fps=7.5)
    assert (views.fps, views.frames, views.size) == (7.5, 4, 32) and "fps as given" in said
    assert "at 7.5 fps" in said
    from levjepa.config import ConfigError

    loaded.config = loaded.config.__class__(**{**loaded.config.__dict__, "tubelet": 2})
    with pytest.raises(ConfigError, match="tubelet is 2 frames"):
        model_views(loaded, frames=3)


def test_two_index_tasks_keep_two_probe_folders_and_a_name_is_never_reused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = make_run_dir(tmp_path, steps=(5,))
    a = [_videos(tmp_path / "ucf", s, n, seed) for s, n, seed in (("train", 6, 0), ("val", 4, 1))]
    b = [_videos(tmp_path / "hmdb", s, n, seed) for s, n, seed in (("train", 6, 2), ("val", 4, 3))]
    base = ["probe", str(run), "--probe", "linear", "--no-baseline", "--workers", "0", "--set", "linear_epochs=1"]
    for files in (a, b):
        assert main([*base, "--task", "index:" + ",".join(map(str, files))]) == 0
    assert sorted(p.name for p in (run / "probes").iterdir()) == ["hmdb", "ucf"]
    for name, files in (("ucf", a), ("hmdb", b)):
        trained = json.loads((run / "probes" / name / "linear" / "classifier.json").read_text())["trained"]
        assert trained["task_files"]["train"] == str(files[0].resolve())
    capsys.readouterr()
    # another task under a name already taken: refused before anything is computed, the folder untouched
    before = (run / "probes" / "ucf" / "linear" / "head.safetensors").read_bytes()
    assert main([*base, "--task", "index:" + ",".join(map(str, b)), "--name", "ucf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--name NAME" in err
    assert f"probes whose train file is {a[0].resolve()}, not {b[0].resolve()}" in err
    # the same TRAIN file with another VAL file: the message names the split that differs
    assert main([*base, "--task", "index:" + ",".join(map(str, [a[0], b[1]])), "--name", "ucf"]) == 2
    assert f"probes whose val file is {a[1].resolve()}, not {b[1].resolve()}" in capsys.readouterr().err
    assert (run / "probes" / "ucf" / "linear" / "head.safetensors").read_bytes() == before
    # the same task again: its kept probe is replaced only when asked (--overwrite), never by a plain re-run
    assert main([*base, "--task", "index:" + ",".join(map(str, a))]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (run / "probes" / "ucf" / "linear" / "head.safetensors").read_bytes() == before
    assert main([*base, "--task", "index:" + ",".join(map(str, a)), "--overwrite"]) == 0  # renewed


def test_classify_maps_class_names_and_does_not_score_an_unknown_label(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = make_run_dir(tmp_path, steps=(5,))
    names = ("dark", "light")
    files = [_videos(tmp_path / "named", s, n, seed, names) for s, n, seed in (("train", 6, 0), ("val", 4, 1))]
    probe = ["probe", str(run), "--task", "index:" + ",".join(map(str, files)), "--probe", "linear"]
    assert main([*probe, "--no-baseline", "--workers", "0", "--set", "linear_epochs=1"]) == 0
    kept = run / "probes" / "named" / "linear"
    assert json.loads((kept / "classifier.json").read_text())["labels"] == ["dark", "light"]
    # an index whose names come in another order, plus a class the probe never saw
    test = tmp_path / "named" / "test.txt"
    test.write_text("val0.mp4 light\nval1.mp4 light\nval2.mp4 dark\nval3.mp4 purple\n")
    capsys.readouterr()
    assert main(["classify", str(kept), str(test), "--workers", "0", "--out", str(tmp_path / "p.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "over 3 labelled prediction(s)" in out
    assert "1 file(s) labelled with a class the classifier never saw (purple)" in out
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r.get("truth") for r in rows] == [1, 1, 0, None]  # "light" is the probe's class 1, whatever the file says
