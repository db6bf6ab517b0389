"""``--device`` for the commands: one option, one way to turn it into the device a process uses.

``auto`` (the default) is the GPU when there is one, else the CPU (``levjepa.distributed.resolve_device``).
Commands that may run under ``torchrun`` start the process group with :func:`setup_device`; there each rank
takes its own GPU whatever was asked (``cuda`` alone would put every rank on the first one).
"""

from __future__ import annotations

import argparse

from levjepa import distributed

__all__ = ["add_device_argument", "device_name", "local_device", "setup_device"]


def device_name(text: str) -> str:
    """``--device``: ``auto`` or a device torch names (``cpu``, ``cuda``, ``cuda:1``, ``mps``); a CUDA device on a
    machine whose torch sees none is refused here, naming the option, not where the work starts."""
    import torch

    if text == "auto":
        return text
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected auto, cpu, cuda, cuda:N (or another torch device)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"{text!r}: torch sees no CUDA device (torch {torch.__version__}); use --device cpu or auto"
        )
    return text


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", type=device_name, default="auto", help="auto (the GPU when there is one), cpu, cuda, cuda:N"
    )


def local_device(requested: str) -> str:
    """The device of a single-process command."""
    return distributed.resolve_device(requested)


def setup_device(requested: str) -> tuple[distributed.DistInfo, str]:
    """Start the process group when ``torchrun`` asks for one; returns it and the device this process uses."""
    info = distributed.setup(None if requested == "auto" else requested)
    return info, str(info.device) if requested == "auto" or info.world_size > 1 else requested
