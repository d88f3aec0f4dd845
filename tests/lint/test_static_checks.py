"""ruff and mypy stay clean on everything the project ships (the package, tests, bench,
scripts): both are configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110)


def test_ruff_is_clean() -> None:
    lint = run(str(BIN / "ruff"), "check", ".")
    assert lint.returncode == 0, lint.stdout
    formatting = run(str(BIN / "ruff"), "format", "--check", ".")
    assert formatting.returncode == 0, formatting.stdout


@pytest.mark.parametrize(
    "targets",
    [
        (),
        ("bench", "scripts/check-deploy", "scripts/claude_code_smoke.py", "scripts/codex_smoke.py"),
    ],
    ids=["package", "bench-and-scripts"],
)
def test_mypy_is_clean(targets: tuple[str, ...]) -> None:
    """The package as installed (pyproject's `packages`), then what ships beside it: mypy
    takes either packages or files in one run, not both."""
    result = run(str(BIN / "mypy"), *targets)
    assert result.returncode == 0, result.stdout
