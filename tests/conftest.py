"""Fixtures: a real Redis server per test session (flushed per test), settings, clients, the
tiny model, clusters of real processes; and each test's cost marker, from its folder.

Tests live in folders by what they start, and the folder is the marker (never written by
hand): `unit` (no process, no Redis), `integration` (a real Redis, an in-process app or
engine), `e2e` (spawned API and worker processes, sentinels, clusters, browsers), `lint`
(the static checks: ruff, mypy, import contracts, the docs build) and `deploy` (the
deployment files, through offline validators). `pytest -m "not e2e"` is the fast lane. A
subfolder adds its own marker (registered in pyproject.toml): `e2e/real_model/` holds the
tests on the demo's real model, `real_model`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.support.cluster import Cluster, ClusterFactory, running_cluster
from tests.support.webhook_receiver import Receiver
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.settings import Settings

TESTS = Path(__file__).resolve().parent
COST_FOLDERS = ("unit", "integration", "e2e", "lint", "deploy")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its folder's cost, and with its subfolder's name where it lives
    in one (`e2e/real_model/`: `real_model`); a test outside those folders is an error."""
    for item in items:
        folder, *subfolders = item.path.relative_to(TESTS).parent.parts or ("",)
        if folder not in COST_FOLDERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of {COST_FOLDERS}")
        item.add_marker(folder)
        for subfolder in subfolders:
            item.add_marker(subfolder)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, max_inflight=2, lease_ttl_s=3, max_queue_wait_s=5)


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
async def async_redis(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenrelay.worker.devmodels.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@contextmanager
def _cluster_factory(model_dir: Path, log_dir: Path) -> Iterator[ClusterFactory]:
    """`make(settings, api_workers=, workers=, redis_url=)` starts a `running_cluster`; all
    that were made stop when the fixture ends."""
    with ExitStack() as stack:

        def make(settings: dict[str, str] | None = None, **options: Any) -> Cluster:
            return stack.enter_context(running_cluster(model_dir, log_dir, settings, **options))

        yield make


@pytest.fixture
def make_cluster(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ClusterFactory]:
    with _cluster_factory(tiny_model_dir, tmp_path) as make:
        yield make


@pytest.fixture(scope="module")
def make_module_cluster(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterFactory]:
    with _cluster_factory(tiny_model_dir, tmp_path_factory.mktemp("cluster-logs")) as make:
        yield make


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A local webhook receiver (`tests.support.webhook_receiver.Receiver`)."""
    server = Receiver()
    yield server
    server.close()
