"""Numbers on the command line checked where they are parsed: ``--workers -1`` is refused in one line naming the
option and its range (``argument --workers: '-1': expected a whole number 0..1024``), not by the config it feeds
under an internal name (``extract.workers=-1``) or later as a traceback."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["positive", "whole"]


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in ``low..high`` (no upper bound: ``high`` None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            valid = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number {valid}")
        return value

    parse.__name__ = "whole number"
    return parse


def positive(text: str) -> float:
    """An argparse ``type``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0")
    return value
