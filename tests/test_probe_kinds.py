"""One registry of probe kinds (``levjepa.model.probe_kinds``): a kind registered by one class is a probe of
the harness (its name, input, grid, epochs, table label), a ``HeadConfig`` kind that ``build_head`` builds and
a kept probe that rebuilds to the numbers it was scored with — without touching any other file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from levjepa.config import ConfigError
from levjepa.eval.config import PROBE_INPUTS, PROBE_KINDS, PROBE_LABELS, PROBES, EvalConfig, probe_names
from levjepa.eval.harness import evaluate
from levjepa.eval.probes import build_probe_grid, probe_config
from levjepa.eval.source import FeatureSource, MemorySource
from levjepa.model import probe_kinds
from levjepa.model.classifier import HeadConfig, build_head
from levjepa.model.probe_heads import AttentiveProbeGrid, LinearProbeGrid
from levjepa.model.probe_kinds import HeadKind, head_kind, register


def test_the_built_in_kinds_are_the_probes_they_were():
    assert PROBES == probe_names() == ("attentive", "linear", "linear_cls", "knn")
    assert dict(PROBE_INPUTS) == {"attentive": "tokens", "linear": "mean", "linear_cls": "cls", "knn": "cls"}
    assert dict(PROBE_KINDS) == {"attentive": "attentive", "linear": "linear", "linear_cls": "linear"}
    assert PROBE_LABELS["linear_cls"] == "linear (CLS)" and PROBE_LABELS.get("nope", "nope") == "nope"
    cfg = probe_config("demo")
    assert cfg.grid("attentive") == [(lr, wd) for wd in cfg.weight_decays for lr in cfg.lrs]
    assert cfg.grid("linear") == [(lr, wd) for wd in cfg.linear_weight_decays for lr in cfg.linear_lrs]
    assert (cfg.epochs_of("attentive"), cfg.epochs_of("linear")) == (cfg.epochs, cfg.linear_epochs)
    assert isinstance(build_head(HeadConfig(kind="attentive", dim=64)), AttentiveProbeGrid)
    assert isinstance(build_probe_grid("linear", cfg, 8, 3), LinearProbeGrid)
    assert head_kind("attentive").result_kind(4) == "attentive4" and head_kind("linear").result_kind(4) == "linear"
    with pytest.raises(ConfigError, match=r"head\.kind='mlp': valid choices are attentive, linear"):
        HeadConfig(kind="mlp")
    with pytest.raises(ConfigError, match="a linear head reads mean or cls"):
        HeadConfig(kind="linear", input="tokens")
    with pytest.raises(ValueError, match="valid choices are attentive, linear"):
        build_probe_grid("mlp", cfg, 8, 3)


class _Task:
    """The smallest task of the harness: CLS and mean features in memory (two classes, split on CLS dim 0)."""

    num_classes: ClassVar[Mapping[str, int]] = {"label": 2}
    image_source = "toy"
    clip_text = "none"
    report_seconds = False

    def prepare(self, encoders: Any, cfg: EvalConfig) -> bool:
        return True

    def sources(self, name: str, encoder: Any, cfg: EvalConfig) -> dict[str, FeatureSource]:
        gen = torch.Generator().manual_seed(0)
        out: dict[str, FeatureSource] = {}
        for split, n in (("train", 64), ("val", 32)):
            y = torch.arange(n) % 2
            cls = torch.randn(n, 8, generator=gen) + 6.0 * y[:, None] * torch.eye(8)[0]
            out[split] = MemorySource({"cls": cls, "mean": torch.randn(n, 8, generator=gen)}, {"label": y}, name=split)
        return out

    def info(self) -> dict[str, Any]:
        return {}


def _register_zero(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Register the toy kind ``zero`` into a copy of the registry (restored after the test); returns the list
    its ``build`` appends each grid's probe count to."""
    monkeypatch.setattr(probe_kinds, "KINDS", dict(probe_kinds.KINDS))
    built: list[int] = []

    @register
    class Zero(HeadKind):
        """A toy kind: linear heads on the raw CLS (not standardised), initialised at zero."""

        name = "zero"
        probes: ClassVar[Mapping[str, tuple[str, str]]] = {"zero_cls": ("cls", "zero-init (CLS)")}

        def build(self, num_probes: int, dim: int, num_classes: int, **options: Any) -> nn.Module:
            grid = LinearProbeGrid(num_probes, dim, num_classes)
            nn.init.zeros_(grid.head.weight)
            built.append(num_probes)
            return grid

    return built


def test_a_kind_registered_by_one_class_is_a_probe_of_the_harness(monkeypatch):
    built = _register_zero(monkeypatch)
    assert probe_names() == ("attentive", "linear", "linear_cls", "zero_cls", "knn")
    assert (PROBE_INPUTS["zero_cls"], PROBE_KINDS["zero_cls"], PROBE_LABELS["zero_cls"]) == (
        "cls",
        "zero",
        "zero-init (CLS)",
    )
    probe = probe_config("demo", linear_epochs=40)
    cfg = EvalConfig(probes=("zero_cls",), probe=probe, keep_heads="best")
    result = evaluate({"enc": nn.Identity()}, _Task(), cfg)
    assert result is not None
    res = result.results["enc"]["label"]["zero_cls"]
    assert built == [len(probe.grid("linear"))]  # the kind's own build made the trained grid
    assert res.kind == "zero" and res.epochs == 40 and len(res.val_acc) == len(probe.grid("linear"))
    assert res.reported > 90.0  # it learned the class from CLS dim 0
    assert "zero-init (CLS)" in result.table()
    # the kept probe is a HeadConfig of the new kind that build_head rebuilds to the scored numbers
    head_cfg = HeadConfig(**res.head_fields)
    assert (head_cfg.kind, head_cfg.input) == ("zero", "cls")
    head = build_head(head_cfg)
    assert isinstance(head, LinearProbeGrid) and bool((head.head.weight == 0).all())
    head.load_state_dict(res.heads[res.best])
    val = _Task().sources("enc", None, cfg)["val"]
    pred = head(val.read("cls", torch.arange(32)))[0].argmax(-1)
    assert 100.0 * float((pred == val.labels["label"]).float().mean()) == res.best_val
    with pytest.raises(ConfigError, match="a zero head reads cls"):
        HeadConfig(kind="zero", input="mean")


def test_a_probe_name_is_registered_once(monkeypatch):
    monkeypatch.setattr(probe_kinds, "KINDS", dict(probe_kinds.KINDS))

    class Again(HeadKind):
        name = "again"
        probes: ClassVar[Mapping[str, tuple[str, str]]] = {"linear_cls": ("cls", "again")}

    with pytest.raises(ValueError, match="linear_cls are taken"):
        register(Again)
    with pytest.raises(ConfigError, match="probe 'again': valid choices are attentive, linear, linear_cls, knn"):
        EvalConfig(probes=("again",))


def test_a_registered_kind_is_a_fine_tuning_head_too(monkeypatch, tmp_path, capsys):
    # the same one class: `finetune head=zero` trains a head of that kind on what it reads (CLS), its best
    # classifier records the kind and runs in classify; an unregistered kind is refused naming the valid ones
    from levjepa.cli import main
    from levjepa.finetune.config import FinetuneConfig
    from levjepa.formats.reading.classifier import load_classifier
    from test_classify import write_index
    from test_export import make_run_dir

    with pytest.raises(ConfigError, match="head='zero': valid choices are attentive, linear"):
        FinetuneConfig(task=("a", "b"), head="zero")
    _register_zero(monkeypatch)
    media = tmp_path / "media"
    files = [write_index(media, s, n, seed) for s, n, seed in (("train", 6, 0), ("val", 3, 1), ("test", 3, 2))]
    run, out = make_run_dir(tmp_path, steps=(5,)), tmp_path / "ft"
    recipe = ["frames=4", "frame_stride=1", "size=16", "steps=2", "batch_size=2", "warmup_steps=1", "workers=0"]
    args = ["finetune", str(run), "--task", "index:" + ",".join(map(str, files)), "--out", str(out), "--device", "cpu"]
    assert main([*args, *recipe, "eval_every=2", "checkpoint_every=2", "loggers=", "head=zero"]) == 0
    loaded = load_classifier(out / "best")
    assert (loaded.record.head.kind, loaded.record.head.input) == ("zero", "cls")
    assert isinstance(loaded.model.head, LinearProbeGrid)
    capsys.readouterr()
    assert main(["classify", str(out / "best"), str(files[2]), "--workers", "0"]) == 0
    assert "accuracy" in capsys.readouterr().out
