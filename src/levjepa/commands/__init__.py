"""The ``levjepa`` command line, the top floor: one module per sub-command, and this dispatch.

``levjepa <command> --help`` shows a command's own options with their defaults, and the command module's
docstring (its examples) below them. A command module exposes
``add_arguments(parser)`` and ``main(args) -> int``; it is imported only when its command runs, so
``levjepa --help`` stays instant and a broken optional piece never takes the others down.

Commands import the library; the library never imports a command (``tests/test_layering.py``). A command
parses its arguments, calls library functions and prints; what it computes lives below it: ``train``
(pretraining), ``eval`` (loading, probes, extraction, export, selection), ``infer`` (streaming), ``tools``
(FLOPs, visualisation) and ``data`` (check, prepare, pack).

One error path for every command: a user's mistake — a bad config key or value (``ConfigError``), data that
cannot be read (``DataError``), weights that are missing or unsafe (``WeightsError``), a run directory that
cannot be used (``RunDirError``), a launch that cannot work (``LaunchError``), a missing file, a full disk or
a read-only file system, or a bad option — ends with one line on stderr,
``levjepa <command>: <message>``, and exit status 2 (a run stopped on purpose, ``TrainingStopped``: 1; a run
that a SIGTERM / SIGUSR1 stopped after writing a checkpoint, ``Preempted``: 75, the status to requeue on).
``--debug`` (anywhere on the line) or ``LEVJEPA_DEBUG=1`` shows the traceback instead. Every command that writes
stops on SIGTERM / SIGUSR1 with one line and status 75 (:data:`STOPPED` for those that do not say it themselves).
The commands that run an encoder (:data:`THREADED`) take ``--threads N`` and otherwise run at the count
``levjepa.threads.choose_threads`` picks for the machine, said in one line before their first output. A closed pipe
(``levjepa ... | head``) ends the command quietly; Ctrl-C ends it with status 130.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from typing import NoReturn

from levjepa.commands._notes import note, notes_before_output
from levjepa.version import __version__

# command -> one-line help; the command lives in the module levjepa.commands.<command>
COMMANDS: dict[str, str] = {
    "pretrain": "pretrain an encoder (presets: demo-cpu, demo-cpu-long, vit-tiny-consumer, vit-b-paper)",
    "probe": "frozen-probe evaluation of a run, checkpoint or export",
    "extract": "extract CLS / pooled / patch features from videos and images",
    "visualize": "PCA and cosine-similarity maps of patch features",
    "export": "export an encoder in the Hugging Face hub layout (model.safetensors, config.json, README.md)",
    "import": "import official LeVJEPA weights (HF repo folder, .ckpt) as a levjepa export",
    "select": "label-free model selection over a run's checkpoints",
    "data": "data tools: `data check` scans a source, `data prepare` re-encodes videos, `data pack` shards them",
    "flops": "forward / training FLOPs per clip and per run for a config",
    "stream": "stream a video through the KV-cache encoder, frame by frame",
    "classify": "predict labels of videos with a kept probe or a fine-tuned classifier",
    "finetune": "fine-tune an encoder + head end to end on a labelled index",
}


# a command whose module name differs from it (``import`` is a Python keyword)
MODULES: dict[str, str] = {"import": "import_weights"}

# the commands that run an encoder for long: each takes ``--threads N`` and otherwise runs with the count
# ``levjepa.threads.choose_threads`` picks for the machine, said in one line at its start (``pretrain``: train.threads)
THREADED = ("probe", "extract", "visualize", "export", "import", "stream", "classify", "finetune", "select")


class UsageError(Exception):
    """A command line argparse refuses (unknown option, bad choice, missing argument): one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors reach the dispatcher instead of printing the usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _top_parser() -> argparse.ArgumentParser:
    width = max(len(c) for c in COMMANDS)
    lines = "\n".join(f"  {name:<{width}}  {helptext}" for name, helptext in COMMANDS.items())
    return argparse.ArgumentParser(
        prog="levjepa",
        description="Heuristic-free self-supervised pretraining of video encoders (LeVJEPA).",
        epilog=f"commands:\n{lines}\n\nRun `levjepa <command> --help` for a command's options; `--debug` (or "
        "LEVJEPA_DEBUG=1) shows the traceback of an error.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


# optional packages a command may import -> how to install them (pyproject.toml's extras)
OPTIONAL_PACKAGES: dict[str, str] = {
    "tensorboard": "pip install 'levjepa[tensorboard]' (or tensorboard)",
    "wandb": "pip install 'levjepa[wandb]' (or wandb)",
    "mlflow": "pip install 'levjepa[mlflow]' (or mlflow)",
    "yaml": "pip install 'levjepa[yaml]' (or pyyaml)",
    "fsspec": "pip install 'levjepa[remote]' and the backend of your URL (s3fs, gcsfs, ...)",
}


def _user_errors() -> tuple[type[BaseException], ...]:
    """The library's error types for a user's mistakes (imported once a command runs: they pull in torch)."""
    from levjepa.config import ConfigError
    from levjepa.data.badfiles import DataError
    from levjepa.distributed import LaunchError
    from levjepa.train.run_dir import RunDirError
    from levjepa.weights import WeightsError

    return (
        UsageError,
        ConfigError,
        LaunchError,
        DataError,
        WeightsError,
        RunDirError,
        FileNotFoundError,
        NotADirectoryError,
        IsADirectoryError,
        PermissionError,
        FileExistsError,
    )


# what the system says when a file cannot be written -> what to do about it
_SYSTEM_ERRORS: dict[int, str] = {
    errno.ENOSPC: "free space there or choose another output folder",
    errno.EDQUOT: "your disk quota is full: free space or choose another output folder",
    errno.EROFS: "the file system is read-only: choose an output folder on a writable one",
}


def _system_error(err: BaseException) -> bool:
    """A full disk, a full quota or a read-only file system: the user's to fix, so one line naming the path."""
    return isinstance(err, OSError) and err.errno in _SYSTEM_ERRORS


def _message(err: BaseException) -> str:
    """The error as one plain line: a ``DataError``'s kind prefix (``unreadable:``, ``missing:``, ... — every
    kind of ``levjepa.data.badfiles.BAD_FILE_KINDS``, which ``bad_files.json`` and the counts use) left out."""
    from levjepa.data.badfiles import plain

    return plain(_text(err))


def _text(err: BaseException) -> str:
    if _system_error(err):
        assert isinstance(err, OSError)
        where = err.filename if err.filename is not None else "a file"
        return f"{where}: {(err.strerror or str(err)).lower()}: {_SYSTEM_ERRORS.get(err.errno or 0, '')}"
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror.lower()}"
    return str(err) or type(err).__name__


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Positional arguments may stand on both sides of options (``a=1 --no-progress b=2``); argparse's intermixed
    parsing does that, except under sub-commands (``data``), which parse as usual."""
    if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        return parser.parse_args(argv)
    return parser.parse_intermixed_args(argv)


def _sub_commands(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The sub-command chosen under a command (``check`` of ``levjepa data check``), for the error's prefix."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [str(getattr(args, a.dest)) for a in subs if getattr(args, a.dest, None)]


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (``| head``): stop writing, with no traceback, at the shell's status."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a process its pipe killed


def _any_file_name() -> None:
    """File names in any bytes the file system allows reach stdout and stderr as they are: a name that is not
    UTF-8 (Python holds its bytes as surrogates) is written back as its own bytes on a UTF-8 stream, escaped
    on any other, never a ``UnicodeEncodeError`` at the first ``print``."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            utf8 = (getattr(stream, "encoding", "") or "").lower().replace("-", "") == "utf8"
            reconfigure(errors="surrogateescape" if utf8 else "backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _any_file_name()
    debug = os.environ.get("LEVJEPA_DEBUG", "") not in ("", "0")
    if "--debug" in argv:
        cut = argv.index("--") if "--" in argv else len(argv)
        debug = debug or "--debug" in argv[:cut]
        argv = [a for i, a in enumerate(argv) if a != "--debug" or i > cut]
    top = _top_parser()
    top.add_argument("--version", action="store_true", help="print the version and exit")
    top.add_argument("--debug", action="store_true", help="show the traceback of an error")
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    if argv[0] == "--version":
        print(__version__)
        return 0
    command = argv[0]
    if command not in COMMANDS:
        print(f"levjepa: unknown command {command!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        code = _run(command, argv[1:], debug)
        sys.stdout.flush()  # inside the try: a closed pipe is often found only here
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``--help``: each option's default (unless its help already says it: "default", or the value in brackets)
    and, as the epilog, the command's module docstring (``_epilog``: its first paragraph reflowed, the rest
    as written)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        said = "default" in text or f"({action.default})" in text
        if said or action.default in (None, False, argparse.SUPPRESS) or not text:
            return action.help
        return super()._get_help_string(action)


def sentence(text: str) -> str:
    """A one-line help (``COMMANDS``' lower-case phrases) as the sentence a ``--help`` starts with."""
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def plain_text(doc: str) -> str:
    """A docstring as ``--help`` shows it: its reST read as plain text — ``:class:`x``` and the other roles
    as their name, a double-backquoted literal in single backquotes (as the rest of the command line writes
    code), and a literal block's ``::`` as a colon."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    return re.sub(r"::$", ":", text, flags=re.M)


def _epilog(module: object) -> str:
    """The command module's docstring below the options: its first paragraph without the usage it opens with
    (argparse prints the usage), so it starts as a sentence (reflowed), then the rest; reST as plain text."""
    doc = (getattr(module, "__doc__", None) or "").strip()
    first, _, rest = doc.partition("\n\n")
    usage = re.match(r"``[^`]*``\s*(?::|—)\s*", first)
    if usage:
        first = " ".join(first[usage.end() :].split())
        first = textwrap.fill(first[:1].upper() + first[1:], width=110)
    return plain_text(f"{first}\n\n{rest}".strip())


# what a SIGTERM / SIGUSR1 leaves of the commands that write and do not say it themselves (pretrain, finetune,
# probe, extract, export, import and visualize do): each stops at once with this line and exit status 75
STOPPED: dict[str, str] = {
    "classify": "--out is written whole at the end, so nothing was written; the same command runs it again",
    "stream": "--out is written whole at the end, so nothing was written; the same command runs it again",
    "select": "--out is written whole at the end, so nothing was written; the same command runs it again",
    "data": "every file written is complete, and the same command continues where this one stopped",
}


@contextlib.contextmanager
def _stop_signals(command: str) -> Iterator[None]:
    """SIGTERM / SIGUSR1 end a command of :data:`STOPPED` with its line and exit status 75, like the others."""
    if command not in STOPPED:
        yield
        return
    from levjepa.train.preemption import stop_now_on_signals

    with stop_now_on_signals(lambda name: f"{name} received: stopped before it was done; {STOPPED[command]}"):
        yield


_THREADS_HELP = (
    "torch CPU threads (default: the CPUs free at the start, said in one line; OMP_NUM_THREADS when set; "
    "levjepa.threads)"
)


@contextlib.contextmanager
def _threads(command: str, args: argparse.Namespace) -> Iterator[None]:
    """A threaded command's body at the count it was given or ``choose_threads`` picks, said just before its first
    output (``_notes``; once per job under torchrun); any other command as it is."""
    if command not in THREADED:
        yield
        return
    from levjepa.distributed import launch_rank
    from levjepa.threads import choose_threads, torch_threads

    choice = choose_threads(args.threads)
    if launch_rank() == 0:
        note(choice.line)
    with torch_threads(choice.threads):
        yield


def _run(command: str, argv: list[str], debug: bool) -> int:
    module = importlib.import_module(f"levjepa.commands.{MODULES.get(command, command)}")
    parser = _Parser(
        prog=f"levjepa {command}",
        description=sentence(COMMANDS[command]),
        epilog=_epilog(module),
        formatter_class=_HelpFormatter,
    )
    module.add_arguments(parser)
    if command in THREADED:
        from levjepa.commands._numbers import whole
        from levjepa.threads import MAX_THREADS

        parser.add_argument("--threads", type=whole(1, MAX_THREADS), default=None, metavar="N", help=_THREADS_HELP)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    for action in parser._actions:  # an option without help still shows its default
        if action.help is None and action.default not in (None, False, argparse.SUPPRESS):
            action.help = "(default: %(default)s)"
    from levjepa.train.loop import TrainingStopped
    from levjepa.train.preemption import REQUEUE_EXIT, JobStopped

    errors = _user_errors()
    caught: tuple[type[BaseException], ...] = (*errors, OSError)  # an OSError only when the user can fix it
    name = command
    try:
        args = _parse(parser, argv)
        name = " ".join([command, *_sub_commands(parser, args)])
        with notes_before_output(), _threads(command, args), _stop_signals(command):
            return int(module.main(args) or 0)
    except caught as err:
        if debug or not (isinstance(err, errors) or _system_error(err)):
            raise
        print(f"levjepa {name}: {_message(err)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        package = (err.name or "").split(".")[0]
        if debug or package not in OPTIONAL_PACKAGES:
            raise
        print(
            f"levjepa {name}: this needs {package}, which is not installed: {OPTIONAL_PACKAGES[package]}",
            file=sys.stderr,
        )
        return 2
    except JobStopped as err:  # a run's checkpoint written, or a job whose rerun continues it: requeue
        if err.is_main:
            print(f"levjepa {name}: {err}", file=sys.stderr)
        return REQUEUE_EXIT
    except TrainingStopped as err:
        if debug:
            raise
        print(f"levjepa {name}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        if debug:
            raise
        said = str(err) or "interrupted"  # a run's Ctrl-C names its last checkpoint and the resume command
        print(f"levjepa {command}: {said}", file=sys.stderr)
        return 130
