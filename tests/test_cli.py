"""The command line lists every command and fails clearly on an unknown one."""

from __future__ import annotations

import subprocess
import sys

from levjepa.cli import COMMANDS, main


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
