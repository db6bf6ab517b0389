"""``levjepa export RUN --out DIR [--weights ema|online]``: an encoder-only release (safetensors + config +
model card) that ``levjepa.load(DIR)`` reads back. What an export holds: :mod:`levjepa.formats.export`.
"""

from __future__ import annotations

import argparse

from levjepa.formats.export import export_encoder

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory, checkpoint directory or checkpoint file")
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema", help="which weights (default: ema)")


def main(args: argparse.Namespace) -> int:
    loaded = export_encoder(args.run, args.out, weights=args.weights)
    print(f"exported {loaded.describe()} -> {args.out}/encoder.safetensors (+ config.json, MODEL_CARD.md)")
    return 0
