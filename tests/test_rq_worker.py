"""The RQ glue: JSON jobs, and a worker that only runs allow-listed job functions."""

from __future__ import annotations

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from shared import keys
from shared.generation import ChatMessage, GenerationRequest
from shared.rq_jobs import GENERATE_FUNCTION, enqueue_generation
from shared.settings import Settings
from worker.rq_worker import UnknownJobFunction, allow_listed_job_class, build_worker


def test_a_job_naming_another_function_is_refused(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    queue = Queue(keys.generation_queue(), connection=connection, serializer=JSONSerializer)
    job = queue.enqueue_call("os.system", args=("echo pwned",))
    job_class = allow_listed_job_class({GENERATE_FUNCTION: lambda **_: None})
    fetched = job_class.fetch(job.id, connection=connection, serializer=JSONSerializer)
    with pytest.raises(UnknownJobFunction):
        _ = fetched.func
    connection.close()


def test_enqueued_generation_runs_the_allow_listed_function_with_json_kwargs(
    redis_url: str,
) -> None:
    connection = redis.Redis.from_url(redis_url)
    request = GenerationRequest(
        model="m", messages=(ChatMessage(role="user", content="你好"),), max_tokens=3
    )
    enqueue_generation(connection, Settings(redis_url=redis_url), "job1", request)
    raw = connection.hget("rq:job:job1", "data")
    assert raw is not None and b"pickle" not in raw
    calls: list[dict[str, object]] = []

    def generate(job_id: str, request: dict[str, object]) -> dict[str, str]:
        calls.append({"job_id": job_id, "request": request})
        return {"status": "succeeded"}

    worker = build_worker(connection, "test-worker", {GENERATE_FUNCTION: generate})
    worker.work(burst=True)
    assert calls == [{"job_id": "job1", "request": request.model_dump(mode="json")}]
    connection.close()
