"""Every command inside the policies: ``export`` without its extra says which to install before it writes
anything; a SIGTERM / SIGUSR1 stops every command that writes with one line and exit status 75, leaving nothing
half-written that looks complete (a folder output is moved in whole, ``_outputs.staged_folder``; a stopped pool
runs no more of its items); ``probe --features`` never writes into a run, an export or a fine-tuning folder."""

from __future__ import annotations

import os
import signal
import time

import pytest

import levjepa.commands._extras as extras
import levjepa.formats.writing.export as formats_export
from levjepa.commands import STOPPED, main
from levjepa.commands._outputs import OutputError, claim_outside_owned, folder_kind, staged_folder
from levjepa.data.workers import parallel_map
from levjepa.train.preemption import REQUEUE_EXIT
from test_export import make_run_dir


@pytest.fixture
def run(tmp_path):
    return make_run_dir(tmp_path, steps=(5,))


def _lines(capsys):
    return [x for x in capsys.readouterr().err.splitlines() if x.startswith("levjepa ")]


def _left_beside(folder):
    """Hidden partial folders a stopped command left beside its output."""
    return [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]


def test_export_without_its_extra_names_it_before_writing_anything(run, tmp_path, monkeypatch, capsys):
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda m: None if m == "onnxscript" else real(m))
    out = tmp_path / "out"
    assert main(["export", str(run), "--out", str(out), "--format", "onnx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "onnxscript is not installed" in err[0] and "pip install 'levjepa[deploy]'" in err[0]
    assert not out.exists()
    assert main(["export", str(run), "--out", str(out)]) == 0  # the weights alone need no extra
    assert folder_kind(out) == "export"


def _stop_during(monkeypatch, module, name):
    """Make ``module.name`` deliver a SIGTERM to this process, as a scheduler would, while it works."""
    real = getattr(module, name)

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, stopped)


def test_a_signal_during_an_export_leaves_no_folder_that_looks_like_one(run, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    _stop_during(monkeypatch, formats_export, "export_onnx")  # after the weights and the card are written
    assert main(["export", str(run), "--out", str(out), "--format", "onnx", "--window", "2", "--size", "16"]) == 75
    lines = _lines(capsys)
    assert len(lines) == 1 and "SIGTERM received: stopped before the export was complete" in lines[0]
    assert not out.exists() and _left_beside(out) == []
    monkeypatch.undo()
    assert main(["export", str(run), "--out", str(out)]) == 0  # an export of the weights alone
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _stop_during(monkeypatch, formats_export, "export_onnx")
    argv = ["export", str(run), "--out", str(out), "--overwrite", "--format", "onnx", "--window", "2", "--size", "16"]
    assert main(argv) == REQUEUE_EXIT
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _left_beside(out) == []


@pytest.mark.parametrize("command", sorted(STOPPED))
def test_every_other_command_that_writes_stops_with_one_line_and_75(command, monkeypatch, capsys):
    import importlib

    module = importlib.import_module(f"levjepa.commands.{command}")

    def working(args):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)
        return 0

    monkeypatch.setattr(module, "main", working)
    argv = {"data": ["data", "check", "x"], "select": ["select", "x"], "stream": ["stream", "x", "y"]}
    before = signal.getsignal(signal.SIGUSR1)
    assert main(argv.get(command, [command, "x", "y"])) == REQUEUE_EXIT
    lines = _lines(capsys)
    assert len(lines) == 1 and lines[0].startswith(f"levjepa {command}") and "SIGUSR1 received" in lines[0]
    assert signal.getsignal(signal.SIGUSR1) == before  # the caller's handler back


def test_a_folder_output_is_put_in_place_whole_or_not_at_all(tmp_path):
    out = tmp_path / "maps"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # a folder of no kind, with a file of the user's
    with pytest.raises(RuntimeError), staged_folder(out, replaces=("a.png", "b.png")) as stage:
        (stage / "a.png").write_text("half")
        raise RuntimeError("stopped")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and _left_beside(out) == []
    with staged_folder(out, replaces=("a.png", "b.png")) as stage:
        (stage / "a.png").write_text("new")
    (out / "b.png").write_text("old")
    with staged_folder(out, replaces=("a.png", "b.png")) as stage:  # b.png is the old output's: it goes
        (stage / "a.png").write_text("newer")
    assert sorted(p.name for p in out.iterdir()) == ["a.png", "notes.txt"] and (out / "a.png").read_text() == "newer"


def _slow(path):
    time.sleep(0.2)
    open(path, "w").close()
    return path


def test_a_stopped_pool_runs_none_of_the_items_it_had_not_started(tmp_path):
    items = [str(tmp_path / f"{i}") for i in range(40)]

    def stop(result):
        raise KeyboardInterrupt  # what a signal's exception does to the loop that collects the results

    with pytest.raises(KeyboardInterrupt):
        parallel_map(_slow, items, 2, failed=stop, progress=False)
    time.sleep(0.5)
    assert len(list(tmp_path.iterdir())) <= 12  # the items started or queued to a worker by then, not all 40


def test_probe_features_never_go_into_a_run_an_export_or_a_finetuning_folder(run, tmp_path, capsys):
    (tmp_path / "train.txt").write_text("a.mp4 0\nb.mp4 1\n")
    (tmp_path / "val.txt").write_text("c.mp4 0\nd.mp4 1\n")
    task = f"index:{tmp_path / 'train.txt'},{tmp_path / 'val.txt'}"
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for features in (run, run / "features"):
        assert main(["probe", str(run), "--task", task, "--features", str(features), "--no-save"]) == 2
        lines = _lines(capsys)
        assert len(lines) == 1 and "would write into a pretraining run" in lines[0], lines
    assert main(["probe", str(run), "--task", task, "--out", str(run / "result.json"), "--no-save"]) == 2
    assert "--features (default)" in _lines(capsys)[0]  # features/ beside an --out inside the run
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert main(["export", str(run), "--out", str(tmp_path / "exp")]) == 0
    with pytest.raises(OutputError, match="would write into a levjepa export, inside"):
        claim_outside_owned(tmp_path / "exp" / "stores", "--features")
    assert claim_outside_owned(tmp_path / "stores", "--features") == tmp_path / "stores"
