"""The one write policy of every command: nothing a user owns is replaced without being asked.

Every output a command writes — a folder (``export --out``, ``extract --out``, ``pretrain --run-dir``, ...) or a
file (``probe --out``, ``stream --out``, ...) — is claimed here before the work starts, by :func:`claim_folder`
or :func:`claim_file`, which refuse in one line (``OutputError``, exit 2) naming the output and, when there
is one, the flag that allows it:

* a **folder of another kind** — a pretraining run, a fine-tuning run, an export or a classifier, a feature set,
  shards, prepared files, a folder of kept probes (:func:`folder_kind`: told by the files levjepa writes
  there, under the names their writers define) — is never written into by a command whose output it is not,
  with or without ``--overwrite`` (``levjepa export RUN --out RUN`` would replace the run's ``config.json``);
* a folder of the command's **own kind** is resumed where the command resumes (``extract``, ``data prepare``)
  and otherwise replaced only with ``--overwrite``; a folder of no kind is written into only where none of the
  files the command writes is there already (``README.md`` of a project folder is not an export's card);
* a **file** that exists is replaced only when it is the command's own kind of file (``is_own``: a probe's JSON
  result, a stream's safetensors, a classify CSV) and ``--overwrite`` is given; a file of another kind — a
  video where ``stream --out`` would write safetensors, an index file where ``classify --out`` would write
  predictions — never is, and neither is a file inside a run, an export or a fine-tuning folder;
* a folder output is **whole or absent**: :func:`staged_folder` writes it beside its place and moves it in when
  complete, so a command stopped by a signal (exit 75) or an error leaves nothing half-written that looks done;
  folders of work files (``probe --features``, ``--cache``) are never inside a run, an export or a fine-tuning
  folder (:func:`claim_outside_owned`);
* every output must be **writable**: the nearest folder that exists on its path is a folder and a file can be
  made in it (a path under a file, a read-only file system, a folder without permission: refused at once, not
  after an hour of evaluation).

``tests/test_outputs.py`` walks every command's outputs through this table.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from levjepa.data.prepare import REPORT
from levjepa.data.shards import INDEX_NAME
from levjepa.features.feature_set import MANIFEST, OLD_MANIFEST
from levjepa.formats.reading.classifier import CLASSIFIER, is_classifier
from levjepa.formats.writing.export import is_export_record
from levjepa.tools.visualize import SUMMARY
from levjepa.weights import CHECKPOINTS, CONFIG, METRICS, make_temp_dir

__all__ = [
    "KINDS",
    "OutputError",
    "claim_file",
    "claim_folder",
    "claim_optional_file",
    "claim_outside_owned",
    "folder_kind",
    "is_json_with",
    "is_safetensors",
    "staged_folder",
]

# a folder kind -> how a message names it
KINDS: dict[str, str] = {
    "run": "a pretraining run",
    "finetune": "a fine-tuning run",
    "export": "a levjepa export",
    "classifier": "a kept probe or classifier",
    "probes": "a folder of kept probes",
    "features": "a feature set (levjepa extract / probe --features)",
    "shards": "a folder of shards (levjepa data pack)",
    "prepared": "a folder of prepared files (levjepa data prepare)",
    "maps": "levjepa visualize's maps",
}
# the kinds whose files no other command's file output may replace
_OWNED = ("run", "finetune", "export", "classifier")


class OutputError(FileExistsError):
    """An output that would replace what the user owns, or that cannot be written: one line, exit 2."""


def _json(path: Path) -> dict[str, Any] | None:
    try:
        if path.stat().st_size > 64 << 20:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def folder_kind(path: str | os.PathLike[str]) -> str | None:
    """What levjepa wrote ``path`` as (a key of :data:`KINDS`), told by its files; ``None`` for a folder of no
    kind (or one that does not exist)."""
    p = Path(path)
    if not p.is_dir():
        return None
    owned = _owned_kind(p)
    if owned is not None:
        return owned
    if (p / MANIFEST).is_file() or (p / OLD_MANIFEST).is_file():
        return "features"
    if (p / INDEX_NAME).is_file():
        return "shards"
    if (p / REPORT).is_file():
        return "prepared"
    if (p / SUMMARY).is_file():
        return "maps"
    if any(p.glob(f"*/*/{CLASSIFIER}")) or any(p.glob(f"*/*/*/{CLASSIFIER}")):
        return "probes"
    return None


def _owned_kind(p: Path) -> str | None:
    """The kind of ``p`` when it is one of :data:`_OWNED` (a run, a fine-tuning run, an export, a classifier)."""
    if (p / CONFIG).is_file():
        config = _json(p / CONFIG) or {}
        if is_export_record(config):
            return "export"
        if "source" in config and "task" in config:
            return "finetune"
        if {"model", "data", "train"} & set(config) or (p / CHECKPOINTS).is_dir() or (p / METRICS).is_file():
            return "run"
    if (p / CHECKPOINTS).is_dir() and (p / METRICS).is_file():
        return "run"
    if is_classifier(p):
        return "classifier"
    return None


def claim_outside_owned(path: str | os.PathLike[str], flag: str) -> Path:
    """Claim a folder of work files (``probe --features``'s stores, ``--cache``): refused when it is, or lies
    inside, a pretraining run, a fine-tuning run, an export or a classifier — folders only their own command
    writes into — and when it cannot be written."""
    p = Path(path)
    for folder in [p.absolute(), *p.absolute().parents]:
        kind = _owned_kind(folder) if folder.is_dir() else None
        if kind is not None:
            inside = "" if folder == p.absolute() else f", inside {folder}"
            raise OutputError(
                f"{flag} {path}: would write into {KINDS[kind]}{inside}, which only its own command writes; choose "
                f"a folder outside it"
            )
    _check_writable(p, flag)
    return p


def _check_writable(path: Path, flag: str, *, is_file: bool = False) -> None:
    """The nearest existing folder on ``path``'s way (a file's: from its parent) is a folder where a file can be
    made (module doc)."""
    base = path.parent if is_file else path
    while not base.exists():
        if base.parent == base:
            break
        base = base.parent
    if base.exists() and not base.is_dir():
        raise OutputError(f"{flag} {path}: {base} is a file, not a folder; choose another {flag}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".levjepa-write-check-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = (err.strerror or str(err)).lower()
        raise OutputError(f"{flag} {path}: cannot write in {base} ({reason}); choose another {flag}") from None


def claim_folder(
    path: str | os.PathLike[str],
    flag: str,
    kind: str,
    *,
    writes: Iterable[str] = (),
    overwrite: bool = False,
    overwrite_flag: str | None = "--overwrite",
    resumes: bool = False,
    fresh: bool = False,
) -> Path:
    """Claim the output folder ``path`` (given as ``flag``) for a command whose output is of ``kind`` (module
    doc). ``writes``: the names the command writes there (a folder of no kind holding one of them is refused);
    ``overwrite``: the command was asked to replace its own output (``overwrite_flag`` asks it; ``None``: the
    command cannot); ``resumes``: the command continues an output of its kind (checked by the command itself);
    ``fresh``: the folder must be new or empty (``levjepa import``). Nothing is created here."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{flag} {p}: exists and is not a folder; choose another {flag}")
    found = folder_kind(p)
    allow = f"pass {overwrite_flag} to replace it, or " if overwrite_flag else ""
    if found is not None and found != kind:
        raise OutputError(
            f"{flag} {p}: this is {KINDS[found]}, not {KINDS[kind]}, and is never written into; choose another {flag}"
        )
    if fresh and p.is_dir() and any(p.iterdir()):
        raise OutputError(f"{flag} {p}: already exists and is not empty; {allow}choose a new {flag} folder")
    if found == kind and not (overwrite or resumes or fresh):
        raise OutputError(f"{flag} {p}: holds {KINDS[kind]} already; {allow}choose another {flag}")
    if found is None and p.is_dir():
        clash = sorted(n for n in set(writes) if (p / n).exists())
        if clash:
            raise OutputError(
                f"{flag} {p}: holds {', '.join(clash)}, which is not {KINDS[kind]}'s and is never replaced; choose a "
                f"new or empty {flag} folder"
            )
    _check_writable(p, flag)
    return p


@contextlib.contextmanager
def staged_folder(
    path: str | os.PathLike[str],
    *,
    replaces: Iterable[str] = (),
    what: str = "the output",
    again: str = "runs it again",
) -> Iterator[Path]:
    """A folder output written whole or not at all: the block writes into a hidden folder beside ``path``
    (``.NAME.levjepa-partial-*``), which is put in place only when the block ends without an error — one rename
    where ``path`` is new or empty, else each file moved in after the files of ``replaces`` (the command's own
    names) the new output does not hold are removed — with SIGTERM / SIGUSR1 held off while it moves. Before
    that, a SIGTERM / SIGUSR1 stops the command at once (exit 75) with one line: nothing was written to ``path``
    before ``what`` was complete, and the same command ``again``. A command stopped or failed before leaves
    nothing at ``path`` that looks complete; the hidden folder is removed."""
    from levjepa.train.preemption import StopSignals, stop_now_on_signals

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    said = f"stopped before {what} was complete; nothing was written to {p}; the same command {again}"
    stage = make_temp_dir(p.parent, f".{p.name}.levjepa-partial-")
    try:
        with stop_now_on_signals(lambda signal_name: f"{signal_name} received: {said}"):
            yield stage
        with StopSignals():  # the move is quick: a signal now waits for the output to be whole
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()
            if not p.exists():
                stage.rename(p)
                return
            for name in replaces:
                if not (stage / name).exists():
                    (p / name).unlink(missing_ok=True)
            for item in sorted(stage.iterdir()):
                os.replace(item, p / item.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def is_safetensors(path: Path) -> bool:
    """A safetensors file: an 8-byte little-endian header length, then that many bytes of a JSON object."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = path.stat().st_size
    except OSError:
        return False
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return head[8:9] == b"{" and 8 + n <= size


def is_json_with(*keys: str) -> Callable[[Path], bool]:
    """A JSON object holding every one of ``keys``: the kind of file a command's JSON output is."""

    def check(path: Path) -> bool:
        data = _json(path)
        return data is not None and all(k in data for k in keys)

    return check


def claim_file(
    path: str | os.PathLike[str],
    flag: str,
    what: str,
    *,
    is_own: Callable[[Path], bool],
    overwrite: bool = False,
    overwrite_flag: str = "--overwrite",
) -> Path:
    """Claim the output file ``path`` (given as ``flag``) for a command that writes ``what`` there (module doc):
    a new file, or — with ``overwrite`` — one ``is_own`` recognises as the command's own kind of file."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} {p}: is a folder; give a file name")
    if p.exists():
        inside = folder_kind(p.parent)
        if inside in _OWNED:
            raise OutputError(
                f"{flag} {p}: a file of {KINDS[inside]} ({p.parent}), never replaced; choose another {flag}"
            )
        if not is_own(p):
            raise OutputError(f"{flag} {p}: exists and is not {what}, so it is never replaced; choose another {flag}")
        if not overwrite:
            raise OutputError(
                f"{flag} {p}: exists ({what}); pass {overwrite_flag} to replace it, or choose another {flag}"
            )
    _check_writable(p, flag, is_file=True)
    return p


def claim_optional_file(
    path: str | os.PathLike[str] | None, flag: str, what: str, *, is_own: Callable[[Path], bool], overwrite: bool
) -> None:
    """A command's optional output file (``--out FILE``, ``--json FILE``): claimed (:func:`claim_file`) when
    given; ``--overwrite`` without it is refused (it has nothing to replace)."""
    if path:
        claim_file(path, flag, what, is_own=is_own, overwrite=overwrite)
    elif overwrite:
        raise OutputError(f"--overwrite: with {flag} only (it replaces the file {flag} names)")
