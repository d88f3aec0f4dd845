"""Cost markers come from a test's folder (tests/conftest.py), never from memory: no test
module writes one, and every collected test carries exactly its folder's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import COST_FOLDERS, TESTS

_HAND_WRITTEN = re.compile(r"pytest\.mark\.(" + "|".join(COST_FOLDERS) + r")\b")


def test_no_test_module_writes_a_cost_marker() -> None:
    written = [
        f"{path.relative_to(TESTS)}: {match.group(0)}"
        for path in TESTS.rglob("*.py")
        if path.name != "conftest.py"
        for match in _HAND_WRITTEN.finditer(path.read_text(encoding="utf-8"))
        if path.name != Path(__file__).name
    ]
    assert written == []


def test_this_test_carries_its_folders_marker(request: pytest.FixtureRequest) -> None:
    marks = {mark.name for mark in request.node.iter_markers() if mark.name in COST_FOLDERS}
    assert marks == {"lint"}


def test_every_cost_folder_holds_tests() -> None:
    for folder in COST_FOLDERS:
        assert list((TESTS / folder).glob("test_*.py")), f"tests/{folder} holds no test"


def collected(*arguments: str) -> list[str]:
    """The test ids `pytest --collect-only ARGUMENTS` lists (nothing runs)."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*command, *arguments], cwd=TESTS.parent, capture_output=True, text=True, timeout=100
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_a_subfolder_is_a_marker_of_its_own_beside_its_cost() -> None:
    folder = collected("tests/e2e/real_model")
    assert folder
    marked = collected("-m", "e2e and real_model", "tests/e2e/real_model", "tests/e2e/test_cli.py")
    assert marked == folder
