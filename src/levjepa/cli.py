"""The ``levjepa`` console script (``pyproject.toml``: ``levjepa = "levjepa.cli:main"``); the commands and
their dispatch live in :mod:`levjepa.commands`."""

from __future__ import annotations

from levjepa.commands import COMMANDS, main

__all__ = ["COMMANDS", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
