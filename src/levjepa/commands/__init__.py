"""The ``levjepa`` command line, the top floor: one module per sub-command, and this dispatch.

``levjepa <command> --help`` shows a command's own options. A command module exposes
``add_arguments(parser)`` and ``main(args) -> int``; it is imported only when its command runs, so
``levjepa --help`` stays instant and a broken optional piece never takes the others down.

Commands import the library; the library never imports a command (``tests/test_layering.py``). A command
parses its arguments, calls library functions and prints; what it computes lives below it: ``train``
(pretraining), ``eval`` (loading, probes, extraction, export, selection), ``infer`` (streaming), ``tools``
(FLOPs, visualisation) and ``data`` (check, prepare, pack).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from levjepa import __version__

# command -> one-line help; the command lives in the module levjepa.commands.<command>
COMMANDS: dict[str, str] = {
    "pretrain": "pretrain an encoder (presets: demo-cpu, vit-tiny-consumer, vit-b-paper)",
    "probe": "frozen-probe evaluation of a run, checkpoint or export",
    "extract": "extract CLS / pooled / patch features from videos and images",
    "visualize": "PCA and cosine-similarity maps of patch features",
    "export": "export an encoder to safetensors + config + model card",
    "select": "label-free model selection over a run's checkpoints",
    "data": "data tools: `data check` scans a source, `data prepare` re-encodes videos, `data pack` shards them",
    "flops": "forward / training FLOPs per clip and per run for a config",
    "stream": "stream a video through the KV-cache encoder, frame by frame",
}


def _top_parser() -> argparse.ArgumentParser:
    width = max(len(c) for c in COMMANDS)
    lines = "\n".join(f"  {name:<{width}}  {helptext}" for name, helptext in COMMANDS.items())
    return argparse.ArgumentParser(
        prog="levjepa",
        description="Heuristic-free self-supervised pretraining of video encoders (LeVJEPA).",
        epilog=f"commands:\n{lines}\n\nRun `levjepa <command> --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    top.add_argument("--version", action="store_true", help="print the version and exit")
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    if argv[0] == "--version":
        print(__version__)
        return 0
    command = argv[0]
    if command not in COMMANDS:
        top.error(f"unknown command {command!r}; choose one of: {', '.join(COMMANDS)}")
    module = importlib.import_module(f"levjepa.commands.{command}")
    parser = argparse.ArgumentParser(prog=f"levjepa {command}", description=COMMANDS[command])
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    return int(module.main(args) or 0)
