"""Bad input files: one error type, one report, one line per file.

A long run must never die because one file of a million is broken, nor hide that it met broken files.
Every failure to read a file raises :class:`DataError` whose message starts with a short *kind* and a
colon, then names the file and what was wrong::

    missing      the path does not exist
    empty        0-byte file
    permission   the process may not read it
    unreadable   FFmpeg / PIL cannot open it (not a video, a truncated container, garbage)
    no-video     a container without a video stream (audio only)
    resolution   short side < min_side or long side > max_side (absurd resolution)
    truncated    the container opens but the requested frames cannot be decoded
    short        fewer frames than a clip needs; padded (reported, used) or skipped, per config

The loader skips such a file (or pads it, for ``short`` in "pad" mode), records ``(path, reason)`` in the
batch it was building, and :class:`BadFileReport` collects them: ``counts`` per kind, and
``write(run_dir / "bad_files.json")`` for the run directory (under DDP, ``report.gather()`` on every rank,
then rank 0 writes). A source in which every file is bad raises a ``DataError`` naming the source instead
of looping (see ``loader.py``).

What the user sees: one plain line per file on stderr (:func:`bad_file_line`: the path once, the reason
without its kind prefix, no Python warning header or source line), through ``tqdm.write`` so a progress
bar stays whole; after :data:`SHOWN` files one line says the rest are listed only in ``bad_files.json`` —
1 % bad files of a 100k corpus would otherwise be a thousand lines.

``DataError`` takes a single message string so that it survives being re-raised from a DataLoader
worker process with its type intact.

**The one bad-file rule** (:func:`is_bad_file`), the same for every reader — pretraining's loader, ``levjepa
data check``, and the worker map of probe, extract, classify and fine-tuning (``levjepa.data.workers.safe_map``)
— decides which exception raised while reading one file means "this file is bad" (skip it, report it) and
which is a bug that must end the job:

* bad file: a :class:`DataError` (levjepa's own verdict); any of :data:`READ_ERRORS` (``OSError``,
  ``RuntimeError``, ``ValueError``: what the file system, PyAV, PIL and torch raise on a broken stream); an
  exception whose class a decoder library defines (not Python's builtins, not levjepa's); and an exception of
  *any* type raised inside a decoder, i.e. whose innermost traceback frame lies outside levjepa's source
  (an ``IndexError`` from inside PyAV, PIL or a user's decoder);
* a bug, re-raised: anything that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``), a
  ``MemoryError``, and every other exception raised by levjepa's own code (a ``TypeError``, ``KeyError``,
  ``IndexError``, ``AttributeError`` whose innermost frame is in ``src/levjepa``): a file that levjepa's code
  finds wrong is reported by raising ``DataError``, so any other error there is ours to fix.

:func:`bad_file_reason` is the reason a reader records for it — a ``DataError``'s own message, otherwise
``"unreadable: <Type>: <message>"`` — and :func:`bad_file_line` the one line a report shows.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from tqdm import tqdm

from levjepa import distributed
from levjepa.weights import atomic_write_text, read_json

__all__ = [
    "BAD_FILE_KINDS",
    "SHOWN",
    "BadFileReport",
    "READ_ERRORS",
    "DataError",
    "bad_file_kind",
    "bad_file_line",
    "bad_file_reason",
    "bad_file_text",
    "is_bad_file",
    "plain",
]

BAD_FILE_KINDS = (
    "missing",
    "empty",
    "permission",
    "unreadable",
    "no-video",
    "resolution",
    "truncated",
    "short",
)


class DataError(ValueError):
    """A data file or source cannot be used; the message starts with its kind, e.g. ``"empty: ..."``."""

    @property
    def kind(self) -> str:
        return bad_file_kind(str(self))


SHOWN = 20  # bad-file lines a report prints; the rest are listed only in bad_files.json

# what reading a file raises on a broken file wherever it is raised (module doc): levjepa's DataError, the file
# system's OSError, and PyAV's / PIL's / torch's RuntimeError and ValueError on a broken stream
READ_ERRORS: tuple[type[Exception], ...] = (DataError, OSError, RuntimeError, ValueError)

_LEVJEPA = Path(__file__).resolve().parents[1]  # src/levjepa: where a raise is our own code's


def _raised_by_levjepa(err: BaseException) -> bool:
    """Whether ``err``'s innermost traceback frame is in levjepa's source (no traceback: it was not raised)."""
    tb: TracebackType | None = err.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_LEVJEPA)


def is_bad_file(err: BaseException) -> bool:
    """Whether ``err``, raised while reading one file, means that file is bad rather than a bug (module doc)."""
    if not isinstance(err, Exception) or isinstance(err, MemoryError):
        return False
    if isinstance(err, READ_ERRORS):
        return True
    if type(err).__module__.split(".")[0] not in ("builtins", "levjepa"):
        return True  # a decoder library's own error class (av.error.*, PIL's, ...)
    return not _raised_by_levjepa(err)


def bad_file_reason(err: BaseException) -> str:
    """The reason recorded for a file whose reading raised ``err`` (one that :func:`is_bad_file` accepts):
    a ``DataError``'s message, or ``"unreadable: <Type>: <message>"``."""
    if isinstance(err, DataError):
        return str(err)
    text = str(err)
    return f"unreadable: {type(err).__name__}: {text}" if text else f"unreadable: {type(err).__name__}"


def bad_file_kind(reason: str) -> str:
    """The kind prefix of a ``DataError`` message (``"other"`` when it has none of the known kinds)."""
    head = reason.split(":", 1)[0].strip()
    return head if head in BAD_FILE_KINDS else "other"


def plain(message: str) -> str:
    """A ``DataError`` message as a person reads it: without its kind prefix (``"missing: x does not exist"``
    -> ``"x does not exist"``); the kind is for ``bad_files.json`` and the counts."""
    return message.split(":", 1)[1].strip() if bad_file_kind(message) != "other" else message


def bad_file_text(path: str, reason: str) -> str:
    """A bad file and why, in words: its path once, the reason without its kind (FFmpeg's own message, which
    repeats the path, without it)."""
    text = plain(reason).replace(f": '{path}'", "")
    return text if text.startswith(path) else f"{path}: {text}"


def bad_file_line(path: str, reason: str) -> str:
    """The line a report shows for a bad file: what happened to it, then :func:`bad_file_text`."""
    text = bad_file_text(path, reason)
    return f"bad file: {text}" if bad_file_kind(reason) == "short" else f"bad file skipped: {text}"


class BadFileReport:
    """Accumulates ``(path, reason)`` pairs; each file is counted once, and with ``warn`` shown in one line
    (the first :data:`SHOWN` files; then one line that points at ``bad_files.json``).

    ``counts`` maps a kind to the number of distinct files of that kind; ``total`` is the number of
    distinct files; ``files`` is ``{path: reason}`` (the first reason met for that path).
    """

    def __init__(self, warn: bool = True) -> None:
        self.warn = warn
        self.files: dict[str, str] = {}
        self._met = 0  # files added (not merged or read) by this report: the ones it shows

    def add(self, path: str, reason: str) -> bool:
        """Record one bad file; returns True the first time this path is seen."""
        path = str(path)
        if path in self.files:
            return False
        self.files[path] = reason
        self._met += 1
        if self.warn and self._met <= SHOWN:
            tqdm.write(bad_file_line(path, reason), file=sys.stderr)
        elif self.warn and self._met == SHOWN + 1:
            tqdm.write(
                f"bad files: more than {SHOWN}; the rest are not shown, every one is listed with its reason in "
                "bad_files.json",
                file=sys.stderr,
            )
        return True

    def extend(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Record several ``(path, reason)`` pairs; returns how many files were new."""
        return sum(self.add(p, r) for p, r in pairs)

    def merge(self, other: BadFileReport) -> None:
        """Fold another report in (e.g. gathered from the other ranks), without showing its files again."""
        for path, reason in other.files.items():
            self.files.setdefault(path, reason)

    def gather(self) -> BadFileReport:
        """The report of every rank merged (a collective: call it on all ranks; itself when alone)."""
        merged = BadFileReport(warn=False)
        for files in distributed.all_gather_objects(dict(self.files)):
            for path, reason in files.items():
                merged.files.setdefault(path, reason)
        return merged

    @property
    def total(self) -> int:
        return len(self.files)

    @property
    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(bad_file_kind(reason) for reason in self.files.values()).items()))

    def counts_text(self) -> str:
        """The counts in words, for a message: ``"2 missing, 1 unreadable"``."""
        return ", ".join(f"{n} {kind}" for kind, n in self.counts.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "counts": self.counts,
            "files": [{"path": p, "kind": bad_file_kind(r), "reason": r} for p, r in sorted(self.files.items())],
        }

    @classmethod
    def read(cls, path: str | os.PathLike) -> BadFileReport:
        """A report as :meth:`write` wrote it (not shown again: these files were reported when met)."""
        report = cls(warn=False)
        for entry in read_json(path)["files"]:
            report.files.setdefault(entry["path"], entry["reason"])
        return report

    def write(self, path: str | os.PathLike) -> Path:
        """Write the report as JSON (atomically: a crash never leaves half a file)."""
        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def __len__(self) -> int:
        return self.total

    def __repr__(self) -> str:
        return f"BadFileReport(total={self.total}, counts={self.counts})"
