"""Quality gate: ruff lint and format are clean (the same check a reviewer would run)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe, "ruff is a test dependency: pip install -e '.[test]'"
    return [exe]


def test_ruff_lint_clean():
    r = subprocess.run(
        [*_ruff(), "check", "--no-cache", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_clean():
    r = subprocess.run(
        [*_ruff(), "format", "--no-cache", "--check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
