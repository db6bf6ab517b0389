"""``levjepa import SRC --out DIR``: official LeVJEPA weights as a levjepa export that every command reads.

SRC is an official model directory (``config.json`` + ``model.safetensors``), a hub repo id (``ORG/NAME``,
``--revision``: downloaded or read from the hub cache with huggingface_hub, ``HF_HUB_OFFLINE=1`` offline), an
official training checkpoint (``.ckpt``) or a safetensors file of official tensors. What the weights and
the source's config cannot tell is given as options; the error names what is missing. The export records
the source, the revision and the weights file's SHA-256 (``--sha256`` pins it; the released checkpoint at its
pinned revision is checked without it). ``--reference REF.safetensors`` (the official forward's
``last_hidden_state`` on a fixed clip, ``levjepa.formats.reading.validation``) compares the imported encoder with it
before anything is written and puts the difference in the card's validation table. Examples::

    levjepa import galilai-group/LeVJEPA-VideoMix-Large --revision e831a0347737fcaa660b39c57d41c109de399845 --out vitl
    levjepa import ~/LeVJEPA-VideoMix-Large --out imported/vitl                # a folder downloaded by hand
    levjepa import outputs/checkpoints/last.ckpt --out imported/mine          # EMA copy when it has one
    levjepa probe imported/vitl --task index:train.txt,val.txt
    levjepa pretrain --preset vit-b-paper model.init_from=imported/mine ...   # continued pretraining

How the official computation maps onto levjepa's encoder, and what was verified against the reference code:
:mod:`levjepa.formats.reading.official`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from levjepa.commands._outputs import claim_folder, staged_folder
from levjepa.formats.reading.load import OFFICIAL_PREPROCESSING, load_encoder
from levjepa.formats.reading.official import Overrides, read_official
from levjepa.formats.reading.origin import resolve
from levjepa.formats.reading.validation import validate
from levjepa.formats.writing.export import write_export
from levjepa.model import VideoEncoder
from levjepa.weights import WeightsError

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "src",
        help="official model folder (config.json + model.safetensors), hub repo id ORG/NAME, .ckpt or .safetensors",
    )
    parser.add_argument("--revision", default=None, help="hub revision (commit, branch or tag) of a repo id SRC")
    parser.add_argument("--sha256", default=None, help="refuse unless the weights file has this SHA-256")
    parser.add_argument("--out", required=True, help="output folder for the levjepa export (must not exist)")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema", help="which copy (default: ema)")
    parser.add_argument("--heads", type=int, default=None, help="attention heads, when the source does not state it")
    parser.add_argument(
        "--attention",
        choices=("block_causal", "full", "bidirectional"),
        default=None,
        help="attention mode, when the source does not state it (the official training recipe's: block_causal; "
        "the official VisionTransformer class alone defaults to full)",
    )
    parser.add_argument("--norm-eps", type=float, default=None, help="LayerNorm eps (default: stated, else 1e-6)")
    parser.add_argument("--prefix", default=None, help="key prefix of the encoder, when the file holds several")
    parser.add_argument(
        "--license", default="cc-by-nc-4.0", help="licence in the export's card (default: the official weights')"
    )
    parser.add_argument(
        "--reference",
        default=None,
        metavar="REF.safetensors",
        help="the official forward's outputs on a fixed clip (input.video, output.<mode>): compared, and the "
        "difference recorded in the card's validation table",
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
    claim_folder(out, "--out", "export", fresh=True, overwrite_flag=None)
    over = Overrides(heads=args.heads, attention=args.attention, norm_eps=args.norm_eps, prefix=args.prefix)
    origin = resolve(args.src, args.revision)
    official = read_official(origin.path, over, weights=args.weights, trust_pickle=args.trust_pickle)
    imported = {
        **origin.record(args.sha256),
        "copy": official.copy,
        "stated": official.stated,
        "options": {k: v for k, v in vars(over).items() if v is not None},
        "imported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "layout": "MLO-lab/LeVJEPA module.py (encoder.*, projector.net.*)",
    }
    if args.reference is not None:  # before anything is written: a failed comparison exports nothing
        encoder = VideoEncoder(official.config)
        encoder.load_state_dict(official.encoder, strict=True)
        imported["validation"] = validate(encoder, args.reference).record()
    with staged_folder(out, what="the import", again="imports it again") as stage:  # whole or not at all
        write_export(
            stage,
            config=official.config,
            encoder_state=official.encoder,
            weights=official.copy,
            note=official.note,
            source=official.source,
            projector_state=official.projector,
            imported_from=imported,
            preprocessing=OFFICIAL_PREPROCESSING,  # the released weights' clips: 16 × 224² at 7.5 fps
            license=args.license,
        )
    loaded = load_encoder(out)  # read back: what every command will read
    named = imported["source"] + (f"@{imported['revision']}" if imported["revision"] else "")
    cfg = loaded.config
    print(
        f"imported {official.note} from {named} (sha256 {imported['sha256']}) -> {out} "
        f"(ViT dim {cfg.dim}, depth {cfg.depth}, heads {cfg.heads}, tubelet {cfg.tubelet}, {cfg.attention}"
        f"{', with projector' if official.projector is not None else ''})"
    )
    if "validation" in imported:
        v = imported["validation"]
        print(
            f"validated against the official {v['mode']} outputs of {v['reference']}: "
            f"max |diff| {v['max_abs_diff']:.3g}"
        )
    return 0
