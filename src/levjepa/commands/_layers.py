"""``--layers`` for the commands that read a frozen encoder (``probe``, ``extract``, ``classify``, ``export``): one
option, one spelling, one way to apply it (``levjepa.model.readout_layers``: what a readout of several blocks is).

``--layers 5`` reads block 5 (``-1`` the last, as Python indexes), ``--layers 5,11,17,23`` those four concatenated
on channels in that order, ``--layers hierarchical`` V-JEPA 2.1's four for the model's depth, ``--layers last``
the last block; each block's output goes through the encoder's final norm. Left out, the encoder is read as it
stands: its last block, or the blocks an export made with ``--layers`` records. A block the model does not have
is refused in one line naming its depth.
"""

from __future__ import annotations

import argparse

from levjepa.formats.reading.load import LoadedEncoder
from levjepa.model.readout_layers import parse_layers

__all__ = ["add_layers_argument", "requested_layers", "with_layers"]

HELP = (
    "the blocks to read: one index (-1 the last, as Python), several concatenated on channels in the order given "
    "(5,11,17,23: V-JEPA 2.1's hierarchical readout of a ViT-L), hierarchical (those four for this depth) or last; "
    "each through the final norm (default: {default})"
)


def add_layers_argument(
    parser: argparse.ArgumentParser, default_text: str = "the model's own readout, the last block"
) -> None:
    """The option; its value is None unless given (``default_text`` says what that means)."""
    parser.add_argument("--layers", default=None, metavar="L[,L...]", help=HELP.format(default=default_text))


def requested_layers(text: str | None, depth: int) -> tuple[int, ...] | None:
    """The readout ``--layers text`` names for an encoder of ``depth`` blocks (normalised: ``None`` for the last
    block); ``ConfigError`` in one line for a block out of range."""
    return None if text is None else parse_layers(text, depth)


def with_layers(loaded: LoadedEncoder, text: str | None) -> LoadedEncoder:
    """``loaded`` read at ``--layers text`` (as it stands when ``None``)."""
    if text is None:
        return loaded
    return loaded.with_readout(requested_layers(text, loaded.config.depth))
