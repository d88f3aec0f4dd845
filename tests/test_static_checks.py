"""ruff and mypy stay clean: the project configures both in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110)


def test_ruff_is_clean() -> None:
    lint = run(str(BIN / "ruff"), "check", "api", "worker", "shared", "tests")
    assert lint.returncode == 0, lint.stdout
    formatting = run(str(BIN / "ruff"), "format", "--check", "api", "worker", "shared", "tests")
    assert formatting.returncode == 0, formatting.stdout


def test_mypy_is_clean() -> None:
    result = run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout
