"""``levjepa export RUN --out DIR [--weights ema|online] [--with-projector]``: an encoder in the layout the
Hugging Face tools read (``model.safetensors``, ``config.json``, ``preprocessor_config.json``,
``video_preprocessor_config.json``, ``README.md`` with the model card) that ``levjepa.load(DIR)``,
``levjepa.from_pretrained(DIR)`` and transformers' ``AutoModel`` read back; a classifier's export — a
fine-tuned classifier or a probe kept by ``levjepa probe`` (``RUN/probes/TASK/PROBE``) — adds its head, which
``AutoModelForVideoClassification`` and ``pipeline("video-classification")`` read too.
``--layers 5,11,17,23`` records the blocks the export reads (concatenated on channels, V-JEPA 2.1's hierarchical
readout; ``levjepa.model.readout_layers``): ``AutoModel``'s ``last_hidden_state`` is then their readout.
``--push-to-hub ORG/NAME`` publishes it with huggingface_hub (``create_repo`` + ``upload_folder``; the token
is huggingface_hub's). What an export holds: :mod:`levjepa.formats.writing.export`.

``--format onnx`` needs the ``deploy`` extra (``pip install 'levjepa[deploy]'``), checked before anything is
written. The export is written beside ``--out`` and moved in when whole (``commands._outputs.staged_folder``),
so an export stopped by SIGTERM / SIGUSR1 (exit 75, one line) or by an error leaves no folder that looks like an
export; ``--overwrite`` replaces the files of an earlier export, its graphs the new one does not write included.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Literal

from levjepa.commands._extras import require_extra
from levjepa.commands._layers import add_layers_argument
from levjepa.commands._outputs import claim_folder, staged_folder
from levjepa.config import ConfigError
from levjepa.formats.deployment.graphs import DEFAULT_OPSET
from levjepa.formats.deployment.quantize import KEEP_FLOAT_PARTS, Int8Config
from levjepa.formats.transformers.hub import push_to_hub
from levjepa.formats.writing.card import AUTO_HINT
from levjepa.formats.writing.export import EXPORT_FILES, export_encoder

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", help="run directory, checkpoint directory or file, an export, a fine-tuned classifier or a kept probe"
    )
    parser.add_argument("--out", required=True, help="output folder (created; never a run or another kind of folder)")
    parser.add_argument("--overwrite", action="store_true", help="replace an export already at --out")
    parser.add_argument("--weights", choices=("ema", "online"), default="ema", help="which weights (default: ema)")
    parser.add_argument(
        "--with-projector",
        action="store_true",
        help="also write the training projector (projector.safetensors), for continued pretraining elsewhere",
    )
    add_layers_argument(parser, "the source's own readout, the last block; a classifier's: its head's")
    parser.add_argument("--push-to-hub", metavar="ORG/NAME", default=None, help="publish the export as this hub repo")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    deploy = parser.add_argument_group("deployment graphs (beside the weights; levjepa.formats.deployment.graphs)")
    deploy.add_argument(
        "--format",
        choices=("safetensors", "onnx", "pt2"),
        default="safetensors",
        help="safetensors: the weights only (default); onnx / pt2: also the clip encoder and the streaming step",
    )
    deploy.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32", help="precision of the graphs")
    deploy.add_argument(
        "--quantize",
        choices=("none", "int8"),
        default="none",
        help="int8: dynamic quantization, or static with --calibrate (levjepa.formats.deployment.quantize)",
    )
    deploy.add_argument(
        "--calibrate",
        metavar="DATA",
        default=None,
        help="with --quantize int8: static int8, activation ranges measured on clips of DATA (a folder or an index)",
    )
    deploy.add_argument(
        "--calibration-clips", type=int, default=None, help="how many clips of DATA to calibrate on (default: 32)"
    )
    deploy.add_argument(
        "--keep-float",
        default=None,
        metavar="PARTS",
        help=f"static int8: parts left in float, comma-separated, of {', '.join(KEEP_FLOAT_PARTS)}; 'none' for "
        f"none (default: {','.join(Int8Config().keep_float)}, bench/deploy.md)",
    )
    deploy.add_argument("--window", type=int, default=None, help="streaming window in frames (default: clip length)")
    deploy.add_argument("--size", type=int, default=None, help="frame side in pixels (default: the clip size)")
    deploy.add_argument(
        "--opset",
        type=int,
        default=None,
        help=f"ONNX opset (default: {DEFAULT_OPSET}: fused attention, onnxruntime >= 1.23; 18: MatMul/Softmax)",
    )


def main(args: argparse.Namespace) -> int:
    graphs: Literal["none", "onnx", "pt2"] = "none" if args.format == "safetensors" else args.format
    shaping = {"--window": args.window, "--size": args.size, "--dtype": args.dtype, "--quantize": args.quantize}
    shaping["--opset"] = args.opset
    shaping.update({"--calibrate": args.calibrate, "--calibration-clips": args.calibration_clips})
    shaping["--keep-float"] = args.keep_float
    given = [option for option, value in shaping.items() if value not in (None, "fp32", "none")]
    if graphs == "none" and given:
        verb = "shapes" if len(given) == 1 else "shape"
        raise ConfigError(f"{', '.join(given)} {verb} the deployment graphs, which only --format onnx or pt2 writes")
    int8 = None
    if args.quantize == "int8":
        static = args.calibrate is not None
        keep = Int8Config().keep_float if args.keep_float is None else _parts(args.keep_float)
        clips = 32 if args.calibration_clips is None else args.calibration_clips
        int8 = Int8Config("static" if static else "dynamic", args.calibrate, clips, keep_float=keep)
        if not static and (args.calibration_clips is not None or args.keep_float is not None):
            raise ConfigError("--calibration-clips and --keep-float shape a static int8 graph: add --calibrate DATA")
    elif args.calibrate is not None:
        raise ConfigError("--calibrate: calibration clips make a static int8 graph; add --quantize int8")
    if args.private and not args.push_to_hub:
        raise ConfigError("--private: with --push-to-hub REPO_ID only (it makes the new hub repo private)")
    if graphs == "onnx":  # before anything is written
        require_extra("deploy", "--format onnx")
    claim_folder(args.out, "--out", "export", writes=EXPORT_FILES, overwrite=args.overwrite)
    if Path(args.out).resolve() == Path(args.run).resolve():
        raise ConfigError(f"--out {args.out}: is the source itself; choose another --out folder")
    with staged_folder(args.out, replaces=EXPORT_FILES, what="the export", again="exports it again") as stage:
        loaded = export_encoder(
            args.run,
            stage,
            weights=args.weights,
            with_projector=args.with_projector,
            graphs=graphs,
            window=args.window,
            size=args.size,
            dtype=args.dtype,
            quantize=args.quantize,
            opset=DEFAULT_OPSET if args.opset is None else args.opset,
            int8=int8,
            layers=args.layers,
            say=lambda line: print(line.replace(str(stage), str(Path(args.out))), file=sys.stderr, flush=True),
        )  # its lines name each file where it ends up, not where it is staged
    extra = "" if graphs == "none" else f", clip_encoder.{graphs}, stream_step.{graphs}"
    print(
        f"exported {loaded.describe()} -> {args.out}/model.safetensors (+ config.json, preprocessor_config.json, "
        f"video_preprocessor_config.json, README.md{extra})"
    )
    print(f"transformers: `import levjepa`, then AutoModel.from_pretrained({args.out!r}) ({AUTO_HINT})")
    if args.push_to_hub:
        url = push_to_hub(args.out, args.push_to_hub, private=args.private)
        print(f"pushed {args.out} -> {args.push_to_hub} ({url})")
    return 0


def _parts(text: str) -> tuple[str, ...]:
    return () if text.strip() == "none" else tuple(p.strip() for p in text.split(",") if p.strip())
