"""Hints name only options the command has. Every ``--flag`` in a message a command module raises or prints is
an option of that command's parser, and every ``levjepa CMD ... --flag`` a message anywhere in the package shows
as a command to run is an option of CMD (a hint is no help when the option it names is refused as unknown)."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from pathlib import Path

import pytest

from levjepa.commands import COMMANDS, MODULES, _Parser

SRC = Path(__file__).resolve().parents[1] / "src" / "levjepa"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SHOWN = re.compile(r"levjepa ([a-z]+)((?: (?:data )?[^`'\"]*)?)")


def options(command: str) -> set[str]:
    """Every option string of ``levjepa COMMAND`` (its sub-commands' too), and the dispatcher's own."""
    module = importlib.import_module(f"levjepa.commands.{MODULES.get(command, command)}")
    parser = _Parser(prog=f"levjepa {command}")
    module.add_arguments(parser)
    found = {"--debug", "--help", "--version"}
    todo: list[argparse.ArgumentParser] = [parser]
    while todo:
        p = todo.pop()
        for action in p._actions:
            found.update(s for s in action.option_strings if s.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return found


def _text(node: ast.AST) -> str:
    """The literal text of a string or f-string (``{...}`` parts as a space)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if isinstance(v, ast.Constant) else " " for v in node.values)
    return ""


def messages(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each message in ``path``: the strings of a ``raise X(...)`` and of a ``print(...)``."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        call = node.exc if isinstance(node, ast.Raise) else node
        is_print = isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"
        if (isinstance(node, ast.Raise) and isinstance(call, ast.Call)) or is_print:
            assert isinstance(call, ast.Call)
            for arg in call.args:
                parts = [arg] if not isinstance(arg, ast.BinOp) else [arg.left, arg.right]
                text = "".join(_text(p) for p in parts)
                if text:
                    out.append((node.lineno, text))
    return out


def _command_files() -> dict[str, Path]:
    return {c: SRC / "commands" / f"{MODULES.get(c, c)}.py" for c in COMMANDS}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_commands_messages_name_only_its_own_options(command):
    have = options(command)
    wrong = []
    for line, text in messages(_command_files()[command]):
        text = re.sub(r"`levjepa [^`]*`", "", text)  # another command's line: checked below
        wrong += [f"line {line}: {flag}" for flag in FLAG.findall(text) if flag not in have]
    assert not wrong, f"levjepa {command}: hints name options it does not have: {wrong}"


def test_a_command_line_shown_in_any_message_uses_that_commands_options():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        for line, text in messages(path):
            for shown in re.findall(r"`(levjepa [^`]*)`", text):
                for command in shown.split()[1].split("/"):  # `levjepa probe/extract RUN`: both
                    if command not in COMMANDS:
                        wrong.append(f"{path.name}:{line}: {shown} (no command {command})")
                        continue
                    have = options(command)
                    wrong += [f"{path.name}:{line}: {shown} ({f})" for f in FLAG.findall(shown) if f not in have]
    assert not wrong, "\n".join(wrong)


# library modules -> the commands whose messages they raise (a --flag there must be an option of each)
RAISED_FOR = {"formats/reading/views.py": ("probe", "extract", "visualize", "stream")}
# options of other programs a message names (torchrun / srun's, pip's)
OTHER_PROGRAMS = {"--nproc", "--ntasks", "--index-url"}


def test_library_messages_name_options_that_exist():
    """A message raised below the commands names options of some command; where it is raised for several
    commands (``RAISED_FOR``), an option of each one of them (or one the caller passes in)."""
    every = set().union(*(options(c) for c in COMMANDS)) | OTHER_PROGRAMS
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("commands/"):
            continue
        need = [options(c) for c in RAISED_FOR.get(rel, ())]
        for line, text in messages(path):
            for flag in FLAG.findall(re.sub(r"`levjepa [^`]*`", "", text)):
                if flag not in every or any(flag not in have for have in need):
                    wrong.append(f"{rel}:{line}: {flag}")
    assert not wrong, "\n".join(wrong)


def test_a_refused_finetune_out_names_finetunes_options(tmp_path):
    # the run skeleton is pretraining's, whose refusal named --overwrite and --run-dir, which finetune lacks
    from levjepa.train.run_dir import RunDirError, prepare_run_dir

    (tmp_path / "x").write_text("")
    with pytest.raises(RunDirError) as err:
        prepare_run_dir(tmp_path, resume=False, overwrite=False, flag="--out")
    assert set(FLAG.findall(str(err.value))) <= options("finetune") and "--out" in str(err.value)


def test_the_check_catches_an_option_a_command_lacks():
    assert "--out" in options("export") and "--overwrite" in options("export")
    assert "--frame-stride" not in options("classify")  # so a classify hint naming it would be caught
    assert FLAG.findall("pass --resume to continue, or --run-dir DIR") == ["--resume", "--run-dir"]
