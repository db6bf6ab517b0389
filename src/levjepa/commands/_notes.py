"""Notes a command states at its start, said just before its first output — so a mistake found first is still one line.

A command says some facts before it works (``threads: 1 of 2 CPUs ...``, ``levjepa.threads``). Printed at once,
such a line would stand above the one line of a mistake the command finds a moment later (a missing file, a bad
option), which the house rule wants alone. So :func:`note` keeps the line until the command writes anything, on
stdout or stderr, and writes it first, on that stream (beside the command's own first lines); a command that
fails before writing anything leaves only the dispatcher's error line. Outside :func:`notes_before_output` (a
test calling a command's ``main``), a note is printed at once.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["note", "notes_before_output"]

_pending: list[str] | None = None  # notes waiting for the first output; None: no command is running


def note(line: str) -> None:
    """Say ``line`` before the command's first output (module doc); on stderr where no command runs."""
    if _pending is None:
        print(line, file=sys.stderr, flush=True)
    else:
        _pending.append(line)


def _flush_notes(stream: TextIO) -> None:
    if _pending:
        lines, _pending[:] = list(_pending), []
        stream.write("".join(line + "\n" for line in lines))
        stream.flush()


class _Watch:
    """A text stream that says the pending notes before its first write, on itself."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if text:
            _flush_notes(self._stream)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, flush, ...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def notes_before_output() -> Iterator[None]:
    """While inside, :func:`note` waits for the first output; notes never followed by output are dropped."""
    global _pending
    out, err = sys.stdout, sys.stderr
    _pending = []
    sys.stdout, sys.stderr = _Watch(out), _Watch(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
        _pending = None
