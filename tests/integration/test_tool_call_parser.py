"""Which tool-call parser a model gets, in-process against a real Redis: the one its workers
publish, shown in `/v1/models`; this API process's own `TOKENRELAY_TOOL_CALL_PARSER` until a
worker published one, or where a worker's is unknown here."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from tokenrelay.api.app import create_app
from tokenrelay.shared.redis import job_scripts
from tokenrelay.shared.redis.model_limits import LimitsPublisher
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings

MODEL = "m"


@pytest.fixture
def client(redis_url: str) -> Iterator[TestClient]:
    settings = Settings(redis_url=redis_url, served_model_name=MODEL, tool_call_parser="hermes")
    with TestClient(create_app(settings)) as api:
        yield api


def start_worker(redis_url: str, client: redis.Redis, model: str, parser: str) -> None:
    """What a worker's first heartbeat writes: its registration and its model's limits."""
    settings = Settings(redis_url=redis_url)
    SyncScripts(client).run(job_scripts.register_worker(settings, f"w-{model}", model, 1))
    LimitsPublisher(model, 2048, 4096, None, None, parser).publish(client)


def parsers(client: TestClient) -> dict[str, str]:
    models = client.get("/v1/models").json()["data"]
    return {model["id"]: model["tool_call_parser"] for model in models}


def test_each_model_shows_the_parser_its_workers_publish(
    client: TestClient, redis_url: str, sync_redis: redis.Redis
) -> None:
    start_worker(redis_url, sync_redis, MODEL, "json")
    start_worker(redis_url, sync_redis, "other", "qwen")
    assert parsers(client) == {MODEL: "json", "other": "qwen"}
    assert client.get(f"/v1/models/{MODEL}").json()["tool_call_parser"] == "json"


def test_a_worker_that_publishes_none_leaves_the_api_processs_own_setting(
    client: TestClient, redis_url: str, sync_redis: redis.Redis
) -> None:
    start_worker(redis_url, sync_redis, MODEL, "")
    assert parsers(client) == {MODEL: "hermes"}


def test_a_parser_unknown_here_falls_back_to_the_setting_and_says_so(
    client: TestClient, redis_url: str, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    start_worker(redis_url, sync_redis, MODEL, "pythonic")
    with caplog.at_level(logging.WARNING, logger="tokenrelay.api.jobs.tool_parser"):
        assert parsers(client) == {MODEL: "hermes"}
    assert "'pythonic', unknown to this API process" in caplog.text
