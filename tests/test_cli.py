"""The command line lists every command and fails clearly on an unknown one; every command's ``--help`` starts
with a whole sentence and reads as plain text (no reST)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from levjepa.cli import COMMANDS, main
from levjepa.commands import plain_text


def test_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command_names_choices(capsys):
    assert main(["pretrian"]) == 2
    err = capsys.readouterr().err
    assert "choose one of" in err and err.count("\n") == 1


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "levjepa", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip()


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


HELPS = [[c] for c in COMMANDS] + [["data", sub] for sub in ("check", "prepare", "pack")]


@pytest.mark.parametrize("argv", HELPS, ids=[" ".join(a) for a in HELPS])
def test_every_help_starts_with_a_whole_sentence_and_reads_as_plain_text(argv, capsys):
    text = _help(argv, capsys)
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    assert paragraphs[0].startswith(f"usage: levjepa {' '.join(argv)}")
    opening = " ".join(paragraphs[1].split())  # what follows the usage: the command's one-line help, a sentence
    assert opening[0].isupper() and opening.endswith("."), opening
    sections = text.strip().split("\n\n")[2:]  # after the usage and that sentence: options, then the docstring
    prose = [p for p in sections if not p.startswith(" ") and not p.split("\n")[0].endswith(":")]
    if len(argv) == 1:  # the command module's docstring below the options, whole sentences from its start
        assert prose and prose[0][0].isupper() and prose[0].rstrip().endswith((".", ":")), prose[:1]
    for markup in ("``", ":class:`", ":mod:`", ":func:`", ":meth:`", ":data:`", "::"):
        assert markup not in text, (markup, argv)


def test_plain_text_reads_rst_roles_and_literals():
    doc = "Uses :class:`levjepa.infer.StreamingEncoder` and :func:`~x.y`; ``--window W`` bounds it. Examples::"
    assert plain_text(doc) == "Uses levjepa.infer.StreamingEncoder and x.y; `--window W` bounds it. Examples:"
