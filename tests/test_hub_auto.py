"""levjepa inside transformers, without remote code, both ways: registration in either import order (fresh
interpreters), ``AutoModel`` on the released checkpoint's layout against the official code's outputs, every
``save_pretrained`` round trip read back by levjepa, a fine-tuned classifier through
``AutoModelForVideoClassification`` with the logits levjepa computes, the image processor an export names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

import levjepa
from levjepa.cli import main
from levjepa.config import to_dict
from levjepa.data.eval_clip import ViewSpec
from levjepa.formats.reading.classifier import load_classifier
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.transformers.hub import LeVJEPAForVideoClassification, LeVJEPAModel
from levjepa.formats.transformers.outputs import AMBIGUOUS, ATTENTIONS_REFUSED
from levjepa.formats.writing.export import export_encoder
from levjepa.formats.writing.finetuned import BestExport, Start
from levjepa.model.classifier import HeadConfig, VideoClassifier, build_head
from test_export import make_run_dir
from test_extract import _video
from test_official import CASES, fixture, official_encoder, released_folder, run_import

TESTS = Path(__file__).resolve().parent
SRC = str(TESTS.parent / "src")


def _clip(cfg, seed=0, frames=4, batch=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, frames, 2 * cfg.patch_size, 3 * cfg.patch_size, generator=g)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    run = make_run_dir(root)
    export_encoder(run, root / "export")
    return run, root / "export"


ORDER_SCRIPT = """
import sys, json, torch
{imports}
from transformers import AutoConfig, AutoModel
export, released, video = sys.argv[1], sys.argv[2], torch.load(sys.argv[3])
assert AutoConfig.from_pretrained(export).model_type == "levjepa"
got = AutoModel.from_pretrained(export)(pixel_values=video["export"]).last_hidden_state
want = levjepa.from_pretrained(export)(pixel_values=video["export"]).last_hidden_state
official = AutoModel.from_pretrained(released)(pixel_values=video["released"]).last_hidden_state
print(json.dumps([(got - want).abs().max().item(), (official - video["want"]).abs().max().item()]))
"""


@pytest.mark.parametrize("imports", ["import levjepa\nimport transformers", "import transformers\nimport levjepa"])
def test_either_import_order_registers_levjepa_in_a_fresh_interpreter(export, tmp_path, imports):
    _, out = export
    t = fixture(1)
    released = released_folder(tmp_path / "released", t, 1, "block_causal")
    videos = {
        "export": _clip(load_encoder(out).config, 3),
        "released": t["input.video"],
        "want": t["output.block_causal"],
    }
    torch.save(videos, tmp_path / "video.pt")
    script = ORDER_SCRIPT.format(imports=imports)
    run = subprocess.run([sys.executable, "-c", script, str(out), str(released), str(tmp_path / "video.pt")],
                         capture_output=True, text=True, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin",
                         "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    export_diff, official_diff = json.loads(run.stdout.strip().splitlines()[-1])
    assert export_diff == 0.0 and official_diff < 1e-5


WITHOUT_IMPORT = """
import sys
{line}
from transformers import AutoModel
try:
    AutoModel.from_pretrained(sys.argv[1])
except ValueError as err:
    print("refused:", " ".join(str(err).split()))
else:
    print("loaded")
"""


def test_automodel_without_import_levjepa_fails_as_the_docs_and_the_card_say_and_one_line_fixes_it(export, tmp_path):
    # transformers 5 has no plugin entry point, so a script that never imports levjepa cannot read a levjepa
    # folder; its error blames transformers' version. The docs, the export's card and `levjepa export` name that
    # error and the one line that fixes it — and that line does.
    _, out = export
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    said = {}
    for line in ("", "import levjepa"):
        run = subprocess.run([sys.executable, "-c", WITHOUT_IMPORT.format(line=line), str(out)], capture_output=True,
                             text=True, env=env, timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        said[line] = run.stdout.strip().splitlines()[-1]
    assert said["import levjepa"] == "loaded"
    assert said[""].startswith("refused:") and "does not recognize this architecture" in said[""]
    assert "out of date" in said[""]
    from levjepa.formats.writing.card import AUTO_HINT

    card = (out / "README.md").read_text()
    assert "`import levjepa`" in card and " ".join(AUTO_HINT.split()) in " ".join(card.split())
    weights = " ".join((TESTS.parent / "docs" / "weights.md").read_text().split())
    assert "does not recognize this architecture" in weights and "the fix is `import levjepa`" in weights


def test_import_levjepa_alone_imports_neither_transformers_nor_torch():
    code = "import sys, levjepa; print('transformers' in sys.modules, 'torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": SRC})
    assert run.stdout.split() == ["False", "False"], run.stderr


@pytest.mark.parametrize(("tau", "mode"), CASES)
def test_automodel_on_the_released_layout_computes_the_official_function(tmp_path, tau, mode):
    t = fixture(tau)
    folder = released_folder(tmp_path / "released", t, tau, mode)  # names remote code in auto_map: not run
    model = transformers.AutoModel.from_pretrained(str(folder))  # no trust_remote_code
    names = {k for k in model.state_dict()}
    assert names == set(official_encoder(t, "encoder."))  # the official layout itself, loaded strictly
    with torch.no_grad():
        got = model(pixel_values=t["input.video"])
    assert (got.last_hidden_state - t[f"output.{mode}"]).abs().max().item() < 1e-5
    assert torch.equal(got.pooler_output, got.last_hidden_state[:, 0])


def test_save_pretrained_writes_the_released_layout_back_and_levjepa_reads_it(tmp_path, capsys):
    t = fixture(2)
    folder = released_folder(tmp_path / "released", t, 2, "full")
    model = transformers.AutoModel.from_pretrained(str(folder))
    model.save_pretrained(str(tmp_path / "saved"))
    saved, ref = load_file(str(tmp_path / "saved" / "model.safetensors")), official_encoder(t, "encoder.")
    assert set(saved) == set(ref) and all(torch.equal(saved[k], ref[k]) for k in ref)
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["embed_dim"] == 96 and config["attn_mode"] == "full" and "encoder" not in config
    # levjepa reads what transformers wrote: on the fly, and through `levjepa import`
    got = levjepa.from_pretrained(tmp_path / "saved")(pixel_values=t["input.video"]).last_hidden_state
    assert (got - t["output.full"]).abs().max().item() < 1e-5
    assert main(["import", str(tmp_path / "saved"), "--out", str(tmp_path / "imported")]) == 0
    imported = load_encoder(tmp_path / "imported")
    with torch.no_grad():
        tokens = imported.encoder.forward_features(t["input.video"]).tokens
    assert (tokens - t["output.full"]).abs().max().item() < 1e-5 and imported.imported_from["sha256"]


def test_a_levjepa_export_through_save_pretrained_reads_back_in_levjepa(export, tmp_path, capsys):
    run, out = export
    auto = transformers.AutoModel.from_pretrained(str(out))
    auto.save_pretrained(str(tmp_path / "saved"))
    assert all(k.startswith("encoder.") for k in load_file(str(tmp_path / "saved" / "model.safetensors")))
    source = load_encoder(run).encoder
    x = _clip(source.cfg, 5)
    with torch.no_grad():
        want = source.forward_features(x).tokens
        assert torch.equal(load_encoder(tmp_path / "saved").encoder.forward_features(x).tokens, want)
        assert torch.equal(levjepa.from_pretrained(tmp_path / "saved")(pixel_values=x).last_hidden_state, want)
        again = transformers.AutoModel.from_pretrained(str(tmp_path / "saved"))(pixel_values=x).last_hidden_state
    assert torch.equal(again, want)
    _video(tmp_path / "a.mp4", 12, h=16, w=16)
    args = ["--window", "4", "--stride", "4", "--size", "16", "--workers", "0", "--no-progress"]
    for name, model in (("saved", tmp_path / "saved"), ("export", out)):
        assert main(["extract", str(model), str(tmp_path / "a.mp4"), "--out", str(tmp_path / f"f-{name}"), *args]) == 0
    saved, exported = (load_file(str(tmp_path / f"f-{n}" / "features-00000.safetensors")) for n in ("saved", "export"))
    assert saved.keys() == exported.keys() and all(torch.equal(saved[k], exported[k]) for k in saved)


def test_conventions_pixel_values_videos_hidden_states_and_attentions(export):
    _, out = export
    auto = transformers.AutoModel.from_pretrained(str(out))
    ours = levjepa.from_pretrained(out)
    x = _clip(ours.config, 6)
    with torch.no_grad():
        for model in (auto, ours):
            a = model(pixel_values=x)
            b = model(pixel_values_videos=x.transpose(1, 2))  # [B, T, C, H, W]
            assert torch.equal(a.last_hidden_state, b.last_hidden_state)
            hs = model(pixel_values=x, output_hidden_states=True).hidden_states
            enc = ours.encoder
            assert len(hs) == enc.cfg.depth + 1  # the embeddings, then every block
            patches, _ = enc.patch_embed(x, None)
            assert torch.equal(hs[0][:, 1:], patches) and torch.equal(hs[0][:, 0], enc.cls_token[0].expand(2, -1))
            assert torch.allclose(enc.norm(hs[-1]), a.last_hidden_state, atol=1e-6)
            with pytest.raises(ValueError) as err:
                model(pixel_values=x, output_attentions=True)
            assert str(err.value) == ATTENTIONS_REFUSED and "\n" not in ATTENTIONS_REFUSED
            with pytest.raises(ValueError, match="not both"):
                model(pixel_values=x, pixel_values_videos=x.transpose(1, 2))


def test_the_image_processor_of_an_export_loads_and_feeds_pixel_values_videos(export):
    _, out = export
    processor = transformers.AutoImageProcessor.from_pretrained(str(out))
    pre = json.loads((out / "config.json").read_text())["preprocessing"]
    color = np.array([200, 100, 50], np.uint8)
    frames = [np.broadcast_to(color, (24, 40, 3)).copy() for _ in range(pre["num_frames"])]
    pixels = processor(frames, return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, pre["num_frames"], 3, pre["size"], pre["size"])  # [B, T, C, H, W]
    want = (torch.tensor(color / 255.0) - torch.tensor(pre["mean"])) / torch.tensor(pre["std"])
    assert torch.allclose(pixels[0, 0, :, 5, 5].double(), want, atol=1e-4)
    model, auto = levjepa.from_pretrained(out), transformers.AutoModel.from_pretrained(str(out))
    with torch.no_grad():
        a = model(pixel_values_videos=pixels).last_hidden_state
        b = model(pixel_values=pixels.transpose(1, 2)).last_hidden_state
        c = model(**processor(frames, return_tensors="pt")).last_hidden_state  # pixel_values, frames first
        d = auto(**processor(frames, return_tensors="pt")).last_hidden_state
    assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)


def test_a_frames_first_pixel_values_is_read_as_frames_first_and_the_ambiguous_shape_is_refused(export):
    """``pixel_values`` ``[B, T, C, H, W]`` (what an image processor returns under that name) gives what the
    same clip channels first gives, never a model fed T channels; ``[B, 3, 3, H, W]`` fits both readings and is
    refused in one line, whichever model reads it."""
    _, out = export
    auto, ours = transformers.AutoModel.from_pretrained(str(out)), levjepa.from_pretrained(out)
    for frames in (4, 2, 5):
        x = _clip(ours.config, frames, frames=frames)  # [B, C, T, H, W]
        with torch.no_grad():
            for model in (auto, ours):
                want = model(pixel_values=x).last_hidden_state
                assert torch.equal(model(pixel_values=x.transpose(1, 2).contiguous()).last_hidden_state, want)
                assert torch.equal(model(pixel_values_videos=x.transpose(1, 2)).last_hidden_state, want)
    x = _clip(ours.config, 1, frames=3)
    for model in (auto, ours):
        for given in (x, x.transpose(1, 2)):
            with pytest.raises(ValueError) as err:
                model(pixel_values=given)
            assert str(err.value) == AMBIGUOUS.format(shape=tuple(x.shape), c=3) and "\n" not in str(err.value)
        assert model(pixel_values_videos=x.transpose(1, 2)).last_hidden_state.shape[0] == 2  # the way out works
    with pytest.raises(ValueError, match=r"reads 3 channels, at dim 1"):
        ours(pixel_values=torch.zeros(1, 4, 5, 16, 16))


def _finetuned(root: Path, run: Path, kind: str = "attentive") -> Path:
    """A fine-tuned classifier's folder as ``levjepa finetune`` writes ``best/`` (``BestExport.save``: the
    encoder and its head in the hub layout, classifier.json) with a random head."""
    loaded = load_encoder(run)
    labels = ("walk", "run", "jump")
    head_cfg = HeadConfig(kind=kind, input="tokens" if kind == "attentive" else "mean", dim=loaded.config.dim,
                          num_classes=len(labels))  # fmt: skip
    head = build_head(head_cfg, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    model = VideoClassifier(loaded.encoder, head_cfg, head)
    best = BestExport.of(root / "ft", Start(str(run), "ema", False, 0), loaded)
    best.save(model, labels, ViewSpec(size=16, frames=4, frame_stride=1), {"step": 30, "val_acc": 0.75})
    (root / "ft" / "results.json").write_text(json.dumps({"best_step": 30, "best_val_acc": 0.75, "test_acc": 0.625}))
    return root / "ft" / "best"


def test_the_best_classifier_of_a_fine_tuning_is_a_classifier_export_as_it_is(tmp_path):
    """``best/`` itself (not only its re-export) is what ``AutoModelForVideoClassification`` and
    ``levjepa.from_pretrained`` read as a classifier, with a classifier's card; classify still reads it."""
    run = make_run_dir(tmp_path)
    best = _finetuned(tmp_path, run)
    config = json.loads((best / "config.json").read_text())
    assert config["architectures"] == ["LeVJEPAForVideoClassification"] and config["head"]["num_classes"] == 3
    assert config["id2label"] == {"0": "walk", "1": "run", "2": "jump"} and config["weights"] == "finetuned"
    card = (best / "README.md").read_text()
    assert "pipeline_tag: video-classification" in card and "self-supervision (no labels)" not in card
    x = _clip(load_encoder(run).config, 5, batch=2)
    with torch.no_grad():
        want = load_classifier(best).model(x)  # what levjepa classify computes
        ours = levjepa.from_pretrained(best)
        auto = transformers.AutoModelForVideoClassification.from_pretrained(str(best))
        assert isinstance(ours, LeVJEPAForVideoClassification)
        assert torch.allclose(ours(pixel_values=x).logits, want, atol=1e-5)
        assert torch.allclose(auto(pixel_values=x).logits, want, atol=1e-5)
    assert levjepa.load(best).cfg == load_encoder(run).config  # still a plain encoder to levjepa.load
    assert config["license"] == "mit" and "license: mit" in card
    # fine-tuned from a run continued from the imported official weights: their licence and origin stay
    imported = tmp_path / "imported"
    assert run_import(released_folder(tmp_path / "rel", fixture(1), 1, "block_causal"), imported) == 0
    derived = _finetuned(tmp_path / "d", make_run_dir(tmp_path / "d", init_from=str(imported)))
    config = json.loads((derived / "config.json").read_text())
    assert config["license"] == "cc-by-nc-4.0" and "license: cc-by-nc-4.0" in (derived / "README.md").read_text()
    official = json.loads((imported / "config.json").read_text())["imported_from"]
    assert config["derived_from"]["imported_from"]["sha256"] == official["sha256"]


@pytest.mark.parametrize("kind", ["attentive", "linear"])
def test_a_fine_tuned_classifier_through_its_export_gives_the_same_logits_everywhere(tmp_path, kind, capsys):
    run = make_run_dir(tmp_path)
    best = _finetuned(tmp_path, run, kind)
    out = tmp_path / "published"
    assert main(["export", str(best), "--out", str(out)]) == 0
    x = _clip(load_encoder(run).config, 7, batch=3)
    with torch.no_grad():
        want = load_classifier(best).model(x)  # what classify computes for one segment and one crop
        ours = levjepa.from_pretrained(out)
        auto = transformers.AutoModelForVideoClassification.from_pretrained(str(out))
        got_ours, got_auto = ours(pixel_values=x).logits, auto(pixel_values=x).logits
    assert isinstance(ours, LeVJEPAForVideoClassification) and not isinstance(ours, LeVJEPAModel)
    assert torch.allclose(got_ours, want, atol=1e-5) and torch.allclose(got_auto, want, atol=1e-5)
    assert ours.config.id2label == auto.config.id2label == {0: "walk", 1: "run", 2: "jump"}
    labels = torch.tensor([0, 2, 1])
    loss = auto(pixel_values=x, labels=labels).loss  # what HF's Trainer reads
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(got_auto, labels), atol=1e-6)
    card = (out / "README.md").read_text()
    assert "pipeline_tag: video-classification" in card and "# LeVJEPA video classifier" in card
    assert "`walk`, `run`, `jump`" in card and "| test accuracy (%) | 62.5 |" in card and "kuhn2026levjepa" in card
    assert "self-supervision (no labels)" not in card
    # save_pretrained of the transformers classifier reads back in levjepa with the same logits
    auto.save_pretrained(str(tmp_path / "saved"))
    again = levjepa.from_pretrained(tmp_path / "saved")
    with torch.no_grad():
        assert torch.allclose(again(pixel_values=x).logits, want, atol=1e-5)
    # `levjepa classify` runs the export
    _video(tmp_path / "clip.mp4", 8, h=16, w=16)
    assert main(["classify", str(out), str(tmp_path / "clip.mp4"), "--workers", "0", "--top-k", "1"]) == 0
    printed = capsys.readouterr().out
    assert any(name in printed for name in ("walk", "run", "jump"))


def test_an_encoder_export_is_not_a_classifier(export):
    _, out = export
    card = (out / "README.md").read_text()
    assert "pipeline_tag: feature-extraction" in card and "licence of the weights | MIT" in card
    with pytest.raises(ValueError, match="no classification head"):
        transformers.AutoModelForVideoClassification.from_pretrained(str(out))


def test_fine_tuning_the_released_layout_trains_its_official_parameters(tmp_path):
    t = fixture(1)
    model = transformers.AutoModel.from_pretrained(str(released_folder(tmp_path / "r", t, 1, "block_causal")))
    model.train()
    model(pixel_values=t["input.video"]).pooler_output.square().sum().backward()
    qkv = model.encoder.blocks[0].attn.qkv.weight
    kernel = model.encoder.patch_embed.proj.weight
    assert qkv.grad is not None and qkv.grad.abs().sum() > 0 and kernel.grad.shape == (96, 3, 1, 8, 8)


def test_the_head_config_is_stored_with_the_export(tmp_path):
    run = make_run_dir(tmp_path)
    best = _finetuned(tmp_path, run)
    export_encoder(best, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LeVJEPAForVideoClassification"]
    assert config["head"] == to_dict(HeadConfig(dim=32, num_classes=3)) and config["id2label"]["2"] == "jump"


# ------------------------------------------------------------------------------ the README's hub blocks, run

README = "\n".join(  # the README and the guides under docs/, where the hub's blocks live
    p.read_text() for p in [TESTS.parent / "README.md", *sorted((TESTS.parent / "docs").glob("*.md"))]
)
PINNED = "e831a0347737fcaa660b39c57d41c109de399845"


def _readme_block(marker: str) -> str:
    import re

    (block,) = [b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if marker in b]
    return block


def _offline_script(tmp_path: Path, code: str) -> str:
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"),
           "HOME": str(tmp_path)}  # fmt: skip
    (tmp_path / "block.py").write_text(code)
    run = subprocess.run([sys.executable, str(tmp_path / "block.py")], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_the_readme_block_loads_the_released_repo_without_remote_code(tmp_path):
    from test_official import FAKE_REV, hub_cache

    t = fixture(1)
    hub_cache(tmp_path / "cache", t, FAKE_REV)  # the fixture under the released name (another revision: other bytes)
    torch.save(t, tmp_path / "t.pt")
    block = _readme_block("galilai-group/LeVJEPA-VideoMix-Large")
    assert PINNED in block and "trust_remote_code" not in block
    preamble = "import torch\nt = torch.load('t.pt')\nvideo = t['input.video']\n"
    checks = "\nassert (out.last_hidden_state - t['output.block_causal']).abs().max() < 1e-5\n"
    checks += "assert torch.allclose(model(pixel_values=video).last_hidden_state, out.last_hidden_state, atol=1e-5)\n"
    checks += "print(model.weights_info)\n"
    out = _offline_script(tmp_path, preamble + block.replace(PINNED, FAKE_REV) + checks)
    assert f"@{FAKE_REV} (sha256 " in out


def test_a_fine_tuned_classifier_is_published_and_the_readme_block_loads_it_back(tmp_path, monkeypatch, capsys):
    """`levjepa export ft/best --out clf --push-to-hub ORG/NAME` goes through huggingface_hub's create_repo and
    upload_folder (replaced here by a hub that files the upload in a local cache); the README's block then
    loads it back offline, with levjepa and with AutoModelForVideoClassification."""
    import shutil

    import huggingface_hub

    repo_id, revision = "my-org/levjepa-actions", "89abcdef0123456789abcdef0123456789abcdef"
    pushed = []

    def create_repo(repo_id, repo_type=None, private=False, exist_ok=False, **_):
        pushed.append(("create", repo_id, repo_type, private))

    def upload_folder(repo_id, folder_path, repo_type=None, commit_message=None, **_):
        repo = tmp_path / "cache" / ("models--" + repo_id.replace("/", "--"))
        shutil.copytree(folder_path, repo / "snapshots" / revision)
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(revision)
        pushed.append(("upload", repo_id, repo_type, commit_message))
        return f"https://hub.example/{repo_id}/commit/{revision}"

    monkeypatch.setattr(huggingface_hub, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub, "upload_folder", upload_folder)
    run = make_run_dir(tmp_path)
    best = _finetuned(tmp_path, run)
    assert main(["export", str(best), "--out", str(tmp_path / "clf"), "--push-to-hub", repo_id, "--private"]) == 0
    assert pushed[0] == ("create", repo_id, "model", True) and pushed[1][:3] == ("upload", repo_id, "model")
    assert f"pushed {tmp_path / 'clf'} -> {repo_id}" in capsys.readouterr().out
    frames = _clip(load_encoder(run).config, 9, batch=2).transpose(1, 2)  # [B, T, C, H, W]
    with torch.no_grad():
        want = load_classifier(best).model(frames.transpose(1, 2))
    torch.save({"frames": frames, "want": want}, tmp_path / "f.pt")
    preamble = "import torch\nd = torch.load('f.pt')\nframes = d['frames']\n"
    checks = "\nassert torch.allclose(logits, d['want'], atol=1e-5)\n"
    checks += "assert torch.allclose(clf(pixel_values_videos=frames).logits, logits, atol=1e-5)\n"
    out = _offline_script(tmp_path, preamble + _readme_block("my-org/levjepa-actions") + checks)
    assert out.strip() in ("walk", "run", "jump")
