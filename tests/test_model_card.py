"""The model card is facts then text (``levjepa.formats.writing.card``): every fact of an export's inputs reaches the
card, and every field of :class:`CardFacts` changes the text it renders. (Checked once against the card of
``export.model_card`` at 9055897 for a run with a probe table and official ancestry, imported weights, an
unknown licence and a fine-tuned classifier: the same text, byte for byte — bench/finetune.md.)"""

from __future__ import annotations

import dataclasses
import json

from levjepa.data.eval_clip import ViewSpec
from levjepa.formats.reading.classifier import ClassifierRecord
from levjepa.formats.reading.load import read_run_config
from levjepa.formats.writing.card import CardFacts, card_facts, render_card
from levjepa.model.classifier import HeadConfig
from levjepa.weights import read_metrics
from test_export import make_run_dir

PROBES = {
    "accuracy": {"pretrained-ema": {"ucf": {"linear": 50.0, "attentive": 61.25}}, "random": {"ucf": {"linear": 33.0}}},
    "chance": {"ucf": 33.3},
}
OFFICIAL = {"source": "galilai-group/X", "revision": "abc", "sha256": "feed", "file": "model.ckpt"}


def _run_facts(tmp_path) -> CardFacts:
    run = make_run_dir(tmp_path, steps=(5,))
    cfg = read_run_config(run)
    return card_facts(
        cfg.model, weights="ema", note="EMA of 5 updates", step=5, source=str(run), run=cfg, metrics=read_metrics(run),
        probe_results=PROBES, imported_from=None, classifier=None, params=1_234_567, license="cc-by-nc-4.0",
        derived_from={"init_from": "start/run", "imported_from": OFFICIAL, "found": True},
    )  # fmt: skip


def test_a_run_exports_card_states_every_fact(tmp_path):
    facts = _run_facts(tmp_path)
    card = render_card(facts)
    front, body = card.split("\n---\n", 1)
    assert "license: cc-by-nc-4.0" in front and "pipeline_tag: feature-extraction" in front
    assert "datasets:\n- synthetic" in front  # the run's data sources
    e = facts.encoder
    assert f"ViT, dim {e.dim}, depth {e.depth}, heads {e.heads}, patch {e.patch_size}" in body
    assert "1.23 M parameters" in body and "| weights | ema (EMA of 5 updates) |" in body
    assert "| training steps | 5 |" in body and "objective `levjepa`" in body
    # the losses of the last 10 % of logged steps (make_run_dir logs 1/s at step s: the last is 0.2)
    assert "| final losses (mean of the last 10 % of logged steps) | loss 0.2, invariance 0.1, sigreg 5 |" in body
    assert "official LeVJEPA weights `galilai-group/X` at revision `abc`, model.ckpt SHA-256 `feed`" in body
    assert "through `start/run` (model.init_from)" in body and "CC BY-NC 4.0 (non-commercial use only)" in body
    assert "| task | probe | pretrained-ema | random | chance |" in body
    assert "| ucf | attentive | 61.2 | nan | 33.3 |" in body and "| ucf | linear | 50.0 | 33.0 | 33.3 |" in body
    assert "built-in benchmark clips" in body  # trained on the synthetic source
    assert body.endswith("```\n") and "@article{kuhn2026levjepa" in body


def test_every_fact_changes_the_card(tmp_path):
    """Drop or change any one fact and the text changes: no fact is gathered and then lost."""
    facts = _run_facts(tmp_path)
    card = render_card(facts)
    clf = _classifier_facts(tmp_path)
    other = {
        "encoder": dataclasses.replace(facts.encoder, depth=facts.encoder.depth + 1),
        "params": 7_654_321,
        "weights": "online",
        "note": "another",
        "step": 4,
        "source": "elsewhere",
        "license": "mit",
        "imported": clf.imported,
        "derived": None,
        "run": None,
        "losses": (),
        "probes": None,
        "classifier": clf.classifier,
    }
    assert set(other) == {f.name for f in dataclasses.fields(CardFacts)}
    for name, value in other.items():
        assert value != getattr(facts, name), name
        assert render_card(dataclasses.replace(facts, **{name: value})) != card, name


def _classifier_facts(tmp_path) -> CardFacts:
    best = tmp_path / "ft" / "best"
    best.mkdir(parents=True)
    (best / "model.safetensors").write_bytes(b"")
    (tmp_path / "ft" / "results.json").write_text(json.dumps({"best_step": 30, "test_acc": 62.5}))
    head = HeadConfig(kind="attentive", input="tokens", dim=64, num_classes=3)
    record = ClassifierRecord(head, ("walk", "run", "jump"), ViewSpec(), ".", "finetuned", "f" * 64,
                              trained={"step": 30, "val_acc": 0.75})  # fmt: skip
    run = _run_facts(tmp_path / "r")
    return card_facts(
        run.encoder, weights="finetuned", note="fine-tuned", step=30, source=str(best / "model.safetensors"),
        run=None, metrics=[], probe_results=None, imported_from=OFFICIAL, classifier=record, params=10,
        license="cc-by-nc-4.0", derived_from=None,
    )  # fmt: skip


def test_a_classifiers_card_states_its_classes_head_and_scores(tmp_path):
    card = render_card(_classifier_facts(tmp_path))
    assert "pipeline_tag: video-classification" in card and "- video-classification" in card
    assert "# LeVJEPA video classifier" in card and "with a attentive head" in card
    assert "| labels (`config.id2label`) | `walk`, `run`, `jump` |" in card
    assert "| head | attentive probe head on tokens (width 64, depth 1) |" in card
    assert "| validation accuracy (%) | 75.0 |" in card  # a fraction is shown as a percentage
    assert "| test accuracy (%) | 62.5 |" in card  # results.json beside best/, for this very step
    assert "| fine-tuning steps (best) | 30 |" in card
    assert "| imported from | `galilai-group/X` at revision `abc` (official LeVJEPA layout) |" in card
    assert "| weights file SHA-256 | `feed` (model.ckpt) |" in card
    assert "AutoModelForVideoClassification.from_pretrained(PATH)" in card and "self-supervision" not in card
