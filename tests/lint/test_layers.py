"""The layers are contracts (import-linter, configured in pyproject.toml): kept by the tree,
and broken by a copy of it that imports across them."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
LAYER_FOLDERS = ("api", "cli", "shared", "testing", "worker")
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]


def lint_imports(cwd: Path, *, only_cwd: bool = False) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with `cwd`'s pyproject.toml. With `only_cwd`, the `tokenrelay` package
    is the one in `cwd`: `-S` skips the .pth of our editable install, which would otherwise
    add its own portion to the `tokenrelay` namespace."""
    command = [str(LINT_IMPORTS)]
    env = {"PATH": "/usr/bin:/bin"}
    if only_cwd:
        command = [
            sys.executable,
            "-S",
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
        ]
        env["PYTHONPATH"] = os.pathsep.join([str(cwd), *site.getsitepackages()])
    return subprocess.run(
        [*command, "--no-cache", "--config", str(cwd / "pyproject.toml")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout


BREAKS = {
    "layers": ("shared/redis/keys.py", "from tokenrelay.worker import stop_strings"),
    "layers-sideways": ("worker/stop_strings.py", "from tokenrelay.api import model_routing"),
    "api-without-torch": ("api/jobs/model_routing.py", "import transformers"),
    "shared-is-a-contract": ("shared/settings.py", "import httpx"),
    "layers-testing": ("cli/harness.py", "from tokenrelay.testing import polling"),
    "api-features": ("api/streaming/relay.py", "from tokenrelay.api.jobs import control"),
    "api-features-state": ("api/state.py", "from tokenrelay.api.streaming import hub"),
    "worker-engines": ("worker/batcher.py", "import torch"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_a_copy_that_imports_across_a_layer_breaks_its_contract(case: str, tmp_path: Path) -> None:
    for folder in LAYER_FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / "tokenrelay" / folder)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path, line = BREAKS[case]
    with open(tmp_path / "tokenrelay" / path, "a") as module:
        module.write(f"\n{line}\n")
    result = lint_imports(tmp_path, only_cwd=True)
    assert result.returncode != 0, result.stdout
    contract = case.removesuffix("-sideways").removesuffix("-testing").removesuffix("-state")
    name = next(c["name"] for c in CONTRACTS if c["id"] == contract)
    assert f"{name} BROKEN" in result.stdout
    broken_module = "tokenrelay." + path.removesuffix(".py").replace("/", ".")
    assert broken_module in result.stdout
