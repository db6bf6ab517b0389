"""Every benchmark script that times something says first which CPU it ran on (issue 66 item 6).

A time measured on the CPU means little without the CPU's model and instruction sets (AVX2, AVX-512, VNNI,
AMX: they decide which float and int8 kernels run), so every ``bench/*.py`` that reads a clock prints
``levjepa.infer.cpu.cpu_info().describe()`` before any other line of its ``main``, and the tables in
``bench/*.md`` copy it into their captions. Read from the ``ast``: nothing is run.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
CLOCKS = {"perf_counter", "perf_counter_ns", "process_time", "process_time_ns", "monotonic", "time"}


def _reads_a_clock(tree: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr in CLOCKS and isinstance(n.value, ast.Name) and n.value.id == "time"
        for n in ast.walk(tree)
    )


def _names_the_cpu(call: ast.Call) -> bool:
    """``print(...)`` with ``cpu_info().describe()`` among its arguments."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "describe"
        and isinstance(n.func.value, ast.Call)
        and isinstance(n.func.value.func, ast.Name)
        and n.func.value.func.id == "cpu_info"
        for arg in call.args
        for n in ast.walk(arg)
    )


def _first_print(func: ast.FunctionDef) -> ast.Call | None:
    prints = [n for n in ast.walk(func) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"]
    return min(prints, key=lambda n: (n.lineno, n.col_offset), default=None)


def test_every_timing_script_prints_its_cpu_first():
    timed = {p.name: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(BENCH.glob("*.py"))}
    timed = {name: tree for name, tree in timed.items() if _reads_a_clock(tree)}
    assert len(timed) > 30  # the scripts were found (most of bench/ times something)
    missing = []
    for name, tree in timed.items():
        main = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"), None)
        first = _first_print(main) if main is not None else None
        if first is None or not _names_the_cpu(first):
            missing.append(name)
    assert not missing, f"these bench scripts time something but do not print cpu_info().describe() first: {missing}"
