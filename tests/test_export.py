"""Export and load: run dir / checkpoint / export give the right (EMA or online) weights, frozen; export -> load
gives bit-identical outputs; a pickle-bearing file is refused without being executed."""

from __future__ import annotations

import argparse
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

import levjepa
from levjepa.commands import export as export_mod
from levjepa.config import ConfigError, to_dict
from levjepa.formats.reading.load import load, load_encoder, load_projector, random_encoder
from levjepa.formats.writing.export import export_encoder
from levjepa.model import Projector, VideoEncoder, encoder_config
from levjepa.weights import WeightsError, atomic_write_text, list_checkpoints, save_tensors


def make_run_dir(
    root: Path, steps=(10, 20), *, preset="vit-test", lam=None, losses=None, seed=0, **model: object
) -> Path:
    """A run directory in the trainer's layout (levjepa.weights), with encoders that differ per step and
    between online and EMA weights (the EMA's metadata as the trainer writes it); metrics.jsonl has a loss at
    every step up to the last checkpoint. ``model`` overrides fields of the preset (``tubelet=2``)."""
    cfg = encoder_config(preset, **model)
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    config = {
        "model": to_dict(cfg),
        "data": {"sources": ["synthetic"], "num_frames": 4, "global_size": 32, "local_size": 16, "num_local": 2},
        "objective": {"name": "levjepa", "lam": lam},
        "optim": {"lr": 4e-4, "weight_decay": 0.04},
        "train": {"steps": max(steps), "batch_size": 8},
    }
    atomic_write_text(run / "config.json", json.dumps(config))
    lines = []
    for s in range(1, max(steps) + 1):
        loss = losses(s) if losses else 1.0 / s
        lines.append(json.dumps({"step": s, "loss": loss, "invariance": loss * 0.5, "sigreg": loss * 25}))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n{not json\n")
    for i, step in enumerate(steps):
        ckpt = run / "checkpoints" / f"step_{step:06d}"
        torch.manual_seed(seed * 100 + 2 * i)
        online, proj = VideoEncoder(cfg), Projector.from_config(cfg)
        torch.manual_seed(seed * 100 + 2 * i + 1)
        ema = VideoEncoder(cfg)
        tensors = {f"encoder.{k}": v for k, v in online.state_dict().items()}
        tensors.update({f"projector.{k}": v for k, v in proj.state_dict().items()})
        save_tensors(ckpt / "model.safetensors", tensors)
        ema_meta = {"step": step, "ema_updates": step, "ema_decay": 0.99, "ema_every": 1, "ema_warmup": 10.0}
        save_tensors(ckpt / "ema.safetensors", {f"encoder.{k}": v for k, v in ema.state_dict().items()}, ema_meta)
        atomic_write_text(ckpt / "meta.json", json.dumps({"step": step, "encoder_config": to_dict(cfg)}))
        atomic_write_text(run / "checkpoints" / "latest", ckpt.name)
    return run


def _clip(cfg, seed=0):
    return torch.randn(2, 3, 4, 2 * cfg.patch_size, 2 * cfg.patch_size, generator=torch.Generator().manual_seed(seed))


def _state(run: Path, step: int, file: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    t = load_file(str(run / "checkpoints" / f"step_{step:06d}" / file))
    return {k[len("encoder.") :]: v for k, v in t.items() if k.startswith("encoder.")}


def test_load_run_checkpoint_and_files_pick_the_right_weights(tmp_path):
    run = make_run_dir(tmp_path)
    ema = load_encoder(run)  # default: EMA of the latest checkpoint
    online = load_encoder(run, weights="online")
    assert ema.step == 20 and ema.kind == "run" and ema.weights == "ema"
    for loaded, file in ((ema, "ema.safetensors"), (online, "model.safetensors")):
        want = _state(run, 20, file)
        got = loaded.encoder.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want)
        # frozen: eval mode, no gradients
        assert not loaded.encoder.training
        assert not any(p.requires_grad for p in loaded.encoder.parameters())
    x = _clip(ema.config)
    assert not torch.allclose(ema.encoder(x), online.encoder(x))
    # a checkpoint directory, and the checkpoint files themselves
    ckpt = run / "checkpoints" / "step_000010"
    first = load_encoder(ckpt, weights="online")
    assert first.step == 10 and first.kind == "checkpoint" and first.run_dir == str(run)
    by_file = load_encoder(ckpt / "ema.safetensors", weights="online")  # the file decides
    assert by_file.weights == "ema"
    assert torch.equal(by_file.encoder(x), load_encoder(ckpt).encoder(x))
    assert [p.name for p in list_checkpoints(run)] == ["step_000010", "step_000020"]


def test_export_then_load_gives_identical_outputs_and_a_model_card(tmp_path):
    run = make_run_dir(tmp_path)
    out = tmp_path / "export"
    parser = argparse.ArgumentParser()
    export_mod.add_arguments(parser)
    assert export_mod.main(parser.parse_args([str(run), "--out", str(out), "--weights", "online"])) == 0
    want = [
        "README.md",
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "video_preprocessor_config.json",
    ]
    assert sorted(p.name for p in out.iterdir()) == want  # the hub layout
    source = load_encoder(run, weights="online").encoder
    x = _clip(source.cfg, seed=3)
    for path in (out, out / "model.safetensors"):
        enc = levjepa.load(path)  # the package's lazy `load`, = levjepa.formats.reading.load.load
        assert not enc.training and not any(p.requires_grad for p in enc.parameters())
        a, b = source.forward_features(x), enc.forward_features(x)
        assert torch.equal(a.cls, b.cls) and torch.equal(a.patches, b.patches)  # bit-exact on CPU
    loaded = load_encoder(out)
    assert loaded.kind == "export" and loaded.weights == "online" and loaded.step == 20
    # the run's config comes back as the run's own
    assert loaded.run_config == load_encoder(run).run_config and loaded.run_config.objective.lam_value == 0.02
    card = (out / "README.md").read_text()
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    for needle in ("library_name: levjepa", "license: mit", "pipeline_tag:", "- levjepa", "- synthetic"):
        assert needle in front, needle
    for needle in ("online", "| training steps | 20 |", "synthetic", "loss", "dim 32", "from_pretrained"):
        assert needle in body, needle
    side = json.loads((out / "config.json").read_text())
    assert side["model_type"] == "levjepa" and side["architectures"] == ["LeVJEPAModel"]
    assert side["encoder"] == to_dict(source.cfg) and side["hidden_size"] == 32 and side["levjepa_version"]
    assert side["run_config"]["objective"]["name"] == "levjepa"
    # trained on the built-in benchmark: its clips' geometry (the synthetic section's defaults here)
    assert side["preprocessing"] == {
        "size": 64,
        "num_frames": 16,
        "frame_stride": 1,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "fps": None,  # a run trained at a frame stride, not a rate
    }
    assert levjepa.load(out).pretrained_cfg["input_size"] == (3, 16, 64, 64)
    pre = json.loads((out / "preprocessor_config.json").read_text())
    assert pre["image_mean"] == [0.485, 0.456, 0.406] and pre["rescale_factor"] == 1 / 255
    # no projector unless asked: encoder keys only, and the metadata the hub loaders check
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert not any(k.startswith("projector") for k in f.keys())  # noqa: SIM118
        assert f.metadata()["format"] == "pt"
    assert export_mod.main(parser.parse_args([str(run), "--out", str(tmp_path / "p"), "--with-projector"])) == 0
    assert load_projector(tmp_path / "p") is not None
    assert set(load_projector(tmp_path / "p")) == set(Projector.from_config(source.cfg).state_dict())


def test_exports_written_before_the_hub_layout_still_load(tmp_path):
    """encoder.safetensors + config.json (an ExportRecord) + MODEL_CARD.md, as levjepa wrote them before."""
    cfg = encoder_config("vit-test")
    torch.manual_seed(5)
    enc = VideoEncoder(cfg).eval()
    old = tmp_path / "old"
    old.mkdir()
    meta = {"format": "levjepa-encoder/1", "encoder_config": to_dict(cfg), "weights": "ema", "step": 7}
    save_tensors(old / "encoder.safetensors", enc.state_dict(), meta)
    atomic_write_text(old / "config.json", json.dumps({"model": to_dict(cfg), "weights": "ema", "step": 7}))
    atomic_write_text(old / "MODEL_CARD.md", "# LeVJEPA encoder\n")
    loaded = load_encoder(old)
    x = _clip(cfg)
    with torch.no_grad():
        assert torch.equal(loaded.encoder(x), enc(x)) and loaded.step == 7 and loaded.weights == "ema"
    export_encoder(old, tmp_path / "new")  # and re-export into the hub layout
    with torch.no_grad():
        assert torch.equal(load_encoder(tmp_path / "new").encoder(x), enc(x))


@pytest.mark.parametrize("sources", [["synthetic"], ["/data/videos"]])
def test_model_card_describes_the_builtin_benchmark_only_when_it_was_trained_on(tmp_path, sources):
    run = make_run_dir(tmp_path)
    config = json.loads((run / "config.json").read_text())
    # a run config always carries the synthetic section, whether or not a source uses it
    config["data"].update(sources=sources, synthetic={"image_source": "fashion-mnist", "num_frames": 16, "size": 32})
    atomic_write_text(run / "config.json", json.dumps(config))
    out = tmp_path / "export"
    export_encoder(run, out)
    card = (out / "README.md").read_text()
    assert f"| data sources | {sources[0]} |" in card
    assert ("built-in benchmark clips | image source fashion-mnist, 16×32×32" in card) == (sources == ["synthetic"])


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("how", ["pickle", "torch_save"])
def test_pickle_bearing_weights_are_refused_unexecuted(tmp_path, how):
    run = make_run_dir(tmp_path, steps=(10,))
    out = tmp_path / "export"
    export_encoder(run, out)
    marker = tmp_path / "pwned"
    evil = {"patch_embed.proj.weight": torch.zeros(1), "x": _Payload(str(marker))}
    target = out / "model.safetensors"
    if how == "pickle":
        target.write_bytes(pickle.dumps(evil))
    else:
        torch.save(evil, target)
    for path in (out, target):
        with pytest.raises(WeightsError, match="pickle"):
            load(path)
    # a checkpoint's weights replaced by a pickle, and a bare .pt file
    torch.save(evil, run / "checkpoints" / "step_000010" / "ema.safetensors")
    with pytest.raises(WeightsError, match="pickle"):
        load_encoder(run)
    torch.save(evil, tmp_path / "model.pt")
    with pytest.raises(WeightsError, match="pickle"):
        load_encoder(tmp_path / "model.pt")
    assert not marker.exists()


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(WeightsError, match="no such"):
        load_encoder(tmp_path / "missing")
    run = make_run_dir(tmp_path, steps=(10,))
    ckpt = run / "checkpoints" / "step_000010"
    (ckpt / "ema.safetensors").unlink()
    with pytest.raises(WeightsError, match="weights='online'"):
        load_encoder(run)
    with pytest.raises(ValueError, match="ema, online"):
        load_encoder(run, weights="both")  # type: ignore[arg-type]
    # weights that do not match the recorded architecture
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["encoder_config"]["depth"] = 3
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(WeightsError, match="do not match"):
        load_encoder(run, weights="online")
    with pytest.raises(WeightsError, match="not a run directory"):
        load_encoder(tmp_path)


def test_random_encoder_is_seeded_and_leaves_the_global_rng_alone():
    cfg = encoder_config("vit-test")
    state = torch.random.get_rng_state()
    a, b, c = random_encoder(cfg, seed=1), random_encoder(cfg, seed=1), random_encoder(cfg, seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    x = _clip(cfg)
    assert torch.equal(a.encoder(x), b.encoder(x)) and not torch.equal(a.encoder(x), c.encoder(x))
    assert a.weights == "random" and not a.encoder.training


def _export_of(run: Path, out: Path) -> tuple[dict, str]:
    export_encoder(run, out)
    return json.loads((out / "config.json").read_text()), (out / "README.md").read_text()


def test_weights_continued_from_the_official_ones_keep_their_licence_and_origin(tmp_path):
    from test_official import fixture, released_folder, run_import

    imported = tmp_path / "imported"
    assert run_import(released_folder(tmp_path / "rel", fixture(1), 1, "block_causal"), imported) == 0
    official = json.loads((imported / "config.json").read_text())["imported_from"]
    # a run started from the imported weights (model.init_from) records neither imported_from nor a licence
    run = make_run_dir(tmp_path / "a", init_from=str(imported))
    side, card = _export_of(run, tmp_path / "export")
    assert side["license"] == "cc-by-nc-4.0" and "license: cc-by-nc-4.0" in card
    assert side["derived_from"]["init_from"] == str(imported)
    assert side["derived_from"]["imported_from"]["sha256"] == official["sha256"]
    assert "| derived from | official LeVJEPA weights" in card and official["sha256"] in card
    # a second generation (a run continued from that export) and a run continued from that run inherit it too
    run2 = make_run_dir(tmp_path / "b", init_from=str(tmp_path / "export"))
    run3 = make_run_dir(tmp_path / "c", init_from=str(run2))
    for i, r in enumerate((run2, run3)):
        side, _ = _export_of(r, tmp_path / f"export{i}")
        assert side["license"] == "cc-by-nc-4.0" and side["derived_from"]["imported_from"] == official
    # weights continued from a levjepa run trained from scratch stay MIT; a start that is gone is no guess
    scratch = make_run_dir(tmp_path / "d")
    side, _ = _export_of(make_run_dir(tmp_path / "e", init_from=str(scratch)), tmp_path / "export-mit")
    assert side["license"] == "mit" and side["derived_from"]["imported_from"] is None
    side, card = _export_of(make_run_dir(tmp_path / "f", init_from=str(tmp_path / "gone")), tmp_path / "export-gone")
    assert side["license"] == "other" and "could not be read" in card and "license: mit" not in card


def test_preprocessing_speaks_viewspecs_names_and_keeps_the_on_disk_keys(tmp_path):
    """Preprocessing says ``frames`` as ViewSpec does; config.json's ``preprocessing`` and
    preprocessor_config.json keep transformers' ``num_frames``, and an export reads back what it wrote."""
    from dataclasses import fields

    from levjepa.data.eval_clip import ViewSpec
    from levjepa.formats.reading.load import Preprocessing

    shared = {"size", "frames", "frame_stride", "fps"}  # how frames are taken: one spelling for both
    assert shared <= {f.name for f in fields(Preprocessing)} and shared <= {f.name for f in fields(ViewSpec)}
    pre = Preprocessing(size=32, frames=8, frame_stride=3, fps=7.5)
    record = pre.record()
    assert list(record) == ["size", "num_frames", "frame_stride", "mean", "std", "fps"] and record["num_frames"] == 8
    assert Preprocessing.from_record(record) == pre
    with pytest.raises(ConfigError):
        Preprocessing.from_record({**record, "frames": 8})  # both spellings at once: one is unknown on disk
    out = export_encoder(make_run_dir(tmp_path), tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    processor = json.loads((tmp_path / "out" / "preprocessor_config.json").read_text())
    frames = out.preprocessing.frames if out.preprocessing is not None else None
    assert config["preprocessing"]["num_frames"] == processor["num_frames"] == config["num_frames"] == frames
    assert "frames" not in config["preprocessing"] and "frames" not in processor
    assert load_encoder(tmp_path / "out").preprocessing == out.preprocessing
