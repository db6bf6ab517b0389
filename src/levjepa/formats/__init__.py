"""Weights in and out: every format an encoder is read from or written to.

``load.py`` reads levjepa run directories, checkpoints and exports into a frozen encoder (``levjepa.load``);
``export.py`` writes an encoder-only export. Evaluation, extraction and the commands read weights only
through this package.
"""

from __future__ import annotations

from levjepa.formats.load import LoadedEncoder, load, load_encoder, random_encoder

__all__ = ["LoadedEncoder", "load", "load_encoder", "random_encoder"]
