"""An export's model card (``README.md``): first the facts, then the text.

:func:`card_facts` gathers what the card says from the export's inputs — the encoder config and its size, which
weights (copy, note, step, where they were exported from), the licence and where the weights came from (the
official release they were imported from, the weights a run continued from), the run that trained them (its
objective, data, views, optimiser; the mean of its last logged losses), its frozen-probe table and, for a
classifier, its labels, head and accuracy — into a :class:`CardFacts`, typed and holding no text. Only
:func:`render_card` writes markdown: the hub's YAML front matter (``library_name``, ``license``,
``pipeline_tag``, tags, the run's data sources), a table of the facts, how to use the model and the citation.
``levjepa.formats.writing.export.write_export`` calls both; ``tests/test_model_card.py`` holds the text to the facts.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levjepa.config import to_dict
from levjepa.formats.reading.classifier import ClassifierRecord
from levjepa.formats.reading.validation import Validation
from levjepa.model import EncoderConfig
from levjepa.model.readout_layers import layers_text
from levjepa.train.config import PretrainConfig
from levjepa.weights import read_json

__all__ = [
    "AUTO_HINT",
    "CITATION",
    "LICENSES",
    "CardFacts",
    "ClassifierFacts",
    "DerivedFrom",
    "OfficialOrigin",
    "ProbeTable",
    "RunFacts",
    "card_facts",
    "render_card",
]

CITATION = """@article{kuhn2026levjepa,
  title   = {LeVJEPA: Efficient \\& Scalable Video Pretraining without the Heuristics},
  author  = {Kuhn, Lukas and Maes, Lucas and Serra, Giuseppe and Le Lidec, Quentin
             and LeCun, Yann and Balestriero, Randall and Buettner, Florian},
  year    = {2026}
}"""
LICENSES = {
    "mit": "MIT",
    "cc-by-nc-4.0": "CC BY-NC 4.0 (non-commercial use only)",
    "other": "unknown: the weights its run started from (model.init_from) could not be read to tell their licence",
}


@dataclass(frozen=True)
class OfficialOrigin:
    """Official LeVJEPA weights an export holds or descends from (an ``imported_from`` record)."""

    source: str = "?"
    revision: str | None = None
    sha256: str | None = None
    file: str | None = None
    validation: Validation | None = None  # the comparison with the official forward made at import, if any

    @staticmethod
    def of(record: Mapping[str, Any] | None) -> OfficialOrigin | None:
        if not isinstance(record, Mapping):
            return None
        return OfficialOrigin(
            str(record.get("source", "?")), record.get("revision") or None, record.get("sha256") or None,
            record.get("file"), Validation.of(record.get("validation")),
        )  # fmt: skip


@dataclass(frozen=True)
class DerivedFrom:
    """Where the weights a run continued from came from (``export.weights_lineage``'s ``derived_from``)."""

    init_from: str
    official: OfficialOrigin | None  # the official weights the chain of starts reaches, if it does
    found: bool | None  # False: the start could not be read


@dataclass(frozen=True)
class RunFacts:
    """What the card says of the pretraining run the weights come from."""

    objective: str
    lam: str
    sources: tuple[str, ...]
    synthetic: tuple[str, int, int] | None  # image source, frames, size of the built-in clips (when trained on)
    views: tuple[int, int, int, int, int]  # global views, their size, local views, their size, frames
    optim: tuple[tuple[str, Any], ...]  # the optimiser's plain fields
    train: tuple[tuple[str, Any], ...]  # the training section's plain fields
    init_from: str | None


@dataclass(frozen=True)
class ClassifierFacts:
    """What the card says of a classifier: its classes, its head and its scores."""

    labels: tuple[str, ...]
    head_kind: str
    head_input: str
    head_dim: int
    head_depth: int
    val_acc: float | None
    test_acc: float | None  # the fine-tuning's results.json beside best/, when it scored this very step
    step: Any  # the fine-tuning step of the best classifier (None: not recorded)
    task: str | None = None  # the task a kept probe was trained on (levjepa probe's name for it)
    probe: str | None = None  # a kept probe's name (attentive, linear, ...): a head on a frozen encoder
    views: str = ""  # the views its scores were measured with (ViewSpec.describe)


@dataclass(frozen=True)
class ProbeTable:
    """A run's frozen-probe table: per task and probe, the accuracy of each encoder column and the chance level."""

    encoders: tuple[str, ...]
    rows: tuple[tuple[str, str, tuple[float, ...], float | None], ...]  # task, probe, accuracies, chance
    has_chance: bool


@dataclass(frozen=True)
class CardFacts:
    """Everything a model card states (module doc); :func:`render_card` is its only reader."""

    encoder: EncoderConfig
    params: int
    weights: str
    note: str
    step: int | None
    source: str
    license: str
    imported: OfficialOrigin | None
    derived: DerivedFrom | None
    run: RunFacts | None
    losses: tuple[tuple[str, float], ...]
    probes: ProbeTable | None
    classifier: ClassifierFacts | None


def _final_losses(rows: list[dict[str, Any]], upto: int | None) -> tuple[tuple[str, float], ...]:
    """Mean of each numeric loss term over the last 10 % of logged steps (at most ``upto``)."""
    rows = [r for r in rows if upto is None or r["step"] <= upto]
    if not rows:
        return ()
    tail = rows[-max(1, len(rows) // 10) :]
    keys = [k for k in tail[-1] if k != "step" and isinstance(tail[-1][k], int | float)]
    preferred = [k for k in ("loss", "invariance", "sigreg", "pred", "localreg") if k in keys]
    out = []
    for k in preferred or keys[:6]:
        vals = [float(r[k]) for r in tail if isinstance(r.get(k), int | float)]
        if vals:
            out.append((k, statistics.fmean(vals)))
    return tuple(out)


def _plain(section: Any) -> tuple[tuple[str, Any], ...]:
    """A config section's plain fields (nested sections left out)."""
    return tuple((k, v) for k, v in to_dict(section).items() if not isinstance(v, dict))


def _run_facts(run: PretrainConfig) -> RunFacts:
    data, synth = run.data, run.data.synthetic
    # the synthetic section describes the data only when the run trained on the built-in clips
    built_in = (synth.image_source, synth.num_frames, synth.size) if "synthetic" in data.sources else None
    views = (data.num_global, data.global_size, data.num_local, data.local_size, data.num_frames)
    return RunFacts(
        run.objective.name, f"{run.objective.lam_value}", tuple(data.sources), built_in, views, _plain(run.optim),
        _plain(run.train), run.model.init_from or None,
    )  # fmt: skip


def _probe_facts(results: Mapping[str, Any] | None) -> ProbeTable | None:
    """The run's frozen-probe table (``probe_results.json``), one row per task and probe of its first column."""
    accuracy = (results or {}).get("accuracy")
    if not isinstance(accuracy, Mapping) or not accuracy:
        return None
    encoders = tuple(accuracy)
    chance = (results or {}).get("chance") or {}
    rows = tuple(
        (task, probe, tuple(float(accuracy[e].get(task, {}).get(probe, float("nan"))) for e in encoders),
         float(chance[task]) if task in chance else None)
        for task, probes in accuracy[encoders[0]].items() for probe in probes
    )  # fmt: skip
    return ProbeTable(encoders, rows, bool(chance))


def _score(trained: Mapping[str, Any], key: str) -> float | None:
    value = trained.get(key)
    return float(value) if isinstance(value, int | float) else None


def _classifier_facts(record: ClassifierRecord, source: str) -> ClassifierFacts:
    """A classifier's facts; the fine-tuning's ``results.json`` beside ``best/`` adds the test accuracy."""
    trained = dict(record.trained)
    folder = Path(source).parent if Path(source).is_file() else Path(source)  # best/ (source: its weights file)
    results = folder.parent / "results.json"
    if source and results.is_file():
        data = read_json(results)
        if data.get("best_step") == trained.get("step") and isinstance(data.get("test_acc"), int | float):
            trained["test_acc"] = data["test_acc"]
    h = record.head
    task, probe = trained.get("task"), trained.get("probe")
    return ClassifierFacts(
        tuple(record.labels), h.kind, h.input, h.dim, h.depth, _score(trained, "val_acc"), _score(trained, "test_acc"),
        trained.get("step"), str(task) if task else None, str(probe) if probe else None, record.protocol.describe(),
    )  # fmt: skip


def card_facts(
    config: EncoderConfig,
    *,
    weights: str,
    note: str,
    step: int | None,
    source: str,
    run: PretrainConfig | None,
    metrics: list[dict[str, Any]],
    probe_results: Mapping[str, Any] | None,
    imported_from: Mapping[str, Any] | None,
    classifier: ClassifierRecord | None,
    params: int,
    license: str,
    derived_from: Mapping[str, Any] | None,
) -> CardFacts:
    """The facts of an export's card, from the inputs ``write_export`` was given (module doc)."""
    derived = None
    if derived_from:
        found = derived_from.get("found")
        official = OfficialOrigin.of(derived_from.get("imported_from"))
        derived = DerivedFrom(
            str(derived_from.get("init_from", "?")), official, found if isinstance(found, bool) else None
        )
    return CardFacts(
        encoder=config,
        params=params,
        weights=weights,
        note=note,
        step=step,
        source=source,
        license=license,
        imported=OfficialOrigin.of(imported_from) if imported_from else None,
        derived=derived,
        run=None if run is None else _run_facts(run),
        losses=_final_losses(metrics, step),
        probes=_probe_facts(probe_results),
        classifier=None if classifier is None else _classifier_facts(classifier, source),
    )


def _official_text(o: OfficialOrigin) -> str:
    at = f" at revision `{o.revision}`" if o.revision else ""
    digest = f", {o.file} SHA-256 `{o.sha256}`" if o.sha256 else ""
    return f"official LeVJEPA weights `{o.source}`{at}{digest}"


def _derived_text(d: DerivedFrom) -> str:
    """The start (``model.init_from``) and, when the chain reaches them, the official weights."""
    start = f"`{d.init_from}` (model.init_from)"
    if d.official is not None:
        return f"{_official_text(d.official)}, through {start}"
    if d.found is False:
        return f"{start}, which could not be read"
    return start


def _validation_lines(o: OfficialOrigin) -> list[str]:
    """The import's validation table: the imported encoder against the official forward (module
    ``levjepa.formats.reading.validation``), or, without reference outputs, what was and was not measured."""
    v, head = o.validation, ["", "## Validation", ""]
    if v is None:
        return [
            *head,
            "No reference outputs were given at import (`levjepa import SRC --reference REF.safetensors`: the",
            "official forward's `last_hidden_state` on a fixed clip), so this export was not compared with the",
            "official forward. levjepa's reading of the official layout is tested against the official `module.py`'s",
            "outputs at ≤ 1e-5 (`tests/test_official.py` in levjepa).",
        ]
    clip = f"`input.video` {list(v.input_shape)}, {v.tokens} tokens per clip (CLS + patches), {v.mode} attention"
    return [
        *head,
        "| | |",
        "| --- | --- |",
        f"| compared with | the official forward's `last_hidden_state`: `output.{v.mode}` of `{v.reference}` "
        f"(SHA-256 `{v.reference_sha256}`) |",
        f"| clip | {clip} |",
        f"| max abs difference | {v.max_abs_diff:.3g} (tolerance {v.tolerance:g}) |",
        f"| mean abs difference | {v.mean_abs_diff:.3g} |",
        f"| measured | `levjepa import --reference`: {v.measured} |",
    ]


def _classifier_rows(c: ClassifierFacts) -> list[str]:
    shown = ", ".join(f"`{n}`" for n in c.labels[:20]) + (f", … ({len(c.labels)} in all)" if len(c.labels) > 20 else "")
    lines = [
        f"| task | {f'`{c.task}`: ' if c.task else ''}video classification, {len(c.labels)} classes |",
        f"| labels (`config.id2label`) | {shown} |",
        f"| head | {c.head_kind} probe head on {c.head_input} (width {c.head_dim}, depth {c.head_depth}) |",
    ]
    if c.views:
        lines.append(f"| views (`levjepa classify`; the processors take one) | {c.views} |")
    for value, name in ((c.val_acc, "validation accuracy (%)"), (c.test_acc, "test accuracy (%)")):
        if value is not None:
            lines.append(f"| {name} | {100 * value if value <= 1 else value:.1f} |")
    if c.step is not None:
        lines.append(f"| fine-tuning steps (best) | {c.step} |")
    return lines


def _run_rows(r: RunFacts) -> list[str]:
    lines = [f"| objective | {r.objective}, λ = {r.lam} |", f"| data sources | {', '.join(r.sources)} |"]
    if r.synthetic is not None:
        image_source, frames, size = r.synthetic
        lines.append(f"| built-in benchmark clips | image source {image_source}, {frames}×{size}×{size} |")
    num_global, global_size, num_local, local_size, frames = r.views
    fields = [", ".join(f"{k} {v}" for k, v in section) for section in (r.optim, r.train)]
    lines += [
        f"| views | {num_global} global @ {global_size} px + {num_local} local @ {local_size} px, {frames} frames |",
        f"| optimiser | {fields[0]} |",
        f"| training | {fields[1]} |",
    ]
    if r.init_from:
        lines.append(f"| initialised from | `{r.init_from}` |")
    return lines


def _probe_rows(t: ProbeTable | None) -> list[str]:
    if t is None:
        return []
    head = ["task", "probe", *t.encoders, *(["chance"] if t.has_chance else [])]
    rows = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for task, probe, accs, chance in t.rows:
        level = [f"{chance:.1f}"] if chance is not None else ([""] if t.has_chance else [])
        rows.append(f"| {task} | {probe} | " + " | ".join([*(f"{a:.1f}" for a in accs), *level]) + " |")
    caption = "Frozen-encoder accuracy (%) of the probe chosen on validation, as `levjepa probe` reports it."
    return ["", "## Frozen probes (this run)", "", caption, "", *rows]


# what transformers says of a levjepa folder when levjepa was never imported, and what to do about it
AUTO_HINT = (
    "without `import levjepa` transformers says it does not recognize model type `levjepa` and that its version "
    "may be out of date: no upgrade helps, `import levjepa` does"
)
_USE_CLASSIFIER = [
    "```python",
    "import levjepa",
    "model = levjepa.from_pretrained('PATH/OR/ORG/NAME')   # LeVJEPAForVideoClassification, frozen",
    "logits = model(pixel_values=video).logits            # float [B, 3, T, H, W], ImageNet-normalised",
    "model.config.id2label[int(logits.argmax(-1)[0])]     # the class name",
    "```",
    "",
    "With `transformers` installed, `import levjepa` (before or after transformers) registers the `levjepa` model",
    "type, and `AutoModelForVideoClassification.from_pretrained(PATH)` loads it too (no remote code;",
    f"{AUTO_HINT}), and `pipeline('video-classification', model=PATH)(VIDEO_FILE)` gives its top labels (the",
    "frames sampled as the model was scored: `video_preprocessor_config.json`); `levjepa classify PATH VIDEO`",
    "reads video files with every view of the protocol it was scored with.",
]
_USE_ENCODER = [
    "```python",
    "import levjepa",
    "model = levjepa.from_pretrained('PATH/OR/ORG/NAME')   # LeVJEPAModel, frozen, eval() mode",
    "out = model(pixel_values=video)                      # float [B, 3, T, H, W], ImageNet-normalised",
    "out.last_hidden_state, out.pooler_output             # [B, 1 + T/τ·H/p·W/p, D] (CLS first), [B, D]",
    "encoder = levjepa.load('PATH')                       # the levjepa VideoEncoder itself",
    "```",
    "",
    "With `transformers` installed, `import levjepa` (before or after transformers) registers the `levjepa` model",
    f"type, and `AutoModel.from_pretrained(PATH)` loads it too (no remote code; {AUTO_HINT}).",
]


def render_card(f: CardFacts) -> str:
    """``README.md`` of the facts ``f``: YAML front matter the hub reads, then what the model is and how it was
    made, how to use it and the citation."""
    c, e = f.classifier, f.encoder
    front = [
        "---",
        "library_name: levjepa",
        f"license: {f.license}",
        f"pipeline_tag: {'video-classification' if c else 'feature-extraction'}",
        "tags:",
        "- levjepa",
        "- video",
        "- vision-transformer",
        *(["- video-classification"] if c else ["- self-supervised", "- feature-extraction"]),
    ]
    if f.run is not None and f.run.sources:
        front += ["datasets:", *(f"- {s}" for s in f.run.sources)]
    front.append("---")
    arch = (
        f"ViT, dim {e.dim}, depth {e.depth}, heads {e.heads}, patch {e.patch_size}, tubelet {e.tubelet}, "
        f"{e.attention} attention, final LayerNorm {'on' if e.final_norm else 'off'}, 3D RoPE ({e.rope_layout} "
        f"layout), {f.params / 1e6:.2f} M parameters"
    )
    if e.readout_layers is not None:  # levjepa export --layers: what last_hidden_state holds
        arch += f"; reads {layers_text(e.readout_layers, e.depth)} ({e.readout_dim} channels, each block's output "
        arch += "through the final norm)"
    if c:
        title = "LeVJEPA video classifier"
        how = (
            f"a frozen LeVJEPA encoder with the {c.probe} probe `levjepa probe` trained and kept on its features"
            if c.probe
            else f"a LeVJEPA encoder with a {c.head_kind} head, fine-tuned on labelled clips"
        )
        what = (
            f"A video classifier: {how} ({len(c.labels)} classes). `AutoModelForVideoClassification`, "
            "`pipeline('video-classification')` and `levjepa.from_pretrained` give its logits; `levjepa classify` "
            "runs it on video files."
        )
    else:
        title = "LeVJEPA encoder (official weights, imported)" if f.imported else "LeVJEPA encoder"
        what = "A video encoder pretrained with self-supervision (no labels)" + (
            f", objective `{f.run.objective}`." if f.run is not None else "."
        )
    lines = [*front, "", f"# {title}", "", what, "", "| | |", "| --- | --- |"]
    if c:
        lines += _classifier_rows(c)
    lines += [
        f"| architecture | {arch} |",
        f"| weights | {f.weights}{f' ({f.note})' if f.note else ''} |",
        f"| training steps | {f.step if f.step is not None else 'unknown'} |",
    ]
    if f.imported:
        at = f" at revision `{f.imported.revision}`" if f.imported.revision else ""
        lines.append(f"| imported from | `{f.imported.source}`{at} (official LeVJEPA layout) |")
        if f.imported.sha256:
            lines.append(f"| weights file SHA-256 | `{f.imported.sha256}` ({f.imported.file}) |")
    if f.derived:
        lines.append(f"| derived from | {_derived_text(f.derived)} |")
    if f.run is not None:
        lines += _run_rows(f.run)
    if f.losses:
        loss_text = ", ".join(f"{k} {v:.4g}" for k, v in f.losses)
        lines.append(f"| final losses (mean of the last 10 % of logged steps) | {loss_text} |")
    lines.append(f"| exported from | `{f.source}` |")
    lines.append(f"| licence of the weights | {LICENSES.get(f.license, f.license)} |")
    lines += _probe_rows(f.probes)
    if f.imported:
        lines += _validation_lines(f.imported)
    lines += [
        "",
        "## Use",
        "",
        *(_USE_CLASSIFIER if c else _USE_ENCODER),
        "Images are clips too: repeat the frame along time. No token is dropped at inference. The patch tokens of",
        "frame t depend only on frames ≤ t (block-causal attention) unless the architecture says bidirectional.",
        "Preprocessing: `video_preprocessor_config.json` (`AutoVideoProcessor` with levjepa installed: a file, frames",
        "or a batch in, `pixel_values_videos` `[B, T, C, H, W]` out, the frames sampled as the model was trained) and",
        "`preprocessor_config.json` (transformers' `AutoImageProcessor`: frames out `[B, T, C, H, W]`).",
        "",
        "Files: `model.safetensors` (weights, no pickle), `config.json` (architecture, preprocessing, provenance).",
        "",
        "## Citation",
        "",
        "```bibtex",
        CITATION,
        "```",
        "",
    ]
    return "\n".join(lines)
