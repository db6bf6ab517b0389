"""Weights out into the tools users already use: the official calling convention (``LeVJEPAModel``,
``from_pretrained``), transformers' ``AutoModel`` on a levjepa export, and timm's names on the encoder."""

from __future__ import annotations

import pytest
import torch

import levjepa
from levjepa.formats.reading.load import load_encoder
from levjepa.formats.transformers.hub import LeVJEPAModel, from_pretrained
from levjepa.formats.writing.export import export_encoder
from levjepa.model import VideoEncoder, encoder_config
from levjepa.weights import WeightsError
from test_export import make_run_dir


def _clip(cfg, seed=0, frames=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, frames, 2 * cfg.patch_size, 3 * cfg.patch_size, generator=g)


@pytest.fixture
def export(tmp_path):
    run = make_run_dir(tmp_path)
    out = tmp_path / "export"
    export_encoder(run, out)
    return run, out


def test_from_pretrained_gives_the_official_outputs_of_the_run_encoder(export):
    run, out = export
    model = levjepa.from_pretrained(out)
    assert isinstance(model, LeVJEPAModel) and "ema weights step 20" in model.weights_info
    source = load_encoder(run).encoder
    x = _clip(source.cfg)
    out_ = model(pixel_values=x)
    feats = source.forward_features(x)
    n = 4 * 2 * 3  # T/τ · H/p · W/p
    assert out_.last_hidden_state.shape == (2, 1 + n, 32)
    assert torch.equal(out_.last_hidden_state[:, 0], feats.cls) and torch.equal(out_.pooler_output, feats.cls)
    assert torch.equal(out_.last_hidden_state[:, 1:], feats.patches)  # every patch token, (t, y, x) order
    assert torch.equal(out_["pooler_output"], out_[1]) and list(out_.keys()) == ["last_hidden_state", "pooler_output"]
    # hidden states: the embeddings, then every block's output before the final norm (depth + 1, transformers'
    # convention); the last one normed is the output
    hs = model(x, output_hidden_states=True)
    assert len(hs.hidden_states) == source.cfg.depth + 1
    blocks = source.get_intermediate_layers(x, [0, 1], norm=False)
    assert all(torch.equal(h, b.tokens) for h, b in zip(hs.hidden_states[1:], blocks, strict=True))
    assert torch.allclose(source.norm(hs.hidden_states[-1]), out_.last_hidden_state, atol=1e-6)
    # an image batch is one frame per clip
    img = model(pixel_values=x[:, :, 0])
    assert img.last_hidden_state.shape == (2, 1 + 2 * 3, 32)


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(WeightsError, match="not a hub repo id"):
        from_pretrained(tmp_path / "nothing" / "here" / "at-all")


def test_transformers_automodel_loads_a_levjepa_export_without_remote_code(export):
    import transformers  # a test extra: it imports beside torch 2.13 (README, "Weights in and out")

    assert levjepa.register_transformers()
    run, out = export
    model = transformers.AutoModel.from_pretrained(str(out))  # no trust_remote_code
    config = transformers.AutoConfig.from_pretrained(str(out))
    assert config.model_type == "levjepa" and config.hidden_size == 32
    source = load_encoder(run).encoder
    x = _clip(source.cfg, seed=1)
    with torch.no_grad():
        got = model(pixel_values=x)
        want = source.forward_features(x)
    assert torch.equal(got.pooler_output, want.cls) and torch.equal(got.last_hidden_state[:, 1:], want.patches)


def test_timm_names_on_the_encoder():
    cfg = encoder_config("vit-test")
    enc = VideoEncoder(cfg).eval()
    x = _clip(cfg, seed=2)
    assert enc.num_features == cfg.dim and enc.num_prefix_tokens == 1
    assert enc.pretrained_cfg["mean"] == (0.485, 0.456, 0.406) and enc.pretrained_cfg["input_size"][0] == 3
    with torch.no_grad():
        feats = enc.forward_features(x)
        assert torch.equal(enc.forward_head(feats), feats.cls)
        assert torch.equal(enc.forward_head(feats.tokens, pre_logits=True), feats.cls)  # timm's [B, 1+L, D] input
        final, inter = enc.forward_intermediates(x, indices=[0, -1], output_fmt="NCTHW", return_prefix_tokens=True)
        layers = enc.get_intermediate_layers(x, [0, -1], norm=False)
    assert torch.equal(final, feats.tokens) and len(inter) == 2
    grid = (4, 2, 3)
    for (patches, cls), layer in zip(inter, layers, strict=True):
        assert patches.shape == (2, cfg.dim, *grid) and cls.shape == (2, 1, cfg.dim)
        # NCTHW is the NLC tokens laid on the (t, y, x) grid: token n = (t·H' + y)·W' + x
        assert torch.equal(patches[:, :, 1, 0, 2], layer.patches[:, (1 * 2 + 0) * 3 + 2])
    only = enc.forward_intermediates(x, 1, intermediates_only=True, norm=True)
    assert torch.allclose(only[0], feats.patches, atol=1e-6)  # the last block, normed: the output's patches
    with pytest.raises(ValueError, match="NLC, NCTHW"):
        enc.forward_intermediates(x, output_fmt="NCHW")


def test_a_hub_repo_id_is_downloaded_with_huggingface_hub_then_loaded(export, monkeypatch):
    import huggingface_hub

    run, out = export
    asked = []

    def snapshot_download(repo_id, revision=None, **_):
        asked.append((repo_id, revision))
        return str(out)  # what the hub cache would hold

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    model = from_pretrained("my-org/levjepa-demo", revision="v1")
    assert asked == [("my-org/levjepa-demo", "v1")]
    x = _clip(model.config, seed=4)
    assert torch.equal(model(x).pooler_output, load_encoder(run).encoder(x))


def test_from_pretrained_imports_an_official_folder_on_the_fly(tmp_path):
    from test_official import fixture, hub_folder

    t = fixture(2)
    src = hub_folder(tmp_path / "hub", t, "backbone.", {"model_type": "levjepa_official", "attn_mode": "full"})
    with pytest.raises(WeightsError, match="--heads"):
        from_pretrained(src)  # the heads are not stated: the error says what to give
    model = from_pretrained(src, heads=3)
    got = model(pixel_values=t["input.video"]).last_hidden_state
    assert (got - t["output.full"]).abs().max().item() < 1e-5 and "imported" in model.weights_info


def test_the_official_revision_and_hash_are_said_of_the_official_file_not_of_its_copy(tmp_path, monkeypatch):
    import json

    import levjepa.formats.transformers.hub as hub
    from levjepa.formats.reading.origin import Origin
    from test_official import fixture, released_folder, run_import

    imp = tmp_path / "imp"
    assert run_import(released_folder(tmp_path / "rel", fixture(1), 1, "block_causal"), imp) == 0
    config = json.loads((imp / "config.json").read_text())
    config["imported_from"].update(source="galilai-group/LeVJEPA-VideoMix-Large", revision="e831a03")
    (imp / "config.json").write_text(json.dumps(config))
    official = f"galilai-group/LeVJEPA-VideoMix-Large@e831a03 (sha256 {config['imported_from']['sha256']})"
    info = load_encoder(imp).describe()
    assert info.endswith(f"from {imp / 'model.safetensors'}; imported from {official}")
    # the import published as a hub repo: its own revision, then the official one, each of its own file
    monkeypatch.setattr(hub, "resolve", lambda p, r=None: Origin(imp, "org/x", repo_id="org/x", revision="feedface"))
    assert hub.from_pretrained("org/x").weights_info.endswith(f"from org/x@feedface; imported from {official}")
    # official weights read as they are keep the @revision (sha256 ...) form of the file read
    rel = Origin(tmp_path / "rel", "org/rel", repo_id="org/rel", revision="cafe")
    monkeypatch.setattr(hub, "resolve", lambda p, r=None: rel)
    info = hub.from_pretrained("org/rel").weights_info
    assert "from org/rel@cafe (sha256 " in info and "imported from" not in info


def test_a_failing_registration_warns_once_and_never_breaks_the_import_of_transformers(monkeypatch):
    import sys
    import types
    import warnings

    monkeypatch.setitem(
        sys.modules, "levjepa.formats.transformers.hub", None
    )  # importing it raises, as a broken install would
    monkeypatch.setattr(levjepa, "_HOOK_WARNED", False, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in levjepa.TRANSFORMERS_AUTO:  # both hooks fire inside one `import transformers`
            levjepa._on_transformers(types.ModuleType(name))  # returns: nothing escapes into the import
    assert [w.category for w in caught] == [RuntimeWarning] and "register_transformers" in str(caught[0].message)
