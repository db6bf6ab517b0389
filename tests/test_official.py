"""Official LeVJEPA weights in: imported encoders compute the reference code's function, token for token.

The fixture (``tests/fixtures/official``, made by running the official ``module.py`` outside this project:
``tests/fixtures/official/README.md``) holds random weights in the official key names, an input clip and
the official ``last_hidden_state`` for τ = 1 and 2, block-causal and full attention, an image model, and
the official projector's outputs in both BatchNorm modes. These tests import the weights the ways a user
would (a hub repo folder under several key prefixes, a Lightning ``.ckpt``, a bare safetensors file) and
compare every output token within 1e-5.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from levjepa.cli import main
from levjepa.commands import import_weights
from levjepa.formats.reading.load import load_encoder, load_projector
from levjepa.formats.reading.official import OFFICIAL_SIZES, Overrides, read_official
from levjepa.infer.stream import StreamingEncoder
from levjepa.model import Projector
from levjepa.weights import WeightsError

FIXTURES = Path(__file__).parent / "fixtures" / "official"
CASES = [(tau, mode) for tau in (1, 2) for mode in ("block_causal", "full")]


def fixture(tau: int) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / f"official_tau{tau}.safetensors"))


def official_encoder(t: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    return {prefix + k[len("encoder.") :]: v for k, v in t.items() if k.startswith("encoder.")}


def hub_folder(root: Path, t: dict[str, torch.Tensor], prefix: str, config: dict | None) -> Path:
    """An official model folder as a hub download holds it: config.json + model.safetensors."""
    root.mkdir(parents=True)
    save_file(official_encoder(t, prefix), str(root / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    return root


def released_config(tau: int, mode: str, **sizes) -> dict:
    """config.json in the released checkpoint's schema (model_type levjepa, the official VisionTransformer's
    arguments, remote code named in auto_map), at the fixture's size unless ``sizes`` say otherwise."""
    config = {
        "model_type": "levjepa",
        "architectures": ["LeVJEPAModel"],
        "auto_map": {"AutoConfig": "configuration_levjepa.LeVJEPAConfig", "AutoModel": "modeling_levjepa.LeVJEPAModel"},
        "img_size": 32,
        "patch_size": 8,
        "num_frames": 8,
        "tubelet_size": tau,
        "in_chans": 3,
        "embed_dim": 96,
        "depth": 2,
        "num_heads": 3,
        "mlp_ratio": 4.0,
        "qkv_bias": True,
        "attn_mode": mode,
        "token_drop_rate": 0.95,
        "torch_dtype": "float32",
    }
    return {**config, **sizes}


def released_folder(root: Path, t: dict[str, torch.Tensor], tau: int, mode: str) -> Path:
    """An official model in the released checkpoint's layout: released_config + the encoder under ``encoder.``."""
    root.mkdir(parents=True)
    save_file(official_encoder(t, "encoder."), str(root / "model.safetensors"), metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(released_config(tau, mode)))
    return root


def run_import(src: Path, out: Path, *extra: str) -> int:
    parser = argparse.ArgumentParser()
    import_weights.add_arguments(parser)
    return import_weights.main(parser.parse_args([str(src), "--out", str(out), *extra]))


def tokens(encoder, video: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return encoder.forward_features(video).tokens


@pytest.mark.parametrize(("tau", "mode"), CASES)
@pytest.mark.parametrize("prefix", ["", "encoder.", "model.backbone."])
def test_imported_hub_folder_equals_the_official_output(tmp_path, tau, mode, prefix):
    t = fixture(tau)
    src = hub_folder(tmp_path / "hub", t, prefix, {"model_type": "levjepa-official", "num_heads": 3, "attn_mode": mode})
    assert run_import(src, tmp_path / "out") == 0
    loaded = load_encoder(tmp_path / "out")
    cfg = loaded.config
    assert (cfg.rope_layout, cfg.tubelet, cfg.final_norm_bias, cfg.heads) == ("vjepa2", tau, True, 3)
    got, want = tokens(loaded.encoder, t["input.video"]), t[f"output.{mode}"]
    assert got.shape == want.shape  # CLS + every patch token, (t, y, x) order
    assert (got - want).abs().max().item() < 1e-5


def test_the_modes_differ_so_the_comparison_can_fail():
    t = fixture(1)
    assert (t["output.block_causal"] - t["output.full"]).abs().max() > 1e-2
    # head dim 32: 2 of 32 channels are unrotated in the official layout, the case the issue names
    assert json.loads(load_file_meta(FIXTURES / "official_tau1.safetensors")["config"])["num_heads"] == 3


def load_file_meta(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return dict(f.metadata())


def test_a_wrong_rope_layout_or_cls_rotation_is_caught(tmp_path):
    """The levjepa layout on the official weights is far from the official output: the fixture tells them apart."""
    import dataclasses

    from levjepa.model import VideoEncoder

    t = fixture(1)
    official = read_official(hub_folder(tmp_path / "hub", t, "", None), Overrides(heads=3, attention="block_causal"))
    enc = VideoEncoder(dataclasses.replace(official.config, rope_layout="levjepa")).eval()
    enc.load_state_dict(official.encoder)
    assert (tokens(enc, t["input.video"]) - t["output.block_causal"]).abs().max() > 1e-3


def test_image_model_equals_the_official_output(tmp_path):
    t = fixture(1)
    enc = official_encoder(t)
    enc["patch_embed.proj.weight"] = t["image.patch_embed.proj.weight"]  # a Conv2d kernel [D, C, p, p]
    src = tmp_path / "image.safetensors"
    save_file(enc, str(src))
    assert run_import(src, tmp_path / "out", "--heads", "3", "--attention", "full") == 0
    loaded = load_encoder(tmp_path / "out")
    got = tokens(loaded.encoder, t["input.image"][:, :, None])  # an image is a one-frame clip
    assert (got - t["output.image"]).abs().max().item() < 1e-5


def lightning_checkpoint(t: dict[str, torch.Tensor], path: Path, *, ema_shift: float = 0.0, extra=None) -> Path:
    """A checkpoint as the official main.py leaves it: Lightning's keys, state_dict with encoder.* /
    projector.net.* / sigreg.*, the EMA copy of the encoder under state_dict_ema (the config's save_key)."""
    online = {k: v for k, v in t.items() if k.startswith(("encoder.", "projector.net."))}
    online.update(
        {"sigreg.t": torch.linspace(0, 3, 17), "sigreg.phi": torch.ones(17), "sigreg.weights": torch.ones(17)}
    )
    ema = {k: v + ema_shift for k, v in official_encoder(t, "encoder.").items()}
    ckpt = {
        "epoch": 3,
        "global_step": 1200,
        "pytorch-lightning_version": "2.5.0",
        "state_dict": online,
        "state_dict_ema": ema,
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 4e-4, "params": [0, 1]}]}],
        "lr_schedulers": [{"last_epoch": 1200}],
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"dirpath": "checkpoints", "best_model_score": None}},
        "hyper_parameters": {"model": {"num_heads": 3, "attn_mode": "block_causal", "tubelet_size": 1}},
    }
    if extra is not None:
        ckpt["callbacks"]["extra"] = extra
    torch.save(ckpt, path)
    return path


def test_lightning_checkpoint_reads_the_ema_copy_its_config_and_the_projector(tmp_path):
    t = fixture(1)
    ckpt = lightning_checkpoint(t, tmp_path / "last.ckpt", ema_shift=0.0)
    assert run_import(ckpt, tmp_path / "out") == 0  # heads from the config's model section
    loaded = load_encoder(tmp_path / "out")
    assert loaded.weights == "ema" and "state_dict_ema" in loaded.note
    assert (tokens(loaded.encoder, t["input.video"]) - t["output.block_causal"]).abs().max().item() < 1e-5
    # the official projector, for continued pretraining: the same function in both BatchNorm modes
    state = load_projector(tmp_path / "out")
    assert state is not None
    proj = Projector(96, 64, 16)
    proj.load_state_dict(state)
    x = t["projector.input"]
    with torch.no_grad():
        assert (proj.eval()(x) - t["projector.output.eval"]).abs().max().item() < 1e-5
        assert (proj.train()(x) - t["projector.output.train"]).abs().max().item() < 1e-5


def test_lightning_checkpoint_online_copy_on_request(tmp_path):
    t = fixture(1)
    ckpt = lightning_checkpoint(t, tmp_path / "last.ckpt", ema_shift=0.01)  # the EMA differs from the online
    ema = read_official(ckpt)
    online = read_official(ckpt, weights="online")
    assert (ema.copy, online.copy) == ("ema", "online")
    key = "blocks.0.mlp.fc1.weight"
    assert torch.allclose(ema.encoder[key], online.encoder[key] + 0.01)
    assert torch.equal(online.encoder[key], t["encoder." + key])


class _Arbitrary:
    def __reduce__(self):
        return (print, ("this ran code",))


def test_a_checkpoint_with_arbitrary_objects_is_refused_unless_trusted(tmp_path, capsys):
    t = fixture(1)
    ckpt = lightning_checkpoint(t, tmp_path / "evil.ckpt", extra=_Arbitrary())
    with pytest.raises(WeightsError, match="--trust-pickle"):
        run_import(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists() and "this ran code" not in capsys.readouterr().out
    assert run_import(ckpt, tmp_path / "out", "--trust-pickle") == 0  # the documented opt-in


def test_what_cannot_be_told_is_listed(tmp_path):
    src = hub_folder(tmp_path / "hub", fixture(1), "encoder.", None)  # weights only: no config
    with pytest.raises(WeightsError, match=r"attention heads \(--heads N.*attention mode \(--attention"):
        run_import(src, tmp_path / "out")
    with pytest.raises(WeightsError, match="attention mode") as err:
        run_import(src, tmp_path / "out", "--heads", "3")
    assert "heads" not in str(err.value).split("state")[1].split("(")[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["other-architecture", "not-a-checkpoint", "truncated", "wrong-heads", "no-weights"])
def test_bad_input_is_one_error_naming_the_file_and_nothing_is_written(tmp_path, case):
    t = fixture(1)
    if case == "other-architecture":
        src = tmp_path / "resnet.safetensors"
        save_file({"conv1.weight": torch.zeros(8, 3, 7, 7), "fc.weight": torch.zeros(10, 8)}, str(src))
    elif case == "not-a-checkpoint":
        src = tmp_path / "notes.ckpt"
        src.write_bytes(b"these are not weights\n" * 10)
    elif case == "truncated":
        src = hub_folder(tmp_path / "hub", t, "", {"num_heads": 3, "attn_mode": "full"})
        data = (src / "model.safetensors").read_bytes()
        (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif case == "wrong-heads":
        src = hub_folder(tmp_path / "hub", t, "", {"num_heads": 5, "attn_mode": "full"})  # 96 / 5
    else:
        src = tmp_path / "empty"
        src.mkdir()
        (src / "config.json").write_text("{}")
    with pytest.raises(WeightsError) as err:
        run_import(src, tmp_path / "out")
    assert str(src.name) in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_a_levjepa_reader_names_an_official_folder_and_says_to_import_it(tmp_path):
    src = hub_folder(tmp_path / "hub", fixture(1), "", {"model_type": "vjepa2", "num_heads": 3})
    with pytest.raises(WeightsError, match="levjepa import"):
        load_encoder(src)


def test_streaming_an_imported_model_equals_its_full_forward(tmp_path):
    """CLS is unrotated in the official layout; the KV-cache stream must place it the same way."""
    t = fixture(1)
    src = hub_folder(tmp_path / "hub", t, "", {"num_heads": 3, "attn_mode": "block_causal"})
    run_import(src, tmp_path / "out")
    enc = load_encoder(tmp_path / "out").encoder
    video = t["input.video"]
    stream = StreamingEncoder(enc)
    patches = [stream.push(video[:, :, i : i + 1]) for i in range(video.shape[2])]
    want = t["output.block_causal"]
    assert (stream.cls() - want[:, 0]).abs().max().item() < 1e-5  # CLS read out after the last frame
    assert (torch.cat(patches, dim=1) - want[:, 1:]).abs().max().item() < 1e-5  # every frame's patches


# ---------------------------------------------------------------------------- the released checkpoint's contract

VIT_L = released_config(1, "block_causal", img_size=224, patch_size=16, num_frames=16, embed_dim=1024, depth=24,
                        num_heads=16)  # fmt: skip


def released_vit_l_names() -> dict[str, tuple[int, ...]]:
    """The released ViT-L's tensors as its model card and the official VisionTransformer define them: 293 under
    ``encoder.``, written out here from the architecture (Conv3d kernel (1, 16, 16), no pos_embed with RoPE)."""
    d, h = 1024, 4096
    names = {"encoder.cls_token": (1, 1, d), "encoder.patch_embed.proj.weight": (d, 3, 1, 16, 16)}
    names["encoder.patch_embed.proj.bias"] = (d,)
    for i in range(24):
        b = f"encoder.blocks.{i}."
        for norm in ("norm1", "norm2"):
            names[b + norm + ".weight"] = names[b + norm + ".bias"] = (d,)
        names[b + "attn.qkv.weight"], names[b + "attn.qkv.bias"] = (3 * d, d), (3 * d,)
        names[b + "attn.proj.weight"], names[b + "attn.proj.bias"] = (d, d), (d,)
        names[b + "mlp.fc1.weight"], names[b + "mlp.fc1.bias"] = (h, d), (h,)
        names[b + "mlp.fc2.weight"], names[b + "mlp.fc2.bias"] = (d, h), (d,)
    names["encoder.norm.weight"] = names["encoder.norm.bias"] = (d,)
    return names


def test_the_released_vit_l_contract_on_the_meta_device():
    """The pinned contract of galilai-group/LeVJEPA-VideoMix-Large (revision e831a03…): its config keys, 293
    tensors under encoder. with these shapes, 303,099,904 parameters; AutoModel builds exactly that layout from
    the config, and the importer loads it strictly into levjepa's encoder — all without a single weight."""
    from transformers import AutoModel

    from levjepa.formats.reading.official import RELEASED_KEYS, official_model, official_state_shapes, released_config
    from levjepa.formats.reading.origin import RELEASES
    from levjepa.formats.transformers.config import LeVJEPAConfig
    from levjepa.model import VideoEncoder

    want = released_vit_l_names()
    assert len(want) == 293 and sum(torch.Size(s).numel() for s in want.values()) == 303_099_904
    assert set(RELEASED_KEYS) <= set(VIT_L) and VIT_L["model_type"] == "levjepa"
    assert RELEASES[("galilai-group/LeVJEPA-VideoMix-Large", "e831a0347737fcaa660b39c57d41c109de399845")] == (
        "da8bd836ce6532e1b0074ee5a6a46c65b67103f96323529ec4195be1538edc7d"
    )
    assert {f"encoder.{k}": v for k, v in official_state_shapes(VIT_L).items()} == want
    with torch.device("meta"):
        auto = AutoModel.from_config(LeVJEPAConfig(**VIT_L))
    assert {k: tuple(v.shape) for k, v in auto.state_dict().items()} == want  # what from_pretrained loads strictly
    assert sum(p.numel() for p in auto.parameters()) == 303_099_904
    tensors = {k: torch.empty(s, device="meta") for k, s in want.items()}
    official = official_model({"published": tensors}, VIT_L, Path("model.safetensors"))
    cfg = official.config
    assert cfg == released_config(VIT_L)  # the importer and AutoModel build the same encoder
    assert (cfg.dim, cfg.depth, cfg.heads, cfg.tubelet, cfg.attention, cfg.rope_layout) == (
        1024, 24, 16, 1, "block_causal", "vjepa2"
    )  # fmt: skip
    with torch.device("meta"):
        encoder = VideoEncoder(cfg)
    encoder.load_state_dict(official.encoder, strict=True, assign=True)
    assert sum(p.numel() for p in encoder.parameters()) == 303_099_904


def test_settings_are_read_from_the_encoders_own_section_only(tmp_path):
    """Decoys in other sections (an optimizer's eps, a probe's num_heads, an attn_mode of a teacher) are never
    read: a checkpoint whose model section lacks the heads is asked for --heads, not given the probe's 7."""
    t = fixture(1)
    decoys = {"optimizer": {"eps": 1e-8, "lr": 4e-4}, "probe": {"num_heads": 7, "attn_mode": "full"}}
    named = {"model": {"num_heads": 3, "attn_mode": "block_causal"}, **decoys}
    ckpt = lightning_checkpoint(t, tmp_path / "a.ckpt")
    obj = torch.load(ckpt, weights_only=False)
    obj["hyper_parameters"] = named
    torch.save(obj, ckpt)
    cfg = read_official(ckpt).config
    assert (cfg.heads, cfg.norm_eps, cfg.attention) == (3, 1e-6, "block_causal")
    obj["hyper_parameters"] = {"model": {"tubelet_size": 1}, **decoys}
    torch.save(obj, ckpt)
    with pytest.raises(WeightsError, match=r"attention heads \(--heads N.*attention mode"):
        read_official(ckpt)
    # a hub config.json states its encoder at the top level; a nested section there is not the encoder's
    folder = hub_folder(tmp_path / "hub", t, "encoder.", {"attn_mode": "full", "probe": {"num_heads": 3}})
    with pytest.raises(WeightsError, match="--heads"):
        read_official(folder)
    folder2 = hub_folder(tmp_path / "hub2", t, "", {"num_heads": 3, "attn_mode": "full", "layer_norm_eps": 1e-5})
    assert read_official(folder2).config.norm_eps == 1e-5  # the encoder's own eps is read


def test_a_config_that_contradicts_its_weights_is_refused(tmp_path):
    t = fixture(1)
    bad = {**released_config(1, "full"), "embed_dim": 128}
    folder = hub_folder(tmp_path / "hub", t, "encoder.", bad)
    with pytest.raises(WeightsError, match="embed_dim=128, the weights have 96"):
        read_official(folder)


# ----------------------------------------------------------------------------- the hub cache, offline

REPO, FAKE_REV = "galilai-group/LeVJEPA-VideoMix-Large", "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, t: dict[str, torch.Tensor], revision: str) -> Path:
    """A huggingface_hub cache holding the fixture in the released layout as REPO at ``revision``."""
    repo = root / ("models--" + REPO.replace("/", "--"))
    released_folder(repo / "snapshots" / revision, t, 1, "block_causal")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return root


OFFLINE_SCRIPT = """
import json, sys, torch
import levjepa
from levjepa.cli import main
from transformers import AutoModel
repo, rev, video, out = sys.argv[1], sys.argv[2], torch.load(sys.argv[3]), sys.argv[4]
model = levjepa.from_pretrained(repo, revision=rev)
auto = AutoModel.from_pretrained(repo, revision=rev)
with torch.no_grad():
    a = model(pixel_values=video["x"]).last_hidden_state
    b = auto(pixel_values=video["x"]).last_hidden_state
assert main(["import", repo, "--revision", rev, "--out", out]) == 0
print(json.dumps({"info": model.weights_info, "ours": (a - video["want"]).abs().max().item(),
                  "auto": (b - video["want"]).abs().max().item()}))
"""


def _offline(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "PATH": "/usr/bin:/bin",
           "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path)}  # fmt: skip
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=300)


def test_the_released_repo_loads_offline_from_the_hub_cache_with_its_origin_recorded(tmp_path):
    import hashlib

    t = fixture(1)
    hub_cache(tmp_path / "cache", t, FAKE_REV)
    torch.save({"x": t["input.video"], "want": t["output.block_causal"]}, tmp_path / "video.pt")
    run = _offline(tmp_path, OFFLINE_SCRIPT, REPO, FAKE_REV, str(tmp_path / "video.pt"), str(tmp_path / "imported"))
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["ours"] < 1e-5 and got["auto"] < 1e-5
    weights = tmp_path / "cache" / ("models--" + REPO.replace("/", "--")) / "snapshots" / FAKE_REV / "model.safetensors"
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert f"{REPO}@{FAKE_REV} (sha256 {sha})" in got["info"]
    # every export made from the import records the same origin, in config.json and the card
    assert main(["export", str(tmp_path / "imported"), "--out", str(tmp_path / "again")]) == 0
    for folder in ("imported", "again"):
        origin = json.loads((tmp_path / folder / "config.json").read_text())["imported_from"]
        assert (origin["source"], origin["revision"], origin["sha256"]) == (REPO, FAKE_REV, sha)
        card = (tmp_path / folder / "README.md").read_text()
        assert sha in card and FAKE_REV in card and "license: cc-by-nc-4.0" in card


def test_the_pinned_revision_refuses_other_bytes_and_sha256_pins_any_source(tmp_path):
    t = fixture(1)
    pinned = "e831a0347737fcaa660b39c57d41c109de399845"
    hub_cache(tmp_path / "cache", t, pinned)  # the fixture's bytes under the released revision: not the release
    code = "import sys, levjepa; levjepa.from_pretrained(sys.argv[1], revision=sys.argv[2])"
    run = _offline(tmp_path, code, REPO, pinned)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and "is not the pinned da8bd836ce6532e1" in last
    with pytest.raises(WeightsError, match="is not the pinned 00000"):
        levjepa_from(hub_folder(tmp_path / "hub", t, "encoder.", released_config(1, "full")), "0" * 64)
    code = "import sys, levjepa; levjepa.from_pretrained(sys.argv[1], revision='no-such-branch')"
    run = _offline(tmp_path, code, REPO)
    assert run.returncode == 1 and "not in the hub cache" in run.stderr.strip().splitlines()[-1]


def levjepa_from(path: Path, sha256: str):
    import levjepa

    return levjepa.from_pretrained(path, sha256=sha256)


@pytest.mark.parametrize(
    "change",
    [{"token_drop_rate": 0.0}, {"attn_mode": None}, {"layer_norm_eps": 1e-5}, {"norm_eps": 1e-5}, {}],
    ids=["no-token-drop", "attn-mode-unstated", "layer-norm-eps", "norm-eps", "as-released"],
)
def test_the_importer_and_automodel_read_a_released_config_the_same_way(tmp_path, change):
    """One reading of the released schema: a stated 0.0 is 0.0, an unstated attn_mode is the official
    VisionTransformer's default in both, either eps name is the eps."""
    from levjepa.formats.reading.official import released_config as automodel_config

    folder = released_folder(tmp_path / "rel", fixture(1), 1, "block_causal")
    config = {k: v for k, v in {**released_config(1, "block_causal"), **change}.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(config))
    imported = read_official(folder).config
    assert imported == automodel_config(config)
    want = {"token_drop_rate": ("drop_ratio", 0.0), "attn_mode": ("attention", "block_causal")}
    want |= {"layer_norm_eps": ("norm_eps", 1e-5), "norm_eps": ("norm_eps", 1e-5)}
    for key in change:
        field, value = want[key]
        assert getattr(imported, field) == value


def test_a_generic_top_level_key_does_not_hide_the_model_section(tmp_path):
    """A training config's own ``name`` and the data's ``num_frames`` at the top level are not the encoder's
    section: the ``model`` section beside them is read; a top level that states only a model name still is."""
    ckpt = lightning_checkpoint(fixture(1), tmp_path / "a.ckpt")
    obj = torch.load(ckpt, weights_only=False)
    obj["hyper_parameters"] = {"name": "run-42", "num_frames": 16, "model": {"num_heads": 3, "attn_mode": "full"}}
    torch.save(obj, ckpt)
    cfg = read_official(ckpt).config
    assert (cfg.heads, cfg.attention) == (3, "bidirectional")
    named = lightning_checkpoint(official_sized("vit_tiny"), tmp_path / "named.ckpt")
    obj = torch.load(named, weights_only=False)
    obj["hyper_parameters"] = {"name": "vit_tiny", "attention": "block_causal"}
    torch.save(obj, named)
    assert read_official(named).config.heads == 3  # the top level named the model: vit_tiny has 3 heads


def official_sized(name: str) -> dict[str, torch.Tensor]:
    """Random encoder tensors (``encoder.*``, the official layout, tubelet 1, 16-px patches) at the width and
    depth of an official factory."""
    width, depth, _ = OFFICIAL_SIZES[name]
    g = torch.Generator().manual_seed(0)
    t = {"patch_embed.proj.weight": (width, 3, 1, 16, 16), "patch_embed.proj.bias": (width,)}
    t |= {"cls_token": (1, 1, width), "norm.weight": (width,), "norm.bias": (width,)}
    for i in range(depth):
        for key, shape in {
            "norm1.weight": (width,), "norm1.bias": (width,), "norm2.weight": (width,), "norm2.bias": (width,),
            "attn.qkv.weight": (3 * width, width), "attn.qkv.bias": (3 * width,),
            "attn.proj.weight": (width, width), "attn.proj.bias": (width,),
            "mlp.fc1.weight": (4 * width, width), "mlp.fc1.bias": (4 * width,),
            "mlp.fc2.weight": (width, 4 * width), "mlp.fc2.bias": (width,),
        }.items():  # fmt: skip
            t[f"blocks.{i}.{key}"] = shape
    return {f"encoder.{k}": torch.randn(shape, generator=g) * 0.02 for k, shape in t.items()}


@pytest.mark.parametrize("name", ["vit_tiny", "vit_base", "vit_large"])
def test_a_model_name_that_does_not_fit_the_weights_is_refused_naming_both(tmp_path, name):
    """A config naming an official factory over weights of another width or depth would split the width into
    that factory's heads (vit_large over 96-wide weights: 16 heads of width 6), another function: refused in one
    line naming both sizes, before anything is written; --heads makes the name a label and imports the weights
    as they are; the name over weights of its own size gives its heads (vit_tiny: 3)."""
    t = fixture(1)
    width, depth, heads = OFFICIAL_SIZES[name]
    for config in ({"name": name, "attn_mode": "full"}, {"name": name, "num_heads": 3, "attn_mode": "full"}):
        folder = hub_folder(tmp_path / f"hub-{len(config)}", t, "", config)
        with pytest.raises(WeightsError, match=rf"names {name} \(width {width}, depth {depth}, {heads} heads\), the "
                           r"weights are 96 wide and 2 deep") as err:  # fmt: skip
            run_import(folder, tmp_path / "out")
        assert "\n" not in str(err.value) and not (tmp_path / "out").exists()
    assert run_import(folder, tmp_path / "out", "--heads", "3") == 0  # the caller's heads: the name is a label
    released = {**released_config(1, "full"), "name": name}
    from levjepa.formats.reading.official import released_config as automodel_config

    with pytest.raises(WeightsError, match=f"names {name}"):
        automodel_config(released)  # AutoModel reads the released schema the same way
    fits = hub_folder(tmp_path / "fits", official_sized("vit_tiny"), "", {"name": "vit-tiny", "attn_mode": "full"})
    assert read_official(fits).config.heads == 3


def test_the_released_weights_file_loads_like_its_folder(tmp_path):
    from levjepa.formats.reading.load import load

    rel = released_folder(tmp_path / "rel", fixture(1), 1, "block_causal")
    folder, file = load(rel), load(rel / "model.safetensors")  # levjepa.load
    assert folder.cfg == file.cfg and all(torch.equal(v, file.state_dict()[k]) for k, v in folder.state_dict().items())


def test_an_import_with_the_official_outputs_carries_its_validation_table(tmp_path, capsys):
    """``--reference`` (the official forward's outputs on a fixed clip: here the fixture, made by the official
    code) is compared with the imported encoder before anything is written; the card's validation table
    states the difference, the reference's hash and how it was measured. A reference of another model, or
    numbers the import does not reproduce, export nothing."""
    import hashlib

    t = fixture(1)
    folder = released_folder(tmp_path / "released", t, 1, "block_causal")
    reference = FIXTURES / "official_tau1.safetensors"
    assert run_import(folder, tmp_path / "out", "--reference", str(reference)) == 0
    assert "validated against the official block_causal outputs" in capsys.readouterr().out
    imported = json.loads((tmp_path / "out" / "config.json").read_text())["imported_from"]
    v = imported["validation"]
    assert v["mode"] == "block_causal" and v["tokens"] == t["output.block_causal"].shape[1]
    assert 0 <= v["mean_abs_diff"] <= v["max_abs_diff"] < 1e-5 and v["input_shape"] == [2, 3, 8, 32, 32]
    assert v["reference_sha256"] == hashlib.sha256(reference.read_bytes()).hexdigest()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "## Validation" in card and f"(SHA-256 `{v['reference_sha256']}`)" in card
    assert f"| max abs difference | {v['max_abs_diff']:.3g} (tolerance 0.0001) |" in card
    assert "| measured | `levjepa import --reference`: float32, CPU" in card
    assert "pipeline_tag: feature-extraction" in card and "license: cc-by-nc-4.0" in card
    assert f"| weights file SHA-256 | `{imported['sha256']}`" in card  # provenance: source, revision, hash
    # a reference of another model (τ = 2: other token counts), and outputs the weights do not give
    with pytest.raises(WeightsError, match="a reference made with another model"):
        run_import(folder, tmp_path / "other", "--reference", str(FIXTURES / "official_tau2.safetensors"))
    wrong = {k: v for k, v in t.items() if k in ("input.video", "output.block_causal")}
    wrong["output.block_causal"] = wrong["output.block_causal"] + 1e-3
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    with pytest.raises(WeightsError, match=r"differs from the official output.block_causal by up to 0.001") as err:
        run_import(folder, tmp_path / "wrong", "--reference", str(tmp_path / "wrong.safetensors"))
    assert "\n" not in str(err.value) and not (tmp_path / "wrong").exists() and not (tmp_path / "other").exists()
    # a full-attention import is compared with the reference's output.full (the official attn_mode's name)
    full = released_folder(tmp_path / "released-full", t, 1, "full")
    assert run_import(full, tmp_path / "out-full", "--reference", str(reference)) == 0
    v_full = json.loads((tmp_path / "out-full" / "config.json").read_text())["imported_from"]["validation"]
    assert v_full["mode"] == "full" and v_full["max_abs_diff"] < 1e-5
    # without a reference the card says what was not measured
    assert run_import(folder, tmp_path / "plain") == 0
    plain = (tmp_path / "plain" / "README.md").read_text()
    assert "## Validation" in plain and "so this export was not compared with the" in plain
