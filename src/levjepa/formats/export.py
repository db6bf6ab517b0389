"""An encoder-only release (``levjepa export RUN_DIR --out DIR``), and ``levjepa.load(path)`` to read it back.

An export holds exactly what inference needs, nothing that can run code::

    DIR/encoder.safetensors   the VideoEncoder's state dict ("<param>"); metadata: encoder_config (JSON),
                              weights ("ema" | "online") and weights_note (what the copy averages), step,
                              format "levjepa-encoder/1", levjepa version
    DIR/config.json           an ExportRecord (``levjepa.formats.load``): {"model": EncoderConfig, "format",
                              "weights", "weights_note", "step", "source", "exported_at", "run_config":
                              the run's PretrainConfig}; read back with from_dict
    DIR/MODEL_CARD.md         how it was trained: architecture, objective and λ, data sources, steps,
                              final losses from metrics.jsonl, how to load it

No projector (training only, SPEC §2), no optimiser state. The EMA (Polyak) weights — a weighted average
of the online weights the run trained, see ``levjepa.train.ema`` — are exported by default, as the papers
evaluate them; the command prints which copy it exported. ``levjepa.load(path, weights=...)`` returns a
ready encoder (frozen, ``eval()``) from an export, a checkpoint or a run directory (``levjepa.formats.load``);
its ``weights_info`` says which copy was read; a pickle-bearing file is refused unread.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from levjepa import __version__
from levjepa.config import to_dict
from levjepa.formats.load import EXPORT_FORMAT, ExportRecord, LoadedEncoder, WeightsKind, load_encoder
from levjepa.weights import (
    CONFIG,
    EXPORT_WEIGHTS,
    MODEL_CARD,
    atomic_write_text,
    read_metrics,
    save_tensors,
    write_json,
)

__all__ = ["export_encoder", "model_card"]


def _final_losses(rows: list[dict[str, Any]], upto: int | None) -> dict[str, float]:
    """Mean of each numeric loss term over the last 10 % of logged steps (at most ``upto``)."""
    rows = [r for r in rows if upto is None or r["step"] <= upto]
    if not rows:
        return {}
    tail = rows[-max(1, len(rows) // 10) :]
    keys = [k for k in tail[-1] if k != "step" and isinstance(tail[-1][k], int | float)]
    preferred = [k for k in ("loss", "invariance", "sigreg", "pred", "localreg") if k in keys]
    out = {}
    for k in preferred or keys[:6]:
        vals = [float(r[k]) for r in tail if isinstance(r.get(k), int | float)]
        if vals:
            out[k] = statistics.fmean(vals)
    return out


def _count_params(encoder: torch.nn.Module) -> int:
    return sum(p.numel() for p in encoder.parameters())


def _fields(section: Any) -> str:
    """``key value, ...`` of a config section's plain fields (nested sections left out)."""
    return ", ".join(f"{k} {v}" for k, v in to_dict(section).items() if not isinstance(v, dict))


def model_card(loaded: LoadedEncoder, metrics: list[dict[str, Any]]) -> str:
    """A short Markdown model card: what the encoder is and how it was trained."""
    cfg, run = loaded.config, loaded.run_config
    arch = (
        f"ViT, dim {cfg.dim}, depth {cfg.depth}, heads {cfg.heads}, patch {cfg.patch_size}, "
        f"tubelet {cfg.tubelet}, {cfg.attention} attention, "
        f"final LayerNorm {'on' if cfg.final_norm else 'off'}, "
        f"3D RoPE, {_count_params(loaded.encoder) / 1e6:.2f} M parameters"
    )
    losses = _final_losses(metrics, loaded.step)
    loss_text = ", ".join(f"{k} {v:.4g}" for k, v in losses.items()) or "not recorded (no metrics.jsonl)"
    objective = "unknown" if run is None else run.objective.name
    lam = "unknown" if run is None else f"{run.objective.lam_value}"
    lines = [
        "# LeVJEPA encoder",
        "",
        f"A video encoder pretrained by levjepa with self-supervision (no labels), objective `{objective}`.",
        "",
        "| | |",
        "| --- | --- |",
        f"| architecture | {arch} |",
        f"| weights | {loaded.weights}{f' ({loaded.note})' if loaded.note else ''} |",
        f"| training steps | {loaded.step if loaded.step is not None else 'unknown'} |",
        f"| objective | {objective}, λ = {lam} |",
    ]
    if run is not None:
        data, synth = run.data, run.data.synthetic
        lines.append(f"| data sources | {', '.join(data.sources)} |")
        if "synthetic" in data.sources:  # the synthetic section is always there; it describes the data only then
            lines.append(
                f"| built-in benchmark clips | image source {synth.image_source}, "
                f"{synth.num_frames}×{synth.size}×{synth.size} |"
            )
        lines += [
            f"| views | {data.num_global} global @ {data.global_size} px + {data.num_local} local @ "
            f"{data.local_size} px, {data.num_frames} frames |",
            f"| optimiser | {_fields(run.optim)} |",
            f"| training | {_fields(run.train)} |",
        ]
    else:
        lines.append("| data sources | unknown |")
    lines += [
        f"| final losses (mean of the last 10 % of logged steps) | {loss_text} |",
        f"| exported from | `{loaded.source}` |",
        "",
        "## Use",
        "",
        "```python",
        "import levjepa",
        "encoder = levjepa.load('PATH/TO/THIS/FOLDER')      # frozen, eval() mode",
        "out = encoder.forward_features(video)              # video: float [B, 3, T, H, W], ImageNet-normalised",
        "out.cls, out.patches                               # [B, D], [B, T*H/p*W/p, D]",
        "```",
        "",
        "Images are clips too: repeat the frame along time. No token is dropped at inference. The patch tokens of",
        "frame t depend only on frames ≤ t (block-causal attention) unless the architecture says bidirectional.",
        "",
        "Files: `encoder.safetensors` (weights, no pickle), `config.json` (architecture and the run's config).",
        "",
    ]
    return "\n".join(lines)


def export_encoder(
    source: str | Path, out: str | Path, *, weights: WeightsKind = "ema", device: str = "cpu"
) -> LoadedEncoder:
    """Write ``out/{encoder.safetensors, config.json, MODEL_CARD.md}`` for the encoder at ``source``."""
    loaded = load_encoder(source, weights=weights, device=device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = ExportRecord(
        model=loaded.config,
        weights=loaded.weights,
        weights_note=loaded.note,
        step=loaded.step,
        source=loaded.source,
        exported_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        run_config=loaded.run_config,
    )
    meta = {
        "format": EXPORT_FORMAT,
        "encoder_config": to_dict(loaded.config),
        "weights": loaded.weights,
        "weights_note": loaded.note,
        "step": loaded.step,
        "levjepa_version": __version__,
    }
    save_tensors(out / EXPORT_WEIGHTS, loaded.encoder.state_dict(), meta)
    write_json(out / CONFIG, to_dict(record))
    metrics = read_metrics(loaded.run_dir) if loaded.run_dir else []
    atomic_write_text(out / MODEL_CARD, model_card(loaded, metrics))
    return loaded
