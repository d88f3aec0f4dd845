"""What `pip install` gives a user: one import package, extras that carry their commands,
and child processes that never import the current directory's code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.cli.embedded_redis import free_port
from tokenrelay.cli.harness import ProcessGroup, tokenrelay_command
from tokenrelay.testing.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 600
SERVE_TIMEOUT_S = 120
# A user's own packages with our layers' names: importing either one is the bug.
SHADOWING_PACKAGES = ("api", "shared", "worker", "cli")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip_wheel, "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    (path,) = out.glob("tokenrelay-*.whl")
    return path


def test_the_wheel_installs_one_top_level_package_with_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"tokenrelay"}
    for layer in ("api", "cli", "shared", "worker"):
        assert f"tokenrelay/{layer}/__init__.py" in names
        assert f"tokenrelay/{layer}/py.typed" in names
    assert "tokenrelay/api/static/index.html" in names
    lua = {Path(name).name for name in names if name.startswith("tokenrelay/shared/lua/")}
    assert lua == {path.name for path in (ROOT / "shared" / "lua").glob("*.lua")}


@pytest.fixture(scope="module")
def client_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with only `tokenrelay[client]`; its bin folder."""
    home = tmp_path_factory.mktemp("client-venv")
    venv.create(home, with_pip=True)
    pip = [str(home / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run(
        [*pip, f"tokenrelay[client] @ {wheel.as_uri()}"],
        check=True,
        capture_output=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    return home / "bin"


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster({"TOKENRELAY_WORKER_CONCURRENCY": "1"})


def test_the_client_extra_alone_runs_chat_and_top(client_env: Path, cluster: Cluster) -> None:
    python = str(client_env / "python")
    for absent in ("api", "shared", "worker", "fastapi", "uvicorn", "torch", "transformers"):
        probe = subprocess.run(
            [python, "-c", f"import {absent}"], cwd=client_env, capture_output=True, timeout=60
        )
        assert probe.returncode == 1, f"{absent} is importable with only the client extra"
    env = {"PATH": os.environ["PATH"], "TOKENRELAY_URL": cluster.base_url}
    chat = subprocess.run(
        [str(client_env / "tokenrelay"), "chat", "hello", "--max-tokens", "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert chat.returncode == 0, chat.stderr
    assert "Traceback" not in chat.stderr
    top = subprocess.run(
        [str(client_env / "tokenrelay"), "top", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert top.returncode == 0, top.stderr
    assert MODEL_NAME in top.stdout


@pytest.fixture
def shadowing_dir(tmp_path: Path) -> Iterator[Path]:
    """A project folder whose own `api`, `shared`, `worker` and `cli` packages fail loudly."""
    for name in SHADOWING_PACKAGES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('imported the user\\'s own {name} package')\n"
        )
    yield tmp_path


def test_serve_demo_answers_from_a_directory_with_its_own_api_and_shared(
    shadowing_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENRELAY_")}
    env["TOKENRELAY_CACHE_DIR"] = str(tmp_path_factory.mktemp("serve-cache"))
    serve = [str(Path(sys.executable).parent / "tokenrelay"), "serve", "--demo", "tiny"]
    with ProcessGroup(env=env, log_dir=tmp_path_factory.mktemp("serve-logs")) as group:
        served = group.spawn("serve", [*serve, "--port", str(port)], cwd=shadowing_dir)
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            served.check_running()
            try:
                models = httpx.get(f"{url}/v1/models", timeout=2).json()["data"]
            except (httpx.HTTPError, ValueError):
                return False
            return bool(models)

        eventually(answers, SERVE_TIMEOUT_S, "tokenrelay serve --demo tiny to list its model")
        body = {
            "model": httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"],
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
        }
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
        log = served.log_path
        assert log is not None
        assert "imported the user" not in log.read_text()


def test_every_version_reads_the_package_metadata() -> None:
    """pyproject.toml is the one place the version is written: the CLI and the OpenAPI
    document read it from the metadata; the deployment files' image tags must agree."""
    from tokenrelay.api.app import create_app
    from tokenrelay.shared.settings import Settings

    installed = version("tokenrelay")
    printed = subprocess.run(
        tokenrelay_command("--version"), capture_output=True, text=True, timeout=60
    )
    assert printed.stdout.strip() == f"tokenrelay {installed}"
    assert create_app(Settings()).openapi()["info"]["version"] == installed
    chart = (ROOT / "helm" / "Chart.yaml").read_text()
    assert f'appVersion: "{installed}"' in chart
    tags = re.findall(r'^\s+tag: "([^"]+)"', (ROOT / "helm" / "values.yaml").read_text(), re.M)
    assert tags and set(tags) == {installed}
    for compose in ("compose.yaml", "compose.cpu.yaml"):
        defaults = re.findall(r"TOKENRELAY_VERSION:-([^}]+)}", (ROOT / compose).read_text())
        assert defaults and set(defaults) == {installed}, compose
