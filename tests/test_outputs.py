"""One write policy for every command (``levjepa.commands._outputs``): a table walks every command's outputs.

For each output of each command: a folder of another kind (a run, an export, a fine-tuning run, a project folder
holding a ``README.md``) is never written into, a file of another kind (a video, an index file, a run's
``config.json``) is never replaced, an output of the command's own kind is replaced only with the flag the
message names, and an output that cannot be written (a path under a file) is refused at once. Each refusal is
one line naming the output, exit status 2, and the protected files are byte for byte what they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from levjepa.cli import main
from levjepa.commands import COMMANDS
from levjepa.commands._outputs import OutputError, claim_file, claim_folder, folder_kind, is_safetensors
from levjepa.formats.writing.export import export_encoder
from levjepa.weights import save_tensors
from test_export import make_run_dir


@pytest.fixture(scope="module")
def w(tmp_path_factory) -> dict[str, Path]:
    """A run, an export, a fine-tuning run, a project folder, a video, an index file and a plain file."""
    root = tmp_path_factory.mktemp("outputs")
    run = make_run_dir(root)
    export = root / "export"
    export_encoder(run, export)
    ft = root / "ft"
    ft.mkdir()
    (ft / "config.json").write_text(json.dumps({"source": str(run), "task": ["a.txt", "b.txt"], "steps": 5}))
    project = root / "project"
    project.mkdir()
    (project / "README.md").write_text("# my project\n")
    video = root / "clip.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    index = root / "train.txt"
    index.write_text("clip.mp4 0\n")
    afile = root / "afile"
    afile.write_text("a file, not a folder\n")
    videos = root / "videos"
    videos.mkdir()
    return {
        "root": root,
        "run": run,
        "export": export,
        "ft": ft,
        "project": project,
        "video": video,
        "index": index,
        "afile": afile,
        "videos": videos,
    }


def _snapshot(paths: list[Path]) -> dict[str, bytes]:
    out = {}
    for p in paths:
        for f in [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()):
            out[str(f)] = f.read_bytes()
    return out


def _cases(w: dict[str, Path]) -> list[tuple[str, list[str], Path, str]]:
    """(case id, argv, the output the message names, what it protects or says): every command's outputs."""
    r, e, ft, pr = str(w["run"]), str(w["export"]), str(w["ft"]), str(w["project"])
    v, idx, under = str(w["video"]), str(w["index"]), w["afile"] / "x"
    pre = ["--preset", "demo-cpu"]
    return [
        # export --out: a run, a fine-tuning run, a project folder, an export without --overwrite, under a file
        ("export-into-run", ["export", r, "--out", r], w["run"], "pretraining run"),
        ("export-into-run-overwrite", ["export", r, "--out", r, "--overwrite"], w["run"], "pretraining run"),
        ("export-into-finetune", ["export", r, "--out", ft, "--overwrite"], w["ft"], "fine-tuning run"),
        ("export-over-readme", ["export", r, "--out", pr], w["project"], "README.md"),
        ("export-over-export", ["export", r, "--out", e], w["export"], "--overwrite"),
        ("export-unwritable", ["export", r, "--out", str(under)], under, "not a folder"),
        # stream --out: a video, even with --overwrite; a run's config.json; under a file
        ("stream-over-video", ["stream", r, v, "--out", v, "--overwrite"], w["video"], "never replaced"),
        ("stream-over-config", ["stream", r, v, "--out", f"{r}/config.json"], w["run"], "never replaced"),
        ("stream-unwritable", ["stream", r, v, "--out", f"{under}.safetensors"], under, "not a folder"),
        # probe --out, --probes-dir
        ("probe-over-index", ["probe", r, "--out", idx], w["index"], "never replaced"),
        ("probe-unwritable-out", ["probe", r, "--out", f"{under}.json"], under, "not a folder"),
        ("probe-probes-in-export", ["probe", r, "--probes-dir", e], w["export"], "levjepa export"),
        ("probe-probes-unwritable", ["probe", r, "--probes-dir", str(under)], under, "not a folder"),
        # classify --out
        ("classify-over-index", ["classify", r, v, "--out", idx, "--overwrite"], w["index"], "never replaced"),
        ("classify-unwritable", ["classify", r, v, "--out", f"{under}.csv"], under, "not a folder"),
        # extract --out
        ("extract-into-run", ["extract", r, v, "--out", r, "--overwrite"], w["run"], "pretraining run"),
        ("extract-unwritable", ["extract", r, v, "--out", str(under)], under, "not a folder"),
        # visualize --out
        ("visualize-into-export", ["visualize", r, v, "--out", e, "--overwrite"], w["export"], "levjepa export"),
        ("visualize-unwritable", ["visualize", r, v, "--out", str(under)], under, "not a folder"),
        # finetune --out
        ("finetune-into-export", ["finetune", r, "--task", f"index:{idx},{idx}", "--out", e], w["export"], "export"),
        ("finetune-unwritable", ["finetune", r, "--task", f"index:{idx},{idx}", "--out", str(under)], under, "folder"),
        # pretrain --run-dir, --summary-json
        ("pretrain-delete-export", ["pretrain", *pre, "--run-dir", e, "--overwrite"], w["export"], "levjepa export"),
        ("pretrain-delete-project", ["pretrain", *pre, "--run-dir", pr, "--overwrite"], w["project"], "no pretraining"),
        ("pretrain-unwritable", ["pretrain", *pre, "--run-dir", str(under)], under, "not a folder"),
        ("pretrain-summary-over-index", ["pretrain", *pre, "--summary-json", idx], w["index"], "never replaced"),
        # import --out
        ("import-into-run", ["import", e, "--out", r], w["run"], "already exists"),
        ("import-unwritable", ["import", e, "--out", str(under)], under, "not a folder"),
        # select --out
        ("select-over-index", ["select", r, "--out", idx, "--overwrite"], w["index"], "never replaced"),
        ("select-unwritable", ["select", r, "--out", f"{under}.json"], under, "not a folder"),
        # data check --json, prepare DST, pack DST
        ("check-over-index", ["data", "check", str(w["videos"]), "--json", idx], w["index"], "never replaced"),
        ("check-unwritable", ["data", "check", str(w["videos"]), "--json", f"{under}.json"], under, "not a folder"),
        ("prepare-into-run", ["data", "prepare", str(w["videos"]), r], w["run"], "pretraining run"),
        ("prepare-unwritable", ["data", "prepare", str(w["videos"]), str(under)], under, "not a folder"),
        ("pack-into-export", ["data", "pack", str(w["videos"]), e, "--shards", "1"], w["export"], "levjepa export"),
        ("pack-unwritable", ["data", "pack", str(w["videos"]), str(under), "--shards", "1"], under, "not a folder"),
    ]


# the commands that write nothing (flops prints); every other one has a row above
NO_OUTPUTS = {"flops"}


def test_every_command_with_outputs_has_rows(w):
    walked = {argv[0] for _, argv, _, _ in _cases(w)}
    assert walked == set(COMMANDS) - NO_OUTPUTS


def test_every_output_of_every_command_refuses_what_it_must_not_write(w, capsys):
    protected = [w["run"], w["export"], w["ft"], w["project"], w["video"], w["index"], w["afile"]]
    before = _snapshot(protected)
    failures = []
    for case, argv, named, said in _cases(w):
        code = main(argv)
        err = capsys.readouterr().err.strip()
        ok = code == 2 and len(err.splitlines()) == 1 and err.startswith(f"levjepa {argv[0]}")
        if not (ok and str(named) in err and said in err):
            failures.append(f"{case}: exit {code}, {err!r}")
    assert not failures, "\n".join(failures)
    assert _snapshot(protected) == before, "a refused command changed a file"
    assert not list(w["root"].rglob(".levjepa-write-check-*")), "the writability check left a file behind"


def test_own_outputs_are_replaced_only_when_asked(w, tmp_path, capsys):
    # an export over an export: refused without --overwrite (above), written with it
    out = tmp_path / "again"
    assert main(["export", str(w["run"]), "--out", str(out)]) == 0
    assert main(["export", str(w["run"]), "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", str(w["run"]), "--out", str(out), "--overwrite"]) == 0
    # a stream's safetensors: its own kind of file, replaced with --overwrite only
    mine = tmp_path / "s.safetensors"
    save_tensors(mine, {"cls": torch.zeros(1, 2)})
    assert is_safetensors(mine) and not is_safetensors(w["video"])
    with pytest.raises(OutputError, match="--overwrite"):
        claim_file(mine, "--out", "a stream's safetensors", is_own=is_safetensors)
    assert claim_file(mine, "--out", "a stream's safetensors", is_own=is_safetensors, overwrite=True) == mine
    # a command resuming its own kind of folder passes; a folder of no kind, with none of its files, too
    assert claim_folder(w["run"], "--run-dir", "run", resumes=True) == w["run"]
    assert claim_folder(w["project"], "--out", "maps", writes=("visualize.png",)) == w["project"]


def test_folder_kinds_are_told_by_their_files(w):
    assert folder_kind(w["run"]) == "run" and folder_kind(w["export"]) == "export"
    assert folder_kind(w["ft"]) == "finetune" and folder_kind(w["project"]) is None


def test_a_kept_probe_is_not_replaced_by_a_rerun_without_overwrite(tmp_path, capsys):
    run = make_run_dir(tmp_path)
    kept = run / "probes" / "appearance" / "attentive"
    kept.mkdir(parents=True)
    (kept / "classifier.json").write_text('{"kept": "before"}')
    argv = ["probe", str(run), "--task", "appearance", "--probe", "attentive", "--no-baseline"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(kept) in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert (kept / "classifier.json").read_text() == '{"kept": "before"}'


def test_stream_onnx_hint_exports_into_a_new_folder_not_into_the_run(w, capsys):
    assert main(["stream", str(w["run"]), str(w["video"]), "--backend", "onnx"]) == 2
    err = capsys.readouterr().err
    assert f"levjepa export {w['run']} --out EXPORT_DIR" in err and f"--out {w['run']} " not in err
