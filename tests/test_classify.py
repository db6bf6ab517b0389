"""Kept probes and ``levjepa classify``: a probe kept by ``levjepa probe`` reproduces its test accuracy on the
test index, file by file, with the protocol's multi-view averaging; a head refuses another encoder; bad
input ends in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from levjepa.cli import main
from levjepa.data import write_video
from levjepa.eval.protocols import PROTOCOLS, Protocol
from levjepa.formats.reading.classifier import read_classifier
from test_export import make_run_dir

# 2 segments x 3 crops of 4 frames at 16 px (2 x 2 patches of vit-test per frame): every view path of the
# standard protocols, at a size the default suite affords
TINY = Protocol("tiny", 16, 2, 3, 3, False, "test")  # 16 px, 2 segments × 3 crops, 3 classes; --slots 4


def write_index(root: Path, split: str, n: int, seed: int) -> Path:
    """``n`` noisy 12-frame videos whose brightness says the class (0, 1, 2), except every fourth, which shows
    the next class: no probe gets them all right."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        label = i % 3
        shown = label if i % 4 != 3 else (label + 1) % 3
        frames = rng.integers(0, 255, (12, 16, 24, 3)).astype(np.float32) * 0.8 + 12 * shown
        path = root / f"{split}{i}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_video(path, frames.clip(0, 255).astype(np.uint8), fps=10)
        lines.append(f"{path.name} {label}")
    (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root / f"{split}.txt"


@pytest.fixture
def index_task(tmp_path, monkeypatch):
    monkeypatch.setitem(PROTOCOLS, "tiny", TINY)
    monkeypatch.chdir(tmp_path)  # the feature stores: ./features
    media = tmp_path / "media"
    return [write_index(media, s, n, seed) for s, n, seed in (("train", 12, 0), ("val", 6, 1), ("test", 9, 2))]


def test_kept_probes_reproduce_their_test_accuracy(tmp_path, index_task, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    out = tmp_path / "res" / "probe.json"
    task = "index:" + ",".join(map(str, index_task))
    args = ["probe", str(run), "--task", task, "--protocol", "tiny", "--slots", "4", "--no-baseline", "--workers", "0"]
    assert main([*args, "--probe", "attentive,linear,linear_cls", "--set", "epochs=3", "--out", str(out)]) == 0
    capsys.readouterr()
    reported = json.loads(out.read_text())["results"]["pretrained-ema"]["media"]
    accs = []
    for probe in ("attentive", "linear", "linear_cls"):
        kept = run / "probes" / "media" / probe
        rec = read_classifier(kept)
        assert rec.protocol.segments == 2 and rec.protocol.crops == 3 and rec.trained["chosen"]
        assert rec.trained["lr"] == reported[probe]["best"]["lr"]
        preds = tmp_path / f"{probe}.jsonl"
        assert main(["classify", str(kept), str(index_task[2]), "--workers", "0", "--out", str(preds)]) == 0
        rows = [json.loads(line) for line in preds.read_text().splitlines()]
        assert len(rows) == 9 and all(abs(sum(r["probs"]) - 1) < 1e-5 for r in rows)  # top-5 of 3 classes: all
        acc = 100.0 * sum(r["classes"][0] == r["truth"] for r in rows) / len(rows)
        assert acc == pytest.approx(reported[probe]["best"]["test_acc"], abs=1e-9), probe
        assert f"accuracy {acc:.1f} %" in capsys.readouterr().out
        accs.append(acc)
    assert len(set(accs)) > 1 or 0 < accs[0] < 100  # the numbers compared are not trivially all equal


def test_a_head_refuses_another_encoder_and_unreadable_input(tmp_path, index_task, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    other = make_run_dir(tmp_path / "other", steps=(5,), seed=3)
    task = "index:" + ",".join(map(str, index_task[:2]))
    args = ["probe", str(run), "--task", task, "--protocol", "tiny", "--slots", "4", "--no-baseline", "--workers", "0"]
    assert main([*args, "--probe", "linear", "--set", "linear_epochs=2"]) == 0
    kept = run / "probes" / "media" / "linear"
    capsys.readouterr()
    assert main(["classify", str(kept), str(index_task[1]), "--encoder", str(other), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "a head reads only the encoder it was trained on" in err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.mp4").write_bytes(b"not a video")
    (broken / "b.mp4").write_bytes(b"")
    assert main(["classify", str(kept), str(broken), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "none of the 2 file(s) could be read" in err[-1]
    # one unreadable file among readable ones is listed, not fatal
    assert main(["classify", str(kept), str(index_task[1]), str(broken / "a.mp4"), "--workers", "0"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 6 + 1 and "a.mp4" in captured.err


def test_windows_give_one_prediction_per_window_with_its_time_span(tmp_path, index_task, capsys):
    run = make_run_dir(tmp_path, steps=(5,))
    task = "index:" + ",".join(map(str, index_task[:2]))
    args = ["probe", str(run), "--task", task, "--protocol", "tiny", "--slots", "4", "--no-baseline", "--workers", "0"]
    assert main([*args, "--probe", "linear", "--set", "linear_epochs=2"]) == 0
    out = tmp_path / "w.csv"
    video = index_task[1].parent / "val0.mp4"  # 12 frames at 10 fps: windows of 4 frames
    assert main(["classify", str(run / "probes/media/linear"), str(video), "--windows", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("path,window,start_time,end_time,truth,label1,prob1")
    spans = [(float(r.split(",")[2]), float(r.split(",")[3])) for r in lines[1:]]
    assert [t for span in spans for t in span] == pytest.approx([0.0, 0.4, 0.4, 0.8, 0.8, 1.2])
    # at a rate: 5 fps keeps every 2nd frame of the 10-fps video, so 6 frames make 2 windows of 4 (the last padded);
    # the predictions written above are replaced only when asked (--overwrite)
    again = ["classify", str(run / "probes/media/linear"), str(video), "--windows", "--fps", "5", "--out", str(out)]
    assert main(again) == 2 and "--overwrite" in capsys.readouterr().err
    assert main([*again, "--overwrite"]) == 0
    starts = [float(r.split(",")[2]) for r in out.read_text().splitlines()[1:]]
    assert starts == pytest.approx([0.0, 0.8])


def test_bad_index_tasks_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    media = tmp_path / "m"
    train = write_index(media, "train", 3, 0)
    run = make_run_dir(tmp_path, steps=(5,))
    one = media / "one.txt"
    one.write_text("train0.mp4 0\ntrain3.mp4 0\n")
    unseen = media / "unseen.txt"
    unseen.write_text("train0.mp4 0\ntrain1.mp4 7\n")
    broken = media / "broken.txt"
    for name in ("x.mp4", "y.mp4", "z.mp4"):
        (media / name).write_bytes(b"not a video")
    broken.write_text("x.mp4 0\ny.mp4 1\nz.mp4 2\n")
    cases = (
        ((one, train), "need >= 2 classes"),
        ((train, unseen), "never occur in TRAIN"),
        ((broken, train), "none of the 3 file(s)"),
    )
    for split_files, msg in cases:
        before = sorted(p.name for p in run.rglob("*"))
        task = "index:" + ",".join(map(str, split_files))
        assert main(["probe", str(run), "--task", task, "--no-baseline", "--workers", "0", "--size", "16"]) == 2
        *progress, error = capsys.readouterr().err.strip().splitlines()
        assert error.startswith("levjepa probe: ") and msg in error  # the error: one line, last
        # before it only progress lines, and one line per unreadable file
        assert all((" files" in line and "eta" in line) or line.startswith("bad file skipped: ") for line in progress)
        assert sorted(p.name for p in run.rglob("*")) == before


def test_a_head_is_written_and_read_back_by_one_pair_and_checked_against_its_encoder(tmp_path):
    """write_classifier / read_head give back the same head (the token dtype overridable), head_module refuses
    weights of another shape in one line, and check_encoder refuses any encoder but the one fingerprinted."""
    import torch

    from levjepa.data.eval_clip import ViewSpec
    from levjepa.formats.reading.classifier import (
        ClassifierRecord,
        check_encoder,
        head_module,
        read_head,
        write_classifier,
    )
    from levjepa.model import encoder_config
    from levjepa.model.classifier import HeadConfig, build_head
    from levjepa.model.fingerprint import function_fingerprint
    from levjepa.model.vit import VideoEncoder
    from levjepa.weights import WeightsError

    torch.manual_seed(0)
    enc, other = VideoEncoder(encoder_config("vit-test")), VideoEncoder(encoder_config("vit-test"))
    cfg = HeadConfig(kind="attentive", input="tokens", dim=enc.cfg.dim, num_classes=3, token_dtype="float16")
    head = build_head(cfg, torch.Generator().manual_seed(1))
    rec = ClassifierRecord(cfg, ("a", "b", "c"), ViewSpec(size=16, frames=4), "enc", "ema", function_fingerprint(enc))
    write_classifier(tmp_path / "clf", rec, head.state_dict())
    got, module = read_head(tmp_path / "clf")
    assert got == rec and module.state_dict().keys() == head.state_dict().keys()
    assert all(torch.equal(module.state_dict()[k], v) for k, v in head.state_dict().items())
    assert read_head(tmp_path / "clf", token_dtype="float32")[0].head.token_dtype == "float32"
    small = build_head(HeadConfig(kind="attentive", input="tokens", dim=enc.cfg.dim, num_classes=2))
    with pytest.raises(WeightsError, match="the head's weights do not fit its config"):
        head_module(cfg, small.state_dict(), "somewhere")
    check_encoder(rec, enc, where="clf", other="this holds")  # the encoder it was trained on: accepted
    with pytest.raises(WeightsError, match="a head reads only the encoder it was trained on"):
        check_encoder(rec, other, where="clf", other="this holds")


def test_the_papers_k400_readout_stores_cls_and_mean_only(tmp_path, index_task, capsys):
    """``--probe linear`` with a multi-segment protocol (K400's readout in the paper: a linear probe on
    mean-pooled tokens): the stores keep CLS and mean, no token, and the plan counts 2 · D · 4 bytes a view."""
    run = make_run_dir(tmp_path, steps=(5,))
    task = "index:" + ",".join(map(str, index_task[:2]))
    args = ["probe", str(run), "--task", task, "--protocol", "tiny", "--slots", "4", "--no-baseline", "--workers", "0"]
    assert main([*args, "--probe", "linear", "--plan"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("disk in all")]
    views = 12 * 2 * 1 + 6 * 2 * 3  # train: 2 segments, 1 crop; val: 2 × 3
    assert line.startswith(f"disk in all: {views * 2 * 32 * 4 / 1e3:.1f} kB")
    assert main([*args, "--probe", "linear", "--set", "linear_epochs=2"]) == 0
    stores = sorted((tmp_path / "features").rglob("store.json"))
    assert stores and all(not json.loads(p.read_text())["config"]["tokens"] for p in stores)
    assert not list((tmp_path / "features").rglob("tokens-*.npy"))


def test_splits_that_share_files_are_refused_before_any_decoding_unless_allowed(tmp_path, capsys, monkeypatch):
    """The same file in TRAIN and VAL scores a probe on what it trained on (without TEST, the number reported):
    refused in one line before anything is decoded, by probe and finetune alike; --allow-shared-files runs it,
    says so before the features, and the table's caption says so too."""
    monkeypatch.chdir(tmp_path)
    media = tmp_path / "m"
    train = write_index(media, "train", 6, 0)
    val = media / "val.txt"
    val.write_text("train0.mp4 0\n./train1.mp4 1\n")  # the same files, one spelled differently
    run = make_run_dir(tmp_path, steps=(5,))
    task = f"index:{train},{val}"
    args = ["probe", str(run), "--task", task, "--no-baseline", "--workers", "0", "--size", "16", "--frames", "4"]
    assert main([*args, "--probe", "knn"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{train} and {val} share 2 file(s) (e.g. {media / 'train0.mp4'})" in err
    assert "--allow-shared-files" in err and not (tmp_path / "features").exists()
    assert main(["finetune", str(run), "--task", task, "--out", str(tmp_path / "ft"), "steps=1"]) == 2
    assert "share 2 file(s)" in capsys.readouterr().err and not (tmp_path / "ft").exists()
    assert main([*args, "--probe", "knn", "--allow-shared-files"]) == 0
    out = capsys.readouterr().out
    assert out.index("warning: train and val share 2 file(s)") < out.index("SPLITS SHARE FILES (train/val 2)")
