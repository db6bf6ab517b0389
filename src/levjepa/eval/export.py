"""An encoder-only release (``levjepa export RUN_DIR --out DIR``), and ``levjepa.load(path)`` to read it back.

An export holds exactly what inference needs, nothing that can run code::

    DIR/encoder.safetensors   the VideoEncoder's state dict ("<param>"); metadata: encoder_config (JSON),
                              weights ("ema" | "online") and weights_note (what the copy averages), step,
                              format "levjepa-encoder/1", levjepa version
    DIR/config.json           {"format", "model": EncoderConfig, "weights", "weights_note", "step", "source",
                               "run_config"}
    DIR/MODEL_CARD.md         how it was trained: architecture, objective and λ, data sources, steps,
                              final losses from metrics.jsonl, how to load it

No projector (training only, SPEC §2), no optimiser state. The EMA (Polyak) weights — a weighted average
of the online weights the run trained, see ``levjepa.train.ema`` — are exported by default, as the papers
evaluate them; the command prints which copy it exported. ``levjepa.load(path, weights=...)`` returns a
ready encoder (frozen, ``eval()``) from an export, a checkpoint or a run directory (``levjepa.eval.load``);
its ``weights_info`` says which copy was read; a pickle-bearing file is refused unread.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from levjepa.config import to_dict
from levjepa.eval.load import LoadedEncoder, WeightsKind, load_encoder
from levjepa.weights import atomic_write_text, save_tensors

__all__ = ["EXPORT_FORMAT", "export_encoder", "load", "model_card", "read_metrics"]

EXPORT_FORMAT = "levjepa-encoder/1"


def load(path: str | Path, weights: WeightsKind = "ema", device: str | torch.device = "cpu") -> torch.nn.Module:
    """A ready, frozen ``VideoEncoder`` from an export, a checkpoint or a run directory (``levjepa.load``).

    Its ``weights_info`` attribute says which copy was read and what it is (``LoadedEncoder.describe``), e.g.
    ``"ema weights step 800 (EMA: weighted average of the online weights over 800 update(s), …) from …"``.
    """
    loaded = load_encoder(path, weights=weights, device=device)
    loaded.encoder.weights_info = loaded.describe()
    return loaded.encoder


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of ``metrics.jsonl`` that carry a ``step`` (malformed lines are skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int | float):
            rows.append(row)
    return rows


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


def model_card(loaded: LoadedEncoder, metrics: list[dict[str, Any]]) -> str:
    """A short Markdown model card: what the encoder is and how it was trained."""
    cfg = to_dict(loaded.config)
    run = loaded.run_config or {}
    obj = run.get("objective") or {}
    data = run.get("data") or {}
    optim = run.get("optim") or {}
    train = run.get("train") or {}
    lam = obj.get("lam")
    lam_text = "default for the objective" if lam is None else f"{lam}"
    arch = (
        f"ViT, dim {cfg['dim']}, depth {cfg['depth']}, heads {cfg['heads']}, patch {cfg['patch_size']}, "
        f"tubelet {cfg['tubelet']}, {cfg['attention']} attention, "
        f"final LayerNorm {'on' if cfg['final_norm'] else 'off'}, "
        f"3D RoPE, {_count_params(loaded.encoder) / 1e6:.2f} M parameters"
    )
    losses = _final_losses(metrics, loaded.step)
    loss_text = ", ".join(f"{k} {v:.4g}" for k, v in losses.items()) or "not recorded (no metrics.jsonl)"
    sources = data.get("sources", "unknown")
    source_list = [str(s) for s in sources] if isinstance(sources, list | tuple) else [str(sources)]
    sources = ", ".join(source_list)
    # the synthetic section is always in the config; it describes the data only when a source uses it
    uses_synthetic = "synthetic" in source_list
    synth = data.get("synthetic") if uses_synthetic and isinstance(data.get("synthetic"), dict) else None
    lines = [
        "# LeVJEPA encoder",
        "",
        "A video encoder pretrained by levjepa with self-supervision (no labels), "
        f"objective `{obj.get('name', 'unknown')}`.",
        "",
        "| | |",
        "| --- | --- |",
        f"| architecture | {arch} |",
        f"| weights | {loaded.weights}{f' ({loaded.note})' if loaded.note else ''} |",
        f"| training steps | {loaded.step if loaded.step is not None else 'unknown'} |",
        f"| objective | {obj.get('name', 'unknown')}, λ = {lam_text} |",
        f"| data sources | {sources} |",
    ]
    if synth:
        lines.append(
            f"| built-in benchmark clips | image source {synth.get('image_source')}, "
            f"{synth.get('num_frames')}×{synth.get('size')}×{synth.get('size')} |"
        )
    if data:
        lines.append(
            f"| views | {data.get('num_global', '?')} global @ {data.get('global_size', '?')} px + "
            f"{data.get('num_local', '?')} local @ {data.get('local_size', '?')} px, "
            f"{data.get('num_frames', '?')} frames |"
        )
    if optim:
        lines.append(
            "| optimiser | " + ", ".join(f"{k} {v}" for k, v in optim.items() if not isinstance(v, dict)) + " |"
        )
    if train:
        lines.append(
            "| training | " + ", ".join(f"{k} {v}" for k, v in train.items() if not isinstance(v, dict)) + " |"
        )
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
    cfg = to_dict(loaded.config)
    meta = {
        "format": EXPORT_FORMAT,
        "encoder_config": cfg,
        "weights": loaded.weights,
        "weights_note": loaded.note,
        "step": loaded.step,
    }
    try:
        from levjepa import __version__

        meta["levjepa_version"] = __version__
    except ImportError:  # pragma: no cover
        pass
    save_tensors(out / "encoder.safetensors", loaded.encoder.state_dict(), meta)
    side = {
        "format": EXPORT_FORMAT,
        "model": cfg,
        "weights": loaded.weights,
        "weights_note": loaded.note,
        "step": loaded.step,
        "source": loaded.source,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_config": loaded.run_config,
    }
    atomic_write_text(out / "config.json", json.dumps(side, indent=2) + "\n")
    metrics = read_metrics(loaded.run_dir) if loaded.run_dir else []
    atomic_write_text(out / "MODEL_CARD.md", model_card(loaded, metrics))
    return loaded
