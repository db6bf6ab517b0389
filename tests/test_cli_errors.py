"""One error path for every command: a user's mistake ends with one line naming the command and exit status 2,
``--debug`` shows the traceback, a closed pipe exits quietly, and inputs are bounded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from levjepa.cli import main
from levjepa.config import ConfigError
from levjepa.data import DataError
from levjepa.data.badfiles import BAD_FILE_KINDS, bad_file_kind
from levjepa.train.loop import pretrain
from train_utils import tiny_config

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "run"
    pretrain(tiny_config("train.steps=2", "train.checkpoint_every=2"), path, progress=False)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("inputs")
    (root / "notes.txt").write_text("hello world\nsecond line\n")
    (root / "notes.mp4").write_text("not a video")
    return {"text": str(root / "notes.txt"), "fake_video": str(root / "notes.mp4"), "missing": str(root / "nope")}


def _cases(run: Path, f: dict[str, str], out: str) -> list[tuple[list[str], str]]:
    """(argv, a word the message must hold) — each command with each kind of mistake it can be given."""
    r = str(run)
    return [
        (["pretrain", "--preset", "demo-cpu", "model.depht=3", "--print-config"], "model.depht"),
        (["pretrain", "--preset", "nope"], "invalid choice"),
        (["pretrain", "--preset", "demo-cpu", "data.batch_size=6400000", "--print-config"], "1..65536"),
        (["pretrain", "--preset", "demo-cpu", "data.global_size=22400", "--print-config"], "8..4096"),
        (["pretrain", "--resume", f["missing"]], "nope"),
        (["pretrain", "--config", f["missing"]], "nope"),
        (["pretrain", "--config", f["text"]], "notes.txt"),
        (["probe", f["missing"]], "nope"),
        (["probe", r, "--weights", "both", "--budget", "huge"], "invalid choice"),
        (["probe", r, "--set", "nope=1"], "nope"),
        (["probe", r, "--task", f"index:{f['missing']},{f['missing']}"], "nope"),
        (["probe", r, "--task", f"index:{f['text']},{f['text']}"], "does not look like a V-JEPA index"),
        (["extract", f["missing"], f["text"], "--out", out], "nope"),
        (["extract", r, f["text"], "--out", out, "--format", "csv"], "invalid choice"),
        (["extract", r], "required"),
        (["export", f["missing"], "--out", out], "nope"),
        (["export", r, "--out", out, "--weights", "both"], "invalid choice"),
        (["select", r, "--task", "colour"], "valid choices"),
        (["select"], "required"),
        (["stream", f["missing"], f["fake_video"]], "nope"),
        (["stream", r, f["fake_video"]], "notes.mp4"),
        (["stream", r, f["missing"]], "nope"),
        (["stream", r, f["fake_video"], "--size", "100000"], "--size"),
        (["visualize", r, f["fake_video"], "--out", out], "notes.mp4"),
        (["visualize", r, "synthetic:99999", "--out", out], "0..399"),
        (["visualize", r, "synthetic:x", "--out", out], "synthetic:i"),
        (["visualize", r, "synthetic:1", "--out", out, "--query", "1,2"], "t,y,x"),
        (["visualize", r, "synthetic:1", "--out", out, "--frames", "100000"], "--frames"),
        (["data", "check", f["missing"]], "nope"),
        (["data", "check", f["text"]], "does not look like a V-JEPA index"),
        (["data", "pack", f["missing"], out, "--shards", "2"], "nope"),
        (["data", "frobnicate"], "invalid choice"),
        (["flops", "--model", "vit-giant"], "invalid choice"),
        (["flops", "--frames", "many"], "invalid int"),
        (["flops", "--frames", "3", "--set", "tubelet=2"], "--frames 3"),
        (["flops", "--drop-ratio", "1.5"], "--drop-ratio 1.5"),
        (["flops", "--sweep", "0,x"], "--sweep"),
        (["flops", "--local-size", "90"], "--local-size 90"),
        (["export", r, "--out", out, "--window", "8", "--dtype", "fp16"], "--window, --dtype shape"),
        (["export", r, "--out", out, "--opset", "11"], "--opset shapes"),
        (["export", r, "--out", out, "--private"], "--push-to-hub"),
        (["probe", r, "--task", f"index:{f['text']},{f['text']}", "--protocol", "k400", "--size", "48"], "--size"),
        (["probe", r, "--task", f"index:{f['text']},{f['text']}", "--protocol", "k400", "--frames", "2"], "--frames"),
        (
            [
                "probe",
                r,
                "--task",
                f"index:{f['text']},{f['text']}",
                "--slots",
                "vjepa2",
                "--protocol",
                "ssv2",
                "--fps",
                "4",
            ],
            "--fps",
        ),
        (["probe", r, "--task", f"index:{f['text']},{f['text']}", "--slots", "16"], "--protocol"),
        (["classify", r, f["fake_video"], "--top-k", "0"], "--top-k: '0'"),
    ]


def test_every_command_reports_a_mistake_in_one_line_with_status_2(run, files, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LEVJEPA_DEBUG", raising=False)
    for argv, word in _cases(run, files, str(tmp_path / "out")):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert len(lines) == 1, (argv, captured.err)
        prog = "levjepa " + (" ".join(argv[:2]) if argv[0] == "data" and argv[1] != "frobnicate" else argv[0])
        assert lines[0].startswith(f"{prog}: "), (argv, lines[0])
        assert word in lines[0], (argv, lines[0])
        said = lines[0][len(prog) + 2 :]  # in plain words: no error kind (unreadable:, missing:, ...) before it
        assert bad_file_kind(said) == "other", (argv, lines[0])
        assert not re.search(r"\b[a-z_]+='", said), (argv, lines[0])  # nor a Python keyword argument
        assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "out").exists()  # no command wrote anything before failing


def test_an_errors_kind_never_leads_its_line(monkeypatch, capsys):
    import levjepa.commands.flops as flops

    for kind in BAD_FILE_KINDS:

        def fail(args, kind=kind):
            raise DataError(f"{kind}: x.mp4 what")

        monkeypatch.setattr(flops, "main", fail)
        assert main(["flops"]) == 2
        assert capsys.readouterr().err == "levjepa flops: x.mp4 what\n"


def test_debug_shows_the_traceback(files, monkeypatch, capsys):
    with pytest.raises(ConfigError, match=r"model\.depht"):
        main(["pretrain", "--preset", "demo-cpu", "model.depht=3", "--debug"])
    monkeypatch.setenv("LEVJEPA_DEBUG", "1")
    with pytest.raises(ConfigError, match=r"model\.depht"):
        main(["pretrain", "--preset", "demo-cpu", "model.depht=3"])
    monkeypatch.setenv("LEVJEPA_DEBUG", "0")
    assert main(["data", "check", files["missing"]]) == 2
    assert "Traceback" not in capsys.readouterr().err
    with pytest.raises(DataError, match="nope"):  # --debug may also stand before the command
        main(["--debug", "data", "check", files["missing"]])


def test_overrides_may_stand_on_both_sides_of_an_option(capsys):
    assert main(["pretrain", "--preset", "demo-cpu", "train.steps=3", "--print-config", "model.depth=3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["train"]["steps"] == 3 and printed["model"]["depth"] == 3


def test_a_closed_pipe_ends_the_command_quietly():
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write fails with EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "levjepa", "pretrain", "--preset", "demo-cpu", "--print-config"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": SRC},
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""
