"""transformers' standard video path on levjepa exports: the video processor (``AutoVideoProcessor``, both
import orders, fresh interpreters), the video-classification pipeline against ``levjepa classify``, processor +
``AutoModel`` features against ``levjepa extract``, images through the same processor.

These run without torchvision (this project's CPU torch has none): levjepa's processor derives from
transformers' backend-free ``VideoProcessorMixin``. The one test of transformers' top-level
``transformers.AutoVideoProcessor`` (a placeholder that demands torchvision when it is missing) runs wherever
torchvision imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers.models.auto.video_processing_auto import AutoVideoProcessor

from levjepa.cli import main
from levjepa.data.eval_clip import ViewSpec, center_square
from levjepa.data.views import normalize
from levjepa.features.feature_set import read_rows
from levjepa.formats.reading.classifier import ClassifierRecord, load_classifier, read_classifier, write_classifier
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.transformers.video_processor import LeVJEPAVideoProcessor
from levjepa.formats.writing.export import export_encoder
from levjepa.model.classifier import HeadConfig, build_head
from levjepa.model.fingerprint import function_fingerprint
from levjepa.weights import WeightsError
from test_export import make_run_dir
from test_extract import _video
from test_hub_auto import _finetuned
from test_official import fixture, released_folder

TESTS = Path(__file__).resolve().parent
SRC = str(TESTS.parent / "src")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """An encoder export, a fine-tuned classifier's export (4 frames, every frame, 16 px: its views) and a
    30-frame video."""
    root = tmp_path_factory.mktemp("video")
    run = make_run_dir(root)
    export_encoder(run, root / "export")
    export_encoder(_finetuned(root, run), root / "clf")
    _video(root / "clip.mp4", 30, h=24, w=40)
    return root


def _levjepa_clip(frames: torch.Tensor, size: int, patch: int) -> torch.Tensor:
    """What levjepa's readers feed the encoder for uint8 frames ``[T, C, H, W]``: ``[T, C, S, S]`` normalised."""
    square = center_square(frames.permute(0, 2, 3, 1), size, patch).permute(3, 0, 1, 2)  # [C, T, S, S]
    return normalize(square).transpose(0, 1)


def test_the_video_processor_round_trips_a_batched_5d_tensor(tiny, tmp_path):
    processor = AutoVideoProcessor.from_pretrained(str(tiny / "export"))
    assert isinstance(processor, LeVJEPAVideoProcessor)
    config = json.loads((tiny / "export" / "config.json").read_text())
    pre, patch = config["preprocessing"], config["encoder"]["patch_size"]
    batch = torch.randint(0, 256, (2, 5, 3, 24, 40), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    got = processor(batch, return_tensors="pt")["pixel_values_videos"]  # [B, T, C, S, S]
    want = torch.stack([_levjepa_clip(v, pre["size"], patch) for v in batch])
    assert got.shape == (2, 5, 3, pre["size"], pre["size"]) and torch.equal(got, want)
    # every layout of the same frames gives the same tensor
    same = [
        batch.permute(0, 1, 3, 4, 2).numpy(),  # [B, T, H, W, C]
        list(batch),  # a list of videos [T, C, H, W]
        [[f.permute(1, 2, 0).numpy() for f in v] for v in batch],  # a list of videos, each a list of frames
    ]
    for videos in same:
        assert torch.equal(processor(videos, return_tensors="pt")["pixel_values_videos"], got)
    one = [Image.fromarray(f.permute(1, 2, 0).numpy()) for f in batch[1]]  # one video as PIL frames
    assert torch.equal(processor(one, return_tensors="pt")["pixel_values_videos"], got[1:])
    # float frames (values in [0, 255]) skip only the rounding back to uint8
    floats = processor(batch.float(), return_tensors="pt")["pixel_values_videos"]
    assert 0 < (floats - got).abs().max() <= 0.5 / 255 / min(pre["std"]) + 1e-6
    # save_pretrained / from_pretrained: the same settings, the same output
    processor.save_pretrained(str(tmp_path / "saved"))
    again = AutoVideoProcessor.from_pretrained(str(tmp_path / "saved"))
    assert isinstance(again, LeVJEPAVideoProcessor) and again.to_dict() == processor.to_dict()
    assert torch.equal(again(batch, return_tensors="pt")["pixel_values_videos"], got)
    # through AutoModel: the features of the clips levjepa's readers would feed
    auto = transformers.AutoModel.from_pretrained(str(tiny / "export"))
    encoder = load_encoder(tiny / "export").encoder
    with torch.no_grad():
        tokens = auto(**processor(batch, return_tensors="pt")).last_hidden_state
        assert torch.equal(tokens, encoder.forward_features(want.transpose(1, 2)).tokens)
        assert torch.equal(auto.get_vision_features(pixel_values_videos=got), tokens)


def test_the_video_processor_refuses_what_it_cannot_read_in_one_line(tiny):
    processor = LeVJEPAVideoProcessor.from_pretrained(str(tiny / "export"))
    bad = [
        (lambda: processor(np.zeros((4, 3, 9, 3), np.uint8)), "channels could be first or last"),
        (lambda: processor(np.zeros((2, 4, 5, 9, 9), np.uint8)), "no channel axis"),
        (lambda: processor(np.zeros((4, 9, 9, 3), np.uint8), size=32), "size not read here"),
        (lambda: processor([np.zeros((4, 9, 9, 3), np.uint8), np.zeros((5, 9, 9, 3), np.uint8)]), "do not batch"),
        (lambda: LeVJEPAVideoProcessor(do_center_crop=False), "do_center_crop=False"),
        (lambda: LeVJEPAVideoProcessor(num_frames=0), "frames=0 must be >= 1"),
    ]
    for call, message in bad:
        with pytest.raises((ValueError, Exception)) as err:
            call()
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_an_image_is_its_frame_repeated_to_the_model_slots(tiny):
    processor = AutoVideoProcessor.from_pretrained(str(tiny / "export"))
    frames = json.loads((tiny / "export" / "config.json").read_text())["num_frames"]
    image = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    got = processor(image, return_tensors="pt")["pixel_values_videos"]
    video = processor(np.repeat(image[None], frames, 0), return_tensors="pt")["pixel_values_videos"]
    assert got.shape[:2] == (1, frames) and torch.equal(got, video)
    assert torch.equal(processor(Image.fromarray(image), return_tensors="pt")["pixel_values_videos"], got)
    path = tiny / "still.png"
    Image.fromarray(image).save(path)
    from_file = processor(str(path), return_tensors="pt")["pixel_values_videos"]
    assert from_file.shape == got.shape and (from_file - got).abs().max() < 0.1  # the file is read at its size


def test_the_pipeline_gives_the_labels_and_scores_of_levjepa_classify(tiny, capsys):
    clf, clip = tiny / "clf", tiny / "clip.mp4"
    out = tiny / "classify.jsonl"
    assert main(["classify", str(clf), str(clip), "--workers", "0", "--top-k", "3", "--out", str(out)]) == 0
    want = json.loads(out.read_text().splitlines()[0])
    pipe = transformers.pipeline("video-classification", model=str(clf))
    assert isinstance(pipe.video_processor, LeVJEPAVideoProcessor)
    got = pipe(str(clip), top_k=3)
    assert [g["label"] for g in got] == want["labels"]
    assert np.allclose([g["score"] for g in got], want["probs"], atol=1e-5)


def test_processor_and_automodel_give_the_features_of_levjepa_extract(tiny, capsys):
    """The processor's clip of a video file is its centred window; ``extract`` at a stride of one frame has a
    row for that window, with the same CLS and mean features."""
    export, clip = tiny / "export", tiny / "clip.mp4"
    pre = json.loads((export / "config.json").read_text())["preprocessing"]
    out = tiny / "feats"
    args = ["--stride", "1", "--workers", "0", "--no-progress", "--format", "safetensors"]
    assert main(["extract", str(export), str(clip), "--out", str(out), *args]) == 0
    rows = read_rows(out)
    start = (30 - ((pre["num_frames"] - 1) * pre["frame_stride"] + 1)) // 2  # the centred window
    (row,) = [r for r in rows if r["start_frame"] == start]
    from safetensors.torch import load_file

    feats = load_file(str(out / "features-00000.safetensors"))
    processor = AutoVideoProcessor.from_pretrained(str(export))
    auto = transformers.AutoModel.from_pretrained(str(export))
    with torch.no_grad():
        output = auto(**processor(str(clip), return_tensors="pt"))
    cls, mean = output.pooler_output[0], output.last_hidden_state[0, 1:].mean(0)
    assert torch.allclose(cls, feats["cls"][row["row"]], atol=1e-5)
    assert torch.allclose(mean, feats["mean"][row["row"]], atol=1e-5)


def test_the_released_layout_has_the_released_preprocessing(tmp_path):
    """The released checkpoint ships no processor file: levjepa's processor reads its config (16 frames at
    7.5 fps, 224 px, its patch size); ``levjepa import`` writes the file."""
    folder = released_folder(tmp_path / "released", fixture(1), 1, "block_causal")
    processor = LeVJEPAVideoProcessor.from_pretrained(str(folder))
    d = processor.to_dict()
    assert (d["num_frames"], d["fps"], d["size"], d["patch_size"]) == (16, 7.5, {"shortest_edge": 224}, 8)
    assert main(["import", str(folder), "--out", str(tmp_path / "imported")]) == 0
    imported = AutoVideoProcessor.from_pretrained(str(tmp_path / "imported"))
    assert imported.to_dict()["fps"] == 7.5 and imported.to_dict()["patch_size"] == 8


ORDER_SCRIPT = """
import sys, json, torch
{imports}
from transformers import pipeline
from transformers.models.auto.video_processing_auto import AutoVideoProcessor
export, clf, clip, batch = sys.argv[1], sys.argv[2], sys.argv[3], torch.load(sys.argv[4])
processor = AutoVideoProcessor.from_pretrained(export)
pixels = processor(batch, return_tensors="pt")["pixel_values_videos"]
pipe = pipeline("video-classification", model=clf)
print(json.dumps({{"type": type(processor).__name__, "pixels": pixels.tolist(), "pipe": pipe(clip, top_k=3)}}))
"""


@pytest.mark.parametrize("imports", ["import levjepa\nimport transformers", "import transformers\nimport levjepa"])
def test_either_import_order_gives_the_processor_and_the_pipeline_offline(tiny, tmp_path, imports, capsys):
    batch = torch.randint(0, 256, (2, 4, 3, 20, 28), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    torch.save(batch, tmp_path / "batch.pt")
    args = [str(tiny / "export"), str(tiny / "clf"), str(tiny / "clip.mp4"), str(tmp_path / "batch.pt")]
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", ORDER_SCRIPT.format(imports=imports), *args],
                         capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["type"] == "LeVJEPAVideoProcessor"
    want = AutoVideoProcessor.from_pretrained(str(tiny / "export"))(batch, return_tensors="pt")["pixel_values_videos"]
    assert torch.equal(torch.tensor(got["pixels"]), want)
    assert main(["classify", str(tiny / "clf"), str(tiny / "clip.mp4"), "--workers", "0", "--top-k", "3"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert [g["label"] for g in got["pipe"]] == printed.split("\t")[1].split()[::2]


def _torchvision_imports() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _torchvision_imports(), reason="transformers' top-level AutoVideoProcessor needs torchvision")
def test_transformers_top_level_auto_video_processor_returns_levjepa_processor(tiny):
    processor = transformers.AutoVideoProcessor.from_pretrained(str(tiny / "export"))
    assert isinstance(processor, LeVJEPAVideoProcessor)
    batch = torch.randint(0, 256, (1, 4, 3, 24, 40), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    got = processor(batch, return_tensors="pt")["pixel_values_videos"]
    assert torch.equal(got, LeVJEPAVideoProcessor.from_pretrained(str(tiny / "export"))(batch)["pixel_values_videos"])


def _kept_probe(run: Path, tokens: str = "full") -> Path:
    """A probe as ``levjepa probe`` keeps it (``levjepa.eval.kept_probes``): ``RUN/probes/TASK/PROBE`` with an
    attentive head reading float16 tokens, the encoder left in the run (named, fingerprinted), its scores."""
    loaded = load_encoder(run)
    head_cfg = HeadConfig(kind="attentive", input="tokens", dim=loaded.config.dim, num_classes=3, token_dtype="float16")
    head = build_head(head_cfg, torch.Generator().manual_seed(3))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() + 1)))
    trained = {"probe": "attentive", "task": "media", "val_acc": 0.5, "test_acc": 0.4, "chosen": True}
    record = ClassifierRecord(
        head_cfg, ("walk", "run", "jump"), ViewSpec(size=16, frames=4, frame_stride=2), str(run), "ema",
        function_fingerprint(loaded.encoder), trained=trained, tokens=tokens,
    )  # fmt: skip
    return write_classifier(run / "probes" / "media" / f"attentive-{tokens}", record, head.state_dict())


def test_a_kept_probe_exports_as_a_classifier_the_pipeline_reads(tiny, tmp_path, capsys):
    run = make_run_dir(tmp_path)
    kept, clip = _kept_probe(run), tiny / "clip.mp4"
    out = tmp_path / "published"
    assert main(["export", str(kept), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LeVJEPAForVideoClassification"] and config["head"]["token_dtype"] == "float16"
    assert config["id2label"] == {"0": "walk", "1": "run", "2": "jump"} and config["num_frames"] == 4
    assert read_classifier(out).encoder_source == "."  # the encoder travels with it now
    card = (out / "README.md").read_text()
    assert "pipeline_tag: video-classification" in card and "| test accuracy (%) | 40.0 |" in card
    assert "media" in card and "probe" in card and "fine-tuned" not in card
    x = torch.randn(2, 3, 4, 16, 16, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = load_classifier(kept).model(x)  # what classify computes for one view
        auto = transformers.AutoModelForVideoClassification.from_pretrained(str(out))
        assert torch.allclose(auto(pixel_values=x).logits, want, atol=1e-4)
    preds = tmp_path / "kept.jsonl"
    assert main(["classify", str(kept), str(clip), "--workers", "0", "--top-k", "3", "--out", str(preds)]) == 0
    want = json.loads(preds.read_text().splitlines()[0])
    got = transformers.pipeline("video-classification", model=str(out))(str(clip), top_k=3)
    assert [g["label"] for g in got] == want["labels"]
    assert np.allclose([g["score"] for g in got], want["probs"], atol=1e-4)
    # a probe trained on a compact store's tokens: the export could not give it what it read
    with pytest.raises(WeightsError, match=r"compact store kept \(pool2\)") as err:
        export_encoder(_kept_probe(run, "pool2"), tmp_path / "compact")
    assert "\n" not in str(err.value)


def test_the_docs_block_runs_offline_and_gives_classify_and_extract(tiny, tmp_path, capsys):
    """docs/weights.md's transformers block, in a fresh interpreter offline, on a classifier export ``clf``, an
    encoder export ``vitl`` and ``clip.mp4``: the pipeline's top labels are classify's, the features extract's."""
    import re
    import shutil

    docs = (TESTS.parent / "docs" / "weights.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", docs, flags=re.S) if 'model="clf"' in b]
    for name, src in (("clf", tiny / "clf"), ("vitl", tiny / "export")):
        shutil.copytree(src, tmp_path / name)
    shutil.copy(tiny / "clip.mp4", tmp_path / "clip.mp4")
    preds = tmp_path / "classify.jsonl"
    assert main(["classify", str(tmp_path / "clf"), str(tmp_path / "clip.mp4"), "--workers", "0", "--top-k", "3",
                 "--out", str(preds)]) == 0  # fmt: skip
    pre = json.loads((tmp_path / "vitl" / "config.json").read_text())["preprocessing"]
    args = ["--stride", "1", "--workers", "0", "--no-progress"]
    assert (
        main(["extract", str(tmp_path / "vitl"), str(tmp_path / "clip.mp4"), "--out", str(tmp_path / "f"), *args]) == 0
    )
    start = (30 - ((pre["num_frames"] - 1) * pre["frame_stride"] + 1)) // 2
    (row,) = [r for r in read_rows(tmp_path / "f") if r["start_frame"] == start]
    from safetensors.torch import load_file

    feats = load_file(str(tmp_path / "f" / "features-00000.safetensors"))
    torch.save({"cls": feats["cls"][row["row"]], "mean": feats["mean"][row["row"]]}, tmp_path / "want.pt")
    want = json.loads(preds.read_text().splitlines()[0])
    checks = (
        "\nimport json, torch\nw = torch.load('want.pt')\n"
        "assert torch.allclose(cls[0], w['cls'], atol=1e-5) and torch.allclose(mean[0], w['mean'], atol=1e-5)\n"
        "assert torch.equal(tokens, out.last_hidden_state)\n"
        "print(json.dumps(top))\n"
    )
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    (tmp_path / "block.py").write_text(block + checks)
    run = subprocess.run([sys.executable, "block.py"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    top = json.loads(run.stdout.strip().splitlines()[-1])
    assert [t["label"] for t in top] == want["labels"] and np.allclose(
        [t["score"] for t in top], want["probs"], atol=1e-5
    )


def test_frames_sampled_by_the_processor_are_the_frames_a_path_gives(tiny):
    """``do_sample_frames=True`` on decoded frames takes the path's frames: the centred window at the model's
    stride, or at its rate given the frames' own (``video_metadata``); without that rate it is refused."""
    import av

    with av.open(str(tiny / "clip.mp4")) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])  # 30 frames at 10 fps
    stride = AutoVideoProcessor.from_pretrained(str(tiny / "export"))
    settings = {k: v for k, v in stride.to_dict().items() if k != "video_processor_type"}
    rate = LeVJEPAVideoProcessor(**{**settings, "num_frames": 4, "fps": 5.0})  # every 2nd frame of a 10 fps video
    every_2nd = LeVJEPAVideoProcessor(**{**settings, "num_frames": 4, "frame_stride": 2})
    path = str(tiny / "clip.mp4")
    for processor, meta in ((stride, None), (rate, {"fps": 10}), (every_2nd, None)):
        want = processor(path, return_tensors="pt")["pixel_values_videos"]
        got = processor(frames, do_sample_frames=True, video_metadata=meta, return_tensors="pt")
        assert torch.equal(got["pixel_values_videos"], want)
    assert torch.equal(rate(path)["pixel_values_videos"], every_2nd(path)["pixel_values_videos"])
    assert not torch.equal(rate(path)["pixel_values_videos"], rate(path, fps=10.0)["pixel_values_videos"])
    with pytest.raises(ValueError, match=r"samples at 5 fps; give video_metadata"):
        rate(frames, do_sample_frames=True)
