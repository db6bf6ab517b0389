"""Protocol presets read a small split in each supported format (index, Kinetics CSV, SSv2 JSON), with the
views each preset states; bad rows are reported, not dropped; the in1k preset runs end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from levjepa.commands import probe as cli_probe
from levjepa.data import DataError, write_video
from levjepa.data.eval_clip import ViewSpec
from levjepa.eval.dataset_task import dataset_task
from levjepa.eval.protocols import PROTOCOLS, read_labelled
from test_export import make_run_dir


def _video(path: Path, colour: int) -> None:
    frames = np.full((6, 16, 20, 3), colour, np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_video(path, frames, fps=10)


def test_kinetics_csv(tmp_path):
    root = tmp_path / "k400"
    rows = {
        "train": [("abseiling", "aaa", 10, 20), ("zumba", "bbb", 0, 10), ("bowling", "ccc", 5, 15)],
        "val": [("zumba", "ddd", 3, 13), ("bowling", "eee", 1, 11)],
    }
    for split, rs in rows.items():
        lines = ["label,youtube_id,time_start,time_end,split"]
        for label, yt, t0, t1 in rs:
            lines.append(f"{label},{yt},{t0},{t1},{split}")
            if yt != "eee":  # one video was never downloaded
                _video(root / "videos" / split / label / f"{yt}_{t0:06d}_{t1:06d}.mp4", 100)
        (root / f"{split}.csv").write_text("\n".join(lines) + "\n")
    task = dataset_task(
        [str(root / "train.csv"), str(root / "val.csv")], protocol="k400", video_root=str(root / "videos")
    )
    assert [(Path(i.path).name, i.label) for i in task.splits["train"]] == [
        ("aaa_000010_000020.mp4", 0),
        ("bbb_000000_000010.mp4", 2),
        ("ccc_000005_000015.mp4", 1),
    ]
    assert [i.label for i in task.splits["val"]] == [2, 1]  # the training file's class indices
    assert Path(task.splits["val"][1].path).name == "eee_000001_000011.mp4"  # kept: reported as bad later
    assert task.classes == 400
    assert (task.test_views.views.segments, task.test_views.views.crops, task.train_views.views.crops) == (8, 3, 1)
    # the paper's matched evaluation: 8 temporal positions of a τ = 1 encoder, at the sampling it was given
    v = task.test_views.views
    assert (v.frames, v.frame_stride, v.size) == (8, 2, 256)
    assert "k400, 8 slots" in task.protocol_text and "the paper's matched evaluation" in task.protocol_text
    # V-JEPA 2's own sampling for comparison: 16 frames every 4th, whatever the tubelet
    vjepa2 = PROTOCOLS["k400"].views(2, ViewSpec(fps=7.5), "vjepa2")
    assert (vjepa2.frames, vjepa2.frame_stride, vjepa2.fps, vjepa2.segments, vjepa2.crops) == (16, 4, None, 8, 3)
    # 16 slots, selectable; a τ = 2 encoder reads twice the frames at the same slots, at the model's rate
    assert PROTOCOLS["k400"].views(1, ViewSpec(), 16).frames == 16
    tau2 = PROTOCOLS["k400"].views(2, ViewSpec(fps=7.5), 8)
    assert (tau2.frames, tau2.fps) == (16, 7.5)
    bad = tmp_path / "bad.csv"
    bad.write_text("label,youtube_id,time_start,time_end,split\nnew_class,fff,0,10,val\n")
    with pytest.raises(DataError, match="not in the training file's classes"):
        read_labelled(bad, video_root=root, classes={"zumba": 0})


def test_ssv2_json(tmp_path):
    root = tmp_path / "ssv2"
    (root / "videos").mkdir(parents=True)
    labels = {"Holding something next to something": "0", "Pushing something from left to right": "1"}
    (root / "something-something-v2-labels.json").write_text(json.dumps(labels))
    train = [
        {"id": "11", "template": "Holding [something] next to [something]", "label": "holding a cup"},
        {"id": "12", "template": "Pushing [something] from left to right", "label": "pushing a pen"},
    ]
    val = [{"id": "13", "template": "Pushing [something] from left to right"}]
    for e in train + val:
        _video(root / "videos" / f"{e['id']}.mp4", 50)  # any extension: found by stem
    (root / "train.json").write_text(json.dumps(train))
    (root / "validation.json").write_text(json.dumps(val))
    task = dataset_task(
        [str(root / "train.json"), str(root / "validation.json")], protocol="ssv2", video_root=str(root / "videos")
    )
    assert [(Path(i.path).name, i.label) for i in task.splits["train"]] == [("11.mp4", 0), ("12.mp4", 1)]
    assert task.splits["val"][0].label == 1 and task.classes == 174
    assert (task.test_views.views.segments, task.test_views.views.crops, task.test_views.views.frames) == (2, 3, 8)
    (root / "test.json").write_text(json.dumps([{"id": "14"}]))
    with pytest.raises(DataError, match="no 'template'"):
        read_labelled(root / "test.json", video_root=root / "videos")
    (root / "other").mkdir()
    (root / "other" / "t.json").write_text("[]")
    with pytest.raises(DataError, match="labels file"):
        read_labelled(root / "other" / "t.json")


def _images(root: Path, split: str, n: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        label = i % 2
        colour = [220, 30, 30] if label == 0 else [30, 30, 220]
        Image.fromarray(np.full((20, 26, 3), colour, np.uint8)).save(root / f"{split}{i}.jpg")
        lines.append(f"{split}{i}.jpg {label}")
    (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root / f"{split}.txt"


def test_in1k_preset_reads_an_index_of_images(tmp_path):
    train, val = _images(tmp_path / "img", "train", 6), _images(tmp_path / "img", "val", 4)
    task = dataset_task([str(train), str(val)], protocol="in1k")  # a τ = 1 encoder: 8 repeats unless told
    assert task.test_views.views.frames == 8 and task.test_views.views.size == 224 and task.test_views.views.crops == 1
    assert task.protocol_text.startswith("in1k, 8 slots (images repeated 8 times")
    assert dataset_task([str(train), str(val)], protocol="in1k", tubelet=2).test_views.views.frames == 16
    assert dataset_task([str(train), str(val)], protocol="in1k", slots="vjepa2").test_views.views.frames == 16
    assert task.splits["train"][0].kind == "image" and task.classes == 1000
    assert [i.label for i in task.splits["val"]] == [0, 1, 0, 1]


@pytest.mark.slow
def test_in1k_preset_end_to_end(tmp_path, capsys, one_thread):
    """16 frames of 224 px per image (6272 tokens at vit-test): about a minute on one core."""
    train, val = _images(tmp_path / "img", "train", 6), _images(tmp_path / "img", "val", 4)
    run = make_run_dir(tmp_path, steps=(5,))
    out = tmp_path / "res" / "probe.json"
    parser = argparse.ArgumentParser()
    cli_probe.add_arguments(parser)
    args = parser.parse_args(
        [
            str(run),
            "--task",
            f"index:{train},{val}",
            "--protocol",
            "in1k",
            "--probe",
            "knn",
            "--no-baseline",
            "--workers",
            "0",
            "--out",
            str(out),
        ]
    )
    assert cli_probe.main(args) == 0
    assert "protocol in1k (16×1×1)" in capsys.readouterr().out
    js = json.loads(out.read_text())
    assert js["info"]["split_sizes"] == {"train": 6, "val": 4}
    assert js["accuracy"]["pretrained-ema"]["labels"]["knn"] == 100.0
    assert (out.parent / "features").is_dir()


def test_protocol_options_need_an_index_task(tmp_path):
    from levjepa.commands import select as cli_select
    from levjepa.config import ConfigError

    run = make_run_dir(tmp_path, steps=(5,))
    for mod in (cli_probe, cli_select):
        parser = argparse.ArgumentParser()
        mod.add_arguments(parser)
        args = parser.parse_args([str(run), "--protocol", "ssv2", "--device", "cpu"])
        with pytest.raises(ConfigError, match="index:TRAIN,VAL"):
            mod.main(args)


def test_the_readme_index_command_runs_with_its_defaults(tmp_path, monkeypatch, capsys):
    """``levjepa probe RUN --task index:TRAIN,VAL`` exactly as documented: every default, ``--probe all``
    included (the CLS linear probe from feature stores on disk used to crash: issue 27)."""
    from levjepa.cli import main

    media = tmp_path / "media"
    for split, n in (("train", 4), ("val", 2)):
        lines = []
        for i in range(n):
            _video(media / f"{split}{i}.mp4", 40 if i % 2 == 0 else 200)
            lines.append(f"{split}{i}.mp4 {i % 2}")
        (media / f"{split}.txt").write_text("\n".join(lines) + "\n")
    run = make_run_dir(tmp_path, steps=(5,))
    monkeypatch.chdir(tmp_path)  # the default --features folder: ./features
    assert main(["probe", str(run), "--task", f"index:{media / 'train.txt'},{media / 'val.txt'}"]) == 0
    text = capsys.readouterr().out
    for label in ("attentive", "linear (mean)", "linear (CLS)", "kNN (CLS)"):
        assert f"| media | {label} |" in text  # the task is named by the folder of its generic train.txt
    assert (tmp_path / "features").is_dir()


def test_index_files_labelled_by_class_name_share_the_training_split_map(tmp_path):
    """Kinetics-style lists (``path left``): names numbered in sorted order, validation numbered as training."""
    from levjepa.eval.protocols import read_labelled

    for name in ("a.mp4", "b.mp4", "c.mp4"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "train.txt").write_text("a.mp4 right\nb.mp4 left\nc.mp4 up\n")
    (tmp_path / "val.txt").write_text("c.mp4 left\na.mp4 up\n")
    train, classes = read_labelled(tmp_path / "train.txt")
    assert classes == {"left": 0, "right": 1, "up": 2} and [it.label for it in train] == [1, 0, 2]
    val, same = read_labelled(tmp_path / "val.txt", classes=classes)
    assert same == classes and [it.label for it in val] == [0, 2]
