"""Every cache and compatibility check is keyed by what the encoder computes (``levjepa.model.fingerprint``),
not by its weights alone: two imports of the same official weights with another attention mode or head split
get different feature stores in a shared ``--features`` folder, and a kept probe of one is refused on the other
in one line. Records written before function fingerprints (a 40-digit weights fingerprint) are still checked,
against the weights."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import save_file

from levjepa.cli import main
from levjepa.formats.reading.classifier import load_classifier, read_classifier
from levjepa.formats.reading.load import load_encoder
from levjepa.model.fingerprint import TRAINING_ONLY, function_fingerprint, matches
from levjepa.weights import WeightsError, weights_fingerprint, write_json
from test_classify import index_task  # noqa: F401 (a fixture)
from test_official import fixture, official_encoder, run_import


@pytest.fixture
def two_imports(tmp_path):
    """The same official weights imported twice: block-causal and bidirectional."""
    src = tmp_path / "official.safetensors"
    save_file(official_encoder(fixture(1)), str(src))
    a, b = tmp_path / "causal", tmp_path / "full"
    assert run_import(src, a, "--heads", "3", "--attention", "block_causal") == 0
    assert run_import(src, b, "--heads", "3", "--attention", "full") == 0
    return a, b


def test_same_weights_other_function_other_fingerprint(two_imports):
    a, b = (load_encoder(p).encoder for p in two_imports)
    assert weights_fingerprint(a) == weights_fingerprint(b)  # not a weight changed
    assert function_fingerprint(a) != function_fingerprint(b)
    # what a frozen forward never reads does not change the function
    import dataclasses

    for name in TRAINING_ONLY:
        value = {"drop_ratio": 0.5, "drop_mode": "tube", "init_std": 0.1, "tubelet_init": "inflate",
                 "grad_checkpointing": True, "init_from": "elsewhere"}[name]  # fmt: skip
        same = type(a)(dataclasses.replace(a.cfg, **{name: value}))
        same.load_state_dict(a.state_dict())
        assert function_fingerprint(same) == function_fingerprint(a), name
    # an old record (weights fingerprint) is compared with the weights, a new one with the function
    assert matches(weights_fingerprint(a), b) == (True, weights_fingerprint(b))
    assert matches(function_fingerprint(a), b) == (False, function_fingerprint(b))


def test_shared_features_folder_and_kept_probes_follow_the_function(tmp_path, two_imports, index_task, capsys):  # noqa: F811
    a, b = two_imports
    features = tmp_path / "features"
    task = "index:" + ",".join(map(str, index_task[:2]))
    common = ["--task", task, "--protocol", "tiny", "--no-baseline", "--workers", "0", "--features", str(features)]
    for model in (a, b):
        args = ["probe", str(model), *common, "--probe", "linear", "--set", "linear_epochs=2"]
        assert main([*args, "--probes-dir", str(model / "probes")]) == 0
    stores = sorted(p.name for p in features.iterdir() if (p / "store.json").is_file())
    prints = {json.loads((features / s / "store.json").read_text())["encoder"] for s in stores}
    assert len(prints) == 2 and len(stores) == 2 * 2  # two encoders × (train, val), none shared
    capsys.readouterr()
    kept = a / "probes" / "media" / "linear"
    assert main(["classify", str(kept), str(index_task[1]), "--encoder", str(b), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "a head reads only the encoder it was trained on" in err
    assert main(["classify", str(kept), str(index_task[1]), "--workers", "0"]) == 0  # its own encoder reads it


def test_a_record_from_before_function_fingerprints_is_checked_against_the_weights(tmp_path, two_imports, index_task):  # noqa: F811
    a = two_imports[0]
    task = "index:" + ",".join(map(str, index_task[:2]))
    args = ["probe", str(a), "--task", task, "--protocol", "tiny", "--no-baseline", "--workers", "0"]
    assert main([*args, "--probe", "linear", "--set", "linear_epochs=2", "--probes-dir", str(a / "probes")]) == 0
    kept = a / "probes" / "media" / "linear"
    record = json.loads((kept / "classifier.json").read_text())
    record["encoder_fingerprint"] = weights_fingerprint(load_encoder(a).encoder)  # as an older levjepa wrote it
    write_json(kept / "classifier.json", record)
    assert read_classifier(kept).encoder_fingerprint == record["encoder_fingerprint"]
    load_classifier(kept)  # the weights it names: read
    other = tmp_path / "other.safetensors"
    enc = official_encoder(fixture(1))
    enc = {k: v + 1 if k.endswith("cls_token") else v for k, v in enc.items()}
    save_file(enc, str(other))
    assert run_import(other, tmp_path / "other", "--heads", "3", "--attention", "block_causal") == 0
    with pytest.raises(WeightsError, match="a head reads only the encoder it was trained on"):
        load_classifier(kept, encoder=tmp_path / "other")
