"""The ``levjepa`` command line: one sub-command per job, each living with its concept.

``levjepa <command> --help`` shows a command's own options. A command module exposes
``add_arguments(parser)`` and ``main(args) -> int``; it is imported only when its command runs, so
``levjepa --help`` stays instant and a broken optional piece never takes the others down.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "pretrain": ("levjepa.train.cli", "pretrain an encoder (presets: demo-cpu, vit-tiny-consumer, vit-b-paper)"),
    "probe": ("levjepa.eval.cli_probe", "frozen-probe evaluation of a run, checkpoint or export"),
    "extract": ("levjepa.eval.cli_extract", "extract CLS / pooled / patch features from videos and images"),
    "visualize": ("levjepa.tools.visualize", "PCA and cosine-similarity maps of patch features"),
    "export": ("levjepa.eval.export", "export an encoder to safetensors + config + model card"),
    "select": ("levjepa.eval.select", "label-free model selection over a run's checkpoints"),
    "data": ("levjepa.data.cli", "data tools: `data check` scans a source, `data prepare` re-encodes videos"),
    "flops": ("levjepa.tools.flops", "forward / training FLOPs per clip and per run for a config"),
    "stream": ("levjepa.infer.cli", "stream a video through the KV-cache encoder, frame by frame"),
}


def _top_parser() -> argparse.ArgumentParser:
    width = max(len(c) for c in COMMANDS)
    lines = "\n".join(f"  {name:<{width}}  {helptext}" for name, (_, helptext) in COMMANDS.items())
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
        from levjepa import __version__

        print(__version__)
        return 0
    command = argv[0]
    if command not in COMMANDS:
        top.error(f"unknown command {command!r}; choose one of: {', '.join(COMMANDS)}")
    module = importlib.import_module(COMMANDS[command][0])
    parser = argparse.ArgumentParser(prog=f"levjepa {command}", description=COMMANDS[command][1])
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    return int(module.main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
