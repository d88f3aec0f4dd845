"""Placement by prefix through every generating route, in-process against a real Redis: the
API's block hashes are those of the very ids the worker prefills (the tiny model's tokenizer
and chat template, tools and system prompts included), so a request sent again goes to the
own queue of the worker that ran it; and the load bound sends it to the model's queue.

A fake worker plays the worker's part through the scripts a worker runs, with the worker's
own tokenization (`ModelFiles`, as `JobRunner` encodes) and hashing (`placement.prompt_blocks`).
It records only the prompt's last whole block: its hash chains every id before it, so a
placement on it proves the API's ids equal the worker's up to that block's end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer

from tokenrelay.api.app import create_app
from tokenrelay.shared.events import Done, Started, Usage
from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.jobs import JobStatus
from tokenrelay.shared.redis import job_scripts, keys, placement
from tokenrelay.shared.redis.model_limits import LimitsPublisher
from tokenrelay.shared.redis.rq_jobs import PRIORITIES
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings

pytestmark = pytest.mark.timeout(120)

MODEL = "m"
BLOCK_TOKENS = 16
LONG = "The quick brown fox jumps over the lazy dog near the quiet river bank. " * 6
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 3
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ROUTES: list[tuple[str, dict[str, Any]]] = [
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "max_tokens": 4,
            "tools": [WEATHER],
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": LONG},
                {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "And the weather in Paris?"},
            ],
        },
    ),
    ("/v1/completions", {"model": MODEL, "max_tokens": 4, "prompt": LONG}),
    ("/", {"prompt": LONG, "max_tokens": 4}),
    (
        "/chat",
        {"query": LONG, "history": [["hello", "hi there"]], "system": SYSTEM, "max_tokens": 4},
    ),
    (
        "/v1/jobs",
        {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": LONG}]},
    ),
    (
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 4,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": LONG}],
        },
    ),
    ("/v1/responses", {"model": MODEL, "max_output_tokens": 4, "input": LONG}),
]


@pytest.fixture
def app_settings(redis_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        served_model_name=MODEL,
        lease_ttl_s=5,
        max_queue_wait_s=30,
        prefix_placement_block_tokens=BLOCK_TOKENS,
    )


@pytest.fixture
def files(tiny_model_dir: Path, sync_redis: redis.Redis) -> Any:
    """The tiny model's tokenizer and template, published as a worker publishes them."""
    from tokenrelay.worker.engines.model_files import ModelFiles

    model_files = ModelFiles(str(tiny_model_dir))
    publisher = LimitsPublisher(
        MODEL,
        4096,
        32_768,
        model_files.tokenizer_json(),
        model_files.chat_template(),
        prefix_block_tokens=BLOCK_TOKENS,
    )
    publisher.publish(sync_redis)
    return model_files


@pytest.fixture
def client(app_settings: Settings, files: Any) -> Iterator[TestClient]:
    with TestClient(create_app(app_settings)) as test_client:
        yield test_client


class FakeWorker:
    """Takes the next job from `name`'s own queues or the model's, as a worker drains them,
    starts it recording its prompt's last block, and ends it."""

    def __init__(self, settings: Settings, files: Any, name: str) -> None:
        self._settings = settings
        self._files = files
        self.name = name
        self.client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        self.scripts = SyncScripts(self.client)
        self.scripts.run(job_scripts.register_worker(settings, name, MODEL, 1))

    def queues(self) -> list[str]:
        own = placement.worker_queue_keys(self.name)
        prefix = Queue.redis_queue_namespace_prefix
        shared = [prefix + keys.generation_queue(MODEL, p) for p in PRIORITIES]
        return [key for pair in zip(own, shared, strict=True) for key in pair]

    def serve_one(self) -> tuple[str, GenerationRequest]:
        """Serve the next job; returns the queue it came from and its request."""
        popped = self.client.blpop(self.queues(), 10)
        assert popped is not None, "no job was enqueued"
        queue, job_id = popped
        job = Job.fetch(job_id, connection=redis.Redis.from_url(self._settings.redis_url))
        job.serializer = JSONSerializer
        request = GenerationRequest.model_validate(job.kwargs["request"])
        if request.prompt is not None:
            ids = self._files.encode_prompt(request.prompt)
        else:
            ids = self._files.encode_chat(request.messages, request.tools)
        blocks = placement.prompt_blocks(MODEL, ids, BLOCK_TOKENS)
        assert len(blocks) >= 2
        index = placement.index_args(self._settings, MODEL, blocks[-1:])
        started = Started(worker=self.name, prompt_tokens=len(ids)).to_wire()
        call = job_scripts.start(self._settings, job_id, self.name, started, index)
        assert job_scripts.parse_start(self.scripts.run(call)).status == "running"
        usage = Usage(prompt_tokens=len(ids), completion_tokens=0, total_tokens=len(ids))
        done = Done(finish_reason="stop", usage=usage).to_wire()
        self.scripts.run(
            job_scripts.finish(self._settings, job_id, JobStatus.SUCCEEDED, {}, done, 1)
        )
        return queue, request


def post_served(
    client: TestClient, path: str, body: dict[str, Any], serve: Callable[[], Any]
) -> Any:
    """POST `body` while `serve` plays the worker; returns what `serve` returned."""
    served: list[Any] = []
    thread = threading.Thread(target=lambda: served.append(serve()))
    thread.start()
    response = client.post(path, json=body)
    thread.join(timeout=20)
    assert response.status_code in (200, 202), response.text
    assert served, "the fake worker failed"
    return served[0]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[path for path, _ in ROUTES])
def test_a_request_sent_again_goes_to_the_worker_that_prefilled_its_blocks(
    client: TestClient, app_settings: Settings, files: Any, path: str, body: dict[str, Any]
) -> None:
    first, second = FakeWorker(app_settings, files, "w-a"), FakeWorker(app_settings, files, "w-b")
    shared = Queue.redis_queue_namespace_prefix + keys.generation_queue(MODEL, "normal")
    queue, request = post_served(client, path, body, first.serve_one)
    assert queue == shared  # nothing indexed yet
    prompt_fit = client.app.state.tokenrelay.prompt_fit  # type: ignore[attr-defined]
    api_ids = client.portal.call(prompt_fit.prompt_ids, request, BLOCK_TOKENS)
    worker_ids = (
        files.encode_prompt(request.prompt)
        if request.prompt is not None
        else files.encode_chat(request.messages, request.tools)
    )
    assert api_ids == worker_ids
    if path == "/v1/chat/completions":
        assert request.tools and request.messages[0].role == "system"
    queue, _ = post_served(client, path, body, first.serve_one)
    assert queue == placement.worker_queue_keys("w-a")[1]
    second.client.close()
    first.client.close()


def test_the_load_bound_sends_a_job_to_the_models_queue_and_metrics_count_both(
    client: TestClient, app_settings: Settings, files: Any, sync_redis: redis.Redis
) -> None:
    path, body = ROUTES[4]  # /v1/jobs: answered at once, the job left queued
    first, second = FakeWorker(app_settings, files, "w-a"), FakeWorker(app_settings, files, "w-b")
    post_served(client, path, body, first.serve_one)
    own = placement.worker_queue_keys("w-a")[1]
    shared = Queue.redis_queue_namespace_prefix + keys.generation_queue(MODEL, "normal")
    bound = app_settings.prefix_placement_max_backlog
    for _ in range(bound + 2):
        assert client.post(path, json=body).status_code == 202
    assert sync_redis.llen(own) == bound
    assert sync_redis.llen(shared) == 2
    scrape = client.get("/metrics").text
    assert 'tokenrelay_placements_total{queue="prefix"} 4.0' in scrape
    assert 'tokenrelay_placements_total{queue="shared"} 3.0' in scrape
    second.client.close()
    first.client.close()


def test_with_one_live_worker_a_known_prefix_goes_to_the_models_queue(
    client: TestClient, app_settings: Settings, files: Any
) -> None:
    """One worker drains every queue anyway: placing on it would only let the job pass
    others of its priority."""
    path, body = ROUTES[4]
    only = FakeWorker(app_settings, files, "w-a")
    post_served(client, path, body, only.serve_one)
    queue, _ = post_served(client, path, body, only.serve_one)
    assert queue == Queue.redis_queue_namespace_prefix + keys.generation_queue(MODEL, "normal")
    assert 'tokenrelay_placements_total{queue="shared"} 2.0' in client.get("/metrics").text
    only.client.close()


def test_with_placement_off_the_api_places_nothing(app_settings: Settings, files: Any) -> None:
    """The workers record their blocks (their own setting), the API with placement off
    neither looks them up nor counts a placement."""
    off = app_settings.model_copy(update={"prefix_placement": "off"})
    path, body = ROUTES[4]
    with TestClient(create_app(off)) as client:
        first = FakeWorker(app_settings, files, "w-a")
        second = FakeWorker(app_settings, files, "w-b")
        for _ in range(2):
            queue, _ = post_served(client, path, body, first.serve_one)
            assert queue == Queue.redis_queue_namespace_prefix + keys.generation_queue(
                MODEL, "normal"
            )
        assert "tokenrelay_placements_total{" not in client.get("/metrics").text
        first.client.close()
        second.client.close()
