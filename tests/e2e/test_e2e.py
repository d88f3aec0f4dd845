"""End to end through real processes: `tokenrelay api --workers 2`, `tokenrelay worker`, a real
Redis and the tiny Qwen2 model; driven with the `openai` package and httpx."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import redis

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.shared.redis import keys

LONG_JOB_TOKENS = 1500  # several seconds on the tiny model: long enough to overlap requests
MESSAGES = [{"role": "user", "content": "写一首诗 about the sea 🌊\nplease"}]


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster(
        {
            "TOKENRELAY_MAX_INFLIGHT": "2",
            "TOKENRELAY_LEASE_TTL_S": "3",
            "TOKENRELAY_WORKER_CONCURRENCY": "1",
        },
        api_workers=2,
    )


def job_events(http: httpx.Client, job_id: str, last_event_id: int | None = None) -> list[dict]:
    """Every event of a job through the terminal one, as parsed from the SSE stream."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    events = []
    with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["x-accel-buffering"] == "no"
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
    return events


def assert_no_leases(cluster: Cluster) -> None:
    client = redis.Redis.from_url(cluster.redis_url)
    try:
        assert client.zcard(keys.leases()) == 0
    finally:
        client.close()


def test_non_stream_completion_with_usage(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=12, seed=1
    )
    choice = completion.choices[0]
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens > 10
    assert 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_text_equals_final_text_and_usage(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    usage = chunks[-1].usage
    assert finish in (["stop"], ["length"])
    assert usage is not None and usage.completion_tokens <= 30
    job_id = chunks[0].id.removeprefix("chatcmpl-")
    record = http.get(f"/v1/jobs/{job_id}").json()
    assert record["status"] == "succeeded"
    assert record["text"] == text
    assert record["usage"]["completion_tokens"] == usage.completion_tokens


def test_same_seed_gives_same_text(client: openai.OpenAI) -> None:
    def sample() -> str | None:
        completion = client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=20, temperature=1.0, seed=1234
        )
        return completion.choices[0].message.content

    assert sample() == sample()


def test_late_subscriber_receives_every_event_from_seq_0(http: httpx.Client) -> None:
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 16}
    response = http.post("/v1/jobs", json=body)
    assert response.status_code == 202
    job_id = response.json()["id"]
    assert response.headers["location"] == f"/v1/jobs/{job_id}"
    first = job_events(http, job_id)
    assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
    late = job_events(http, job_id)
    assert late == first
    assert [e["seq"] for e in late] == list(range(len(late)))
    assert late[0]["type"] == "started" and late[-1]["type"] == "done"
    text = "".join(e["text"] for e in late if e["type"] == "token")
    assert http.get(f"/v1/jobs/{job_id}").json()["text"] == text
    resumed = job_events(http, job_id, last_event_id=1)
    assert resumed == late[2:]


async def test_admission_limit_and_cancel_of_queued_and_running_jobs(cluster: Cluster) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "max_tokens": LONG_JOB_TOKENS,
        "min_tokens": LONG_JOB_TOKENS,
    }
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=30) as http:
        responses = await asyncio.gather(*(http.post("/v1/jobs", json=body) for _ in range(6)))
        admitted = [r for r in responses if r.status_code == 202]
        refused = [r for r in responses if r.status_code == 503]
        assert (len(admitted), len(refused)) == (2, 4)
        for r in refused:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "cluster_overloaded"
        job_ids = [r.json()["id"] for r in admitted]
        running = await _wait_for_status(http, job_ids, "running")
        queued = next(j for j in job_ids if j != running)
        cancelled = await http.delete(f"/v1/jobs/{queued}")
        assert cancelled.json()["status"] == "cancelled"
        await http.delete(f"/v1/jobs/{running}")
    with httpx.Client(base_url=cluster.base_url, timeout=30) as sync_http:
        events = job_events(sync_http, running)
        assert events[-1]["type"] == "error" and events[-1]["error_type"] == "cancelled"
        record = sync_http.get(f"/v1/jobs/{running}").json()
        assert record["status"] == "cancelled"
        assert record["usage"]["completion_tokens"] < LONG_JOB_TOKENS
    assert_no_leases(cluster)


async def _wait_for_status(http: httpx.AsyncClient, job_ids: list[str], status: str) -> str:
    async with asyncio.timeout(30):
        while True:
            for job_id in job_ids:
                if (await http.get(f"/v1/jobs/{job_id}")).json()["status"] == status:
                    return job_id
            await asyncio.sleep(0.05)


def test_client_disconnect_cancels_the_streaming_job(cluster: Cluster, http: httpx.Client) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "max_tokens": LONG_JOB_TOKENS,
        "min_tokens": LONG_JOB_TOKENS,
        "stream": True,
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
    job_id = first["id"].removeprefix("chatcmpl-")
    events = job_events(http, job_id)
    assert events[-1]["type"] == "error" and events[-1]["error_type"] == "cancelled"
    assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    assert_no_leases(cluster)


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": MODEL_NAME}, 400, "invalid_request_error", "messages"),
        (
            {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 10**6},
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        ({"model": MODEL_NAME, "messages": MESSAGES, "n": 2}, 400, "invalid_request_error", "n"),
        (
            {"model": MODEL_NAME, "messages": MESSAGES, "temperature": 5},
            400,
            "invalid_request_error",
            "temperature",
        ),
        ({"model": "gpt-4", "messages": MESSAGES}, 404, "model_not_found", "model"),
        (
            {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 5, "min_tokens": 6},
            400,
            "invalid_request_error",
            "min_tokens",
        ),
        (
            {"model": MODEL_NAME, "messages": [{"role": "robot", "content": "x"}]},
            400,
            "invalid_request_error",
            "messages.0.role",
        ),
    ],
)
def test_bad_input_gets_a_clear_4xx(
    http: httpx.Client, body: dict, status: int, code: str, param: str
) -> None:
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]


def test_malformed_json_and_unknown_job(http: httpx.Client) -> None:
    response = http.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]
    missing = http.get("/v1/jobs/does-not-exist")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "job_not_found"


def test_too_long_prompt_fails_with_context_length_exceeded(client: openai.OpenAI) -> None:
    huge = [{"role": "user", "content": "hello world " * 1200}]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL_NAME, messages=huge, max_tokens=1000)
    assert "maximum context length" in str(raised.value)


def test_a_prompt_that_can_never_fit_is_refused_at_admission(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    connection = redis.Redis.from_url(cluster.redis_url)
    admitted_before = connection.lrange(keys.recent_jobs(), 0, -1)
    huge = [{"role": "user", "content": "hello world " * 1200}]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL_NAME, messages=huge, max_tokens=10)
    assert raised.value.code == "context_length_exceeded"
    assert "asks for at least" in str(raised.value), "counted by the API, not a worker"
    assert connection.lrange(keys.recent_jobs(), 0, -1) == admitted_before
    connection.close()


def test_too_long_prompt_is_a_400_before_a_stream_starts(client: openai.OpenAI) -> None:
    huge = [{"role": "user", "content": "hello world " * 1200}]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL_NAME, messages=huge, max_tokens=1000, stream=True
        )
    assert raised.value.code == "context_length_exceeded"
    assert raised.value.param == "messages"


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL_NAME]


def test_text_completions_stream_and_not(client: openai.OpenAI) -> None:
    fields = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 12, "seed": 3}
    whole = client.completions.create(**fields, temperature=1.0)  # type: ignore[call-overload]
    chunks = list(
        client.completions.create(  # type: ignore[call-overload]
            **fields, temperature=1.0, stream=True, stream_options={"include_usage": True}
        )
    )
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == whole.choices[0].text
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and chunks[-1].usage == whole.usage
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model=MODEL_NAME, prompt="x", suffix="y")
