"""``levjepa export RUN --out DIR [--weights ema|online] [--with-projector]``: an encoder in the layout the
Hugging Face tools read (``model.safetensors``, ``config.json``, ``preprocessor_config.json``, ``README.md``
with the model card) that ``levjepa.load(DIR)``, ``levjepa.from_pretrained(DIR)`` and transformers'
``AutoModel`` read back. Publish it with ``huggingface-cli upload ORG/NAME DIR``. What an export holds:
:mod:`levjepa.formats.export`.
"""

from __future__ import annotations

import argparse

from levjepa.formats.export import export_encoder

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory, checkpoint directory or checkpoint file, or an export")
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema", help="which weights (default: ema)")
    parser.add_argument(
        "--with-projector",
        action="store_true",
        help="also write the training projector (projector.safetensors), for continued pretraining elsewhere",
    )


def main(args: argparse.Namespace) -> int:
    loaded = export_encoder(args.run, args.out, weights=args.weights, with_projector=args.with_projector)
    print(
        f"exported {loaded.describe()} -> {args.out}/model.safetensors (+ config.json, preprocessor_config.json, "
        "README.md)"
    )
    return 0
