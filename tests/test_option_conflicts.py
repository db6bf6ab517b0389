"""Every conflict said: a table of the commands' option pairs that cannot both hold, and of options that do not
apply to the input given. Each is refused in one line naming both (exit status 2) before anything is read or
written — never settled in silence (``pretrain --run-dir A --resume B`` extended B and ignored A). A value
adjusted to fit is printed as adjusted."""

from __future__ import annotations

from pathlib import Path

import pytest

from levjepa.cli import main
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.reading.views import model_views
from test_export import make_run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run_dir(tmp_path_factory.mktemp("conflicts"))


def _pairs(run: Path, tmp: Path) -> list[tuple[str, list[str], list[str]]]:
    """(case, argv, the words the one line must hold: both sides of the conflict)."""
    r, other, out = str(run), str(tmp / "other"), str(tmp / "out")
    idx = str(tmp / "train.txt")
    return [
        ("pretrain run-dir+resume", ["pretrain", "--run-dir", other, "--resume", r], ["--run-dir", "--resume", r]),
        ("pretrain resume+overwrite", ["pretrain", "--resume", r, "--overwrite"], ["--resume", "--overwrite"]),
        ("pretrain overwrite, no run-dir", ["pretrain", "--preset", "demo-cpu", "--overwrite"], ["--overwrite"]),
        ("pretrain help-config+preset", ["pretrain", "--help-config", "--preset", "demo-cpu"], ["--preset"]),
        ("finetune out+resume", ["finetune", "--out", other, "--resume", r], ["--out", "--resume"]),
        ("probe no-save+save-all", ["probe", r, "--no-save", "--save-all"], ["--no-save", "--save-all"]),
        ("probe no-save+probes-dir", ["probe", r, "--no-save", "--probes-dir", out], ["--no-save", "--probes-dir"]),
        ("probe plan+out", ["probe", r, "--task", f"index:{idx},{idx}", "--plan", "--out", out], ["--plan", "--out"]),
        ("probe features, built-in", ["probe", r, "--features", out], ["--features", "index"]),
        (
            "probe fps+frame-stride",
            ["probe", r, "--task", f"index:{idx},{idx}", "--fps", "4", "--frame-stride", "2"],
            ["--fps", "--frame-stride"],
        ),
        ("stream overwrite, no out", ["stream", r, idx, "--overwrite"], ["--overwrite", "--out"]),
        (
            "stream fps+frame-stride",
            ["stream", r, idx, "--fps", "4", "--frame-stride", "2"],
            ["--fps", "--frame-stride"],
        ),
        ("classify overwrite, no out", ["classify", r, idx, "--overwrite"], ["--overwrite", "--out"]),
        ("select overwrite, no out", ["select", r, "--overwrite"], ["--overwrite", "--out"]),
        (
            "extract per-video-feature, shards",
            ["extract", r, idx, "--out", out, "--per-video-feature", "cls"],
            ["--per-video-feature", "--format"],
        ),
        (
            "extract fps+frame-stride",
            ["extract", r, idx, "--out", out, "--fps", "4", "--frame-stride", "2"],
            ["--fps", "--frame-stride"],
        ),
        (
            "visualize fps+frame-stride",
            ["visualize", r, idx, "--out", out, "--fps", "4", "--frame-stride", "2"],
            ["--fps", "--frame-stride"],
        ),
        ("export private, no push", ["export", r, "--out", out, "--private"], ["--private", "--push-to-hub"]),
        ("export window, safetensors", ["export", r, "--out", out, "--window", "4"], ["--window", "--format"]),
        ("data check overwrite, no json", ["data", "check", str(tmp), "--overwrite"], ["--overwrite", "--json"]),
        (
            "data pack seed+no-shuffle",
            ["data", "pack", str(tmp), out, "--shards", "1", "--seed", "3", "--no-shuffle"],
            ["--seed", "--no-shuffle"],
        ),
        (
            "data prepare keep-files, no shards",
            ["data", "prepare", str(tmp), out, "--keep-files"],
            ["--keep-files", "--shards"],
        ),
        ("data prepare dst=src", ["data", "prepare", str(tmp), str(tmp)], ["DST", "SRC"]),
    ]


def test_every_option_pair_that_cannot_hold_is_refused_in_one_line(run, tmp_path, capsys):
    (tmp_path / "train.txt").write_text("clip.mp4 0\n")
    before = sorted(p.name for p in run.rglob("*"))
    failures = []
    for case, argv, words in _pairs(run, tmp_path):
        code = main(argv)
        err = capsys.readouterr().err.strip()
        one = code == 2 and len(err.splitlines()) == 1 and err.startswith(f"levjepa {argv[0]}")
        if not (one and all(w in err for w in words)):
            failures.append(f"{case}: exit {code}, {err!r}")
    assert not failures, "\n".join(failures)
    assert sorted(p.name for p in run.rglob("*")) == before, "a refused command wrote into the run"
    assert not (tmp_path / "out").exists() and not (tmp_path / "other").exists()


def test_a_resume_into_its_own_run_dir_is_no_conflict(run, capsys):
    # --run-dir naming the run --resume continues is the same run: not refused for the pair (the run's own
    # checks come after: this fake run's config cannot resume, which is a different message)
    main(["pretrain", "--run-dir", str(run), "--resume", str(run)])
    assert "--run-dir" not in capsys.readouterr().err


def test_a_size_the_patch_grid_cannot_hold_is_said_as_adjusted(run):
    loaded = load_encoder(run)
    patch = loaded.config.patch_size
    _, said = model_views(loaded, size=3 * patch + 1)
    assert f"cut to {3 * patch} px" in said and f"{3 * patch + 1} adjusted" in said
    _, said = model_views(loaded, size=3 * patch)
    assert "adjusted" not in said


def test_weights_an_export_does_not_hold_are_named_not_dropped(run, tmp_path, capsys):
    # an export keeps one set of weights: --weights online / both read it, and the line says so (it was silent)
    from levjepa.formats.writing.export import export_encoder

    export = tmp_path / "export"
    export_encoder(run, export)
    argv = ["probe", str(export), "--weights", "both", "--plan", "--task", "appearance"]
    main(argv)  # refused (--plan is for an index task) after the weights are read: what matters is the note
    err = capsys.readouterr().err
    assert f"note: --weights both: {export} holds one set of weights (ema), read as it is in place of online" in err
