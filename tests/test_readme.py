"""The documented paths run as written (issue 27; the guides under ``docs/`` since issue 48): every ``levjepa``
command line of the README's and the guides' bash blocks and of the command table is accepted by the command's
own parser (options, choices, config keys), a tiny set of them runs end to end, and their Python blocks, read
from the files themselves, run as scripts (in a fresh process: the pretraining block starts loader workers that
re-import the script) on tiny inputs — every Python block of every page is claimed by a test here or in
``tests/test_hub_auto.py`` (:func:`test_every_python_block_is_run_by_a_test`). The README's map names every
package and top-level module (:func:`test_the_readme_map_names_every_package`).

The tiny inputs are what the README's placeholders name (``DIR``, ``RUN``, ``video``, ``clip.mp4``, ...), made
here; the pretraining block runs with the tiny test overrides in place of its ``train.steps=100`` (the block
as written, 100 steps of the demo, is the ``slow`` variant)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from levjepa.cli import main
from levjepa.commands import COMMANDS, MODULES, _parse, _Parser
from test_extract import _video
from train_utils import TINY

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
DOCS = README + "\n" + "\n".join(PAGES.values())  # the README and every guide: what the blocks come from
SRC = str(ROOT / "src")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOCS, flags=re.S)


def _command_lines() -> list[list[str]]:
    """Every levjepa invocation of the bash blocks and the command table, as argument lists after the command."""
    lines: list[str] = []
    for block in _blocks("bash"):
        lines += block.replace("\\\n", " ").splitlines()
    rows = [line for line in DOCS.splitlines() if line.startswith("| `")]  # the command table
    table = [span for row in rows for span in re.findall(r"`([^`]*levjepa [^`]*)`", row.split(" | ")[0])]
    lines += [t.replace("[", "").replace("]", "").replace("...", "").replace("NAME", "demo-cpu") for t in table]
    found = []
    for line in lines:
        if "$" in line or line.lstrip().startswith("#"):  # the sbatch script: its variables, its comments
            continue
        for part in re.split(r"&&|;", line.split("  #")[0]):
            words = shlex.split(part, comments=True)
            if "levjepa" in words:
                found.append([w for w in words[words.index("levjepa") + 1 :] if w != "k=v"])
    return [f for f in found if f and f[0] in COMMANDS]


COMMAND_LINES = _command_lines()


def test_the_readme_documents_every_command():
    assert {line[0] for line in COMMAND_LINES} == set(COMMANDS)


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=[" ".join(a)[:60] for a in COMMAND_LINES])
def test_every_documented_command_line_parses(argv):
    import importlib

    command, rest = argv[0], argv[1:]
    module = importlib.import_module(f"levjepa.commands.{MODULES.get(command, command)}")
    parser = _Parser(prog=f"levjepa {command}")
    module.add_arguments(parser)
    args = _parse(parser, rest)
    if command == "pretrain" and args.resume is None:  # the config it names resolves (keys and values valid)
        from levjepa.commands.pretrain import resolve_config

        overrides = [o for o in args.overrides if "=" in o]
        if args.config is None:
            resolve_config(args.preset or "demo-cpu", overrides, None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny run, its export, two videos and an index: what the README's placeholders stand for."""
    root = tmp_path_factory.mktemp("readme")
    run = root / "run"
    assert (
        main(["pretrain", "--preset", "demo-cpu", *TINY, "train.steps=2", "--run-dir", str(run), "--no-progress"]) == 0
    )
    videos = root / "videos"
    videos.mkdir()
    _video(videos / "video1.mp4", 40, h=32, w=32)
    _video(videos / "video2.mp4", 30, h=32, w=32)
    (root / "train.txt").write_text(f"{videos / 'video1.mp4'} 0\n{videos / 'video2.mp4'} 1\n")
    return root


def _script(tmp_path: Path, code: str, name: str = "block.py", timeout: float = 600) -> str:
    script = tmp_path / name
    script.write_text(code)
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=timeout)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _pretrain_block() -> str:
    (block,) = [b for b in _blocks("python") if "from levjepa.train import pretrain" in b]
    return block


def test_the_pretraining_block_runs_as_a_script_with_tiny_overrides(tmp_path):
    block = _pretrain_block()
    assert 'if __name__ == "__main__":' in block and '["train.steps=100"]' in block
    fast = block.replace('["train.steps=100"]', repr([*TINY, "train.steps=2", "data.num_workers=1"]))
    out = _script(tmp_path, fast).splitlines()
    # 16 frames in tubelets of 2 (demo-cpu's), 32 px in 8-px patches: 8 x 4 x 4 tokens of dim 32
    assert out[0] == "torch.Size([2, 32]) torch.Size([2, 128, 32]) torch.Size([2, 128, 3])"
    # SIGReg on one unseeded Gaussian draw: its null value 1.05 up to the draw's noise (0.88 seen at N = 512);
    # a statistic without its factor N (≈ 0.002) or scaled twice (≈ 500) fails
    assert 0.6 < float(out[1]) < 1.6
    assert "test" in "\n".join(out[2:]).lower()  # the probe table
    assert (tmp_path / "runs" / "demo" / "checkpoints" / "latest").is_file()


@pytest.mark.slow
def test_the_pretraining_block_runs_as_written(tmp_path):
    out = _script(tmp_path, _pretrain_block(), timeout=1800)
    assert "torch.Size([2, 192])" in out.splitlines()[0]


def test_the_hub_block_runs_on_an_export(tiny, tmp_path):
    (block,) = [b for b in _blocks("python") if "levjepa.from_pretrained" in b]
    export = tmp_path / "export"
    assert main(["export", str(tiny / "run"), "--out", str(export)]) == 0
    preamble = "import torch\nvideo = torch.randn(1, 3, 4, 32, 32)\n"  # what the block calls `video`
    checks = "\nassert out.last_hidden_state.shape == (1, 1 + 2 * 16, 32)\n"  # tubelets of 2 frames, 4 x 4 patches
    checks += "auto = model(pixel_values=video).last_hidden_state\n"  # AutoModel computes what levjepa's does
    checks += "assert torch.allclose(auto, out.last_hidden_state, atol=1e-6)\nprint('ok')\n"
    assert _script(tmp_path, preamble + block.replace('"DIR"', repr(str(export))) + checks).strip() == "ok"


def test_the_feature_reading_block_reads_what_extract_and_probe_wrote(tiny, tmp_path, capsys):
    (block,) = [b for b in _blocks("python") if "PER_VIDEO/video1.npy" in b]
    run, videos = str(tiny / "run"), str(tiny / "videos")
    small = ["--window", "4", "--stride", "4", "--frame-stride", "2", "--size", "32", "--workers", "0", "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (
            main(["extract", run, videos, "--out", str(tmp_path / "PER_VIDEO"), "--format", "per_video", *small]) == 0
        )
        assert main(["extract", run, videos, "--out", str(tmp_path / "DIR"), "--format", "npy", "--patch", *small]) == 0
        from levjepa.data import list_media
        from levjepa.data.eval_clip import ViewSpec
        from levjepa.features.store import StoreConfig, build_store
        from levjepa.formats.reading.load import load_encoder

        encoder = load_encoder(run).encoder
        build_store(encoder, list_media(str(tiny / "train.txt")), tmp_path / "STORE",
                    StoreConfig(ViewSpec(size=32, frames=4), workers=0))  # fmt: skip
    checks = "\nprint(feats.shape, len(rows), patches.dtype, tokens.dtype)\n"
    out = _script(tmp_path, block + checks).split()
    assert out[0:2] == ["(5,", "32)"] and int(out[2]) == 5 + 4  # video1: 20 kept frames, 5 windows; video2: 4
    assert out[3:] == ["float16", "float16"]
    assert np.load(tmp_path / "PER_VIDEO" / "video1.npy").shape == (5, 32)


def test_the_documented_commands_run_on_a_tiny_input(tiny, tmp_path, capsys):
    run, video = str(tiny / "run"), str(tiny / "videos" / "video1.mp4")
    index = str(tiny / "train.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["stream", run, video, "--window", "4"]) == 0
        assert main(["visualize", run, video, "--out", str(tmp_path / "vis"), "--frames", "4", "--size", "32"]) == 0
        assert main(["select", run]) == 0
        assert main(["data", "check", str(tiny / "videos")]) == 0
        assert main(["flops"]) == 0
        assert main(["pretrain", "--resume", run, "train.steps=3", "--no-progress"]) == 0
    assert json.loads((tiny / "run" / "config.json").read_text())["train"]["steps"] == 3
    assert (tmp_path / "vis" / "visualize.png").is_file() and index


def _run_the_onnx_block(run: Path, video: Path, tmp_path: Path, **recorded: object) -> list[tuple[int, np.ndarray]]:
    """The README's ONNX streaming block on ``run`` exported as ONNX (32-px frames, a 4-frame window) to DIR,
    streaming ``video`` as clip.mp4: its (slot, first 3 CLS values) lines. ``recorded``: preprocessing values
    written into the export's config.json (as a run of another sampling would record them)."""
    (block,) = [b for b in _blocks("python") if "stream_step" in b and "onnxruntime" in b]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = ["--format", "onnx", "--window", "4", "--size", "32"]
        assert main(["export", str(run), "--out", str(tmp_path / "DIR"), *args]) == 0
    if recorded:
        cfg = json.loads((tmp_path / "DIR" / "config.json").read_text())
        cfg["preprocessing"].update(recorded)
        (tmp_path / "DIR" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "clip.mp4").symlink_to(video)
    out = _script(tmp_path, block).replace("[", " ").replace("]", " ").splitlines()
    return [(int(line.split()[0]), np.array(line.split()[1:], float)) for line in out]


def test_the_onnx_streaming_block_streams_the_demo_models_tubelets_as_levjepa_stream_does(tiny, tmp_path, capsys):
    """The demo's encoder reads 2-frame tubelets: the block takes them from config.json, so 30 frames are 15
    steps, and each printed CLS is the one ``levjepa stream --backend onnx`` reads after that tubelet (the 32-px
    video needs no resize: both read the same pixels)."""
    video = tiny / "videos" / "video2.mp4"
    lines = _run_the_onnx_block(tiny / "run", video, tmp_path)
    assert [slot for slot, _ in lines] == list(range(15))
    out = tmp_path / "stream.safetensors"
    assert (
        main(["stream", str(tmp_path / "DIR"), str(video), "--backend", "onnx", "--every", "2", "--out", str(out)]) == 0
    )
    from levjepa.weights import load_tensors

    want = load_tensors(out)[0]["cls"][:, :3].numpy()
    assert want.shape == (15, 3)
    np.testing.assert_allclose(np.stack([cls for _, cls in lines]), want, atol=1e-4)


def test_the_onnx_streaming_block_keeps_the_models_sampling_as_levjepa_stream_does(tiny, tmp_path):
    """An export recorded at every 2nd frame (real-video runs' default; the released weights' 7.5 of 15 fps):
    the block keeps 15 of the 30 frames, 7 whole tubelets, the CLS ``levjepa stream --backend onnx`` reads."""
    video = tiny / "videos" / "video2.mp4"
    lines = _run_the_onnx_block(tiny / "run", video, tmp_path, frame_stride=2)
    out = tmp_path / "stream.safetensors"
    assert main(["stream", str(tmp_path / "DIR"), str(video), "--backend", "onnx", "--out", str(out)]) == 0
    from levjepa.weights import load_tensors

    want = load_tensors(out)[0]["cls"][:, :3].numpy()
    assert [slot for slot, _ in lines] == list(range(7)) and want.shape == (7, 3)
    np.testing.assert_allclose(np.stack([cls for _, cls in lines]), want, atol=1e-4)


@pytest.mark.slow  # one more ONNX export (about 20 s here)
def test_the_onnx_streaming_block_streams_a_tubelet_1_export_frame_by_frame(tiny, tmp_path):
    run = tmp_path / "run"
    args = ["pretrain", "--preset", "demo-cpu", *TINY, "model.tubelet=1", "train.steps=1", "--run-dir", str(run)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, "--no-progress"]) == 0
    lines = _run_the_onnx_block(run, tiny / "videos" / "video2.mp4", tmp_path)
    assert [slot for slot, _ in lines] == list(range(30))  # one CLS readout per frame


# the marker of each Python block and the test that runs it (tests/test_hub_auto.py runs the hub's two)
BLOCK_RUNNERS = {
    "from levjepa.train import pretrain": "test_the_pretraining_block_runs_as_a_script_with_tiny_overrides",
    'levjepa.from_pretrained("DIR")': "test_the_hub_block_runs_on_an_export",
    "PER_VIDEO/video1.npy": "test_the_feature_reading_block_reads_what_extract_and_probe_wrote",
    "stream_step": "test_the_onnx_streaming_block_streams_the_demo_models_tubelets_as_levjepa_stream_does",
    "galilai-group/LeVJEPA-VideoMix-Large": "test_hub_auto: test_the_readme_block_loads_the_released_repo_...",
    "my-org/levjepa-actions": "test_hub_auto: test_a_fine_tuned_classifier_is_published_and_the_readme_block_...",
    'pipeline("video-classification", model="clf")': "test_hub_video: test_the_docs_block_runs_offline_...",
}


def test_every_python_block_is_run_by_a_test():
    """A Python block added to the README or a guide without a test that runs it fails here."""
    for block in _blocks("python"):
        runners = [marker for marker in BLOCK_RUNNERS if marker in block]
        assert len(runners) == 1, f"a Python block no test runs (or two claim): {block[:200]!r}"


def test_the_readme_map_names_every_package():
    """The README's layout map names every package and top-level module of src/levjepa."""
    src = ROOT / "src" / "levjepa"
    fenced = re.findall(r"^```\w*\n(.*?)^```", README, flags=re.S | re.M)
    (tree,) = [b for b in fenced if b.startswith("src/levjepa/")]
    packages = sorted(p.name for p in src.iterdir() if (p / "__init__.py").is_file())
    modules = sorted(p.name for p in src.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "cli.py"))
    missing = [f"{p}/" for p in packages if f"  {p}/" not in tree] + [m for m in modules if m not in tree]
    assert missing == [], f"the README's map leaves out {missing}"
    for package in packages:  # and every module of each package, by its file name (commands: by their names)
        if package == "commands":
            assert [c for c in COMMANDS if c not in re.findall(r"[\w-]+", tree)] == []
            continue
        names = sorted(p.name for p in (src / package).rglob("*.py") if p.name != "__init__.py")  # rooms' too
        rooms = sorted(f"{p.parent.name}/" for p in (src / package).glob("*/__init__.py"))
        assert [n for n in [*names, *rooms] if n not in tree] == [], package
