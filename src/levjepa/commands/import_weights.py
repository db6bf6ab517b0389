"""``levjepa import SRC --out DIR``: official LeVJEPA weights as a levjepa export that every command reads.

SRC is an official model directory (a download of a hub repo: ``config.json`` + ``model.safetensors``), an
official training checkpoint (``.ckpt``) or a safetensors file of official tensors. What the weights and
the source's config cannot tell is given as options; the error names what is missing. Examples::

    levjepa import ~/LeVJEPA-VideoMix-Large --out imported/vitl --heads 16 --attention block_causal
    levjepa import outputs/checkpoints/last.ckpt --out imported/mine          # EMA copy when it has one
    levjepa probe imported/vitl --task index:train.txt,val.txt
    levjepa pretrain --preset vit-b-paper model.init_from=imported/mine ...   # continued pretraining

How the official computation maps onto levjepa's encoder, and what was verified against the reference code:
:mod:`levjepa.formats.official`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from levjepa.formats.export import write_export
from levjepa.formats.load import load_encoder
from levjepa.formats.official import Overrides, read_official
from levjepa.weights import WeightsError

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="official model folder (config.json + model.safetensors), .ckpt or .safetensors")
    parser.add_argument("--out", required=True, help="output folder for the levjepa export (must not exist)")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema", help="which copy (default: ema)")
    parser.add_argument("--heads", type=int, default=None, help="attention heads, when the source does not state it")
    parser.add_argument(
        "--attention",
        choices=("block_causal", "full", "bidirectional"),
        default=None,
        help="attention mode, when the source does not state it (the official default: block_causal)",
    )
    parser.add_argument("--norm-eps", type=float, default=None, help="LayerNorm eps (default: stated, else 1e-6)")
    parser.add_argument("--prefix", default=None, help="key prefix of the encoder, when the file holds several")
    parser.add_argument(
        "--license", default="cc-by-nc-4.0", help="licence in the export's card (default: the official weights')"
    )
    parser.add_argument(
        "--trust-pickle",
        action="store_true",
        help="read a .ckpt that torch.load(weights_only=True) refuses; unpickling can run code from the file",
    )


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists():
        raise WeightsError(f"{out}: already exists; choose a new --out folder (nothing was written)")
    over = Overrides(heads=args.heads, attention=args.attention, norm_eps=args.norm_eps, prefix=args.prefix)
    official = read_official(args.src, over, weights=args.weights, trust_pickle=args.trust_pickle)
    imported = {
        "source": str(Path(args.src).resolve()),
        "copy": official.copy,
        "stated": official.stated,
        "options": {k: v for k, v in vars(over).items() if v is not None},
        "imported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "layout": "MLO-lab/LeVJEPA module.py (encoder.*, projector.net.*)",
    }
    tmp = out.with_name(f".{out.name}.importing")
    write_export(
        tmp,
        config=official.config,
        encoder_state=official.encoder,
        weights=official.copy,
        note=official.note,
        source=official.source,
        projector_state=official.projector,
        imported_from=imported,
        license=args.license,
    )
    tmp.rename(out)
    loaded = load_encoder(out)  # read back: what every command will read
    cfg = loaded.config
    print(
        f"imported {official.note} from {official.source} -> {out} "
        f"(ViT dim {cfg.dim}, depth {cfg.depth}, heads {cfg.heads}, tubelet {cfg.tubelet}, {cfg.attention}"
        f"{', with projector' if official.projector is not None else ''})"
    )
    return 0
