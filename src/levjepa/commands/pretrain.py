"""``levjepa pretrain --preset NAME [section.key=value ...]`` — the main job.

Examples::

    levjepa pretrain --preset demo-cpu                       # 10 minutes on 2 CPU cores, ends with probes
    levjepa pretrain --preset vit-b-paper data.sources=/data/k710_index.txt --run-dir runs/vitb
    torchrun --nproc_per_node=8 -m levjepa pretrain --preset vit-b-paper data.sources=/data/videos
    levjepa pretrain --resume runs/vitb                      # continue exactly where it stopped
    levjepa pretrain --preset demo-cpu --print-config        # the resolved config, then exit

Overrides are checked against the config's fields: an unknown key or a bad value fails at once with the
valid choices listed.

The run itself is :func:`levjepa.train.pretrain`; with ``train.eval_at_end`` (the demo) this command then
reads the final checkpoint back from the run directory and evaluates it on the built-in benchmark:
frozen probes of the EMA and online weights beside the same architecture at the random initialisation the
run started from (``probe_results.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from levjepa.config import ConfigError, apply_overrides, from_dict, to_dict
from levjepa.data import DataError
from levjepa.eval.benchmark import EvalConfig, evaluate_benchmark
from levjepa.eval.load import load_encoder, random_encoder
from levjepa.presets import PRESETS, needs_sources, preset
from levjepa.train.config import PretrainConfig
from levjepa.train.loop import TrainingStopped, pretrain, summary_json
from levjepa.train.run_dir import RunDirError
from levjepa.weights import CONFIG, PROBE_RESULTS, read_json, write_json

__all__ = ["add_arguments", "evaluate_run", "main", "resolve_config"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="named preset (see levjepa.presets)")
    parser.add_argument("--run-dir", type=Path, help="run directory (default: runs/<preset>-<time>)")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    parser.add_argument("--overwrite", action="store_true", help="delete an existing --run-dir first")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    parser.add_argument("--summary-json", type=Path, help="also write the end-of-run summary here")


def resolve_config(preset_name: str | None, overrides: list[str], resume: Path | None) -> PretrainConfig:
    """The run's config: a preset (or the resumed run's ``config.json``) with ``overrides`` applied."""
    if resume is not None:
        if preset_name:
            raise ConfigError("--resume continues a run with its own config; drop --preset")
        if not (resume / CONFIG).is_file():
            raise ConfigError(f"{resume}: no config.json here, so there is no run to resume")
        cfg = from_dict(PretrainConfig, read_json(resume / CONFIG))
    elif preset_name:
        cfg = preset(preset_name)
    else:
        raise ConfigError("give --preset NAME (demo-cpu, vit-tiny-consumer, vit-b-paper) or --resume RUN_DIR")
    cfg = apply_overrides(cfg, overrides)
    if needs_sources(cfg):
        raise ConfigError(
            f"preset {cfg.preset} trains on your videos: add data.sources=PATH "
            "(a folder of videos, a V-JEPA index file `path label`, or several comma-separated)"
        )
    return cfg


def evaluate_run(cfg: PretrainConfig, run_dir: Path) -> dict[str, Any]:
    """The demo's ending: frozen probes on the built-in benchmark of the run's last checkpoint (EMA and online
    weights) beside the random initialisation the run started from; writes ``probe_results.json``."""
    encoders = {
        "pretrained (EMA)": load_encoder(run_dir, weights="ema").encoder,
        "pretrained (online)": load_encoder(run_dir, weights="online").encoder,
        "random init": random_encoder(cfg.model, seed=cfg.train.seed).encoder,
    }
    evaluation = EvalConfig(budget=cfg.train.eval_budget, seed=cfg.train.seed)
    result = evaluate_benchmark(encoders, cfg.data.synthetic, evaluation)
    data = result.to_json()
    write_json(run_dir / PROBE_RESULTS, data)
    print(result.table(), file=sys.stderr)
    return data


def main(args: argparse.Namespace) -> int:
    try:
        cfg = resolve_config(args.preset, args.overrides, args.resume)
    except ConfigError as err:
        print(f"levjepa pretrain: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(to_dict(cfg), indent=2))
        return 0
    try:
        summary = pretrain(
            cfg,
            args.resume if args.resume is not None else args.run_dir,
            resume=args.resume is not None,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    except (RunDirError, TrainingStopped, DataError, ConfigError) as err:
        print(f"levjepa pretrain: {err}", file=sys.stderr)
        return 1
    if cfg.train.eval_at_end and summary.rank == 0:
        summary.probe_results = evaluate_run(cfg, summary.run_dir)
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary_json(summary), indent=2))
    return 0
